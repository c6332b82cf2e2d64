"""Backfill benchmark (issue 14): from `apply` of a new view to the view serving full windows.

``--tier nearline`` (default): the example repo's nearline plan without ``user_search_nearline``
runs over N behaviour events (and payments) until idle; then the full plan is applied and the worker
restarted: it keeps every other view's state and replays each partition's retained history into the
new view before it reads on (``pipelines/nearline/backfill.py``). Measured: records replayed, replay
seconds (sum over the partitions, one process), replayed records per second, and the wall time from
the restart to the moment every entity of the new view is in Redis (polled every 0.1 s; the final
count is the one after the worker exits). Then the same figures extrapolated to the example source's
declared rate (``expected_rate_per_s``) and the new view's longest window plus the replay margins:
what a new 24 h view costs at that rate in one process.

``--tier realtime``: the realtime job (a local mini-cluster, parallelism 1, checkpoints every 2 s)
runs rt_all over N behaviour events of 200 users spread over 10 minutes of event time, checkpoints
and is killed; then rt_clicks (rt_all's operator) and rt_items (a new operator) are applied and the
job restarted from its checkpoint: it replays the new views' windows (plus margins) from Kafka before
the checkpoint's offsets and goes on live (``pipelines/realtime/backfill.py``). Measured: the wall time
from the restart to the moment rt_clicks holds a value of the phase's last boundary (polled
every 0.2 s; includes the JVM start), the same for a restart that backfills nothing (the kept views
only), the records replayed; and every user's rt_clicks and rt_all checked against the reference.

The machine is shared: load averages are recorded with the figures.
Usage: python bench/bench_backfill.py [--tier nearline|realtime] [--events N]
Writes bench/results/nearline_backfill.json or bench/results/realtime_backfill.json.
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
    ap.add_argument("--tier", choices=["nearline", "realtime"], default="nearline")
    ap.add_argument("--events", type=int, default=None, help="behaviour events before the view is added")
    args = ap.parse_args()
    if args.tier == "realtime":
        realtime(args.events or 10_000)
    else:
        nearline(args.events or 100_000)


def nearline(events: int) -> None:
    """Measure the nearline worker's backfill (module docstring)."""
    args = argparse.Namespace(events=events)
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


def realtime(events: int) -> None:
    """Measure the realtime job's backfill (module docstring)."""
    import random
    import re
    import uuid

    import numpy as np
    import redis
    from kafka import KafkaAdminClient
    from kafka.admin import NewTopic

    sys.path.insert(0, str(ROOT / "tests/integration/pipelines"))
    from realtime.conftest import (  # the realtime integration tests' helpers
        T0,
        Feed,
        JobProcess,
        Names,
        apply,
        checkpoints,
        event,
        expected_vectors,
        read_store,
    )

    from headwater.pipelines.realtime.testing import ALL_KINDS_VIEW, CLICKS_VIEW, ITEM_VIEW

    load_start = os.getloadavg()
    settings = Settings.from_env()
    tmp = Path(tempfile.mkdtemp(prefix="bench-rt-backfill-"))
    tag = uuid.uuid4().hex[:8]
    names = Names(f"bench.rtbf.{tag}", f"bench.rtbf.{tag}.dlq", f"hwbench{tag}")
    admin = KafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap)
    admin.create_topics([NewTopic(names.topic, 1, 1), NewTopic(names.dlq, 1, 1)])
    plan_a, state_a = apply(tmp, "a", {"rt_all.yaml": ALL_KINDS_VIEW})
    views_b = {"rt_all.yaml": ALL_KINDS_VIEW, "rt_clicks.yaml": CLICKS_VIEW, "rt_items.yaml": ITEM_VIEW}
    plan_b, state_b = apply(tmp, "b", views_b)
    users = [f"u{i}" for i in range(200)]
    rng = random.Random(14)
    span_ms = 600_000
    kinds = ["impression", "impression", "click", "purchase", "dwell"]

    def make(i: int, t_ms: int, user: str) -> dict[str, Any]:
        kind = rng.choice(kinds)
        extra: dict[str, Any] = {"position": rng.randint(1, 9), "category": f"c{rng.randint(0, 4)}"}
        if kind == "purchase":
            extra["price"] = round(rng.uniform(1, 50), 2)
        if kind == "dwell":
            extra = {"dwell_ms": rng.randint(100, 9000)}
        return event(i, user, kind, t_ms, **extra)

    first = [make(i, i * span_ms // events, rng.choice(users)) for i in range(events)]
    end_a = span_ms + 1_000
    first += [make(events + k, span_ms - 500, u) for k, u in enumerate(users)]  # every user near the end
    first.append(event(10**9, "zz", "impression", end_a))
    end_b = end_a + 5_000
    second = [make(2 * events + k, end_a + 1_000 + k * 10, users[k % 50]) for k in range(200)]
    second.append(event(10**9 + 1, "zz", "impression", end_b))
    feed = Feed(settings.kafka_bootstrap, names.topic)
    chk, log = tmp / "checkpoints", tmp / "job.log"
    client = redis.Redis.from_url(settings.redis_url)
    result: dict[str, Any] = {}

    def written(plan: Any, view: str, b_ms: int) -> bool:
        """Whether a value of the phase's last boundary is in Redis: the job has read every record.

        (Not every user: a value that has not changed for twice its window since its write expires.)
        """
        _, res = read_store(settings.redis_url, names.namespace, plan, view, users)
        return bool((res.found & (res.event_time_ms >= b_ms)).any())

    def times(plan: Any, view: str) -> list[float]:
        _, res = read_store(settings.redis_url, names.namespace, plan, view, users)
        t = res.event_time_ms[res.found]
        return [round((int(t.min()) - T0) / 1000, 1), round((int(t.max()) - T0) / 1000, 1)] if len(t) else []

    seen_at: list[dict[str, Any]] = []

    def run(
        plan: Any, state: Path, events_: list[dict[str, Any]], view: str, b_ms: int, extra: tuple[str, ...]
    ) -> float:
        feed.send(*events_)
        started = time.monotonic()
        job = JobProcess(state, names, chk, log, extra=extra)
        try:
            deadline = started + 900
            while not written(plan, view, b_ms):
                assert time.monotonic() < deadline, log.read_text(errors="replace")[-3000:]
                assert job.proc.poll() is None, log.read_text(errors="replace")[-3000:]
                time.sleep(0.2)
            took = time.monotonic() - started
            seen_at.append(
                {"view": view, "boundary_s": (b_ms - T0) / 1000, "event_times_s": times(plan, view)}
            )
            # a checkpoint triggered after the values were seen (see the realtime conftest's Run.phase)
            after = max([n for n, _, _ in checkpoints(chk)] + [0]) + 2
            while not any(n >= after for n, _, _ in checkpoints(chk)):
                time.sleep(0.2)
            time.sleep(3)  # the sink's last chunks (the check reads them before the job is killed)
            return took
        finally:
            job.kill()

    def exact(plan: Any, view: str, sent: list[dict[str, Any]], b_ms: int) -> dict[str, int]:
        """Count the entities whose stored value differs from the reference at ``b_ms``, and those not found.

        Not found: never written, or expired (a value's TTL is twice its window from its write, and a
        value that stops changing early in a slow replay can expire before the check).
        """
        ids = ["i0", "i1", "i2"] if view == "rt_items" else users
        _, res = read_store(settings.redis_url, names.namespace, plan, view, ids)
        unique = list({e["event_id"]: e for e in sent}.values())
        _, want = expected_vectors(plan, view, unique, ids, client, names.namespace, b_ms)
        differ = [
            not np.allclose(g, w, rtol=1e-5, equal_nan=True)
            for g, w, f in zip(res.values, want, res.found, strict=True)
            if f
        ]
        return {"found": int(res.found.sum()), "differing": sum(differ), "not_found": int((~res.found).sum())}

    try:
        # run and exact take absolute event times (epoch ms); event() takes them relative to T0
        first_s = run(plan_a, state_a, first, "rt_all", T0 + end_a, ())
        backfill_s = run(plan_b, state_b, second, "rt_clicks", T0 + end_b, ("--from-latest",))
        sent = first + second
        ok = {v: exact(plan_b, v, sent, T0 + end_b) for v in ("rt_all", "rt_clicks", "rt_items")}
        third = [make(3 * events + k, end_b + 1_000 + k * 10, users[k % 50]) for k in range(200)]
        end_c = end_b + 5_000
        third.append(event(10**9 + 2, "zz", "impression", end_c))
        kept_s = run(plan_b, state_b, third, "rt_clicks", T0 + end_c, ("--from-latest",))
        text = log.read_text(errors="replace")
        replayed = [int(n) for n in re.findall(r"replayed from Kafka \((\d+) records", text)]
        result = {
            "command": f"python bench/bench_backfill.py --tier realtime --events {events}",
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "load_avg_start": [round(x, 1) for x in load_start],
            "load_avg_end": [round(x, 1) for x in os.getloadavg()],
            "cpus": os.cpu_count(),
            "events": len(first),
            "users": len(users),
            "event_time_span_s": span_ms / 1000,
            "new_views": ["rt_clicks", "rt_items"],
            "first_run_s": round(first_s, 1),
            "restart_to_full_values_backfill_s": round(backfill_s, 1),
            "restart_to_values_no_backfill_s": round(kept_s, 1),
            "records_replayed": replayed,
            "users_differing_from_reference": ok,
            "event_times_when_seen": seen_at,
            "note": "wall times include the JVM and mini-cluster start (PyFlink), most of it under load",
        }
        out = ROOT / "bench/results/realtime_backfill.json"
        out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
        print(json.dumps(result, indent=2))
    finally:
        feed.close()
        client.close()
        admin.delete_topics([names.topic, names.dlq])
        admin.close()
        subprocess.run(["rm", "-rf", str(tmp)], check=False)


if __name__ == "__main__":
    main()
