"""CPU per request of the prediction log (record version 2: each value's view, version and event time).

Usage: .venv/bin/python bench/bench_skew_log.py [--requests 20000] [--candidates 500] [--k 20]
    [--user-views 8] [--item-views 4] [--rate 0.01]

What the service does more per request for the log, measured in process CPU time with synthetic
vectors of the given shape (no Kafka: the sender thread's produce is kafka-python's own cost):

- every request: the per-view item event times the fetch keeps (:func:`~headwater.serving.fetch.view_times`)
  and the sampling draw (:meth:`PredictionLog.sampled`);
- a sampled request (``--rate`` of them): the record (:func:`prediction_record` with the served
  views) and its JSON encoding (on the sender thread, counted here all the same).

The per-request figure at ``--rate`` is set against the service's CPU per ranking request from
bench/results/serve.json (``server_cpu_ms_per_request``, the lowest level: the most conservative);
the target is <= 3%. Writes bench/results/bench_skew_log.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from headwater.pipelines.store import ViewLayout
from headwater.serving.fetch import RequestFeatures, view_times
from headwater.serving.skew import PredictionLog, PredictionLogConfig, prediction_record
from headwater.serving.store import ViewRows

RESULTS = Path(__file__).parent / "results"


def main() -> None:
    """Measure and print the figures; write the JSON."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=20_000)
    ap.add_argument("--candidates", type=int, default=500)
    ap.add_argument("--k", type=int, default=20)
    ap.add_argument("--user-views", type=int, default=8)
    ap.add_argument("--item-views", type=int, default=4)
    ap.add_argument("--rate", type=float, default=PredictionLogConfig().sample_rate)
    args = ap.parse_args()
    rng = np.random.default_rng(1)
    now = 1_767_225_600_000

    def layouts(side: str, n: int) -> tuple[ViewLayout, ...]:
        names = [tuple(f"f{j}_{i}" for i in range(8)) for j in range(n)]
        return tuple(ViewLayout(f"{side}_v{j}", side, names[j], version=f"{j:012x}") for j in range(n))

    user_l, item_l = layouts("user", args.user_views), layouts("item", args.item_views)
    sides = {"user": SimpleNamespace(layouts=user_l), "item": SimpleNamespace(layouts=item_l)}
    registry: Any = SimpleNamespace(**sides, on_demand=None)
    n, k = args.candidates, args.k
    rows = [ViewRows(rng.random((n, 8), dtype=np.float32), rng.random(n) < 0.95,
                     now - rng.integers(0, 60_000, n)) for _ in item_l]  # fmt: skip
    items = rng.random((n, 8 * len(item_l)), dtype=np.float32)
    user = rng.random(8 * len(user_l), dtype=np.float32)
    user_ms = {lay.view: now - 1_000 for lay in user_l}
    candidates = [f"i{j}" for j in range(n)]
    answer: Any = {"items": [{"item_id": candidates[j], "score": float(j)} for j in range(k)],
                   "model_version": "77efc1d0aa8b", "fallback": None}  # fmt: skip
    found = np.ones(n, dtype=bool)
    log = PredictionLog(
        PredictionLogConfig(enabled=True, sample_rate=args.rate), connect=lambda: None, seed=1
    )

    start = time.process_time()
    for _ in range(args.requests):
        times = view_times(rows)
        log.sampled()
    every = (time.process_time() - start) / args.requests
    features = RequestFeatures(user, user_ms, items, found, times.min(axis=1), times, now)
    start = time.process_time()
    size = 0
    for r in range(args.requests // 10):
        record = prediction_record(f"r{r}", now, "u1", answer, candidates, user, items, found, user_ms,
                                   registry, features)  # fmt: skip
        size = len(json.dumps(record).encode())
    sampled = (time.process_time() - start) / (args.requests // 10)
    per_request = every + args.rate * sampled
    serve = json.loads((RESULTS / "serve.json").read_text())
    server_ms = min(level["server_cpu_ms_per_request"] for level in serve["levels"])
    share = per_request * 1000 / server_ms
    out = {
        "benchmark": "skew_log",
        "command": "python bench/bench_skew_log.py "
        + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items()),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "load_avg_1m": os.getloadavg()[0],
        "python": platform.python_version(),
        "every_request_us": every * 1e6,
        "sampled_request_us": sampled * 1e6,
        "record_bytes": size,
        "rate": args.rate,
        "per_request_us": per_request * 1e6,
        "server_cpu_ms_per_request": server_ms,
        "share_of_request_cpu": share,
        "target": 0.03,
        "ok": share <= 0.03,
    }
    print(f"prediction log: {every * 1e6:.1f} us every request (per-view item times, sampling draw),"
          f" {sampled * 1e6:.0f} us per logged record ({size} bytes of JSON); at rate {args.rate:g}:"
          f" {per_request * 1e6:.1f} us per request = {share:.2%} of the service's {server_ms:.2f} ms"
          f" (bench/results/serve.json) vs 3%: {'ok' if share <= 0.03 else 'OVER'}")  # fmt: skip
    (RESULTS / "bench_skew_log.json").write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
