"""Offline tier benchmark: landing events/s, offline views events/s, training set rows, materialize rows/s.

Usage: .venv/bin/python -u bench/bench_offline.py [--events N] [--days D] [--materialize-rows R]
       .venv/bin/python -u bench/bench_offline.py --materialize-only   (rerun only that step)
Needs Kafka and Redis (make services-up). Writes bench/results/offline.json and prints a table.
The training set's labels are the landed click/impression events after the first day (their count
scales with --events; the issue's 1M labels need about --events 2000000). Each step records the
1-minute load average at its end: on a shared 2-core machine the figures scale with it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
from kafka import KafkaProducer

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from headwater.pipelines.settings import Settings
    from headwater.registry.plans import TierPlan

ROOT = Path(__file__).resolve().parents[1]
RESULT = ROOT / "bench" / "results" / "offline.json"


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
    parser.add_argument("--materialize-only", action="store_true",
                        help="Rerun only materialize; keep the other figures of offline.json.")  # fmt: skip
    args = parser.parse_args()

    from headwater.pipelines.settings import Settings
    from headwater.pipelines.topics import ensure_topics
    from headwater.registry.plans import read_plan

    work = Path(tempfile.mkdtemp(prefix="hw-bench-offline-"))
    subprocess.run([str(ROOT / ".venv/bin/headwater"), "apply", str(ROOT / "features"), "--state-dir",
                    str(work / "state"), "--no-feast"], check=True, capture_output=True)  # fmt: skip
    plan = read_plan(work / "state", "offline")
    settings = Settings.from_env()
    if args.materialize_only:
        previous = json.loads(RESULT.read_text())
        results = {k: v for k, v in previous.items() if isinstance(v, dict) and k not in ("machine", "args")}
        results["materialize"] = bench_materialize(plan, settings, args.materialize_rows, 1_767_225_600_000)
        results["materialize"]["rerun"] = "bench/bench_offline.py --materialize-only"
        _write(previous["args"], results, previous["command"])
        return
    topic = f"bench-offline-{uuid.uuid4().hex[:6]}"
    ensure_topics(settings, {topic: {}, f"{topic}.dlq": {}}, settings.partitions)
    try:
        results, hi_ms = bench_pipeline(args, plan, settings, topic, work)
        results["materialize"] = bench_materialize(plan, settings, args.materialize_rows, hi_ms)
        _write(args, results)
    finally:
        for name in (topic, f"{topic}.dlq"):
            _delete_topic(settings.kafka_bootstrap, name)
        shutil.rmtree(work, ignore_errors=True)


def bench_pipeline(
    args: argparse.Namespace, plan: TierPlan, settings: Settings, topic: str, work: Path
) -> tuple[dict[str, object], int]:
    """Produce, land, compute every offline view, build a training set; return figures and max event ms."""
    from headwater.pipelines.offline.job import read_bronze, run_view
    from headwater.pipelines.offline.lake import bronze_path, day_of_ms, days
    from headwater.pipelines.offline.landing import Lander, LandingConfig
    from headwater.pipelines.offline.session import offline_session

    results: dict[str, object] = {}
    produce_s = produce(settings.kafka_bootstrap, topic, args.events, args.days)
    results["produce"] = {"events": args.events, "seconds": round(produce_s, 2), "load_avg_1m": _load()}
    print(f"produced {args.events} events in {produce_s:.1f} s")

    spark = offline_session("bench-offline")
    lake = work / "lake"
    config = LandingConfig(settings.kafka_bootstrap, topic, f"{topic}.dlq", bronze_path(lake))
    stats = Lander(spark, config).run(progress=lambda s: print(f"  landing batch {s.batches}: {s.records}"))
    results["landing"] = {"records": stats.records, "landed": stats.landed, "malformed": stats.malformed,
                          "late": stats.late, "seconds": round(stats.seconds, 2),
                          "events_per_s": round(stats.records_per_s), "load_avg_1m": _load()}  # fmt: skip
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
                                "seconds": round(views_s, 2), "events_per_s": round(stats.landed / views_s),
                                "load_avg_1m": _load()}  # fmt: skip
    print(f"offline views: {len(plan.views)} views x {len(all_days)} days in {views_s:.1f} s")
    results["training_set"] = bench_training_set(spark, bronze, plan, settings, span["lo"], work)
    spark.stop()
    return results, int(span["hi"])


def bench_training_set(
    spark: SparkSession, bronze: DataFrame, plan: TierPlan, settings: Settings, lo_ms: int, work: Path
) -> dict[str, object]:
    """Point-in-time training set for the landed impressions/clicks after the first day."""
    from headwater.pipelines.offline.training import build_training_set, labels_from_bronze
    from headwater.pipelines.store import OnlineStore
    from headwater.pipelines.windows import RedisDictionary

    store = OnlineStore.from_url(settings.redis_url, namespace=f"hwbench-{uuid.uuid4().hex[:6]}")
    ids = RedisDictionary(store.client, store.namespace).ids
    lake = work / "lake"
    t = time.monotonic()
    labels = labels_from_bronze(bronze).where(
        f"event_time >= {lo_ms // 86_400_000 * 86_400_000 + 86_400_000}"
    )
    ts = build_training_set(spark, labels, plan.views, lake, work / "train.parquet", plan.registry_hash, ids)
    ts_s = time.monotonic() - t
    print(f"training set: {ts.rows} labels in {ts_s:.1f} s")
    for key in store.client.scan_iter(match=f"{store.namespace}:*", count=10_000):
        store.client.unlink(key)
    store.close()
    return {"labels": ts.rows, "positives": ts.positives, "columns": len(ts.columns),
            "seconds": round(ts_s, 2), "rows_per_s": round(ts.rows / ts_s), "load_avg_1m": _load(),
            "note": "labels: landed impressions/clicks after the first day; scale with --events"}  # fmt: skip


def bench_materialize(plan: TierPlan, settings: Settings, n: int, hi_ms: int) -> dict[str, object]:
    """Pack and write ``n`` generated rows of user_purchase_offline with the shared writer."""
    from headwater.pipelines.offline.materialize import write_table
    from headwater.pipelines.store import OnlineStore
    from headwater.pipelines.windows import RedisDictionary

    store = OnlineStore.from_url(settings.redis_url, namespace=f"hwbench-{uuid.uuid4().hex[:6]}")
    view = next(v for v in plan.views if v.name == "user_purchase_offline")
    rng = np.random.default_rng(7)
    table = pa.table({"__entity": [f"u{i}" for i in range(n)],
                      "event_time_ms": np.full(n, hi_ms // 86_400_000 * 86_400_000, dtype=np.int64),
                      **{f.name: rng.random(n) * 10 for f in view.features}})  # fmt: skip
    t = time.monotonic()
    written = write_table(
        store, view, plan.registry_hash, table, RedisDictionary(store.client, store.namespace)
    )
    mat_s = time.monotonic() - t
    print(f"materialize: {n} rows in {mat_s:.2f} s = {n / mat_s:,.0f} rows/s")
    for key in store.client.scan_iter(match=f"{store.namespace}:*", count=10_000):
        store.client.unlink(key)
    store.close()
    return {"view": view.name, "rows": n, "written": written, "seconds": round(mat_s, 2),
            "rows_per_s": round(n / mat_s), "target_rows_per_s": 100_000,
            "load_avg_1m": _load()}  # fmt: skip


def _write(args: argparse.Namespace | dict[str, object], results: dict[str, Any], command: str = "") -> None:
    out = {"benchmark": "offline", "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
           "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                       "load_avg_1m": _load()},
           "command": command or " ".join(["bench/bench_offline.py", *sys.argv[1:]]),
           "args": args if isinstance(args, dict) else vars(args),
           **results}  # fmt: skip
    RESULT.parent.mkdir(parents=True, exist_ok=True)
    RESULT.write_text(json.dumps(out, indent=2) + "\n")
    print_table(out)


def print_table(out: dict[str, Any]) -> None:
    """Print the figures of a result file as a table."""
    steps = [("landing", "landing", "records", "records", "events_per_s", "ev/s"),
             ("offline_views", "offline views", "events", "events", "events_per_s", "ev/s"),
             ("training_set", "training set", "labels", "labels", "rows_per_s", "rows/s"),
             ("materialize", "materialize", "rows", "rows", "rows_per_s", "rows/s")]  # fmt: skip
    print(f"{'step':<15}{'size':>18}{'time':>11}{'rate':>18}{'load 1m':>9}")
    for key, label, size_key, unit, rate_key, rate_unit in steps:
        x = out.get(key)
        if isinstance(x, dict):
            size, rate = f"{x[size_key]:,} {unit}", f"{x[rate_key]:,} {rate_unit}"
            print(f"{label:<15}{size:>18}{x['seconds']:>9} s{rate:>18}{x.get('load_avg_1m', ''):>9}")


def _delete_topic(bootstrap: str, name: str) -> None:
    from kafka import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.delete_topics([name])
    finally:
        admin.close()


def _load() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


if __name__ == "__main__":
    main()
