"""The demo's feedback loop: rank for a user, click the top item, watch the next ranking change.

The click goes through the ranking service to Kafka, the realtime tier counts it into the user's
session features, and the next ranking reads them: this prints how long that took.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from headwater.cli.client import post

RUN_DIR = Path(__file__).resolve().parents[1] / ".headwater/demo"
VIEW = "user_session_realtime"


def show(title: str, answer: dict[str, Any], top: int = 5) -> None:
    """Print the top of a ranking answer."""
    items = ", ".join(f"{i['item_id']} {i['score']:.3f}" for i in answer["items"][:top])
    fallback = answer.get("fallback") or "none"
    why = f" ({answer['fallback_reason']})" if answer.get("fallback_reason") else ""
    print(f"{title}: model {answer.get('model_version')} fallback {fallback}{why}: {items}")


def main() -> None:
    """Rank, click, poll until the ranking reflects the click; print the loop's latency."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", default="http://127.0.0.1:8080")
    parser.add_argument("--user", default="u000042")
    parser.add_argument("--wait", type=float, default=30.0, help="give up after this many seconds")
    args = parser.parse_args()
    (RUN_DIR / "loop_user").write_text(args.user)
    body = {"user_id": args.user, "candidates": [f"i{n:06d}" for n in range(300)], "k": 10}
    post(args.url, "/v1/rank", {**body, "log_impressions": False})  # warm-up: the model's first call is slow
    before = post(args.url, "/v1/rank", body)
    show(f"ranking for {args.user}", before)
    top = before["items"][0]["item_id"]
    click = post(args.url, "/v1/feedback", {"user_id": args.user, "item_id": top, "event_type": "click",
                                             "request_id": before["request_id"], "position": 1})  # fmt: skip
    clicked_ms = click["event_time_ms"]
    print(f"clicked {top} at position 1 (event {click['event_id']})")
    deadline = time.monotonic() + args.wait
    while time.monotonic() < deadline:
        time.sleep(0.2)
        after = post(args.url, "/v1/rank", {**body, "log_impressions": False})
        seen = after.get("user_feature_event_ms", {}).get(VIEW, 0)
        if seen > clicked_ms:  # the realtime value now covers a boundary after the click
            elapsed = time.time() - clicked_ms / 1000
            show(f"{elapsed:.1f} s after the click, {VIEW} includes it; new ranking", after)
            return
    print(f"the ranking did not reflect the click within {args.wait:.0f} s (is the realtime tier running?)")


if __name__ == "__main__":
    main()
