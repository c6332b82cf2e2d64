"""Realtime tier benchmark: sustained input at fixed rates through `headwater run realtime`, freshness.

What runs: the registry's own realtime views of the behaviour source (``features/``, applied to a
scratch state folder; ``--source``, default ``events``), compiled into one Flink job by the real CLI
(``--source events``: a subprocess, local mini-cluster, parallelism 2, checkpoints every 5 s), reading
a fresh topic and writing a fresh Redis namespace. The job decodes with the generic JVM decoder built
from the plan's source (its schemas and fields).

Input: producer processes send at a fixed rate for ``--phase-s`` seconds per rate, one rate after
the other into the same running job (start-up is paid once). Events are realistic templates from
the event generator (users, items, sessions, mix of types; no late, duplicate or malformed ones),
each sent with a unique ``event_id`` and ``event_time`` = the wall clock at send. Payloads are
spliced from pre-encoded Avro pieces (only the id and the time are encoded per event), so the
producer costs little CPU on this shared 2-core machine.

Reported per rate:

- ``consumed_eps``: events the job consumed per second, from the Kafka offsets its source
  commits at each checkpoint (committed offset growth / time between the first and last commit
  seen in the phase); ``lag_end``: produced - committed at the end of the phase.
- freshness per view, two figures, over the values written while the producers sent (the settle
  time after a phase is left out: there the stream has ended, and the last boundaries wait for the
  job's idle advance, 2 s, instead of the next event):
  (a) ``write_minus_boundary``: every second all entity keys of each view are read back; each
  new (entity, boundary B) value gives ``write_time - B``. The job publishes B as soon as its
  clock (the newest event time it has seen) passes B, so this is the pipeline's own delay:
  producer linger, Kafka, Flink's network buffers, the sink's flush interval (100 ms).
  (b) ``event_to_write``: every 97th sent event is a probe (entity, event time t); its value
  change is the write at B = the first boundary after t, so ``write_time - t`` is measured per
  probe (probes whose boundary was not seen are counted as ``unmatched``). This is what the
  issue's "event time to Redis write" means; it is (a) plus the wait for the window boundary,
  up to one slide (1 s for the user views, 5 s for the item view).
  The job writes a value only when it changes, so the store's event time of an unchanged value
  stays at the boundary of its last change: both figures are taken on writes only.
- ``holds``: consumed >= 95 % of the offered rate and the lag at the end below 10 s of input;
  ``producer_short``: the producers sent under 95 % of the rate (then the phase says nothing of
  the job, and the run stops).
- ``job_cpu_cores`` (and ``_by_kind``: the JVM vs the Python processes): CPU seconds of the job's
  process group per wall second of the phase: how much of the shared machine the job got.

``--quick``: 20 s phases at 1k, 5k and 10k events/s, for a smoke run. ``--label`` names the run
inside the JSON; other labels are kept.

The machine is shared: load averages at start, per phase and at the end are in the JSON.
Usage: python bench/bench_realtime.py [--quick] [--rates 1000,5000,10000] [--more 15000,20000] [--phase-s 120]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from headwater.pipelines.events.codec import EventCodec
from headwater.pipelines.events.generator import EventGenerator, GeneratorConfig
from headwater.pipelines.events.producer import ProducerSettings
from headwater.pipelines.settings import Settings
from headwater.pipelines.store import OnlineStore
from headwater.pipelines.windows import compile_view, view_layout
from headwater.registry.plans import TierPlan, read_plan

ROOT = Path(__file__).resolve().parents[1]
PROBE_EVERY = 97
"""Every 97th sent event is a probe: its entity and event time are kept to measure event-to-write."""
REF_TIME = 1_234_567_890_123  # a marker event time whose varint is searched for in a template's bytes


def zigzag(n: int) -> bytes:
    """Avro's zig-zag varint encoding of a long."""
    n = (n << 1) ^ (n >> 63)
    out = bytearray()
    while n & ~0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


Piece = tuple[bytes, bytes, str, str]
"""A pre-encoded event template: (middle, tail, user_id, item_id or "")."""
Probe = tuple[str, str, int]
"""(user_id, item_id, event_time) of a sent event."""


def templates(users: int, items: int, n: int) -> tuple[list[Piece], set[str], set[str]]:
    """Pre-encoded (middle, tail) pieces of ``n`` generated events: id and time are spliced in per send."""
    codec = EventCodec()
    config = GeneratorConfig(
        users=users, items=items, late_share=0.0, out_of_order_share=0.0, duplicate_share=0.0,
        malformed_share=0.0,
    )  # fmt: skip
    pieces: list[Piece] = []
    user_ids: set[str] = set()
    item_ids: set[str] = set()
    marker = zigzag(REF_TIME)
    for emission in EventGenerator(config).take(n):
        if emission.event is None:
            continue
        ev = dict(emission.event)
        user_ids.add(ev["user_id"])
        if ev["item_id"]:
            item_ids.add(ev["item_id"])
        raw = codec.encode({**ev, "event_id": "", "event_time": REF_TIME})
        at = raw.index(marker, 1)
        pieces.append((raw[1:at], raw[at + len(marker) :], ev["user_id"], ev["item_id"] or ""))
    return pieces, user_ids, item_ids


def splice(event_id: str, t_ms: int, middle: bytes, tail: bytes) -> bytes:
    """Return the Avro payload of a template with its id and time set."""
    raw = event_id.encode()
    return zigzag(len(raw)) + raw + middle + zigzag(t_ms) + tail


def produce(bootstrap: str, topic: str, rate: float, duration_s: float, tag: str,
            pieces: list[Piece], out: Any) -> None:  # fmt: skip
    """Send at ``rate`` events/s for ``duration_s``; put (sent, seconds, most behind, probes) on ``out``.

    ``probes``: (user_id, item_id, event_time) of every ``PROBE_EVERY``-th event sent, for the
    measured event-to-write freshness.
    """
    from kafka import KafkaProducer

    codec = EventCodec()
    producer = KafkaProducer(**ProducerSettings(bootstrap, topic).kafka_config())
    fp = codec.headers()[0]
    start = time.monotonic()
    sent, behind_max, i = 0, 0.0, random.randrange(len(pieces))
    probes: list[tuple[str, str, int]] = []
    while True:
        elapsed = time.monotonic() - start
        if elapsed >= duration_s:
            break
        due = int(rate * elapsed) - sent
        if due <= 0:
            time.sleep(0.002)
            continue
        behind_max = max(behind_max, due / rate)
        now = time.time_ns() // 1_000_000
        headers = [fp, ("produce-ts", str(now).encode())]
        for _ in range(min(due, 2000)):
            middle, tail, user, item = pieces[i % len(pieces)]
            i += 1
            producer.send(topic, splice(f"{tag}-{i}", now, middle, tail), headers=headers)
            sent += 1
            if sent % PROBE_EVERY == 0:
                probes.append((user, item, now))
    producer.flush()
    seconds = time.monotonic() - start
    producer.close()
    out.put((sent, seconds, behind_max, probes))


@dataclass
class Sampler:
    """Reads every entity of every view once a second; keeps write - B of each new (view, entity, B)."""

    plan: TierPlan
    redis_url: str
    namespace: str
    ids: dict[str, list[str]]
    seen: dict[tuple[str, str], int] = field(default_factory=dict)
    samples: list[tuple[str, int, int]] = field(default_factory=list)
    """(view, B, write_time) of each new value."""
    writes: dict[tuple[str, str, int], int] = field(default_factory=dict)
    """write_time of each (view, entity, B) seen."""
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        """Sample until ``stop`` is set."""
        store = OnlineStore.from_url(self.redis_url, namespace=self.namespace)
        layouts = {v.name: view_layout(compile_view(v)) for v in self.plan.views}
        try:
            while not self.stop.wait(1.0):
                for view, layout in layouts.items():
                    ids = self.ids[view]
                    res = store.read_batch(layout, ids)
                    for j in np.flatnonzero(res.found):
                        b, w = int(res.event_time_ms[j]), int(res.write_time_ms[j])
                        if self.seen.get((view, ids[j])) != b:
                            self.seen[(view, ids[j])] = b
                            self.samples.append((view, b, w))
                            self.writes[(view, ids[j], b)] = w
        finally:
            store.close()


@dataclass
class OffsetWatch:
    """Polls the job's committed offsets and the topic's end offsets twice a second."""

    bootstrap: str
    group: str
    topic: str
    rows: list[tuple[float, int, int]] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        """Poll until ``stop`` is set."""
        from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition

        admin = KafkaAdminClient(bootstrap_servers=self.bootstrap)
        consumer = KafkaConsumer(bootstrap_servers=self.bootstrap)
        parts = [TopicPartition(self.topic, p) for p in consumer.partitions_for_topic(self.topic) or ()]
        try:
            while not self.stop.wait(0.5):
                offsets = admin.list_group_offsets(self.group).get(self.group, {})
                done = sum(o.offset for tp, o in offsets.items() if tp.topic == self.topic and o.offset >= 0)
                end = sum(consumer.end_offsets(parts).values())
                self.rows.append((time.time(), done, end))
        finally:
            admin.close()
            consumer.close()


def group_cpu_s(pgid: int) -> dict[str, float]:
    """CPU seconds (user + system) used so far by the live processes of group ``pgid``, by kind.

    ``jvm``: the java process (mini-cluster: every SQL operator, Kafka source, Java decode);
    ``python``: the rest (the CLI and PyFlink's Python workers: sink and any Python UDF).
    """
    tick = os.sysconf("SC_CLK_TCK")
    total = {"jvm": 0.0, "python": 0.0}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            head, rest = stat.read_text().rsplit(")", 1)
        except OSError:
            continue
        fields = rest.split()
        if int(fields[2]) == pgid:  # pgrp is the 5th field; [0] here is the 3rd (state)
            kind = "jvm" if head.endswith("(java") else "python"
            total[kind] += (int(fields[11]) + int(fields[12])) / tick  # utime, stime
    return total


def consumed_rate(rows: list[tuple[float, int, int]], t0: float, t1: float) -> float | None:
    """Committed-offset growth per second between the first and last change seen in [t0, t1]."""
    inside = [(t, c) for t, c, _ in rows if t0 <= t <= t1]
    changes = [(t, c) for k, (t, c) in enumerate(inside) if k == 0 or c != inside[k - 1][1]]
    if len(changes) < 3:
        return None
    (ta, ca), (tb, cb) = changes[1], changes[-1]
    return (cb - ca) / (tb - ta) if tb > ta else None


def percentiles(values: Sequence[float]) -> dict[str, float | int | None]:
    """p50/p99/max (ms) and count of a list of values."""
    if not values:
        return {"n": 0, "p50_ms": None, "p99_ms": None, "max_ms": None}
    arr = np.asarray(values, dtype=float)
    return {"n": len(values), "p50_ms": round(float(np.percentile(arr, 50))),
            "p99_ms": round(float(np.percentile(arr, 99))), "max_ms": round(float(arr.max()))}  # fmt: skip


def start_job(
    state: Path, source: str, topic: str, namespace: str, group: str, chk: Path, log: Path
) -> subprocess.Popen[bytes]:
    """Start `headwater run realtime` in its own process group (so it is stopped as a whole)."""
    cmd = [sys.executable, "-m", "headwater.cli.realtime", "--state-dir", str(state),
           "--checkpoint-dir", str(chk), "--source", source, "--topic", f"{source}={topic}",
           "--dlq-topic", f"{topic}.dlq", "--namespace", namespace, "--group-id", group,
           "--checkpoint-interval", "5", "--parallelism", "2", "--from-earliest"]  # fmt: skip
    return subprocess.Popen(
        cmd, cwd=ROOT, stdout=log.open("ab"), stderr=subprocess.STDOUT, start_new_session=True
    )


def run_phase(settings: Settings, topic: str, rate: float, seconds: float, tag: str,
              pieces: list[Piece], per_process: float) -> tuple[dict[str, Any], list[Probe]]:  # fmt: skip
    """Produce at ``rate`` with enough processes; return what was sent, how well pacing held, probes."""
    n = max(1, int(np.ceil(rate / per_process)))
    queue: Any = mp.get_context("spawn").Queue()
    procs = [
        mp.get_context("spawn").Process(
            target=produce,
            args=(settings.kafka_bootstrap, topic, rate / n, seconds, f"{tag}{k}", pieces, queue),
        )
        for k in range(n)
    ]
    for p in procs:
        p.start()
    results = [queue.get(timeout=seconds + 120) for _ in procs]
    for p in procs:
        p.join()
    sent = sum(r[0] for r in results)
    probes = [p for r in results for p in r[3]]
    return {"producers": n, "sent": sent, "produced_eps": round(sent / max(r[1] for r in results)),
            "producer_behind_max_s": round(max(r[2] for r in results), 3)}, probes  # fmt: skip


def view_freshness(
    plan: TierPlan,
    sampler: Sampler,
    new: list[tuple[str, int, int]],
    probes: list[tuple[str, str, int]],
    sent_until_ms: int,
) -> dict[str, Any]:
    """Per view: (a) write - B of the new values, (b) write - event time of the probe events.

    (b) is measured per probe event (entity e, time t): the write of e's value at its boundary
    B = the first slide boundary after t (the value changes there: t entered the window). A probe
    whose boundary was not seen (the event passes none of the view's filters, or the value
    changed again within the sampler's 1 s period) is counted as ``unmatched``, not guessed. Probes
    whose boundary comes after the last event sent (``sent_until_ms``) are left out: no later event
    moves the job's clock past it.
    """
    out: dict[str, Any] = {}
    for v in plan.views:
        slide_ms = round(v.features[0].slide_s * 1000)
        e2w = []
        unmatched = 0
        for user, item, t in probes:
            entity = user if v.join_key == "user_id" else item
            b = (t // slide_ms + 1) * slide_ms
            if b > sent_until_ms:
                continue
            w = sampler.writes.get((v.name, entity, b))
            if w is None:
                unmatched += 1
            else:
                e2w.append(w - t)
        out[v.name] = {
            "write_minus_boundary": percentiles([w - b for view, b, w in new if view == v.name]),
            "event_to_write": {**percentiles(e2w), "unmatched_probes": unmatched},
        }
    return out


def main() -> None:
    """Run the benchmark and write bench/results/realtime.json."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rates", default="1000,5000,10000")
    ap.add_argument("--more", default="15000,20000,30000", help="rates tried after --rates while each holds")
    ap.add_argument("--phase-s", type=float, default=120.0, help="seconds per rate (the issue: >= 120)")
    ap.add_argument("--quick", action="store_true", help="20 s phases, 1k/5k/10k only: a smoke run")
    ap.add_argument("--source", default="events", help="the behaviour source of the registry (its views run)")
    ap.add_argument("--settle-s", type=float, default=15.0, help="quiet time after each phase (drain)")
    ap.add_argument("--users", type=int, default=5000)
    ap.add_argument("--items", type=int, default=2000)
    ap.add_argument("--per-producer", type=float, default=5000.0, help="events/s one producer process sends")
    ap.add_argument("--out", type=Path, default=ROOT / "bench/results/realtime.json")
    ap.add_argument("--registry", type=Path, default=ROOT / "features", help="feature repo to apply")
    ap.add_argument("--label", default="registry", help="name of this run in the JSON (other runs are kept)")
    args = ap.parse_args()
    if args.quick:
        args.phase_s, args.settle_s, args.more = 20.0, 10.0, ""

    from headwater.pipelines import jvm

    if not any(j.name.startswith("zstd-jni") for j in jvm.jars("flink")):
        sys.exit(
            f"no zstd-jni jar in {jvm.LIB_DIR / 'flink'}: the job could not read the zstd-compressed "
            "topic (NoClassDefFoundError com/github/luben/zstd/BufferPool); see this file's docstring"
        )
    settings = Settings.from_env()
    tag = uuid.uuid4().hex[:8]
    work = Path(tempfile.mkdtemp(prefix="bench_rt_"))
    state = work / "state"
    done = subprocess.run([str(Path(sys.executable).parent / "headwater"), "apply", str(args.registry),
                           "--state-dir", str(state), "--no-feast"], cwd=ROOT, capture_output=True, text=True,
                          check=False)  # fmt: skip
    if done.returncode != 0:
        sys.exit(f"headwater apply failed:\n{done.stdout}{done.stderr}")
    plan = read_plan(state, "realtime")
    source = next((s for s in plan.sources if s.name == args.source), None)
    if source is None:
        sys.exit(f"source {args.source!r} is not in the realtime plan ({[s.name for s in plan.sources]})")
    plan = plan.model_copy(update={"views": [v for v in plan.views if v.source == source.name]})
    pieces, users, items = templates(args.users, args.items, 60_000)
    ids = {v.name: sorted(users if v.join_key == "user_id" else items) for v in plan.views}

    from kafka import KafkaAdminClient
    from kafka.admin import NewTopic

    topic, group, namespace = f"bench.rt.{tag}", f"bench-rt-{tag}", f"hwbench{tag}"
    admin = KafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap)
    admin.create_topics([NewTopic(topic, settings.partitions, 1), NewTopic(f"{topic}.dlq", 1, 1)])
    log = work / "job.log"
    load_start = os.getloadavg()
    t_start = time.time()
    job = start_job(state, source.name, topic, namespace, group, work / "chk", log)
    sampler = Sampler(plan, settings.redis_url, namespace, ids)
    watch = OffsetWatch(settings.kafka_bootstrap, group, topic)
    threads = [
        threading.Thread(target=sampler.run, daemon=True),
        threading.Thread(target=watch.run, daemon=True),
    ]
    for t in threads:
        t.start()
    phases: list[dict[str, Any]] = []
    try:
        # warm-up: a trickle until the first value is written (JVM, Python workers, first boundary)
        while not sampler.samples:
            if job.poll() is not None:
                sys.exit(f"the job exited ({job.returncode}); log: {log}")
            run_phase(settings, topic, 100, 5, f"{tag}w", pieces, args.per_producer)  # probes unused
            if time.time() - t_start > 600:
                sys.exit(f"no value written after 600 s; log: {log}")
        startup_s = time.time() - t_start
        print(f"first value after {startup_s:.0f} s (JVM + job start + first boundary)")
        rates = [float(r) for r in args.rates.split(",")]
        more = [float(r) for r in args.more.split(",") if r]
        while rates:
            rate = rates.pop(0)
            n0 = len(sampler.samples)
            t0 = time.time()
            cpu0, c0 = group_cpu_s(job.pid), watch.rows[-1][1] if watch.rows else 0
            sent, probes = run_phase(
                settings, topic, rate, args.phase_s, f"{tag}r{int(rate)}", pieces, args.per_producer
            )
            t1 = time.time()
            time.sleep(args.settle_s)
            t2 = time.time()
            cpu_by = {k: v - cpu0[k] for k, v in group_cpu_s(job.pid).items()}
            cpu = sum(cpu_by.values())
            c2 = watch.rows[-1][1] if watch.rows else 0
            rows = [r for r in watch.rows if t0 <= r[0] <= t1]
            lag_end = rows[-1][2] - rows[-1][1] if rows else None
            consumed = consumed_rate(watch.rows, t0, t1 + 3)
            phase = {"rate": int(rate), "seconds": round(t1 - t0, 1), **sent,
                     "consumed_eps": round(consumed) if consumed else None, "lag_end": lag_end,
                     "load_average_end": [round(x, 2) for x in os.getloadavg()],
                     "job_cpu_cores": round(cpu / (t2 - t0), 2),
                     "job_cpu_cores_by_kind": {k: round(v / (t2 - t0), 2) for k, v in cpu_by.items()},
                     "events_per_job_cpu_s": round((c2 - c0) / cpu) if cpu > 0 else None}  # fmt: skip
            new = [s for s in sampler.samples[n0:] if t0 * 1000 <= s[2] <= t1 * 1000]
            phase["values_written"] = len(new)
            phase["freshness"] = view_freshness(plan, sampler, new, probes, int(t1 * 1000))
            phase["producer_short"] = sent["produced_eps"] < 0.95 * rate
            phase["holds"] = bool(consumed and consumed >= 0.95 * rate and (lag_end or 0) <= 10 * rate)
            phases.append(phase)
            print(json.dumps(phase))
            if not phase["holds"] or phase["producer_short"]:
                break
            if not rates and more:
                rates.append(more.pop(0))
    finally:
        sampler.stop.set()
        watch.stop.set()
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGTERM)
            try:
                job.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(job.pid, signal.SIGKILL)
        admin.delete_topics([topic, f"{topic}.dlq"])
        admin.close()
        import redis

        client = redis.Redis.from_url(settings.redis_url)
        keys = list(client.scan_iter(match=f"{namespace}:*", count=1000))
        if keys:
            client.delete(*keys)
        client.close()

    ooo_ms = source.max_out_of_orderness_ms
    result = {
        "benchmark": "realtime",
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"cpus": os.cpu_count(), "load_average_at_start": [round(x, 2) for x in load_start],
                    "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
                    "python": platform.python_version(), "note": "the load averages say what else ran"},
        "setup": {"registry": str(args.registry), "views": [v.name for v in plan.views],
                  "users": len(users), "items": len(items),
                  "parallelism": 2, "checkpoint_interval_s": 5, "partitions": settings.partitions,
                  "phase_s": args.phase_s, "settle_s": args.settle_s,
                  "source": source.name, "decode": "java (generic: the plan source's schemas)",
                  "probe_every": PROBE_EVERY,
                  "note": f"{args.phase_s:g} s per rate" + (" (--quick: shorter than the issue's 2 min)"
                                                            if args.phase_s < 120 else "")},
        "startup_s": round(startup_s, 1),
        "floor": {"write_minus_boundary_ms": 0,
                  "event_to_write_max_ms": {v.name: round(v.features[0].slide_s * 1000) for v in plan.views},
                  "out_of_orderness_ms": ooo_ms,
                  "why": "B is published when the job's clock (the newest event time) passes B, and revised "
                         "by out-of-order events within the allowed lateness; an event waits up to one slide "
                         "for its boundary"},
        "phases": phases,
        "highest_rate_held": max((p["rate"] for p in phases if p["holds"]), default=None),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
    }  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    previous = json.loads(args.out.read_text()) if args.out.exists() else {}
    runs = previous.get("runs", {}) if previous.get("benchmark") == "realtime" else {}
    runs[args.label] = result
    kept = previous if previous.get("benchmark") == "realtime" else {}  # notes beside the runs stay
    args.out.write_text(json.dumps({**kept, "benchmark": "realtime", "runs": runs}, indent=2) + "\n")
    print_table(result)


def print_table(result: dict[str, Any]) -> None:
    """Print one line per rate and view."""
    print(
        f"\nstart-up {result['startup_s']} s; floor write-B {result['floor']['write_minus_boundary_ms']} ms"
    )
    print(f"{'rate':>7} {'produced':>9} {'consumed':>9} {'lag_end':>8} {'view':<24} {'n':>6} "
          f"{'w-B p50':>8} {'w-B p99':>8} {'e2w p50':>8} {'e2w p99':>8} {'load':>5} holds")  # fmt: skip
    for p in result["phases"]:
        for view, f in p["freshness"].items():
            wb, ew = f["write_minus_boundary"], f["event_to_write"]
            cells = [f"{p['rate']:>7}", f"{p['produced_eps']:>9}", f"{p['consumed_eps'] or '-':>9}",
                     f"{p['lag_end'] or 0:>8}", f"{view:<24}", f"{wb['n']:>6}", f"{wb['p50_ms'] or '-':>8}",
                     f"{wb['p99_ms'] or '-':>8}", f"{ew['p50_ms'] or '-':>8}", f"{ew['p99_ms'] or '-':>8}",
                     f"{p['load_average_end'][0]:>5}", str(p["holds"])]  # fmt: skip
            print(" ".join(cells))


if __name__ == "__main__":
    main()
