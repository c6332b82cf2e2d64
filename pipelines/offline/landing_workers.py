"""Landing with several reader processes: each consumes and decodes its own partitions of a batch.

Reading Kafka and decoding Avro are per-record Python (about 35 us per event), the one part of
landing that does not run in the JVM. With ``workers > 1`` the topic's partitions are dealt
out to that many processes (spawned once per run). For each batch the lander snapshots the end
offsets, then every worker reads its partitions from the checkpoint's positions up to those
ends (or its share of ``batch_records``), decodes them with :func:`.landing_batch.decode_records`,
sends and flushes its dead letters, and returns Arrow rows, next positions and watermarks. The
lander alone commits, so exactly-once is unchanged: one Delta commit holds all the rows of the
batch and the positions after them; a worker that fails fails the batch before its commit.
"""

from __future__ import annotations

import multiprocessing
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from headwater.pipelines import kafka as kafka_clients
from headwater.pipelines.events.timing import SourceTiming
from headwater.pipelines.offline.landing_state import Checkpoint
from headwater.registry.plans import PlanSource

if TYPE_CHECKING:
    from kafka import KafkaConsumer, KafkaProducer

    from headwater.pipelines.events.codec import EventCodec

_WORKER: dict[str, Any] = {}
CHUNK_RECORDS = 50_000
STALL_S = 120.0
"""A worker that gets no record of a partition behind its end offset for this long fails the batch."""


@dataclass(frozen=True)
class SliceTask:
    """What one worker reads in a batch: start and end offset per partition, at most ``budget`` records."""

    starts: dict[int, int]
    ends: dict[int, int]
    max_event_ms: dict[int, int]
    budget: int


@dataclass
class SliceResult:
    """What one worker read: rows, next positions, watermarks and dead-letter reasons."""

    table: pa.Table
    next_offsets: dict[int, int]
    max_event_ms: dict[int, int]
    records: int
    reasons: dict[str, int] = field(default_factory=dict)


def _init(bootstrap: str, source: PlanSource, dlq_topic: str, poll_timeout_ms: int) -> None:
    """Open this worker's consumer, dead-letter producer and the source's codec (once per process)."""
    from headwater.pipelines.events.codec import EventCodec

    _WORKER.update(
        topic=source.topic, dlq_topic=dlq_topic, rules=SourceTiming.of(source),
        poll_timeout_ms=poll_timeout_ms,
        codec=EventCodec(source),
        consumer=kafka_clients.consumer(bootstrap, group_id=None, enable_auto_commit=False,
                                        auto_offset_reset="earliest",
                                        fetch_max_bytes=64 * 1024 * 1024,
                                        max_partition_fetch_bytes=16 * 1024 * 1024,
                                        client_id="headwater-landing-worker"),
        producer=kafka_clients.producer(bootstrap, acks="all", enable_idempotence=True, linger_ms=5,
                                        client_id="headwater-landing-dlq"),
    )  # fmt: skip


def read_slice(task: SliceTask) -> SliceResult:
    """In a worker: read, decode and dead-letter the task's records; return their rows."""
    from kafka import TopicPartition

    from headwater.pipelines.events.codec import dead_letter
    from headwater.pipelines.offline.landing_batch import decode_records

    w = _WORKER
    consumer: KafkaConsumer = w["consumer"]
    producer: KafkaProducer = w["producer"]
    codec: EventCodec = w["codec"]
    todo = {p: TopicPartition(w["topic"], p) for p, start in task.starts.items() if start < task.ends[p]}
    consumer.assign(list(todo.values()))
    for p, tp in todo.items():
        consumer.seek(tp, task.starts[p])
    result = SliceResult(pa.table({}), dict(task.starts), dict(task.max_event_ms), 0)
    tables, futures = [], []
    deadline = time.monotonic() + STALL_S
    while todo and result.records < task.budget:
        if time.monotonic() > deadline:
            msg = f"no records from partitions {sorted(todo)} of {w['topic']!r} for {STALL_S:.0f} s"
            raise TimeoutError(msg)
        budget = min(CHUNK_RECORDS, task.budget - result.records)
        polled = consumer.poll(timeout_ms=w["poll_timeout_ms"], max_records=budget)
        records = [r for tp, batch in polled.items() if tp.partition in todo for r in batch
                   if r.offset < task.ends[tp.partition]]  # fmt: skip
        if records:
            deadline = time.monotonic() + STALL_S
        now_ms = time.time_ns() // 1_000_000
        chunk = decode_records(codec, records, w["rules"], result.max_event_ms, now_ms)
        tables.append(chunk.table)
        result.records += len(records)
        result.next_offsets.update(chunk.next_offsets)
        for bad in chunk.rejected:
            letter = dead_letter(bad.record, bad.reason, bad.detail)
            futures.append(producer.send(w["dlq_topic"], value=letter.value, key=letter.key,
                                         headers=letter.kafka_headers()))  # fmt: skip
            result.reasons[bad.reason] = result.reasons.get(bad.reason, 0) + 1
        for p in [p for p, tp in todo.items() if consumer.position(tp) >= task.ends[p]]:
            result.next_offsets[p] = task.ends[p]  # every record before the end was seen
            consumer.pause(todo.pop(p))
    producer.flush(timeout=60)
    for future in futures:
        future.get(timeout=60)  # the broker's error fails the batch before its commit
    result.table = pa.concat_tables(tables) if tables else result.table
    return result


def worker_pool(
    workers: int, bootstrap: str, source: PlanSource, dlq_topic: str, poll_timeout_ms: int
) -> ProcessPoolExecutor:
    """Start ``workers`` reader processes for ``source`` (spawned: the parent holds a JVM gateway)."""
    return ProcessPoolExecutor(
        workers, mp_context=multiprocessing.get_context("spawn"), initializer=_init,
        initargs=(bootstrap, source, dlq_topic, poll_timeout_ms),
    )  # fmt: skip


def deal(partitions: list[int], workers: int) -> list[list[int]]:
    """Partitions dealt round-robin to ``workers`` (no empty hand)."""
    hands = [partitions[i::workers] for i in range(min(workers, len(partitions)))]
    return [h for h in hands if h]


def collect_parallel(
    pool: ProcessPoolExecutor,
    hands: list[list[int]],
    starts: dict[int, int],
    ends: dict[int, int],
    checkpoint: Checkpoint,
    batch_records: int,
) -> tuple[pa.Table, Checkpoint, int, dict[str, int]] | None:
    """Read one batch with the pool; return rows, the checkpoint after them, records read, reasons."""
    budget = max(1, batch_records // len(hands))
    tasks = [
        SliceTask({p: starts[p] for p in hand}, {p: ends[p] for p in hand},
                  {p: checkpoint.max_event_ms[p] for p in hand if p in checkpoint.max_event_ms}, budget)
        for hand in hands
    ]  # fmt: skip
    results = list(pool.map(read_slice, tasks))
    records = sum(r.records for r in results)
    if records == 0:
        return None
    after = Checkpoint(checkpoint.seq + 1, dict(checkpoint.offsets), dict(checkpoint.max_event_ms))
    reasons: dict[str, int] = {}
    for r in results:
        after.offsets.update(r.next_offsets)
        after.max_event_ms.update(r.max_event_ms)
        for reason, n in r.reasons.items():
            reasons[reason] = reasons.get(reason, 0) + n
    tables = [r.table for r in results if r.table.num_columns]
    return pa.concat_tables(tables), after, records, reasons
