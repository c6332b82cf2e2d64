"""The demo's experiment traffic: many users rank through the service, some click, so the arms have figures.

The generated events (`headwater events produce`) carry no arm: only answers of the service do. Each
of ``--users`` users (the generator's ids, ``u000000``...) ranks ``--candidates`` items once, and
clicks the top item with probability ``--click-rate`` (posted as feedback: the impression and the
click carry the user's arm). The service logs a sample of these answers for `headwater skew`. The
answers are counted per arm and how they were made: the model, or a fallback with its reason
(``fallback_reason``: ``experiment`` for an arm that starts below the DCN, ``missing_user_features``
for a cold user, ``deadline``, ``store_error``, ...), so a fallback never passes for a model answer.
"""

from __future__ import annotations

import argparse
import random

import click

from headwater.cli.client import post


def how_answered(answer: dict[str, object]) -> str:
    """``model``, or the fallback and why (``linear: experiment``, ``popularity: missing_user_features``)."""
    fallback = answer.get("fallback")
    if not fallback:
        return "model"
    return f"{fallback}: {answer.get('fallback_reason') or 'no reason given'}"


def main() -> None:
    """Rank for each user, click some top items; print what was sent and how the answers were made."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", default="http://127.0.0.1:8080")
    parser.add_argument("--users", type=int, default=300)
    parser.add_argument("--candidates", type=int, default=100)
    parser.add_argument("--click-rate", type=float, default=0.3)
    parser.add_argument("--seed", type=int, default=20)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    arms: dict[str, int] = {}
    clicks = errors = 0
    for n in range(args.users):
        user = f"u{n:06d}"
        first = rng.randrange(0, 1000)
        body = {"user_id": user, "candidates": [f"i{first + c:06d}" for c in range(args.candidates)], "k": 10}
        try:
            answer = post(args.url, "/v1/rank", body)
            arm = f"{answer.get('arm')} {how_answered(answer)}"
            arms[arm] = arms.get(arm, 0) + 1
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
    print(f"experiment traffic: {args.users} users ranked, {clicks} clicked, {errors} failed; answers:")
    for name, count in sorted(arms.items()):  # every fallback with its reason, counted
        print(f"  {name:<48} {count}")


if __name__ == "__main__":
    main()
