"""The demo's funnel call: POST /v1/recommend for one user, printed with each stage's time and count.

Run twice: the second answer leaves out the first one's items (the seen filter), except pins.
"""

from __future__ import annotations

import argparse
from typing import Any

from headwater.cli.client import post


def show(answer: dict[str, Any]) -> None:
    """Print the items, then one line of stages: name, ms, candidates passed on, fallback if any."""
    print("recommend: " + ", ".join(i["item_id"] for i in answer["items"]))
    stages = []
    for stage in answer["stages"]:
        text = f"{stage['stage']} {stage['ms']:.1f} ms -> {stage['candidates']}"
        stages.append(text + (f" ({stage['fallback']})" if stage.get("fallback") else ""))
    print(f"  {answer['latency_ms']:.1f} ms: " + "; ".join(stages))


def main() -> None:
    """Ask the funnel twice for one user's top k."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", default="http://127.0.0.1:8080")
    parser.add_argument("--user", required=True)
    parser.add_argument("--k", type=int, default=10)
    args = parser.parse_args()
    for _ in range(2):
        show(post(args.url, "/v1/recommend", {"user_id": args.user, "k": args.k}))


if __name__ == "__main__":
    main()
