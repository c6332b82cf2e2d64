"""Nearline tier benchmark: events/s with 1 and 2 processes, changelog restore time, state size.

Produces N generator events (users=20k) to a fresh 4-partition topic, runs `run_nearline` as a
subprocess until the consumer group has committed every offset, and reads the workers' stats.
Then deletes the local stores and times the restore from the changelog. Writes
bench/results/nearline.json. Usage: python bench/bench_nearline.py [N]
"""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

from headwater.pipelines.settings import Settings

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location(
    "nl_harness", ROOT / "tests/integration/pipelines/nearline/harness.py"
)
assert _spec is not None
assert _spec.loader is not None
h = importlib.util.module_from_spec(_spec)
sys.modules["nl_harness"] = h
_spec.loader.exec_module(h)


def run(n: int, processes: int) -> dict[str, float]:
    env = h.Env(settings=Settings.from_env(), tmp=Path(tempfile.mkdtemp(prefix="bench-nl-")))
    env.create()
    try:
        h.produce(env.settings, n, seed=5, rate=2000.0, users=20_000)
        started = time.monotonic()
        proc = env.start(idle_exit_s=3, max_poll=20_000, processes=processes)
        while env.committed() < n:
            time.sleep(0.2)
        took = time.monotonic() - started
        proc.wait(timeout=120)
        stats = [json.loads(p.read_text()) for p in env.store_dir.glob("stats-*.json")]
        restore = sum(s["counters"]["restore_s"] for s in stats)
        state = sum(sum(s["state_bytes"].values()) for s in stats)
        keys = sum(sum(t["panes"].values()) for s in stats for t in s["tasks"])
        out = {
            "events": n,
            "processes": processes,
            "seconds_incl_startup": round(took, 2),
            "events_per_s": round(n / took),
            "events_per_s_per_process": round(n / took / processes),
            "state_bytes": state,
            "pane_records": keys,
            "initial_open_s": round(restore, 2),
        }
        if processes == 1:
            shutil.rmtree(env.store_dir)
            t0 = time.monotonic()
            proc = env.start(idle_exit_s=1, processes=1)
            proc.wait(timeout=300)
            logs = "".join(p.read_text(errors="replace") for p in env.tmp.glob("worker-*.log"))
            secs = [float(x) for x in re.findall(r"changelog records in ([0-9.]+) s", logs)[-4:]]
            recs = [int(x) for x in re.findall(r"\+ (\d+) changelog records", logs)[-4:]]
            out.update(
                {
                    "restore_s": round(sum(secs), 2),
                    "restore_changelog_records": sum(recs),
                    "restore_wall_incl_startup_s": round(time.monotonic() - t0, 2),
                }
            )
        return out
    finally:
        env.cleanup()
        shutil.rmtree(env.tmp, ignore_errors=True)


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
    results = {"one": run(n, 1), "two": run(n, 2)}
    print(json.dumps(results, indent=2))
    out = ROOT / "bench/results/nearline.json"
    out.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
