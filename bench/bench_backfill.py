"""Nearline backfill benchmark (issue 14): from `apply` of a new view to the view serving full windows.

The example repo's nearline plan without ``user_search_nearline`` runs over N behaviour events (and
payments) until idle; then the full plan is applied and the worker restarted: it keeps every other
view's state and replays each partition's retained history into the new view before it reads on
(``pipelines/nearline/backfill.py``). Measured: records replayed, replay seconds (sum over the
partitions, one process), replayed records per second, and the wall time from the restart to the
moment every entity of the new view is in Redis (polled every 0.1 s; the final count is the one
after the worker exits). Then the same figures extrapolated to the example source's declared rate
(``expected_rate_per_s``) and the new view's longest window plus the replay margins: what a new
24 h view costs at that rate in one process.

The machine is shared: load averages are recorded with the figures.
Usage: python bench/bench_backfill.py [--events N]
Writes bench/results/nearline_backfill.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from headwater.pipelines.settings import Settings
from headwater.pipelines.store import OnlineStore

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests/integration/pipelines/nearline"))
import harness as h  # noqa: E402  (the integration tests' helpers: plan, topics, producer)

NEW_VIEW = "user_search_nearline"


def _keys(store: OnlineStore, namespace: str) -> int:
    return sum(1 for _ in store.client.scan_iter(match=f"{namespace}:{{{NEW_VIEW}}}:*", count=5000))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=100_000, help="behaviour events before the view is added")
    args = ap.parse_args()
    load_start = os.getloadavg()
    tmp = Path(tempfile.mkdtemp(prefix="bench-backfill-"))
    env = h.Env(settings=Settings.from_env(), tmp=tmp)
    plan = env.create_example()
    try:
        without = plan.model_copy(update={"views": [v for v in plan.views if v.name != NEW_VIEW]})
        h._write(tmp, without)
        h.produce(env.settings, args.events, seed=61, users=20_000, rate=200.0)
        h.produce_payments(env.settings, env.topics["payments"], args.events // 10, seed=62)
        t0 = time.monotonic()
        assert env.start(idle_exit_s=5, max_poll=20_000).wait(timeout=1800) == 0
        first_s = time.monotonic() - t0
        h._write(tmp, plan)  # `headwater apply` of the plan with the new view
        store = OnlineStore.from_url(env.settings.redis_url, namespace=env.namespace)
        samples: list[tuple[float, int]] = []
        done = threading.Event()

        def poll() -> None:
            while not done.is_set():
                samples.append((time.monotonic(), _keys(store, env.namespace)))
                time.sleep(0.1)

        poller = threading.Thread(target=poll, daemon=True)
        started = time.monotonic()
        proc = env.start(idle_exit_s=5, max_poll=20_000)
        poller.start()
        assert proc.wait(timeout=1800) == 0
        done.set()
        poller.join()
        final = _keys(store, env.namespace)
        store.close()
        serving_s = next(t for t, n in [*samples, (time.monotonic(), final)] if n >= final) - started
        stats = json.loads((env.store_dir / "stats-0.json").read_text())
        c = stats["counters"]
        reports = [t["restored"]["backfill"] for t in stats["tasks"] if t["restored"]["backfill"]]
        replayed = int(c.get("backfill_records", 0))
        replay_s = float(c.get("backfill_s", 0.0))
        rate = replayed / replay_s if replay_s else 0.0
        spec = next(v for v in plan.views if v.name == NEW_VIEW)
        source = next(s for s in plan.sources if s.name == spec.source)
        longest_s = max(f.window_s + f.slide_s for f in spec.features)
        margins_s = (
            source.max_out_of_orderness_ms + source.allowed_lateness_ms + source.max_future_ms
        ) / 1000
        at_rate = source.expected_rate_per_s
        history = at_rate * (longest_s + margins_s)
        result: dict[str, Any] = {
            "command": f"python bench/bench_backfill.py --events {args.events}",
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "load_avg_start": [round(x, 1) for x in load_start],
            "load_avg_end": [round(x, 1) for x in os.getloadavg()],
            "cpus": os.cpu_count(),
            "new_view": NEW_VIEW,
            "events": args.events,
            "first_run_s": round(first_s, 1),
            "backfill_records": replayed,
            "backfill_s": round(replay_s, 2),
            "backfill_records_per_s": round(rate),
            "apply_to_serving_s": round(serving_s, 2),
            "new_view_keys": final,
            "partitions": [
                {k: r[k] for k in ("start_offset", "end_offset", "records", "seconds", "complete")}
                for r in reports
            ],
            "extrapolated": {
                "source_rate_per_s": at_rate,
                "history_s": longest_s + margins_s,
                "history_records": round(history),
                "backfill_s_one_process": round(history / rate) if rate else None,
            },
        }
        out = ROOT / "bench/results/nearline_backfill.json"
        out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
        print(json.dumps(result, indent=2))
    finally:
        env.cleanup()
        subprocess.run(["rm", "-rf", str(tmp)], check=False)


if __name__ == "__main__":
    main()
