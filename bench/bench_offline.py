"""Offline tier benchmark: produce, landing, offline views, labels, training set, materialize.

Usage: .venv/bin/python -u bench/bench_offline.py [--events N] [--days D] [--producers P]
           [--labels L] [--batch B] [--materialize-rows R]
       .venv/bin/python -u bench/bench_offline.py --quick            (200k events, 100k labels)
       .venv/bin/python -u bench/bench_offline.py --events 10000000 --labels 1000000   (the issue's size)
       .venv/bin/python -u bench/bench_offline.py --materialize-only (rerun only that step)
       .venv/bin/python -u bench/bench_offline.py --decode-only 200000 [--baseline DIR]
           (landing's decode step per source; DIR holds ``headwater/`` of another build, e.g. links to
           an older checkout's pipelines/ and registry/: its behaviour-source decode is timed alternately)
Needs Kafka and Redis (make services-up). Writes bench/results/offline.json and prints a table;
``--decode-only`` needs neither and writes bench/results/offline_decode.json.

Stages, each timed on its own and stamped with the 1-minute load average at its end (on a shared
2-core machine the figures scale with it):
- produce: P processes generate and encode one time slice each, sent in time order (not a tier figure);
- landing: ``Lander`` from Kafka into the behaviour source's bronze Delta table (events/s = Kafka
  records handled per second);
- offline views: every offline view of ``features/`` over the behaviour source, over every landed day
  (events/s = landed events over the total time of all views);
- labels: ``derive_labels`` over bronze, written to Parquet;
- training set: point-in-time join of the first L labels after the first day (rows/s);
- materialize: pack and write R rows with the shared writer (rows/s).
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
from collections.abc import Callable
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
    from headwater.registry.plans import PlanSource, TierPlan

ROOT = Path(__file__).resolve().parents[1]
RESULT = ROOT / "bench" / "results" / "offline.json"
DECODE_RESULT = ROOT / "bench" / "results" / "offline_decode.json"
START_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z
QUICK = {"events": 200_000, "days": 2, "labels": 100_000, "materialize_rows": 100_000}


def produce_slice(
    bootstrap: str, topic: str, events: int, days: float, start_ms: int, turn: Any, done: Any
) -> None:
    """Generate and encode one time slice, then send it once the previous slice is sent (one process).

    Slices are sent in time order so that each partition stays in event-time order: slices sent at
    the same time would interleave days and make the earlier one look late to every tier.
    """
    from headwater.pipelines.events.codec import EventCodec
    from headwater.pipelines.events.generator import EventGenerator, GeneratorConfig

    rate = events / (days * 86_400)
    gen = EventGenerator(replace(GeneratorConfig(), rate=rate, session_gap_s=max(1.0, 20 / rate),
                                 start_ms=start_ms))  # fmt: skip
    codec = EventCodec()
    records: list[tuple[bytes | None, bytes | None, Any]] = []
    for _ in range(events):
        em = next(gen)
        if em.event is not None:
            records.append((codec.encode(em.event), em.event["user_id"].encode(), None))
        elif em.malformed is not None:
            records.append((em.malformed.value, None, list(em.malformed.headers)))
    if turn is not None and not turn.wait(timeout=7_200):
        msg = "the previous slice was not sent within 2 h (its process failed?)"
        raise RuntimeError(msg)
    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=50, batch_size=1024 * 1024)
    for value, key, headers in records:
        producer.send(topic, value, key=key, headers=headers if headers is not None else codec.headers())
    producer.flush()
    producer.close()
    done.set()


def produce(bootstrap: str, topic: str, events: int, days: int, processes: int) -> float:
    """Produce ``events`` over ``days`` of event time: ``processes`` slices generated in parallel."""
    import multiprocessing

    ctx = multiprocessing.get_context("fork")  # before Spark starts: nothing to inherit but Python
    span_ms = days * 86_400_000 // processes
    sizes = [events // processes + (1 if i < events % processes else 0) for i in range(processes)]
    dones = [ctx.Event() for _ in range(processes)]
    started = time.monotonic()
    workers = [ctx.Process(target=produce_slice, args=(bootstrap, topic, n, days / processes,
                                                       START_MS + i * span_ms, dones[i - 1] if i else None,
                                                       dones[i]))
               for i, n in enumerate(sizes)]  # fmt: skip
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    failed = [w.exitcode for w in workers if w.exitcode != 0]
    if failed:
        msg = f"producer process(es) failed with exit codes {failed}"
        raise RuntimeError(msg)
    return time.monotonic() - started


def parse_args() -> argparse.Namespace:
    """Command-line options (``--quick`` sets the small sizes unless given explicitly)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=None, help="Events to produce (default 1,000,000).")
    parser.add_argument("--days", type=int, default=None, help="Days of event time (default 3).")
    parser.add_argument(
        "--labels", type=int, default=None, help="Labels in the training set (default 1,000,000)."
    )
    parser.add_argument("--producers", type=int, default=2, help="Producer processes.")
    parser.add_argument("--batch", type=int, default=1_000_000, help="Landing records per Delta commit.")
    parser.add_argument("--workers", type=int, default=2, help="Landing reader processes (1: in-process).")
    parser.add_argument(
        "--materialize-rows", type=int, default=None, help="Rows to materialize (default 200,000)."
    )
    parser.add_argument("--quick", action="store_true", help=f"Small run: {QUICK}.")
    parser.add_argument("--materialize-only", action="store_true",
                        help="Rerun only materialize; keep the other figures of offline.json.")  # fmt: skip
    parser.add_argument("--decode-only", type=int, default=None, metavar="N",
                        help="Only time landing's decode step (decode_records) over N records per example "
                             "source, in CPU seconds; no services needed.")  # fmt: skip
    parser.add_argument("--baseline", type=Path, default=None, metavar="DIR",
                        help="With --decode-only: a folder holding headwater/ of another build.")  # fmt: skip
    args = parser.parse_args()
    defaults = QUICK if args.quick else {"events": 1_000_000, "days": 3, "labels": 1_000_000,
                                         "materialize_rows": 200_000}  # fmt: skip
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    return args


BASELINE_SNIPPET = """
import sys, time
from headwater.pipelines.events.codec import EventCodec
from headwater.pipelines.events.testing import Record
from headwater.pipelines.offline import landing_batch as lb
from headwater.pipelines.offline.testing import event
try:
    from headwater.pipelines.events.timing import SourceTiming as Rules
except ImportError:  # a build from before the one timing module
    Rules = lb.TimeRules
n, start = int(sys.argv[1]), int(sys.argv[2])
codec = EventCodec()
recs = [Record(i, codec.encode(event(i, f"u{i % 1000}", ("click", "impression")[i % 2], start + i * 50,
                                     item_id=f"i{i % 5000}", price=1.5)), codec.headers()) for i in range(n)]
seen, cpu = {}, time.process_time()
for s in range(0, n, 50_000):
    lb.decode_records(codec, recs[s : s + 50_000], Rules(5_000, 60_000, 300_000), seen, start + n * 50)
print(time.process_time() - cpu)
"""
"""The behaviour-source decode as every build since the landing existed can run it (its own codec)."""


def _decode_cpu(n: int, import_root: Path | None) -> float:
    """CPU seconds of :data:`BASELINE_SNIPPET` in a fresh process (``import_root``: another build)."""
    env = dict(os.environ)
    if import_root is not None:
        env["PYTHONPATH"] = str(import_root)
    out = subprocess.run([sys.executable, "-c", BASELINE_SNIPPET, str(n), str(START_MS)], env=env,
                         cwd="/", check=True, capture_output=True, text=True)  # fmt: skip
    return float(out.stdout.strip().splitlines()[-1])


def bench_decode(n: int, rounds: int = 3, baseline: Path | None = None) -> None:
    """Time ``decode_records`` (the landing's per-record Python) over ``n`` records of each example source.

    Records are encoded once, then decoded ``rounds`` times in chunks of the landing's size; the best
    round counts. CPU seconds of this process are the figure (the machine is shared); wall time too.
    """
    from headwater.pipelines.events.codec import EventCodec
    from headwater.pipelines.events.testing import Record
    from headwater.pipelines.events.timing import SourceTiming
    from headwater.pipelines.offline.landing_batch import decode_records
    from headwater.pipelines.offline.landing_state import CHUNK_RECORDS
    from headwater.pipelines.offline.testing import behaviour, event, payment, payments

    step = 50  # ms between events: in order, none late
    makers: dict[str, tuple[PlanSource, Callable[[int], dict[str, Any]]]] = {
        "events": (behaviour(), lambda i: event(i, f"u{i % 1000}", ("click", "impression")[i % 2],
                                                 START_MS + i * step, item_id=f"i{i % 5000}", price=1.5)),
        "payments": (payments(), lambda i: payment(i % 99_999, f"a{i % 1000}", START_MS + i * step,
                                                   merchant_id=f"m{i % 300}", risk_score=0.25)),
    }  # fmt: skip
    figures: dict[str, object] = {}
    for name, (source, make) in makers.items():
        codec = EventCodec(source)
        headers = codec.headers()
        records = [Record(i, codec.encode(make(i)), headers, topic=source.topic) for i in range(n)]
        best_cpu = best_wall = float("inf")
        for _ in range(rounds):
            seen: dict[int, int] = {}
            cpu, wall = time.process_time(), time.monotonic()
            landed = 0
            for s in range(0, n, CHUNK_RECORDS):
                chunk = decode_records(codec, records[s : s + CHUNK_RECORDS], SourceTiming.of(source), seen,
                                       START_MS + n * step)  # fmt: skip
                landed += chunk.table.num_rows
            best_cpu = min(best_cpu, time.process_time() - cpu)
            best_wall = min(best_wall, time.monotonic() - wall)
        assert landed == n, f"{name}: {landed} of {n} records decoded"
        figures[name] = {"records": n, "fields": len(source.fields), "cpu_seconds": round(best_cpu, 3),
                         "records_per_cpu_s": round(n / best_cpu), "wall_seconds": round(best_wall, 3),
                         "records_per_s": round(n / best_wall), "load_avg_1m": _load()}  # fmt: skip
        print(f"{name}: {n / best_cpu:,.0f} records per CPU second ({n / best_wall:,.0f}/s wall)")
    if baseline is not None:
        # Alternate the two builds so that both see the same load; best of the rounds each.
        this, other = [], []
        for _ in range(rounds):
            other.append(_decode_cpu(n, baseline))
            this.append(_decode_cpu(n, None))
        commit = subprocess.run(["git", "-C", str(baseline / "headwater" / "pipelines"), "rev-parse", "HEAD"],
                                capture_output=True, text=True, check=False).stdout.strip()  # fmt: skip
        figures["events_vs_baseline"] = {
            "records": n, "baseline": commit or str(baseline), "this_records_per_cpu_s": round(n / min(this)),
            "baseline_records_per_cpu_s": round(n / min(other)),
            "rate_change": round(min(other) / min(this) - 1, 3),
            "note": "behaviour source, a fresh process per round, this build and the baseline alternately",
        }  # fmt: skip
        print(f"events vs baseline: {n / min(this):,.0f} vs {n / min(other):,.0f} records per CPU second")
    out = {"benchmark": "offline_decode", "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
           "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
           "command": " ".join(["bench/bench_offline.py", *sys.argv[1:]]), "rounds": rounds,
           "note": "decode_records per source: Avro decode with the source's codec, validation, Arrow "
                   "columns from its schema, future/late rules; best of the rounds",
           "sources": figures}  # fmt: skip
    DECODE_RESULT.parent.mkdir(parents=True, exist_ok=True)
    DECODE_RESULT.write_text(json.dumps(out, indent=2) + "\n")


def main() -> None:
    args = parse_args()
    if args.decode_only:
        bench_decode(args.decode_only, baseline=args.baseline)
        return
    from headwater.pipelines.settings import Settings
    from headwater.pipelines.topics import ensure_topics
    from headwater.registry.plans import read_plan

    work = Path(tempfile.mkdtemp(prefix="hw-bench-offline-"))
    subprocess.run([str(ROOT / ".venv/bin/headwater"), "apply", str(ROOT / "features"), "--state-dir",
                    str(work / "state"), "--no-feast"], check=True, capture_output=True)  # fmt: skip
    plan = read_plan(work / "state", "offline")
    settings = Settings.from_env()
    if args.materialize_only:
        shutil.rmtree(work, ignore_errors=True)
        previous = json.loads(RESULT.read_text())
        kept: dict[str, Any] = {
            k: v for k, v in previous.items() if isinstance(v, dict) and k not in ("machine", "args")
        }
        rerun = bench_materialize(plan, settings, args.materialize_rows, START_MS)
        kept["materialize"] = {**rerun, "rerun": "bench/bench_offline.py --materialize-only"}
        _write(previous["args"], kept, previous["command"])
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
    from headwater.pipelines.offline.job import read_bronze
    from headwater.pipelines.offline.lake import bronze_path
    from headwater.pipelines.offline.landing import Lander, LandingConfig
    from headwater.pipelines.offline.session import offline_session

    results: dict[str, object] = {}
    produce_s = produce(settings.kafka_bootstrap, topic, args.events, args.days, args.producers)
    results["produce"] = {"events": args.events, "processes": args.producers, "seconds": round(produce_s, 2),
                          "events_per_s": round(args.events / produce_s), "load_avg_1m": _load(),
                          "note": "generate + encode + send; not part of the tier's figures"}  # fmt: skip
    print(f"produced {args.events} events in {produce_s:.1f} s ({args.producers} processes)")

    spark = offline_session("bench-offline")
    lake = work / "lake"
    source = next(s for s in plan.sources if s.name == "events").model_copy(update={"topic": topic})
    config = LandingConfig(settings.kafka_bootstrap, source, f"{topic}.dlq", bronze_path(lake, source.name),
                           batch_records=args.batch, workers=args.workers)  # fmt: skip
    stats = Lander(spark, config).run(
        progress=lambda s: print(f"  landing batch {s.batches} committed ({s.records} records read)")
    )
    results["landing"] = {"records": stats.records, "landed": stats.landed, "malformed": stats.malformed,
                          "future_dated": stats.future, "late": stats.late, "batches": stats.batches,
                          "workers": args.workers,
                          "seconds": round(stats.seconds, 2), "events_per_s": round(stats.records_per_s),
                          "load_avg_1m": _load()}  # fmt: skip
    print(f"landing: {stats.records} records in {stats.seconds:.1f} s = {stats.records_per_s:,.0f}/s")

    bronze = read_bronze(spark, lake, source)
    span = bronze.selectExpr(f"min({source.event_time}) lo", f"max({source.event_time}) hi").collect()[0]
    views = plan.model_copy(update={"views": [v for v in plan.views if v.source == source.name]})
    results["offline_views"] = bench_views(
        spark, bronze, views, source, lake, span["lo"], span["hi"], stats.landed
    )
    results.update(bench_training_set(spark, bronze, views, source, settings, span["lo"], work, args.labels))
    spark.stop()
    return results, int(span["hi"])


def bench_views(
    spark: SparkSession, bronze: DataFrame, plan: TierPlan, source: PlanSource, lake: Path, lo_ms: int,
    hi_ms: int, events: int,
) -> dict[str, object]:  # fmt: skip
    """Every offline view of ``source`` over every landed day, in one chunk per view."""
    from headwater.pipelines.offline.job import run_view
    from headwater.pipelines.offline.lake import day_of_ms, days

    all_days = days(day_of_ms(lo_ms), day_of_ms(hi_ms))
    started = time.monotonic()
    per_view = {}
    for view in plan.views:
        t = time.monotonic()
        runs = run_view(spark, bronze, view, source, lake, all_days, chunk_days=len(all_days))
        per_view[view.name] = {"rows": sum(r.rows for r in runs), "seconds": round(time.monotonic() - t, 2)}
        print(f"  {view.name}: {per_view[view.name]}")
    views_s = time.monotonic() - started
    print(f"offline views: {len(plan.views)} views x {len(all_days)} days in {views_s:.1f} s")
    return {"views": per_view, "days": len(all_days), "events": events, "seconds": round(views_s, 2),
            "events_per_s": round(events / views_s), "load_avg_1m": _load()}  # fmt: skip


def bench_training_set(
    spark: SparkSession, bronze: DataFrame, plan: TierPlan, source: PlanSource, settings: Settings,
    lo_ms: int, work: Path, n_labels: int,
) -> dict[str, object]:  # fmt: skip
    """Time labels from bronze, then a point-in-time training set of the first ``n_labels`` after day 1."""
    from headwater.pipelines.offline.labels import derive_labels, write_labels
    from headwater.pipelines.offline.lake import day_of_ms
    from headwater.pipelines.store import OnlineStore
    from headwater.pipelines.windows import RedisDictionary
    from headwater.ranking.training_set import build_training_set, read_labels

    lake = work / "lake"
    t = time.monotonic()
    first = day_of_ms(lo_ms // 86_400_000 * 86_400_000 + 86_400_000)
    written = write_labels(derive_labels(bronze, source, first), work / "labels.parquet", lake / "_staging")
    labels_s = time.monotonic() - t
    print(f"labels: {written.rows} impressions labelled ({written.positives} positive) in {labels_s:.1f} s")
    store = OnlineStore.from_url(settings.redis_url, namespace=f"hwbench-{uuid.uuid4().hex[:6]}")
    ids = RedisDictionary(store.client, store.namespace).ids
    t = time.monotonic()
    labels = read_labels(spark, written.path).limit(n_labels)
    ts = build_training_set(spark, labels, plan.views, lake, work / "train.parquet", plan.registry_hash, ids)
    ts_s = time.monotonic() - t
    print(f"training set: {ts.rows} labels in {ts_s:.1f} s")
    for key in store.client.scan_iter(match=f"{store.namespace}:*", count=10_000):
        store.client.unlink(key)
    store.close()
    return {
        "labels": {"labels": written.rows, "positives": written.positives, "seconds": round(labels_s, 2),
                   "rows_per_s": round(written.rows / labels_s), "load_avg_1m": _load()},
        "training_set": {"labels": ts.rows, "asked": n_labels, "positives": ts.positives,
                         "columns": len(ts.columns), "seconds": round(ts_s, 2),
                         "rows_per_s": round(ts.rows / ts_s), "load_avg_1m": _load(),
                         "note": "first --labels labels of `headwater labels` after the first day; "
                                 "fewer when the events give fewer impressions"},
    }  # fmt: skip


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
    written = write_table(store, view, table, RedisDictionary(store.client, store.namespace))
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
    steps = [("produce", "produce", "events", "events", "events_per_s", "ev/s"),
             ("landing", "landing", "records", "records", "events_per_s", "ev/s"),
             ("offline_views", "offline views", "events", "events", "events_per_s", "ev/s"),
             ("labels", "labels", "labels", "labels", "rows_per_s", "rows/s"),
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
