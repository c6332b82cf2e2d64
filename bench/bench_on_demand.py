"""CPU cost of the on-demand features per ranking request: ``features/``'s on-demand view over N candidates.

One command: ``.venv/bin/python bench/bench_on_demand.py [--candidates 500 2000] [--repeats 300]``.
It binds the example registry as the service does, draws random user and item vectors (10 % NaN),
and times :meth:`headwater.ranking.on_demand.OnDemandProgram.compute` (what the fetcher adds to a
request when the ranker was trained on on-demand slots) per request, and the same numbers from the
training-set path per 100k rows. Prints the median and p99 per request and writes
``bench/results/bench_on_demand.json`` with the machine's load average (other processes share it).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import numpy as np

from headwater.ranking.features import registry_from_repo
from headwater.registry.expr_value import size_of

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    """Run the measurement and write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--candidates", type=int, nargs="+", default=[500, 2000])
    parser.add_argument("--repeats", type=int, default=300)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "bench_on_demand.json")
    args = parser.parse_args()
    reg = registry_from_repo(ROOT / "features", "item_popularity_offline.item_ctr_7d")
    program = reg.on_demand
    if program is None:
        raise SystemExit("features/ declares no on-demand view")
    rng = np.random.default_rng(0)
    rows = []
    load_before = os.getloadavg()[0]
    for n in args.candidates:
        user = rng.uniform(0, 5, reg.user.dim).astype(np.float32)
        items = rng.uniform(0, 5, (n, reg.item.dim)).astype(np.float32)
        items[rng.random(items.shape) < 0.1] = np.nan
        program.compute(user, items, 1_767_225_600_000)  # warm-up
        times = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            program.compute(user, items, 1_767_225_600_000)
            times.append((time.perf_counter() - t0) * 1000.0)
        times.sort()
        rows.append({
            "candidates": n,
            "p50_ms": round(statistics.median(times), 4),
            "p99_ms": round(times[int(0.99 * (len(times) - 1))], 4),
            "us_per_candidate": round(1000.0 * statistics.median(times) / n, 4),
        })  # fmt: skip
        print(
            f"{n:>6} candidates: p50 {rows[-1]['p50_ms']:.3f} ms, p99 {rows[-1]['p99_ms']:.3f} ms per request"
        )
    n = 100_000  # the training-set path: one user row per item row
    users = rng.uniform(0, 5, (n, reg.user.dim)).astype(np.float32)
    items = rng.uniform(0, 5, (n, reg.item.dim)).astype(np.float32)
    t0 = time.perf_counter()
    program.compute(users, items, np.full(n, 1_767_225_600_000, dtype=np.int64))
    offline_s = time.perf_counter() - t0
    print(f"training-set path: {n:,} rows in {offline_s:.3f} s")
    result = {
        "features": list(program.names),
        "ops_per_request": sum(size_of(step.ast) for step in program.steps),
        "serving": rows,
        "training_rows_per_s": round(n / offline_s),
        "load_avg_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "cpus": os.cpu_count(),
        "command": "bench/bench_on_demand.py",
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"load average {result['load_avg_1m']}; wrote {args.out}")


if __name__ == "__main__":
    main()
