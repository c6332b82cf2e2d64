"""Nearline tier benchmark: throughput (1 and 2 processes), paced freshness, changelog restore, state size.

Sections (each can be skipped; all write bench/results/nearline.json):

- throughput: N generator events (20k users, simulated at --sim-rate events/s, so window boundaries
  pass and every live entity is re-published at each one) are produced once to a 4-partition
  topic; then `headwater run nearline` (a subprocess, the real CLI) consumes them with 1 and with 2
  processes, --repeats times each, each run in a fresh consumer group and Redis namespace. Reported
  per run: records/s from the first to the last batch (steady state; all records, including dead
  letters and duplicates), records/s including start-up and group join, records per CPU second
  (load-independent), and the time per phase of the commit protocol. The median run is reported.
- paced: a producer sends at a fixed rate at wall-clock event time for --paced-seconds while one
  worker runs; every online write records write time - window boundary B (the value's event time).
  The plan's slides are 10 s here (the tests use 1 min), so a minute holds 6 boundaries.
- hour: one process over an hour of simulated traffic (--hour-events): state on disk, pane
  records kept and expired, dedup ids kept (windows expire state: it stays bounded).
- restore: --restore-keys synthetic pane records on one changelog partition, restored into an
  empty store and loaded into memory (what a takeover after losing the local folder does).
- baseline (only with --baseline DIR): 1-process throughput runs alternating between this checkout
  and another build of the package (DIR on the workers' PYTHONPATH, e.g. an older commit's
  folders under DIR/headwater/), over the same topic, so both see the same machine load.

The machine is shared: load averages at start and end are recorded with the figures.
Usage: python bench/bench_nearline.py [--quick] [--events N] [--repeats R]
       [--skip throughput,paced,hour,restore] [--baseline DIR]
``--quick`` is a short run for development (about 3 minutes); the defaults are the reported run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from headwater.pipelines.settings import Settings

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests/integration/pipelines/nearline"))
import harness as h  # noqa: E402  (the integration tests' helpers: plan, topics, producer)

PHASES = ("t_process", "t_changelog", "t_rocksdb", "t_publish", "t_commit")


def _stats(env: h.Env) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted(env.store_dir.glob("stats-*.json"))]


def _fresh_run(env: h.Env) -> None:
    env.group = f"nl-{uuid.uuid4().hex[:10]}"
    env.namespace = f"t{uuid.uuid4().hex[:8]}"
    shutil.rmtree(env.store_dir, ignore_errors=True)


def _throughput_run(env: h.Env, records: int, processes: int) -> dict[str, Any]:
    _fresh_run(env)
    started = time.time()
    proc = env.start(3.0, 20_000, processes)
    deadline = time.monotonic() + 900
    while env.committed() < records and time.monotonic() < deadline:
        time.sleep(0.25)
    all_done = time.time() - started
    proc.wait(timeout=120)
    stats = _stats(env)
    _drop_group(env)
    counters = [s["counters"] for s in stats]
    first = min(c["first_batch_at"] for c in counters)
    last = max(c["last_batch_at"] for c in counters)
    done = sum(c["events"] + c["dead"] + c["duplicates"] for c in counters)
    steady = done / (last - first)
    return {
        "records": done,
        "records_per_s": round(steady),
        "records_per_s_per_process": round(steady / processes),
        "records_per_s_incl_startup": round(records / all_done),
        "records_per_cpu_s_per_process": round(done / sum(c["cpu_s"] for c in counters)),
        "phase_s": {p: round(sum(c.get(p, 0.0) for c in counters), 2) for p in PHASES},
        "online_rows_written": int(sum(c["written"] for c in counters)),
        "batches": int(sum(c["batches"] for c in counters)),
        "state_bytes": sum(sum(s["state_bytes"].values()) for s in stats),
        "pane_records": sum(sum(t["panes"].values()) for s in stats for t in s["tasks"]),
    }


def _drop_group(env: h.Env) -> None:
    """Delete one run's changelog topic and Redis keys (the events topic stays for the next run)."""
    from kafka import KafkaAdminClient

    from headwater.pipelines.store import OnlineStore

    admin = KafkaAdminClient(bootstrap_servers=env.settings.kafka_bootstrap)
    try:
        admin.delete_topics([t for t in admin.list_topics() if t.startswith(f"{env.group}-")])
    finally:
        admin.close()
    store = OnlineStore.from_url(env.settings.redis_url, namespace=env.namespace)
    for key in store.client.scan_iter(match=f"{env.namespace}:*", count=1000):
        store.client.unlink(key)
    store.close()


def throughput(settings: Settings, n: int, sim_rate: float, repeats: int) -> dict[str, Any]:
    env = h.Env(settings=settings, tmp=Path(tempfile.mkdtemp(prefix="bench-nl-")))
    env.create()
    try:
        h.produce(env.settings, n, seed=5, rate=sim_rate, users=20_000)
        records = env_records(env)
        out: dict[str, Any] = {"produced_records": records, "sim_rate": sim_rate, "users": 20_000}
        for processes in (1, 2):
            runs = [_throughput_run(env, records, processes) for _ in range(repeats)]
            runs.sort(key=lambda r: r["records_per_s_per_process"])
            out[f"p{processes}"] = {
                "median": runs[len(runs) // 2],
                "all_per_process": [r["records_per_s_per_process"] for r in runs],
            }
            print(f"{processes} process(es): {out[f'p{processes}']['all_per_process']} records/s/process")
        out["cpu_us_per_record"] = cpu_breakdown(env, records)
        print(f"CPU us per record: {out['cpu_us_per_record']}")
        return out
    finally:
        env.cleanup()
        shutil.rmtree(env.tmp, ignore_errors=True)


def baseline(settings: Settings, n: int, sim_rate: float, repeats: int, folder: Path) -> dict[str, Any]:
    """1-process runs of this checkout and of the build in ``folder``, interleaved (ABBA...)."""
    env = h.Env(settings=settings, tmp=Path(tempfile.mkdtemp(prefix="bench-nlb-")))
    env.create()
    # An older build may read its topic from the environment rather than from the plan.
    other = {"PYTHONPATH": str(folder), "HEADWATER_EVENTS_TOPIC": env.settings.events_topic}
    runs: dict[str, list[dict[str, Any]]] = {"baseline": [], "this": []}
    try:
        h.produce(env.settings, n, seed=5, rate=sim_rate, users=20_000)
        records = env_records(env)
        for r in range(repeats):
            for which in ("baseline", "this") if r % 2 == 0 else ("this", "baseline"):
                env.extra_env = other if which == "baseline" else {}
                load = os.getloadavg()[0]
                run = _throughput_run(env, records, 1)
                run["load_1m_at_start"] = round(load, 2)
                runs[which].append(run)
                print(
                    f"{which}: {run['records_per_s']} records/s, {run['records_per_cpu_s_per_process']}/cpu s"
                )
    finally:
        env.cleanup()
        shutil.rmtree(env.tmp, ignore_errors=True)
    out: dict[str, Any] = {"baseline_pythonpath": str(folder), "records": records, "sim_rate": sim_rate}
    for which, rs in runs.items():
        out[which] = {
            "records_per_s": [r["records_per_s"] for r in rs],
            "records_per_cpu_s": [r["records_per_cpu_s_per_process"] for r in rs],
            "t_process_s": [r["phase_s"]["t_process"] for r in rs],
            "load_1m_at_start": [r["load_1m_at_start"] for r in rs],
        }
    return out


def cpu_breakdown(env: h.Env, records: int, batch: int = 20_000) -> dict[str, Any]:
    """CPU microseconds per record of poll, process and a changelog send, each measured alone."""
    from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition

    from headwater.pipelines.events.codec import EventCodec
    from headwater.pipelines.nearline.plan import NearlinePlan
    from headwater.pipelines.nearline.restore import check_crcs
    from headwater.pipelines.nearline.state import PartitionStore
    from headwater.pipelines.nearline.task import PartitionTask
    from headwater.pipelines.topics import ensure_topics
    from headwater.registry.plans import read_plan

    tps = [TopicPartition(env.settings.events_topic, p) for p in range(env.partitions)]
    consumer = KafkaConsumer(
        bootstrap_servers=env.settings.kafka_bootstrap,
        enable_auto_commit=False,
        max_partition_fetch_bytes=4 << 20,
        fetch_max_bytes=32 << 20,
        check_crcs=check_crcs(),
    )
    polled: dict[Any, list[Any]] = {tp: [] for tp in tps}
    try:
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        t0 = time.process_time()
        got = 0
        while got < records:
            for tp, recs in consumer.poll(timeout_ms=1000, max_records=batch).items():
                polled[tp] += recs
                got += len(recs)
        poll_us = (time.process_time() - t0) / got * 1e6
    finally:
        consumer.close()
    source = NearlinePlan.from_plan(read_plan(env.tmp, "nearline")).source("events")
    codec, changes = EventCodec(source.source), 0
    tasks = [
        PartitionTask(
            tp.partition,
            PartitionStore(env.tmp / "cpu", tp.partition),
            source.views,
            source.timing,
            codec,
        )
        for tp in tps
    ]
    t0 = time.process_time()
    now = int(time.time() * 1000)
    for task, tp in zip(tasks, tps, strict=True):
        for i in range(0, len(polled[tp]), batch):
            changes += len(task.process(polled[tp][i : i + batch], now).changes)
    process_us = (time.process_time() - t0) / got * 1e6
    for task in tasks:
        task.store.close()
    topic = f"{env.group}-cpu"
    ensure_topics(env.settings, {topic: {}}, env.partitions)
    producer = KafkaProducer(
        bootstrap_servers=env.settings.kafka_bootstrap, linger_ms=5, batch_size=512 * 1024, acks="all"
    )
    key, value = (
        b"p\x1fnl_activity\x1fu0001234\x1f1767225600000",
        b"[12345,3,1500.0,[42.5,2],null,null,[1,4]]",
    )
    try:
        t0 = time.process_time()
        for i in range(20_000):
            producer.send(topic, key=key, value=value, partition=i % env.partitions)
        producer.flush()
        send_us = (time.process_time() - t0) / 20_000 * 1e6
    finally:
        producer.close()
        admin = KafkaAdminClient(bootstrap_servers=env.settings.kafka_bootstrap)
        admin.delete_topics([topic])
        admin.close()
    per_event = changes / got
    return {
        "poll_us": round(poll_us, 1),
        "process_us": round(process_us, 1),
        "changelog_send_us": round(send_us, 1),
        "changelog_records_per_record": round(per_event, 3),
        "sum_us": round(poll_us + process_us + send_us * per_event, 1),
        "records": got,
        "batch": batch,
    }


def hour(settings: Settings, n: int) -> dict[str, Any]:
    """One process over an hour of simulated traffic (n events): state size, panes kept and expired."""
    env = h.Env(settings=settings, tmp=Path(tempfile.mkdtemp(prefix="bench-nlh-")))
    env.create()
    try:
        h.produce(env.settings, n, seed=6, rate=n / 3600, users=20_000)
        records = env_records(env)
        _fresh_run(env)
        proc = env.start(3.0, 20_000, 1)
        while env.committed() < records:
            time.sleep(0.5)
        proc.wait(timeout=120)
        stats = _stats(env)[0]
        _drop_group(env)
        c = stats["counters"]
        return {
            "simulated_s": 3600,
            "records": records,
            "state_bytes_on_disk": sum(stats["state_bytes"].values()),
            "pane_records_kept": sum(sum(t["panes"].values()) for t in stats["tasks"]),
            "panes_expired": int(c["expired_panes"]),
            "dedup_ids_kept": sum(t["dedup_ids"] for t in stats["tasks"]),
            "entities_kept": sum(sum(t["entities"].values()) for t in stats["tasks"]),
            "records_per_s": round(
                (c["events"] + c["dead"] + c["duplicates"]) / (c["last_batch_at"] - c["first_batch_at"])
            ),
        }
    finally:
        env.cleanup()
        shutil.rmtree(env.tmp, ignore_errors=True)


def env_records(env: h.Env) -> int:
    """Return the records in the events topic (the consumer group must commit this many offsets)."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=env.settings.kafka_bootstrap)
    try:
        tps = [TopicPartition(env.settings.events_topic, p) for p in range(env.partitions)]
        return sum(consumer.end_offsets(tps).values())
    finally:
        consumer.close()


def _weighted_pct(samples: list[tuple[int, int]], q: float) -> float:
    ordered = sorted(samples)
    total = sum(n for _, n in ordered)
    seen = 0
    for lag, n in ordered:
        seen += n
        if seen >= q * total:
            return lag / 1000
    return float("nan")


def paced(settings: Settings, rate: float, seconds: float, slide_s: int) -> dict[str, Any]:
    env = h.Env(settings=settings, tmp=Path(tempfile.mkdtemp(prefix="bench-nlp-")))
    env.create(slide_s=slide_s)
    try:
        worker = env.start(8.0, 20_000, 1)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # wait until the worker owns the 4 partitions
            logs = "".join(p.read_text(errors="replace") for p in env.tmp.glob("worker-*.log"))
            if logs.count("restored from") >= env.partitions:
                break
            time.sleep(0.5)
        code = (
            "import json,sys;from headwater.pipelines.events.producer import ProducerSettings,produce;"
            "from headwater.pipelines.events.generator import GeneratorConfig;"
            f"s=produce(ProducerSettings(bootstrap={env.settings.kafka_bootstrap!r},"
            f"topic={env.settings.events_topic!r},rate={rate},duration_s={seconds}),"
            "GeneratorConfig(seed=9,users=20000,diurnal_amplitude=0.0));print(json.dumps(s.as_dict()))"
        )
        prod = subprocess.run(
            [sys.executable, "-c", code], env=env.env(), capture_output=True, text=True, check=True
        )
        sent = json.loads(prod.stdout.strip().splitlines()[-1])
        worker.wait(timeout=300)
        stats = _stats(env)[0]
        samples = [tuple(x) for x in stats["freshness_ms"]]
        c = stats["counters"]
        return {
            "target_rate": rate,
            "seconds": seconds,
            "slide_s": slide_s,
            "producer": {k: sent[k] for k in ("sent", "elapsed_s", "rate", "cpu_s")},
            "records_processed": int(c["events"] + c["dead"] + c["duplicates"]),
            "online_rows_written": int(c["written"]),
            "boundary_publishes": len(samples),
            "write_minus_boundary_s": {
                "p50": _weighted_pct(samples, 0.50),
                "p99": _weighted_pct(samples, 0.99),
                "max": max((lag for lag, _ in samples), default=0) / 1000,
            },
            "worker_cpu_s": round(c["cpu_s"], 1),
            "phase_s": {p: round(c.get(p, 0.0), 2) for p in PHASES},
        }
    finally:
        env.cleanup()
        shutil.rmtree(env.tmp, ignore_errors=True)


def restore(settings: Settings, keys: int) -> dict[str, Any]:
    """Time restoring ``keys`` pane records from a changelog partition into an empty store."""
    from kafka import KafkaAdminClient, KafkaProducer

    from headwater.pipelines.events.codec import EventCodec
    from headwater.pipelines.nearline.plan import NearlinePlan
    from headwater.pipelines.nearline.restore import restore_partition
    from headwater.pipelines.nearline.state import META_KEY, PartitionStore, dumps, pane_key
    from headwater.pipelines.nearline.task import PartitionTask
    from headwater.pipelines.topics import ensure_topics

    tmp = Path(tempfile.mkdtemp(prefix="bench-nlr-"))
    topic = f"nl-restore-{uuid.uuid4().hex[:8]}"
    ensure_topics(settings, {topic: {"cleanup.policy": "compact"}}, 1)
    try:
        plan = NearlinePlan.from_plan(h.write_plan(tmp))
        source = plan.source("events")
        view = source.views[0]
        producer = KafkaProducer(bootstrap_servers=settings.kafka_bootstrap, linger_ms=50, batch_size=1 << 20)
        t0 = time.monotonic()
        base = 1_767_225_600_000
        for i in range(keys):  # 10 panes per entity, each with a count, a sum and an avg partial
            rec = dumps([i + 1, 3, 1500.0, [42.5, 2], None, None, [1, 4]])
            key = pane_key(view.name, f"u{i // 10:07d}", base + (i % 10) * 60_000)
            producer.send(topic, key=key, value=rec)
        meta = {"offset": keys, "max_t": base + 600_000, "versions": {view.name: view.version}, "t_pub": {}}
        producer.send(topic, key=META_KEY, value=dumps(meta))
        producer.flush()
        producer.close()
        produce_s = time.monotonic() - t0
        store = PartitionStore(tmp / "stores", 0)
        task = PartitionTask(0, store, source.views, source.timing, EventCodec(source.source))
        t1 = time.monotonic()
        replayed = restore_partition(settings, topic, 0, store, task)
        took = time.monotonic() - t1
        loaded = sum(len(p) for p in task.views[view.name].entities.values())
        size = store.size_bytes()
        store.close()
        return {
            "keys": keys,
            "replayed": replayed,
            "loaded_panes": loaded,
            "restore_s": round(took, 1),
            "keys_per_s": round(replayed / took),
            "store_bytes": size,
            "produce_s": round(produce_s, 1),
        }
    finally:
        admin = KafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap)
        admin.delete_topics([topic])
        admin.close()
        shutil.rmtree(tmp, ignore_errors=True)


def _has_crc32c() -> bool:
    try:
        import crc32c  # noqa: F401
    except ImportError:
        return False
    return True


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--events", type=int, default=200_000)
    ap.add_argument("--sim-rate", type=float, default=1_000.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--paced-rates", default="2000,5000")
    ap.add_argument("--paced-seconds", type=float, default=60.0)
    ap.add_argument("--restore-keys", type=int, default=1_000_000)
    ap.add_argument("--hour-events", type=int, default=360_000, help="events in the simulated hour")
    ap.add_argument("--skip", default="", help="comma-separated: throughput, paced, hour, restore")
    ap.add_argument(
        "--baseline",
        type=Path,
        default=None,
        help="a folder with another build of the package (PYTHONPATH): 1-process runs alternate with it",
    )
    ap.add_argument("--baseline-label", default="", help="what the --baseline build is (kept in the results)")
    ap.add_argument("--quick", action="store_true", help="short run: 60k events, 1 repeat, 20 s paced, ...")
    args = ap.parse_args()
    if args.quick:
        args.events, args.repeats, args.paced_rates, args.paced_seconds = 60_000, 1, "5000", 20.0
        args.restore_keys, args.hour_events = 200_000, 120_000
    skip = set(filter(None, args.skip.split(",")))
    settings = Settings.from_env()
    out_path = ROOT / "bench/results/nearline.json"
    results: dict[str, Any] = json.loads(out_path.read_text()) if out_path.exists() else {}
    results = {
        k: v
        for k, v in results.items()
        if k in ("throughput", "paced", "hour", "restore", "baseline", "measured_at")
    }
    results["machine"] = {"cpus": os.cpu_count(), "crc32c": _has_crc32c()}
    if "throughput" not in skip:
        load = os.getloadavg()[0]
        results["throughput"] = throughput(settings, args.events, args.sim_rate, args.repeats)
        results["throughput"]["load_1m_start_end"] = [load, os.getloadavg()[0]]
    if args.baseline is not None:
        load = os.getloadavg()[0]
        results["baseline"] = baseline(settings, args.events, args.sim_rate, args.repeats, args.baseline)
        results["baseline"]["load_1m_start_end"] = [load, os.getloadavg()[0]]
        results["baseline"]["label"] = args.baseline_label
        results["baseline"]["measured_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    if "paced" not in skip:
        load = os.getloadavg()[0]
        results["paced"] = [
            paced(settings, float(r), args.paced_seconds, 10) for r in args.paced_rates.split(",")
        ]
        for p in results["paced"]:
            p["load_1m_start_end"] = [load, os.getloadavg()[0]]
            print(f"paced {p['target_rate']}/s: write - B {p['write_minus_boundary_s']}")
    if "hour" not in skip:
        load = os.getloadavg()[0]
        results["hour"] = hour(settings, args.hour_events)
        results["hour"]["load_1m_start_end"] = [load, os.getloadavg()[0]]
        print(f"hour: {results['hour']}")
    if "restore" not in skip and args.restore_keys:
        load = os.getloadavg()[0]
        results["restore"] = restore(settings, args.restore_keys)
        results["restore"]["load_1m_start_end"] = [load, os.getloadavg()[0]]
        print(f"restore: {results['restore']}")
    if not {"throughput", "paced", "hour", "restore"} <= skip:  # the baseline section has its own time
        results["measured_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    print(json.dumps(results, indent=2))
    out_path.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
