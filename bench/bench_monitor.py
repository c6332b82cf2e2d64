"""CPU of ``headwater monitor``'s core: statistics, PSI and KS of every example column.

Usage: .venv/bin/python bench/bench_monitor.py [--served 100000] [--baseline 200000]

Synthetic columns, one per user and item slot of the example feature repo (features/), Poisson(3)
counts (``user.ctr_5m`` uniform): ``--served`` vectors spread over two UTC days (half each: the
monitored day and the day before) and a ``--baseline`` training set. Measured in process CPU time:
reading both Parquet files (written to a temporary folder first, not counted) and
:func:`headwater.ranking.monitor.monitor` (every column's statistics on the day, the day before and
the training set, and both drifts). Writes bench/results/bench_monitor.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from headwater.ranking.monitor import baseline_columns, monitor, served_from_table, watched_columns
from headwater.registry.validate import check_repo

ROOT = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).parent / "results"
DAY_MS = 86_400_000
DEC_4 = 1_796_342_400_000  # 2026-12-04T00:00:00Z


def main() -> None:
    """Write the two files, time the read and the monitor, print and save the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--served", type=int, default=100_000, help="Served vectors (two days).")
    parser.add_argument("--baseline", type=int, default=200_000, help="Training-set rows.")
    args = parser.parse_args()
    watched = watched_columns(check_repo(ROOT / "features").views)
    rng = np.random.default_rng(0)
    n, m = args.served, args.baseline
    at = np.concatenate(
        [DEC_4 - DAY_MS + rng.integers(0, DAY_MS, n // 2), DEC_4 + rng.integers(0, DAY_MS, n - n // 2)]
    )
    served: dict[str, np.ndarray] = {"at_ms": at}
    base: dict[str, np.ndarray] = {}
    for column in sorted(watched):
        served[column] = rng.poisson(3, n).astype(np.float64)
        base[column] = rng.poisson(3, m).astype(np.float64)
    served["user.ctr_5m"], base["user.ctr_5m"] = rng.random(n), rng.random(m)
    with tempfile.TemporaryDirectory(prefix="hw-bench-monitor-") as tmp:
        pq.write_table(pa.table(served), Path(tmp) / "served.parquet")
        pq.write_table(pa.table(base), Path(tmp) / "base.parquet")
        t0 = time.process_time()
        values = served_from_table(pq.read_table(Path(tmp) / "served.parquet"), "served")
        baseline = baseline_columns(pq.read_table(Path(tmp) / "base.parquet"), "base")
        t1 = time.process_time()
        report = monitor(values, baseline, watched)
        t2 = time.process_time()
    result = {
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs",
        "load_avg_1m": os.getloadavg()[0],
        "columns": len(report.columns),
        "served_vectors": n,
        "baseline_rows": m,
        "read_cpu_s": round(t1 - t0, 3),
        "monitor_cpu_s": round(t2 - t1, 3),
        "monitor_cpu_ms_per_column": round((t2 - t1) * 1000 / max(len(report.columns), 1), 2),
        "summary": report.summary_line(),
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "bench_monitor.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
