"""The demo's experiment traffic: many users rank through the service, some click, so the arms have figures.

The generated events (`headwater events produce`) carry no arm: only answers of the service do. The
requests come from users the way a live product's do: most from users who were active in the history
(``--users-from``: the labels file, one row per impression, so an active user is drawn more often) and
a share ``--cold-share`` from users the history never saw (a new user has no features yet, and the
popularity fallback is the right answer for them). Each request ranks ``--candidates`` items and
clicks the top item with probability ``--click-rate`` (posted as feedback: the impression and the
click carry the user's arm). The service logs a sample of these answers for `headwater skew`.

Every answer is counted per arm and by how it was made: the model, or a fallback with its reason
(``fallback_reason``). Two kinds of fallback are by design and are said so: the ``linear`` arm's
answers (the experiment's challenger starts the chain at the linear model) and the popularity answers
for cold users. Every other fallback (``missing_user_features`` for a user with history, ``deadline``,
``store_error``, ...) is a fault, and its share is printed against the 10% the demo allows.
"""

from __future__ import annotations

import argparse
import random
from collections import Counter
from pathlib import Path

import click
import pyarrow.parquet as pq

from headwater.cli.client import post

FAULT_SHARE_LIMIT = 0.10
"""The share of answers whose fallback is a fault above which the demo says so (issue 37's 10%)."""


def how_answered(answer: dict[str, object]) -> str:
    """``model``, or the fallback and why (``linear: experiment``, ``popularity: missing_user_features``)."""
    fallback = answer.get("fallback")
    if not fallback:
        return "model"
    return f"{fallback}: {answer.get('fallback_reason') or 'no reason given'}"


def by_design(how: str, cold: bool) -> str | None:
    """Why a fallback answer is the right one, or None when it is a fault (or the model answered)."""
    if how == "linear: experiment":
        return "the linear arm: the experiment's challenger"
    if cold and how == "popularity: missing_user_features":
        return "a new user: no features yet"
    return None


def draw_users(rng: random.Random, labels: Path | None, n: int, cold_share: float) -> list[tuple[str, bool]]:
    """``n`` (user id, cold) pairs: active users by their impressions in ``labels``, a share of new ones."""
    active = pq.read_table(labels, columns=["user_id"]).column("user_id").to_pylist() if labels else []
    users: list[tuple[str, bool]] = []
    for i in range(n):
        if not active or rng.random() < cold_share:
            users.append((f"u-new-{i:06d}", True))
        else:
            users.append((rng.choice(active), False))
    return users


def main() -> None:
    """Rank for each user, click some top items; print what was sent and how the answers were made."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", default="http://127.0.0.1:8080")
    parser.add_argument("--users", type=int, default=300, help="requests to send (one user each)")
    parser.add_argument("--users-from", type=Path, default=None, help="labels parquet of the history's users")
    parser.add_argument("--cold-share", type=float, default=0.05, help="share of requests from new users")
    parser.add_argument("--candidates", type=int, default=100)
    parser.add_argument("--click-rate", type=float, default=0.3)
    parser.add_argument("--seed", type=int, default=20)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    arms: Counter[str] = Counter()
    designed: Counter[str] = Counter()
    faults: Counter[str] = Counter()
    clicks = errors = 0
    for user, cold in draw_users(rng, args.users_from, args.users, args.cold_share):
        first = rng.randrange(0, 1000)
        body = {"user_id": user, "candidates": [f"i{first + c:06d}" for c in range(args.candidates)], "k": 10}
        try:
            answer = post(args.url, "/v1/rank", body)
            how = how_answered(answer)
            arms[f"{answer.get('arm')} {how}"] += 1
            if how != "model":
                why = by_design(how, cold)
                (designed if why else faults)[why or how] += 1
            if answer["items"] and rng.random() < args.click_rate:
                top = answer["items"][0]["item_id"]
                click_body = {"user_id": user, "item_id": top, "event_type": "click",
                              "request_id": answer["request_id"], "position": 1}  # fmt: skip
                post(args.url, "/v1/feedback", click_body)
                clicks += 1
        except click.ClickException as exc:  # one failed request does not stop the demo; it is counted
            errors += 1
            if errors <= 3:
                print(f"request for {user} failed: {exc.message}")
    answered = sum(arms.values())
    print(f"experiment traffic: {args.users} requests ranked, {clicks} clicked, {errors} failed; answers:")
    for name, count in sorted(arms.items()):  # every fallback with its reason, counted
        print(f"  {name:<48} {count}")
    for why, count in sorted(designed.items()):
        print(f"  fallback by design, {why}: {count}")
    fault_count = sum(faults.values())
    share = fault_count / answered if answered else 0.0
    verdict = "within" if share <= FAULT_SHARE_LIMIT else "OVER"
    detail = ", ".join(f"{how} {count}" for how, count in sorted(faults.items())) or "none"
    print(
        f"  fallbacks that are faults: {fault_count} of {answered} ({share:.1%}, {verdict} the"
        f" {FAULT_SHARE_LIMIT:.0%} allowed): {detail}"
    )


if __name__ == "__main__":
    main()
