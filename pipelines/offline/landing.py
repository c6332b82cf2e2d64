"""Land each source's topic in its own bronze Delta table, exactly once, dead-lettering what is malformed.

Every source of the plan lands into ``bronze/<source>`` (columns from its schema, :mod:`.source_columns`),
decoded with the codec built from its :class:`~headwater.registry.plans.PlanSource` and judged by its
own event-time rules; :func:`land_sources` runs one :class:`Lander` per source side by side.

Exactly once: the Kafka position of every partition is stored in the same Delta commit as the
rows it covers (the commit's ``userMetadata``, with ``txnAppId``/``txnVersion`` so that a batch
committed twice is skipped by Delta itself), and a restart resumes from the last such commit. A
crash before the commit lands nothing and the batch is read again; a crash after it resumes
past it. Each row also keeps its ``kafka_partition``/``kafka_offset``.

Kafka outages: a run that loses the broker (a timed-out offset request, flush or dead-letter ack,
or no broker when it reconnects) closes its clients and starts again from the table's checkpoint
after a back-off, for up to ``kafka_patience_s`` (``LandingStats.retries`` counts the attempts).

One lander per table: :class:`~.landing_lock.LandingLock` (an ``flock`` in the table's folder,
released by the kernel even after kill -9) makes a second landing process of the same source
refuse with a message naming the first, instead of landing rows twice.

Malformed records go to the dead-letter topic with the codec's reason; future-dated events
(more than the source's ``max_future_ms`` ahead of the clock) with reason
``future_dated``, not landed; events older than the source's allowed lateness (per-partition
watermark = max event time seen - max out-of-orderness, as in docs/concepts/windows.md) with reason ``late``,
kept in bronze flagged ``late = true`` (the feature jobs skip them, as the streaming tiers do).
Dead letters are sent, and flushed, before the commit: at least once (a crash between the two
repeats them; their ``dlq-source-*`` headers identify duplicates).

Speed: records are decoded a poll at a time into Arrow columns (:mod:`.landing_batch`), batches
are large (few large files) and a batch's Delta commit runs while the next batch is read. With
``workers > 1`` reader processes consume and decode the partitions in parallel
(:mod:`.landing_workers`); this process still makes every commit.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from headwater.pipelines import kafka as kafka_clients
from headwater.pipelines.events.codec import EventCodec, dead_letter
from headwater.pipelines.events.timing import SourceTiming
from headwater.pipelines.offline.arrow_io import arrow_to_spark, staging_dir
from headwater.pipelines.offline.landing_batch import decode_records
from headwater.pipelines.offline.landing_lock import LandingLock
from headwater.pipelines.offline.landing_state import (
    CHUNK_RECORDS,
    MARKER,
    BrokerUnavailableError,
    Checkpoint,
    LandingConfig,
    LandingError,
    LandingStats,
    SourceTopicMissingError,
    read_checkpoint,
)
from headwater.pipelines.offline.source_columns import BRONZE_WRITE_OPTIONS, with_date
from headwater.pipelines.retry import retry_call

__all__ = [
    "MARKER", "Checkpoint", "Lander", "LandingConfig", "LandingError", "LandingStats", "land_sources",
    "read_checkpoint",
]  # fmt: skip

if TYPE_CHECKING:
    from kafka import KafkaConsumer, KafkaProducer
    from pyspark.sql import DataFrame, SparkSession


class Lander:
    """Moves records from Kafka into the bronze table in batches, one Delta commit per batch.

    Steps of one batch: 1. poll chunks of records until ``batch_records`` (or ``max_batch_s``, or
    nothing more to read), decoding each chunk into Arrow rows at once and sending its dead letters;
    2. flush the dead letters and wait for the broker's acks; 3. wait for the previous batch's
    commit; 4. start this batch's commit (rows + checkpoint in one Delta commit) in the background
    while the next batch is read. Commits stay in order, one in flight: a failed commit stops the run
    before a later one can start, so the table never holds a batch without the ones before it.
    """

    def __init__(self, spark: SparkSession, config: LandingConfig) -> None:
        """Bind to a Spark session and a configuration (nothing is opened yet)."""
        self.spark = spark
        self.config = config
        self.codec = EventCodec(config.source)
        self.rules = SourceTiming.of(config.source)

    def run(
        self,
        follow: bool = False,
        max_batches: int | None = None,
        progress: Callable[[LandingStats], None] | None = None,
        stop: threading.Event | None = None,
    ) -> LandingStats:
        """Land until caught up with the end offsets seen at start (``follow``: until ``stop`` is set).

        Raises:
            LandingError: another landing process lands this table (:mod:`.landing_lock`), or the
                broker, a topic or the table is not usable.
        """
        from kafka.errors import KafkaError

        stats = LandingStats()
        started = time.monotonic()

        def again(exc: BaseException, wait_s: float) -> None:
            stats.retries += 1

        def land() -> LandingStats:
            return self._land(stats, started, follow, max_batches, progress, stop)

        with LandingLock(self.config.table, self.config.source.name):
            # A broker outage mid-run: the batch in flight is not committed; the next attempt resumes
            # from the table's checkpoint, so a retry lands nothing twice (dead letters: at least once).
            what = f"source {self.config.source.name!r}: landing {self.config.topic!r}"
            retry_on = (KafkaError, BrokerUnavailableError)
            return retry_call(
                land, retry_on, what, give_up_after_s=self.config.kafka_patience_s, on_retry=again
            )

    def _land(
        self,
        stats: LandingStats,
        started: float,
        follow: bool,
        max_batches: int | None,
        progress: Callable[[LandingStats], None] | None,
        stop: threading.Event | None,
    ) -> LandingStats:
        checkpoint = read_checkpoint(self.spark, self.config)
        consumer, producer = self._open()
        pending: Future[None] | None = None
        collected = 0
        readers = self._readers()
        try:
            with ThreadPoolExecutor(max_workers=1, thread_name_prefix="landing-commit") as pool:
                partitions = self._assign(consumer, checkpoint)
                begins = consumer.beginning_offsets(partitions)
                while (max_batches is None or collected < max_batches) and not (stop and stop.is_set()):
                    ends = consumer.end_offsets(partitions)
                    if readers is None:
                        behind = [tp for tp in partitions if consumer.position(tp) < ends[tp]]
                    else:
                        behind = [tp for tp in partitions
                                  if checkpoint.offsets.get(tp.partition, begins[tp]) < ends[tp]]  # fmt: skip
                    if not behind:
                        if not follow:
                            break
                        if stop is not None:
                            stop.wait(self.config.poll_timeout_ms / 1000)
                        else:
                            time.sleep(self.config.poll_timeout_ms / 1000)
                        continue
                    if readers is None:
                        batch = self._collect(consumer, producer, checkpoint, stats)
                    else:
                        batch = self._collect_parallel(readers, partitions, begins, ends, checkpoint, stats)
                    if batch is None:
                        continue
                    table, checkpoint = batch
                    collected += 1
                    # Step 3
                    self._finish(pending, stats, started, progress)
                    # Step 4
                    pending = pool.submit(self._commit, table, checkpoint)
                self._finish(pending, stats, started, progress)
        finally:
            if readers is not None:
                readers.shutdown(cancel_futures=True)
            consumer.close()
            producer.close(timeout=10)
        stats.seconds = time.monotonic() - started
        return stats

    def _readers(self) -> ProcessPoolExecutor | None:
        """Start the reader processes (None: read in this process)."""
        if self.config.workers <= 1:
            return None
        from headwater.pipelines.offline.landing_workers import worker_pool

        cfg = self.config
        return worker_pool(cfg.workers, cfg.bootstrap, cfg.source, cfg.dlq_topic, cfg.poll_timeout_ms)

    def _collect_parallel(
        self, readers: ProcessPoolExecutor, partitions: list[Any], begins: dict[Any, int],
        ends: dict[Any, int], previous: Checkpoint, stats: LandingStats,
    ) -> tuple[pa.Table, Checkpoint] | None:  # fmt: skip
        """Run steps 1-2 of a batch in the reader processes (each flushes its own dead letters)."""
        from headwater.pipelines.offline.landing_workers import collect_parallel, deal

        starts = {tp.partition: previous.offsets.get(tp.partition, begins[tp]) for tp in partitions}
        hands = deal(sorted(starts), self.config.workers)
        stops = {tp.partition: ends[tp] for tp in partitions}
        got = collect_parallel(readers, hands, starts, stops, previous, self.config.batch_records)
        if got is None:
            return None
        table, checkpoint, records, reasons = got
        stats.records += records
        stats.landed += table.num_rows
        for reason, n in reasons.items():
            stats.reasons[reason] = stats.reasons.get(reason, 0) + n
        stats.count_reasons()
        return table, checkpoint

    def _finish(
        self,
        pending: Future[None] | None,
        stats: LandingStats,
        started: float,
        progress: Callable[[LandingStats], None] | None,
    ) -> None:
        """Wait for the commit in flight (re-raising its error) and report it."""
        if pending is None:
            return
        pending.result()
        stats.batches += 1
        stats.seconds = time.monotonic() - started
        if progress is not None:
            progress(stats)

    def _collect(
        self, consumer: KafkaConsumer, producer: KafkaProducer, previous: Checkpoint, stats: LandingStats
    ) -> tuple[pa.Table, Checkpoint] | None:
        """Run steps 1-2 of a batch: return its rows and the checkpoint after them (None: nothing read)."""
        cfg = self.config
        checkpoint = Checkpoint(previous.seq + 1, dict(previous.offsets), dict(previous.max_event_ms))
        tables: list[pa.Table] = []
        futures: list[Any] = []
        read = 0
        # Step 1
        deadline = time.monotonic() + cfg.max_batch_s
        while read < cfg.batch_records and time.monotonic() < deadline:
            polled = consumer.poll(
                timeout_ms=cfg.poll_timeout_ms, max_records=min(CHUNK_RECORDS, cfg.batch_records - read)
            )
            records = [r for batch in polled.values() for r in batch]
            if not records:
                break
            read += len(records)
            now_ms = time.time_ns() // 1_000_000
            chunk = decode_records(self.codec, records, self.rules, checkpoint.max_event_ms, now_ms)
            checkpoint.offsets.update(chunk.next_offsets)
            tables.append(chunk.table)
            for bad in chunk.rejected:
                futures.append(self._send(producer, dead_letter(bad.record, bad.reason, bad.detail)))
                stats.reasons[bad.reason] = stats.reasons.get(bad.reason, 0) + 1
            stats.records += len(records)
            stats.landed += chunk.table.num_rows
        if not read:
            return None
        # Step 2
        producer.flush(timeout=60)
        for future in futures:
            future.get(timeout=60)  # raises the broker's error: never commit past an unsent letter
        stats.count_reasons()
        return pa.concat_tables(tables), checkpoint

    def _open(self) -> tuple[KafkaConsumer, KafkaProducer]:
        from kafka.errors import KafkaError

        cfg = self.config
        try:
            consumer = kafka_clients.consumer(
                cfg.bootstrap, group_id=None, enable_auto_commit=False,
                auto_offset_reset="earliest", max_poll_records=cfg.batch_records,
                fetch_max_bytes=64 * 1024 * 1024, max_partition_fetch_bytes=16 * 1024 * 1024,
                client_id="headwater-landing",
            )  # fmt: skip
            producer = kafka_clients.producer(
                cfg.bootstrap, acks="all", enable_idempotence=True, linger_ms=5,
                client_id="headwater-landing-dlq",
            )  # fmt: skip
        except KafkaError:
            msg = f"no Kafka broker at {cfg.bootstrap}; start it with `make services-up`"
            raise BrokerUnavailableError(msg) from None
        return consumer, producer

    def _assign(self, consumer: KafkaConsumer, checkpoint: Checkpoint) -> list[Any]:
        from kafka import TopicPartition

        ids = consumer.partitions_for_topic(self.config.topic)
        if not ids:
            source = self.config.source.name
            msg = (f"source {source!r}: topic {self.config.topic!r} not found on {self.config.bootstrap}"
                   f" (nothing produced to it yet): produce events with `headwater events produce --source"
                   f" {source}` (or create the topics with `headwater topics create`)")  # fmt: skip
            raise SourceTopicMissingError(msg)
        if not consumer.partitions_for_topic(self.config.dlq_topic):
            msg = (f"topic(s) {[self.config.dlq_topic]} not found on {self.config.bootstrap}; "
                   "create them with `headwater topics create`")  # fmt: skip
            raise LandingError(msg)
        partitions = [TopicPartition(self.config.topic, p) for p in sorted(ids)]
        consumer.assign(partitions)
        for tp in partitions:
            if tp.partition in checkpoint.offsets:
                consumer.seek(tp, checkpoint.offsets[tp.partition])
            else:
                consumer.seek_to_beginning(tp)
        return partitions

    def _send(self, producer: KafkaProducer, letter: Any) -> Any:
        return producer.send(
            self.config.dlq_topic, value=letter.value, key=letter.key, headers=letter.kafka_headers()
        )

    def _commit(self, table: pa.Table, checkpoint: Checkpoint) -> None:
        with staging_dir(self.config.table.parent / "_staging") as folder:
            self._write(with_date(arrow_to_spark(self.spark, table, folder), self.config.source), checkpoint)

    def _write(self, frame: DataFrame, checkpoint: Checkpoint) -> None:
        (
            frame.write.format("delta")
            .mode("append")
            .options(**BRONZE_WRITE_OPTIONS)
            .partitionBy("date")
            .option("txnAppId", self.config.app_id)
            .option("txnVersion", checkpoint.seq)
            .option("userMetadata", checkpoint.metadata(self.config.app_id))
            .save(str(self.config.table))
        )


def land_sources(
    spark: SparkSession,
    configs: Sequence[LandingConfig],
    follow: bool = False,
    progress: Callable[[str, LandingStats], None] | None = None,
) -> dict[str, LandingStats]:
    """Land every source of ``configs`` side by side (one :class:`Lander` thread each, one Spark session).

    Each source keeps its own table, checkpoint and commits, so exactly-once holds per source. The
    first failure stops the others (after their commit in flight) and is raised; a source whose topic
    does not exist yet is skipped (its stats' ``skipped`` says why) and the others land.

    Raises:
        LandingError: a source cannot be landed (broker, topic or table problem).
    """
    stop = threading.Event()
    out: dict[str, LandingStats] = {}

    def land(config: LandingConfig) -> LandingStats:
        def report(stats: LandingStats) -> None:
            if progress is not None:
                progress(config.source.name, stats)

        try:
            return Lander(spark, config).run(follow=follow, progress=report, stop=stop)
        except SourceTopicMissingError as exc:  # the others land: one source without events is no failure
            return LandingStats(skipped=str(exc))
        except BaseException:
            stop.set()
            raise

    with ThreadPoolExecutor(max_workers=max(1, len(configs)), thread_name_prefix="landing-source") as pool:
        futures = {c.source.name: pool.submit(land, c) for c in configs}
        try:
            for name, future in futures.items():
                out[name] = future.result()
        except KeyboardInterrupt:
            stop.set()
            raise
    return out
