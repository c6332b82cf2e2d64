"""The nearline worker: a kafka-python consumer group member that owns some partitions of the sources.

One consumer reads the topic of every source of the plan (``plan.py``) and the repartition topics
of the views keyed by another field than their source's key (``repartition.py``): a partition of
any topic it owns is one task with its own store and changelog partition, and the records of a
source's partition are decoded with that source's codec (built from the plan's source).
Each poll batch is committed in this order, per partition task (a kill -9 between any two steps
loses nothing and counts nothing twice; a zombie worker is fenced, see ``fence.py``):

1. **One Kafka transaction per task.** The task's transactional producer (``fence.py``: stable
   ``transactional.id`` per task, so a new owner fences the old one) sends, in one transaction,
   the dead letters, the events forwarded to repartition topics and a watermark marker per
   repartition partition, every store change of the batch (pane records, dedup ids, outbox, and
   the meta record: next source offset, max event time, boundaries) to the compacted changelog
   (partition = source partition), and the consumed offset (``send_offsets_to_transaction``), then
   commits. Every reader of these topics reads ``read_committed``: a batch is all on Kafka or not
   at all, so a crash before the commit re-runs the batch and a dead letter is sent exactly once.
2. **RocksDB.** The same changes, the consumed offset (in the meta record) and the changelog
   position go into the partition's store in ONE write batch. This is the local commit point; a
   crash before it leaves the changelog ahead of the local store, and the next owner replays the
   changelog tail.
3. **Online writes.** The values of the outbox (entities whose value changed, at the view's
   boundary B) are written to Redis, fenced by the task's owner epoch (``fence.py``). Writes are
   idempotent (same B and value: no-op), and the outbox stays in the store until the next batch,
   so a crash here re-publishes it on restart.

On (re)assignment a partition resumes from the offset in its store (the group's committed offset,
committed in the same transaction, is for lag monitoring and for fencing a stale generation).

Idle source partitions: stage B's watermark is the minimum over its source's partitions, so one
source partition without events would hold the repartitioned views' boundary back forever. A
source partition that is caught up (position = high watermark) and got no record for
``idle_timeout_s`` is announced idle to stage B (``repartition.py``), like Flink's
``withIdleness``; its next batch makes it active again.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kafka import ConsumerRebalanceListener, OffsetAndMetadata, TopicPartition
from kafka.errors import KafkaError
from redis.exceptions import RedisError

from headwater.pipelines import kafka as kafka_clients
from headwater.pipelines.events.codec import EventCodec
from headwater.pipelines.freshness.repairs import RepairCounts, add_repair_counts
from headwater.pipelines.nearline.backfill import backfill
from headwater.pipelines.nearline.fence import NearlineFencedError, TaskProducer, transactional_id
from headwater.pipelines.nearline.partitioning import first_misplaced
from headwater.pipelines.nearline.plan import NearlinePlan, SourcePlan, changelog_topic
from headwater.pipelines.nearline.repair import Repairer, RepairStore, StepResult
from headwater.pipelines.nearline.repartition import (
    IdleSources,
    RepartitionedTask,
    forwarded_record,
    idle_headers,
    marker_headers,
    repartition_changelog,
    repartition_topic,
)
from headwater.pipelines.nearline.restore import check_crcs, restore_partition
from headwater.pipelines.nearline.state import META_KEY, PartitionStore
from headwater.pipelines.nearline.supervise import supervise_worker
from headwater.pipelines.nearline.task import BatchOutput, PartitionTask
from headwater.pipelines.settings import Settings
from headwater.pipelines.store import OnlineStore, epoch_ms
from headwater.pipelines.store.connect import check_eviction_policy
from headwater.pipelines.store.store import FencedError
from headwater.pipelines.store.transport import StoreError
from headwater.pipelines.windows import RedisDictionary, to_vectors
from headwater.registry.errors import HeadwaterError

log = logging.getLogger("headwater.nearline")

PAUSE_ENV = "HEADWATER_NEARLINE_PAUSE_AT"
"""Test hook (the zombie tests): ``before_commit`` or ``before_publish`` makes the first batch with
records stop this process (SIGSTOP) at that step, once per process."""
_pause_at = [os.environ.get(PAUSE_ENV)]


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
    session_timeout_ms: int = 45_000
    """Kafka's own default. The rebalance callback (fencing each task's producer, restore, backfill)
    blocks heartbeats while it runs, about 1.5-2 s a partition here: longer than this and the group
    drops the worker, which rejoins and restores again (a rebalance storm, seen at 10 s)."""
    stats_path: Path | None = None
    refresh_unchanged: bool = True
    """Re-publish every live entity at each new boundary (stored event time = the latest B)."""
    idle_timeout_s: float | None = 60.0
    """A caught-up source partition without records this long is announced idle to the
    repartitioned views (None or 0: never); see ``repartition.py``."""
    check_crcs: bool | None = None
    """Verify record CRCs when consuming; None: only when the C ``crc32c`` module is installed
    (kafka-python's pure-Python CRC-32C costs more than the rest of the pipeline together)."""
    sources: tuple[str, ...] = ()
    """Run only these sources of the plan (empty: every source with a nearline view)."""


class NearlineCommitError(HeadwaterError, RuntimeError):
    """A step of the commit protocol failed; nothing of the batch is committed."""


class NearlineSetupError(HeadwaterError, RuntimeError):
    """Opening or closing partitions in the rebalance callback failed; the worker must restart."""


class _Listener(ConsumerRebalanceListener):  # type: ignore[misc]
    """Opens and closes tasks; a failure is kept for ``run`` to raise (the supervisor restarts).

    Without that, the consumer would own a partition without a task and ``run`` would skip its
    records (kafka-python only logs, or re-raises as a bare KafkaError, what a callback raises).
    """

    def __init__(self, worker: NearlineWorker) -> None:
        self.worker = worker

    def on_partitions_revoked(self, revoked: Sequence[TopicPartition]) -> None:
        try:
            self.worker.close_tasks(list(revoked))
        except Exception as exc:
            self.worker.setup_failed("closing", revoked, exc)

    def on_partitions_assigned(self, assigned: Sequence[TopicPartition]) -> None:
        try:
            self.worker.open_tasks(list(assigned))
        except Exception as exc:
            self.worker.setup_failed("opening", assigned, exc)


class NearlineWorker:
    """One consumer-group member: restores its partitions, runs the commit protocol per poll."""

    def __init__(self, config: NearlineConfig, plan: NearlinePlan) -> None:
        self.config = config
        self.plan = plan
        s = config.settings
        self.sources = {sp.topic: sp for sp in plan.sources}
        """Source topic -> its plan."""
        self.codecs = {sp.topic: EventCodec(sp.source) for sp in plan.sources}
        """Source topic -> the codec of its source (one per worker: codecs are not thread-safe)."""
        self.by_key = {
            repartition_topic(config.group_id, sp.name, k): (sp, k)
            for sp in plan.sources
            for k in sp.repartitioned
        }
        """Repartition topic -> (its source, the join key it is keyed by)."""
        self.forwards = {
            sp.topic: [repartition_topic(config.group_id, sp.name, k) for k in sp.repartitioned]
            for sp in plan.sources
        }
        """Source topic -> its repartition topics (empty: no view behind a repartition)."""
        self.consumer = kafka_clients.consumer(
            s.kafka_bootstrap,
            group_id=config.group_id,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            max_partition_fetch_bytes=4 * 1024 * 1024,
            fetch_max_bytes=32 * 1024 * 1024,
            session_timeout_ms=config.session_timeout_ms,
            heartbeat_interval_ms=max(1000, config.session_timeout_ms // 4),
            max_poll_interval_ms=600_000,
            check_crcs=check_crcs(config.check_crcs),
            isolation_level="read_committed",  # repartition topics are written in transactions
        )
        # zstd only without the C crc32c module (fewer bytes through the pure-Python CRC); with
        # it, compression costs more (sender-thread CPU, 2x the flush wall time) than it saves
        self.compression = None if check_crcs(None) else "zstd"
        self.producer = kafka_clients.producer(s.kafka_bootstrap)
        """Metadata only (partition counts); every record goes through a task's ``TaskProducer``."""
        self.txn: dict[TopicPartition, TaskProducer] = {}
        """The transactional producer of each task (``fence.py``)."""
        self.epochs: dict[TopicPartition, dict[str, int]] = {}
        """Each task's Redis fence epoch per view, claimed when it was assigned (``fence.py``)."""
        self.online = OnlineStore.from_url(s.redis_url, namespace=config.namespace)
        check_eviction_policy(self.online.client, allowed=s.redis_eviction, tier="the nearline tier")
        self.dictionary = RedisDictionary(self.online.client, namespace=config.namespace)
        self.tasks: dict[TopicPartition, PartitionTask] = {}
        self.idle = {
            topic: IdleSources(config.idle_timeout_s if self.forwards[topic] else None)
            for topic in self.sources
        }
        """Source topic -> the idle timer of its partitions (never fires without a repartition)."""
        self.upstream_partitions: dict[str, int] = {}
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
            "misplaced_batches": 0,
        }
        self.misplaced_topics: set[str] = set()
        """Source topics already logged for a record outside its key's partition (partitioning.py)."""
        self.freshness_ms: list[tuple[int, int]] = []
        """(write time - boundary B in ms, rows written) per online write batch (first 200k)."""
        self.repair = Repairer(s.repair_interval_s, s.repair_max_keys)
        """The reconciliation pass (``repair.py``): one step between two polls while one is under way."""
        self.repair_counts: dict[str, RepairCounts] = {}
        """Per view, what this worker's repair passes checked, found and repaired (stats file)."""
        self.assigned_at = 0.0
        """When the rebalance callback last opened partitions (restores do not count as idle time)."""
        self.setup_error: NearlineSetupError | None = None
        """A failure of the rebalance callback, raised by ``run`` after the poll that ran it."""

    # -- assignment ----------------------------------------------------------------------------
    def _new_task(self, tp: TopicPartition) -> tuple[PartitionTask, str]:
        """Return the task of an assigned partition and its changelog topic.

        Stores live under ``<state root>/<source>/p<N>`` (stage A) and
        ``<state root>/<source>/by-<field>/p<N>`` (stage B).
        """
        c, p = self.config, tp.partition
        sp = self.sources.get(tp.topic)
        if sp is not None:
            store = PartitionStore(c.state_root / sp.name, p)
            task = PartitionTask(
                p,
                store,
                sp.views,
                sp.timing,
                self.codecs[sp.topic],
                refresh_all=c.refresh_unchanged,
                forward_keys=tuple(sp.repartitioned),
            )
            return task, changelog_topic(c.group_id, sp.name)
        sp, key = self.by_key[tp.topic]
        store = PartitionStore(c.state_root / sp.name / f"by-{key}", p)
        task = RepartitionedTask(
            p,
            store,
            sp.repartitioned[key],
            sp.timing,
            self.codecs[sp.topic],
            self._upstream(sp),
            refresh_all=c.refresh_unchanged,
        )
        return task, repartition_changelog(c.group_id, sp.name, key)

    def _upstream(self, sp: SourcePlan) -> int:
        """Return the partition count of the source's topic (stage B's watermark waits on each)."""
        n = self.upstream_partitions.get(sp.topic)
        if n is None:
            n = self.upstream_partitions[sp.topic] = len(self.producer.partitions_for(sp.topic))
        return n

    def open_tasks(self, assigned: list[TopicPartition]) -> None:
        """Restore each assigned partition (local store, checkpoint, changelog) and seek to its offset.

        First the task producers of every assigned partition, in parallel (each ``init_transactions``
        is a few round trips, and this runs in the rebalance callback, which holds back heartbeats):
        they fence the previous owners and abort their open transactions before any restore reads.
        """
        self.assigned_at = time.monotonic()
        generation = self.consumer.group_metadata().generation_id
        bootstrap = self.config.settings.kafka_bootstrap

        def producer(tp: TopicPartition) -> TaskProducer:
            txn_id = transactional_id(self._changelog_of(tp), tp.partition)
            return TaskProducer(bootstrap, txn_id, self.compression)

        with ThreadPoolExecutor(max_workers=min(8, max(1, len(assigned)))) as pool:
            futures = {tp: pool.submit(producer, tp) for tp in assigned}
        failed: BaseException | None = None
        for tp, future in futures.items():
            if future.exception() is None:
                self.txn[tp] = future.result()  # closed by close_tasks
            else:
                failed = failed or future.exception()
        if failed is not None:
            raise failed
        for tp in assigned:
            started = time.monotonic()
            task, changelog = self._new_task(tp)
            self.tasks[tp] = task  # from now on closed by close_tasks, even if the restore fails
            self.epochs[tp] = {
                view: self.online.claim_fence(self.plan.layouts[view], self._owner(tp), generation)
                for view in task.views
            }
            replayed = restore_partition(self.config.settings, changelog, tp.partition, task.store, task)
            self.changelogs[tp] = changelog
            backfill(self, tp, task)  # drops stale view versions, backfills new ones (backfill.py)
            if task.next_offset is not None:
                self.consumer.seek(tp, task.next_offset)
            else:
                self.consumer.seek_to_beginning(tp)
            self.changelogs[tp] = changelog
            if tp.topic in self.idle:
                self.idle[tp.topic].active(tp.partition, time.monotonic())
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
        # Idle time counts from the end of the restores: they (and the task producers' fencing) can
        # take longer than an --idle-exit, which must not fire before the first poll of the new tasks.
        self.assigned_at = time.monotonic()

    def _owner(self, tp: TopicPartition) -> str:
        """Return the fence owner name of a task (its transactional id)."""
        return transactional_id(self.changelogs.get(tp) or self._changelog_of(tp), tp.partition)

    def _changelog_of(self, tp: TopicPartition) -> str:
        sp = self.sources.get(tp.topic)
        if sp is not None:
            return changelog_topic(self.config.group_id, sp.name)
        sp, key = self.by_key[tp.topic]
        return repartition_changelog(self.config.group_id, sp.name, key)

    def setup_failed(self, doing: str, partitions: Sequence[TopicPartition], exc: Exception) -> None:
        """Count and keep a rebalance callback's failure for ``run`` to raise."""
        self.counters["setup_failures"] = self.counters.get("setup_failures", 0) + 1
        names = ", ".join(f"{tp.topic}:{tp.partition}" for tp in partitions)
        msg = f"{doing} partitions {names} failed: {type(exc).__name__}: {exc}"
        log.error("%s; the worker restarts", msg)
        if self.setup_error is None:
            self.setup_error = NearlineSetupError(msg)
            self.setup_error.__cause__ = exc

    def close_tasks(self, revoked: list[TopicPartition]) -> None:
        """Close the stores of revoked partitions (their state is committed after every batch)."""
        for tp in revoked:
            task = self.tasks.pop(tp, None)
            producer = self.txn.pop(tp, None)
            self.epochs.pop(tp, None)
            if tp.topic in self.idle:
                self.idle[tp.topic].forget(tp.partition)
            try:
                if producer is not None:
                    producer.close()
            finally:
                if task is not None:
                    task.store.close()

    # -- loop ----------------------------------------------------------------------------------
    def run(self, stop: threading.Event, idle_exit_s: float | None = None) -> None:
        """Poll and commit until ``stop`` is set (or ``idle_exit_s`` without records)."""
        self.consumer.subscribe([*self.sources, *self.by_key], listener=_Listener(self))
        idle_since = time.monotonic()
        try:
            while not stop.is_set():
                polled = self.consumer.poll(timeout_ms=500, max_records=self.config.max_poll_records)
                if self.setup_error is not None:
                    raise self.setup_error
                if not self.tasks:
                    idle_since = time.monotonic()  # idle only counts while owning partitions
                idle_since = max(idle_since, self.assigned_at)  # nor while restoring them
                self._announce_idle(polled)
                if not polled:
                    if idle_exit_s is not None and time.monotonic() - idle_since > idle_exit_s:
                        break
                    self._maybe_repair()
                    self._maybe_checkpoint()
                    continue
                idle_since = time.monotonic()
                self.commit_batch({tp: recs for tp, recs in polled.items() if tp in self.tasks})
                self._maybe_repair()
        finally:
            self.close()

    def _announce_idle(self, polled: dict[TopicPartition, list[Any]]) -> None:
        """Send an idle marker for each source partition caught up and without records for the timeout."""
        now = time.monotonic()
        for tp in polled:
            if tp.topic in self.idle and tp in self.tasks:
                self.idle[tp.topic].active(tp.partition, now)
        for topic, timer in self.idle.items():
            for p in timer.due(now, functools.partial(self._caught_up, topic)):
                tp = TopicPartition(topic, p)
                self._markers(tp, idle_headers(p, self.tasks[tp].watermark()))
                self.txn[tp].commit({}, None)
                log.info(
                    "%s partition %d idle: left out of the repartitioned watermark until it has events",
                    topic,
                    p,
                )

    def _caught_up(self, topic: str, partition: int) -> bool:
        tp = TopicPartition(topic, partition)
        task, end = self.tasks.get(tp), self.consumer.highwater(tp)
        return task is not None and end is not None and (task.next_offset or 0) >= end

    def commit_batch(self, polled: dict[TopicPartition, list[Any]]) -> None:
        """Process one poll and run the commit protocol (module docstring, steps 1 to 5)."""
        now = epoch_ms()
        if not self.counters["batches"]:
            self.counters["first_batch_at"] = time.time()
        clock = _PhaseClock(self.counters)
        outputs = {p: self.tasks[p].process(recs, now) for p, recs in polled.items()}
        self._check_partitioning(polled)
        clock.lap("t_process")
        # Step 1: one transaction per task (dead letters, forwards, markers, changelog, offset).
        metas = self._send(outputs)
        _pause("before_commit")
        for tp, out in outputs.items():
            pos = self._commit(tp, out, metas[tp])
            clock.lap("t_changelog")
            # Step 2: state changes + consumed offset + changelog position, one RocksDB write batch.
            self.tasks[tp].store.commit(out.changes, pos)
            clock.lap("t_rocksdb")
        _pause("before_publish")
        # Step 3: online writes (fenced, idempotent; the outbox committed above replays them after a crash).
        self._publish({tp: out.publish for tp, out in outputs.items()})
        clock.lap("t_publish")
        self.counters["last_batch_at"] = time.time()
        self._count(outputs)
        self._maybe_checkpoint()

    def _send(self, outputs: dict[TopicPartition, BatchOutput]) -> dict[TopicPartition, Any]:
        """Send each task's batch into its open transaction (step 1 less the commit); return meta futures."""
        metas: dict[TopicPartition, Any] = {}
        for tp, out in outputs.items():
            producer = self.txn[tp]
            for dl in out.dead:
                producer.send(
                    self.config.settings.dlq_topic, key=dl.key, value=dl.value, headers=dl.kafka_headers()
                )
            if self.forwards.get(tp.topic):
                self._forward(tp, out)
            changelog = self.changelogs[tp]
            for key, value in out.changes.items():
                if key != META_KEY:
                    producer.send(changelog, key=key, value=value, partition=tp.partition)
            metas[tp] = producer.send(
                changelog, key=META_KEY, value=out.changes[META_KEY], partition=tp.partition
            )
        return metas

    def _commit(self, tp: TopicPartition, out: BatchOutput, meta: Any) -> int:
        """Commit ``tp``'s transaction with its consumed offset; return the meta record's changelog offset.

        Raises:
            NearlineFencedError: a newer owner has the partition (nothing of the batch is committed).
            NearlineCommitError: Kafka refused the transaction (the restarted worker re-runs the batch).
        """
        offsets = {}
        if out.next_offset is not None:
            offsets[tp] = OffsetAndMetadata(out.next_offset, "", -1)
        try:
            self.txn[tp].commit(offsets, self.consumer.group_metadata())
            return int(meta.get(timeout=30).offset)
        except NearlineFencedError:
            raise
        except KafkaError as exc:
            msg = (
                f"step 1 of the nearline commit ({tp.topic}:{tp.partition}): Kafka did not commit the "
                f"transaction ({exc!r}); the batch is not committed and is processed again after a "
                "restart. Check the broker at " + self.config.settings.kafka_bootstrap
            )
            raise NearlineCommitError(msg) from exc

    def _transact(self, outputs: dict[TopicPartition, BatchOutput]) -> dict[TopicPartition, int]:
        """Send and commit each task's transaction; return each meta record's changelog offset."""
        metas = self._send(outputs)
        return {tp: self._commit(tp, out, metas[tp]) for tp, out in outputs.items()}

    def _forward(self, tp: TopicPartition, out: BatchOutput) -> list[Any]:
        """Send the batch's events to their repartition topics, then a watermark marker to every partition.

        Inside ``tp``'s open transaction (committed by the caller).
        """
        sent = []
        name = self.sources[tp.topic].name
        producer = self.txn[tp]
        for key, value, event, offset in out.forward:
            payload, headers = forwarded_record(event, tp.partition, offset)
            topic = repartition_topic(self.config.group_id, name, key)
            sent.append(producer.send(topic, key=str(value).encode(), value=payload, headers=headers))
        if out.watermark is not None:
            sent += self._markers(tp, marker_headers(tp.partition, out.watermark))
        return sent

    def _markers(self, tp: TopicPartition, headers: list[tuple[str, bytes]]) -> list[Any]:
        """Send one marker (no key, no value) to every partition of ``tp``'s source's repartition topics.

        Inside ``tp``'s open transaction (committed by the caller).
        """
        return [
            self.txn[tp].send(topic, value=b"", partition=q, headers=headers)
            for topic in self.forwards[tp.topic]
            for q in sorted(self.producer.partitions_for(topic))
        ]

    def _publish(self, by_partition: dict[TopicPartition, dict[str, tuple[int, list[str]]]]) -> None:
        for tp, publish in by_partition.items():
            task = self.tasks[tp]
            for view, (boundary, entities) in publish.items():
                if not entities or boundary <= 0:
                    continue
                spec = task.views[view].spec
                rows = task.values(view, entities, boundary)
                vectors = to_vectors(spec, rows, self.dictionary.ids)
                fence = (self._owner(tp), self.epochs[tp][view])
                try:
                    res = self.online.write_batch(
                        self.plan.layouts[view], entities, vectors, boundary, fence=fence
                    )
                except FencedError as exc:
                    msg = f"{tp.topic}:{tp.partition}: online write of view {view} fenced: {exc}"
                    raise NearlineFencedError(msg) from exc
                self.counters["written"] += res.written
                if res.written and len(self.freshness_ms) < 200_000:
                    self.freshness_ms.append((epoch_ms() - boundary, res.written))

    def _maybe_repair(self) -> None:
        """Run one step of the reconciliation pass when one is under way or due (``repair.py``).

        A store that cannot be read or written stops the step, not the worker: the pass goes on at the
        next step (the commit protocol's own writes fail the worker if Redis stays away).

        Raises:
            NearlineFencedError: a newer owner holds a task's fence (as for a fenced publish).
        """
        online = RepairStore(self.online, self.plan.layouts, self.dictionary.ids, self._fence)
        try:
            step = self.repair.step(self.tasks, online)
        except FencedError as exc:
            raise NearlineFencedError(f"online repair write fenced: {exc}") from exc
        except (StoreError, RedisError) as exc:
            self.counters["repair_errors"] = self.counters.get("repair_errors", 0) + 1
            log.warning(
                "repair step failed (%s: %s); the pass goes on at the next step", type(exc).__name__, exc
            )
            return
        if step is not None:
            self._count_repair(step)

    def _fence(self, tp: Any, view: str) -> tuple[str, int]:
        return self._owner(tp), self.epochs[tp][view]

    def _count_repair(self, step: StepResult) -> None:
        """Add a step's counts to the counters and the store's repair hashes; log a pass that repaired."""
        total = RepairCounts()
        for view, c in step.counts.items():
            self.repair_counts[view] = self.repair_counts.get(view, RepairCounts()) + c
            total = total + c
        for name, value in total.as_dict().items():
            self.counters[f"repair_{name}"] = self.counters.get(f"repair_{name}", 0) + value
        if step.finished is not None:
            self.counters["repair_passes"] = self.counters.get("repair_passes", 0) + 1
        try:
            add_repair_counts(
                self.online.client,
                step.counts,
                self.config.namespace,
                finished=step.finished,
                now_ms=epoch_ms(),
            )
        except RedisError as exc:
            log.warning("repair counters not recorded in the store: %s", exc)
        if step.finished and any(c.repaired or c.missing or c.stale for c in step.finished.values()):
            parts = [
                f"{view}: {c.repaired} repaired ({c.missing} missing, {c.stale} stale) of {c.checked} checked"
                for view, c in sorted(step.finished.items())
            ]
            log.info("repair pass in %.1f s: %s", step.pass_s, "; ".join(parts))

    def _check_partitioning(self, polled: dict[TopicPartition, list[Any]]) -> None:
        """Count (and log once per topic) source batches with a keyed record outside its key's partition."""
        for tp, recs in polled.items():
            if tp.topic not in self.sources or not recs:
                continue
            partitions = len(self.consumer.partitions_for_topic(tp.topic) or ())
            found = first_misplaced(tp.topic, tp.partition, recs, partitions) if partitions else None
            if found is None:
                continue
            self.counters["misplaced_batches"] += 1
            if tp.topic not in self.misplaced_topics:
                self.misplaced_topics.add(tp.topic)
                log.warning("%s", found.message())

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

    def write_stats(self, live: bool = False) -> None:
        """Write counters and state sizes to ``stats_path`` (JSON) when configured.

        ``live``: also the live bytes of each store by view (one scan of the store: done at close,
        not at every checkpoint), ``live_bytes`` in the file, what ``bench_calibrate.py`` measures.
        """
        if self.config.stats_path is None:
            return
        data: dict[str, Any] = {
            "counters": {**self.counters, "cpu_s": time.process_time()},
            "tasks": [t.stats() for t in self.tasks.values()],
            "state_bytes": {
                f"{tp.topic}:{tp.partition}": t.store.size_bytes() for tp, t in self.tasks.items()
            },
            "freshness_ms": self.freshness_ms[-20_000:],
            "repair": {view: c.as_dict() for view, c in self.repair_counts.items()},
        }
        if live:
            data["live_bytes"] = {
                f"{tp.topic}:{tp.partition}": t.store.live_bytes() for tp, t in self.tasks.items()
            }
        tmp = self.config.stats_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data), encoding="utf-8")
        tmp.replace(self.config.stats_path)

    def close(self) -> None:
        """Write stats, close stores, the consumer (leaving the group), the producer and Redis."""
        with contextlib.suppress(OSError):
            self.write_stats(live=True)
        self.close_tasks(list({*self.tasks, *self.txn}))
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


def _pause(where: str) -> None:
    """Stop this process once at ``where`` when :data:`PAUSE_ENV` asks (a test hook)."""
    if _pause_at[0] == where:
        _pause_at[0] = None
        log.warning("test hook %s=%s: stopping (SIGSTOP) until SIGCONT", PAUSE_ENV, where)
        os.kill(os.getpid(), signal.SIGSTOP)


def run_worker(config: NearlineConfig, idle_exit_s: float | None = None) -> None:
    """Entry point of one worker process (stops on SIGTERM/SIGINT after the current batch)."""
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s nearline[%(process)d] %(levelname)s %(message)s",
    )
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    plan = NearlinePlan.load(config)
    supervise_worker(lambda: NearlineWorker(config, plan), stop, idle_exit_s)
