"""The nearline worker: a kafka-python consumer group member that owns some partitions of ``events``.

It also consumes the repartition topics of views keyed by another field (``repartition.py``):
a partition of any topic it owns is one task with its own store and changelog partition.
Each poll batch is committed in this order (a kill -9 between any two steps loses nothing and
counts nothing twice):

1. **Changelog first (write-ahead).** Every store change of the batch (pane records, dedup ids,
   outbox, and last the meta record with the next source offset) is produced to the compacted
   changelog topic, partition = source partition, with the dead letters of the batch; the
   producer is flushed. A crash after this step leaves the changelog ahead of the local store:
   the next owner replays the changelog tail, and because each pane record carries the offset
   of the last event it holds (``hw``), re-reading those events from the older offset skips them.
   Events forwarded to a repartition topic, then a watermark marker per partition, are produced
   here too; after a crash they are forwarded again and the downstream task skips them.
2. **RocksDB.** The same changes, the consumed offset (in the meta record) and the changelog
   position go into the partition's store in ONE write batch. This is the commit point.
3. **Online writes.** The values of the outbox (entities whose value changed, at the view's
   boundary B) are written to Redis. Writes are idempotent (same B and value: no-op), and the
   outbox stays in the store until the next batch, so a crash here re-publishes it on restart.
4. **Kafka offset commit.** Only for monitoring and lag: on (re)assignment a partition resumes
   from the offset in its store, never from the group's committed offset.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kafka import ConsumerRebalanceListener, KafkaConsumer, KafkaProducer, OffsetAndMetadata, TopicPartition

from headwater.pipelines.events.codec import EventCodec
from headwater.pipelines.nearline.plan import NearlinePlan
from headwater.pipelines.nearline.repartition import (
    RepartitionedTask,
    forwarded_record,
    marker_headers,
    repartition_changelog,
    repartition_topic,
)
from headwater.pipelines.nearline.restore import check_crcs, restore_partition
from headwater.pipelines.nearline.state import PartitionStore
from headwater.pipelines.nearline.task import BatchOutput, PartitionTask
from headwater.pipelines.settings import Settings
from headwater.pipelines.store import OnlineStore, epoch_ms
from headwater.pipelines.windows import RedisDictionary, to_vectors

log = logging.getLogger("headwater.nearline")


@dataclass(frozen=True)
class NearlineConfig:
    """Everything a worker needs; the CLI builds it."""

    settings: Settings
    plan_dir: Path
    state_root: Path
    group_id: str = "headwater-nearline"
    namespace: str = "hw"
    max_poll_records: int = 20_000
    checkpoint_interval_s: float = 60.0
    session_timeout_ms: int = 10_000
    stats_path: Path | None = None
    refresh_unchanged: bool = True
    """Re-publish every live entity at each new boundary (stored event time = the latest B)."""
    check_crcs: bool | None = None
    """Verify record CRCs when consuming; None: only when the C ``crc32c`` module is installed
    (kafka-python's pure-Python CRC-32C costs more than the rest of the pipeline together)."""

    @property
    def changelog_topic(self) -> str:
        """The compacted changelog topic of this consumer group."""
        return f"{self.group_id}-changelog"


class _Listener(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, worker: NearlineWorker) -> None:
        self.worker = worker

    def on_partitions_revoked(self, revoked: Sequence[TopicPartition]) -> None:
        self.worker.close_tasks(list(revoked))

    def on_partitions_assigned(self, assigned: Sequence[TopicPartition]) -> None:
        self.worker.open_tasks(list(assigned))


class NearlineWorker:
    """One consumer-group member: restores its partitions, runs the commit protocol per poll."""

    def __init__(self, config: NearlineConfig, plan: NearlinePlan) -> None:
        self.config = config
        self.plan = plan
        self.codec = EventCodec()
        s = config.settings
        self.topic = s.events_topic
        self.by_key = {repartition_topic(config.group_id, k): k for k in plan.repartitioned}
        """Repartition topic -> the join key it is keyed by."""
        self.consumer = KafkaConsumer(
            bootstrap_servers=s.kafka_bootstrap,
            group_id=config.group_id,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            max_partition_fetch_bytes=4 * 1024 * 1024,
            fetch_max_bytes=32 * 1024 * 1024,
            session_timeout_ms=config.session_timeout_ms,
            heartbeat_interval_ms=max(1000, config.session_timeout_ms // 4),
            max_poll_interval_ms=600_000,
            check_crcs=check_crcs(config.check_crcs),
        )
        self.producer = KafkaProducer(
            bootstrap_servers=s.kafka_bootstrap,
            acks="all",
            linger_ms=5,
            batch_size=512 * 1024,
            max_request_size=8 * 1024 * 1024,
            compression_type="zstd",  # fewer bytes through kafka-python's Python send path and CRC
            retries=10,
        )
        self.online = OnlineStore.from_url(s.redis_url, namespace=config.namespace)
        self.dictionary = RedisDictionary(self.online.client, namespace=config.namespace)
        self.tasks: dict[TopicPartition, PartitionTask] = {}
        self.upstream_partitions = 0
        self.changelogs: dict[TopicPartition, str] = {}
        self.last_checkpoint = time.monotonic()
        self.counters: dict[str, float] = {
            "events": 0,
            "dead": 0,
            "duplicates": 0,
            "expired_panes": 0,
            "written": 0,
            "batches": 0,
            "restore_s": 0.0,
        }
        self.freshness_ms: list[tuple[int, int]] = []
        """(write time - boundary B in ms, rows written) per online write batch (first 200k)."""

    # -- assignment ----------------------------------------------------------------------------
    def _new_task(self, tp: TopicPartition) -> tuple[PartitionTask, str]:
        """Return the task of an assigned partition and its changelog topic."""
        c, plan, p = self.config, self.plan, tp.partition
        if tp.topic == self.topic:
            store = PartitionStore(c.state_root, p)
            task = PartitionTask(
                p,
                store,
                plan.views,
                plan.timing,
                plan.registry_hash,
                self.codec,
                refresh_all=c.refresh_unchanged,
                forward_keys=tuple(plan.repartitioned),
            )
            return task, c.changelog_topic
        key = self.by_key[tp.topic]
        store = PartitionStore(c.state_root / f"by-{key}", p)
        upstream = self.upstream_partitions or len(self.producer.partitions_for(self.topic))
        self.upstream_partitions = upstream
        views = plan.repartitioned[key]
        task = RepartitionedTask(
            p, store, views, plan.timing, plan.registry_hash, upstream, refresh_all=c.refresh_unchanged
        )
        return task, repartition_changelog(c.group_id, key)

    def open_tasks(self, assigned: list[TopicPartition]) -> None:
        """Restore each assigned partition (local store, checkpoint, changelog) and seek to its offset."""
        for tp in assigned:
            started = time.monotonic()
            task, changelog = self._new_task(tp)
            replayed = restore_partition(self.config.settings, changelog, tp.partition, task.store, task)
            if task.next_offset is not None:
                self.consumer.seek(tp, task.next_offset)
            else:
                self.consumer.seek_to_beginning(tp)
            self.tasks[tp] = task
            self.changelogs[tp] = changelog
            took = time.monotonic() - started
            self.counters["restore_s"] += took
            log.info(
                "%s partition %d restored from %s + %d changelog records in %.2f s, resuming at offset %s",
                tp.topic,
                tp.partition,
                task.store.restored_from,
                replayed,
                took,
                task.next_offset,
            )
            self._publish({tp: task.restored_publish()})

    def close_tasks(self, revoked: list[TopicPartition]) -> None:
        """Close the stores of revoked partitions (their state is committed after every batch)."""
        for tp in revoked:
            task = self.tasks.pop(tp, None)
            if task is not None:
                task.store.close()

    # -- loop ----------------------------------------------------------------------------------
    def run(self, stop: threading.Event, idle_exit_s: float | None = None) -> None:
        """Poll and commit until ``stop`` is set (or ``idle_exit_s`` without records)."""
        self.consumer.subscribe([self.topic, *self.by_key], listener=_Listener(self))
        idle_since = time.monotonic()
        try:
            while not stop.is_set():
                polled = self.consumer.poll(timeout_ms=500, max_records=self.config.max_poll_records)
                if not self.tasks:
                    idle_since = time.monotonic()  # idle only counts while owning partitions
                if not polled:
                    if idle_exit_s is not None and time.monotonic() - idle_since > idle_exit_s:
                        break
                    self._maybe_checkpoint()
                    continue
                idle_since = time.monotonic()
                self.commit_batch({tp: recs for tp, recs in polled.items() if tp in self.tasks})
        finally:
            self.close()

    def commit_batch(self, polled: dict[TopicPartition, list[Any]]) -> None:
        """Process one poll and run the commit protocol (module docstring, steps 1 to 4)."""
        now = epoch_ms()
        if not self.counters["batches"]:
            self.counters["first_batch_at"] = time.time()
        clock = _PhaseClock(self.counters)
        outputs = {p: self.tasks[p].process(recs, now) for p, recs in polled.items()}
        clock.lap("t_process")
        # Step 1: changelog (write-ahead), dead letters, forwarded events and markers, flushed.
        futures = {}
        for tp, out in outputs.items():
            for key, value in out.changes.items():
                futures[tp] = self.producer.send(
                    self.changelogs[tp], key=key, value=value, partition=tp.partition
                )
            for dl in out.dead:
                self.producer.send(
                    self.config.settings.dlq_topic, key=dl.key, value=dl.value, headers=dl.kafka_headers()
                )
            if self.by_key and tp.topic == self.topic:
                self._forward(tp.partition, out)
        self.producer.flush()
        clock.lap("t_changelog")
        # Step 2: state changes + consumed offset + changelog position, one RocksDB write batch.
        for tp, out in outputs.items():
            self.tasks[tp].store.commit(out.changes, futures[tp].get(timeout=30).offset)
        clock.lap("t_rocksdb")
        # Step 3: online writes (idempotent; the outbox committed in step 2 replays them after a crash).
        self._publish({tp: out.publish for tp, out in outputs.items()})
        clock.lap("t_publish")
        # Step 4: Kafka offset commit (monitoring only: the store's offset is the source of truth).
        offsets = {
            tp: OffsetAndMetadata(out.next_offset, "", -1)
            for tp, out in outputs.items()
            if out.next_offset is not None
        }
        if offsets:
            self.consumer.commit(offsets)
        clock.lap("t_commit")
        self.counters["last_batch_at"] = time.time()
        self._count(outputs)
        self._maybe_checkpoint()

    def _forward(self, partition: int, out: BatchOutput) -> None:
        """Send the batch's events to each repartition topic, then a watermark marker to every partition."""
        for key, value, event, offset in out.forward:
            payload, headers = forwarded_record(event, partition, offset)
            topic = repartition_topic(self.config.group_id, key)
            self.producer.send(topic, key=str(value).encode(), value=payload, headers=headers)
        if out.watermark is None:
            return
        for topic in self.by_key:
            for q in self.producer.partitions_for(topic):
                self.producer.send(
                    topic, value=b"", partition=q, headers=marker_headers(partition, out.watermark)
                )

    def _publish(self, by_partition: dict[TopicPartition, dict[str, tuple[int, list[str]]]]) -> None:
        for tp, publish in by_partition.items():
            task = self.tasks[tp]
            for view, (boundary, entities) in publish.items():
                if not entities or boundary <= 0:
                    continue
                spec = task.views[view].spec
                rows = task.values(view, entities, boundary)
                vectors = to_vectors(spec, rows, self.dictionary.ids)
                res = self.online.write_batch(self.plan.layouts[view], entities, vectors, boundary)
                self.counters["written"] += res.written
                if res.written and len(self.freshness_ms) < 200_000:
                    self.freshness_ms.append((epoch_ms() - boundary, res.written))

    def _count(self, outputs: dict[TopicPartition, BatchOutput]) -> None:
        c = self.counters
        c["batches"] += 1
        for out in outputs.values():
            c["events"] += out.events
            c["dead"] += len(out.dead)
            c["duplicates"] += out.duplicates
            c["expired_panes"] += out.expired_panes

    def _maybe_checkpoint(self) -> None:
        if time.monotonic() - self.last_checkpoint < self.config.checkpoint_interval_s:
            return
        for task in self.tasks.values():
            task.store.checkpoint()
        self.last_checkpoint = time.monotonic()
        self.write_stats()

    def write_stats(self) -> None:
        """Write counters and state sizes to ``stats_path`` (JSON) when configured."""
        if self.config.stats_path is None:
            return
        data = {
            "counters": {**self.counters, "cpu_s": time.process_time()},
            "tasks": [t.stats() for t in self.tasks.values()],
            "state_bytes": {
                f"{tp.topic}:{tp.partition}": t.store.size_bytes() for tp, t in self.tasks.items()
            },
            "freshness_ms": self.freshness_ms[-20_000:],
        }
        tmp = self.config.stats_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data), encoding="utf-8")
        tmp.replace(self.config.stats_path)

    def close(self) -> None:
        """Write stats, close stores, the consumer (leaving the group), the producer and Redis."""
        with contextlib.suppress(OSError):
            self.write_stats()
        self.close_tasks(list(self.tasks))
        self.consumer.close(autocommit=False)
        self.producer.close(timeout=10)
        self.online.close()


class _PhaseClock:
    """Adds the seconds since the previous lap to ``counters[name]`` (the benchmark's breakdown)."""

    def __init__(self, counters: dict[str, float]) -> None:
        self.counters = counters
        self.last = time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.counters[name] = self.counters.get(name, 0.0) + now - self.last
        self.last = now


def run_worker(config: NearlineConfig, idle_exit_s: float | None = None) -> None:
    """Entry point of one worker process (stops on SIGTERM/SIGINT after the current batch)."""
    import signal

    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s nearline[%(process)d] %(levelname)s %(message)s",
    )
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    plan = NearlinePlan.load(config)
    NearlineWorker(config, plan).run(stop, idle_exit_s=idle_exit_s)
