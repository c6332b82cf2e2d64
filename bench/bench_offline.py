"""Offline tier benchmark: landing events/s, offline views events/s, training set rows, materialize rows/s.

Usage: .venv/bin/python bench/bench_offline.py [--events N] [--days D] [--labels L]
Needs Kafka and Redis (make services-up). Writes bench/results/offline.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import tempfile
import time
import uuid
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pyarrow as pa
from kafka import KafkaProducer

ROOT = Path(__file__).resolve().parents[1]


def produce(bootstrap: str, topic: str, events: int, days: int) -> float:
    from headwater.pipelines.events.codec import EventCodec
    from headwater.pipelines.events.generator import EventGenerator, GeneratorConfig

    rate = events / (days * 86_400)
    gen = EventGenerator(replace(GeneratorConfig(), rate=rate, session_gap_s=max(1.0, 20 / rate)))
    codec = EventCodec()
    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=20, batch_size=512 * 1024)
    started = time.monotonic()
    for em in gen.take(events):
        if em.event is not None:
            producer.send(
                topic, codec.encode(em.event), key=em.event["user_id"].encode(), headers=codec.headers()
            )
        elif em.malformed is not None:
            producer.send(topic, em.malformed.value, headers=list(em.malformed.headers))
    producer.flush()
    producer.close()
    return time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--days", type=int, default=3)
    parser.add_argument("--materialize-rows", type=int, default=200_000)
    args = parser.parse_args()

    from headwater.pipelines.offline.job import read_bronze, run_view
    from headwater.pipelines.offline.lake import bronze_path, day_of_ms, days
    from headwater.pipelines.offline.landing import Lander, LandingConfig
    from headwater.pipelines.offline.materialize import write_table
    from headwater.pipelines.offline.session import offline_session
    from headwater.pipelines.offline.training import build_training_set, labels_from_bronze
    from headwater.pipelines.settings import Settings
    from headwater.pipelines.store import OnlineStore
    from headwater.pipelines.topics import ensure_topics
    from headwater.pipelines.windows import RedisDictionary
    from headwater.registry.plans import read_plan

    work = Path(tempfile.mkdtemp(prefix="hw-bench-offline-"))
    subprocess.run([str(ROOT / ".venv/bin/headwater"), "apply", str(ROOT / "features"), "--state-dir",
                    str(work / "state"), "--no-feast"], check=True, capture_output=True)  # fmt: skip
    plan = read_plan(work / "state", "offline")
    settings = Settings.from_env()
    topic = f"bench-offline-{uuid.uuid4().hex[:6]}"
    ensure_topics(settings, {topic: {}, f"{topic}.dlq": {}}, settings.partitions)
    results: dict[str, object] = {}
    produce_s = produce(settings.kafka_bootstrap, topic, args.events, args.days)
    results["produce"] = {"events": args.events, "seconds": round(produce_s, 2)}
    print(f"produced {args.events} events in {produce_s:.1f} s")

    spark = offline_session("bench-offline")
    lake = work / "lake"
    config = LandingConfig(settings.kafka_bootstrap, topic, f"{topic}.dlq", bronze_path(lake))
    stats = Lander(spark, config).run(progress=lambda s: print(f"  landing batch {s.batches}: {s.records}"))
    results["landing"] = {"records": stats.records, "landed": stats.landed, "malformed": stats.malformed,
                          "late": stats.late, "seconds": round(stats.seconds, 2),
                          "events_per_s": round(stats.records_per_s)}  # fmt: skip
    print(f"landing: {stats.records} records in {stats.seconds:.1f} s = {stats.records_per_s:,.0f}/s")

    bronze = read_bronze(spark, lake)
    span = bronze.selectExpr("min(event_time) lo", "max(event_time) hi").collect()[0]
    all_days = days(day_of_ms(span["lo"]), day_of_ms(span["hi"]))
    started = time.monotonic()
    per_view = {}
    for view in plan.views:
        t = time.monotonic()
        runs = run_view(spark, bronze, view, lake, all_days, chunk_days=len(all_days))
        per_view[view.name] = {"rows": sum(r.rows for r in runs), "seconds": round(time.monotonic() - t, 2)}
        print(f"  {view.name}: {per_view[view.name]}")
    views_s = time.monotonic() - started
    results["offline_views"] = {"views": per_view, "days": len(all_days), "events": stats.landed,
                                "seconds": round(views_s, 2),
                                "events_per_s": round(stats.landed / views_s)}  # fmt: skip
    print(f"offline views: {len(plan.views)} views x {len(all_days)} days in {views_s:.1f} s")

    store = OnlineStore.from_url(settings.redis_url, namespace=f"hwbench-{uuid.uuid4().hex[:6]}")
    ids = RedisDictionary(store.client, store.namespace).ids
    t = time.monotonic()
    labels = labels_from_bronze(bronze).where(
        f"event_time >= {span['lo'] // 86_400_000 * 86_400_000 + 86_400_000}"
    )
    ts = build_training_set(spark, labels, plan.views, lake, work / "train.parquet", plan.registry_hash, ids)
    ts_s = time.monotonic() - t
    results["training_set"] = {"labels": ts.rows, "positives": ts.positives, "columns": len(ts.columns),
                               "seconds": round(ts_s, 2), "rows_per_s": round(ts.rows / ts_s)}  # fmt: skip
    print(f"training set: {ts.rows} labels in {ts_s:.1f} s")

    view = next(v for v in plan.views if v.name == "user_purchase_offline")
    n = args.materialize_rows
    rng = np.random.default_rng(7)
    table = pa.table({"__entity": [f"u{i}" for i in range(n)],
                      "event_time_ms": np.full(n, span["hi"] // 86_400_000 * 86_400_000, dtype=np.int64),
                      **{f.name: rng.random(n) * 10 for f in view.features}})  # fmt: skip
    t = time.monotonic()
    written = write_table(
        store, view, plan.registry_hash, table, RedisDictionary(store.client, store.namespace)
    )
    mat_s = time.monotonic() - t
    results["materialize"] = {"view": view.name, "rows": n, "written": written, "seconds": round(mat_s, 2),
                              "rows_per_s": round(n / mat_s)}  # fmt: skip
    print(f"materialize: {n} rows in {mat_s:.2f} s = {n / mat_s:,.0f} rows/s")
    for key in store.client.scan_iter(match=f"{store.namespace}:*", count=10_000):
        store.client.unlink(key)

    out = {"benchmark": "offline", "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
           "machine": {"cpus": 2, "python": platform.python_version(), "load_avg_1m": _load()},
           "args": vars(args), **results}  # fmt: skip
    (ROOT / "bench" / "results" / "offline.json").write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))


def _load() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


if __name__ == "__main__":
    main()
