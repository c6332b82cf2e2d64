"""Land the ``events`` topic in the bronze Delta table, exactly once, dead-lettering what is malformed.

Exactly once: the Kafka position of every partition is stored in the same Delta commit as the
rows it covers (the commit's ``userMetadata``, with ``txnAppId``/``txnVersion`` so that a batch
committed twice is skipped by Delta itself), and a restart resumes from the last such commit. A
crash before the commit lands nothing and the batch is read again; a crash after it resumes
past it. Each row also keeps its ``kafka_partition``/``kafka_offset``.

Malformed records go to the dead-letter topic with the codec's reason; events older than the
source's allowed lateness (per-partition watermark = max event time seen - max out-of-orderness,
as in WINDOWS.md) go there with reason ``late`` and are kept in bronze flagged ``late = true``
(the feature jobs skip them, as the streaming tiers do). Dead letters are sent, and flushed,
before the commit: at least once (a crash between the two repeats them; their ``dlq-source-*``
headers identify duplicates).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from headwater.pipelines.events.codec import DecodedEvent, EventCodec, Reason, dead_letter
from headwater.pipelines.offline.arrow_io import arrow_to_spark, staging_dir
from headwater.pipelines.offline.bronze import with_date
from headwater.pipelines.offline.lake import BRONZE_SCHEMA, EVENT_COLUMNS, is_delta_table

if TYPE_CHECKING:
    from kafka import KafkaConsumer, KafkaProducer
    from kafka.consumer.fetcher import ConsumerRecord
    from pyspark.sql import DataFrame, SparkSession

MARKER = "headwater_landing"


class LandingError(RuntimeError):
    """Landing cannot go on (broker, topic or table problem); the message says what to do."""


@dataclass(frozen=True)
class LandingConfig:
    """Where to read, where to write, and the source's event-time rules."""

    bootstrap: str
    topic: str
    dlq_topic: str
    table: Path
    max_out_of_orderness_ms: int = 5_000
    allowed_lateness_ms: int = 60_000
    batch_records: int = 200_000
    poll_timeout_ms: int = 500

    @property
    def app_id(self) -> str:
        """The Delta ``txnAppId`` of this landing stream."""
        return f"{MARKER}:{self.topic}"


@dataclass
class Checkpoint:
    """What the last landing commit recorded: next offset and max event time per partition."""

    seq: int = 0
    offsets: dict[int, int] = field(default_factory=dict)
    max_event_ms: dict[int, int] = field(default_factory=dict)

    def metadata(self, app_id: str) -> str:
        """Return the commit's ``userMetadata`` JSON."""
        return json.dumps(
            {MARKER: 1, "app": app_id, "seq": self.seq,
             "offsets": {str(p): o for p, o in sorted(self.offsets.items())},
             "max_event_ms": {str(p): t for p, t in sorted(self.max_event_ms.items())}},
            separators=(",", ":"),
        )  # fmt: skip

    @classmethod
    def parse(cls, text: str, app_id: str) -> Checkpoint | None:
        """Return the checkpoint in a commit's ``userMetadata``, or None when it is not one of ``app_id``."""
        try:
            data = json.loads(text)
        except json.JSONDecodeError:
            return None
        if not isinstance(data, dict) or data.get(MARKER) != 1 or data.get("app") != app_id:
            return None
        return cls(
            seq=int(data["seq"]),
            offsets={int(p): int(o) for p, o in data["offsets"].items()},
            max_event_ms={int(p): int(t) for p, t in data["max_event_ms"].items()},
        )


@dataclass
class LandingStats:
    """Counts of one run."""

    batches: int = 0
    records: int = 0
    landed: int = 0
    late: int = 0
    malformed: int = 0
    seconds: float = 0.0
    reasons: dict[str, int] = field(default_factory=dict)

    @property
    def records_per_s(self) -> float:
        """Kafka records handled per second."""
        return self.records / self.seconds if self.seconds > 0 else 0.0


def read_checkpoint(spark: SparkSession, config: LandingConfig) -> Checkpoint:
    """Return the checkpoint of the latest landing commit in the bronze table (empty when none)."""
    if not is_delta_table(config.table):
        return Checkpoint()
    from delta.tables import DeltaTable

    history = DeltaTable.forPath(spark, str(config.table)).history()
    rows = (
        history.where(history.userMetadata.contains(f'"app":"{config.app_id}"'))
        .orderBy(history.version.desc())
        .select("userMetadata")
        .limit(1)
        .collect()
    )
    if not rows:
        return Checkpoint()
    found = Checkpoint.parse(rows[0]["userMetadata"], config.app_id)
    return found if found is not None else Checkpoint()


class Lander:
    """Moves records from Kafka into the bronze table in batches, one Delta commit per batch.

    Steps of one batch: 1. poll up to ``batch_records`` records; 2. decode each, dead-letter the
    malformed and the late ones, advance the per-partition position and watermark; 3. flush the
    dead letters; 4. append the rows with the new checkpoint in one Delta commit.
    """

    def __init__(self, spark: SparkSession, config: LandingConfig) -> None:
        """Bind to a Spark session and a configuration (nothing is opened yet)."""
        self.spark = spark
        self.config = config
        self.codec = EventCodec()

    def run(
        self,
        follow: bool = False,
        max_batches: int | None = None,
        progress: Callable[[LandingStats], None] | None = None,
    ) -> LandingStats:
        """Land until caught up with the end offsets seen at start (or forever with ``follow``)."""
        stats = LandingStats()
        started = time.monotonic()
        checkpoint = read_checkpoint(self.spark, self.config)
        consumer, producer = self._open()
        try:
            partitions = self._assign(consumer, checkpoint)
            while max_batches is None or stats.batches < max_batches:
                ends = consumer.end_offsets(partitions)
                behind = {tp.partition for tp in partitions if consumer.position(tp) < ends[tp]}
                if not behind and not follow:
                    break
                records = self._poll(consumer)
                if not records:
                    continue
                checkpoint = self._land(records, checkpoint, producer, stats)
                stats.seconds = time.monotonic() - started
                if progress is not None:
                    progress(stats)
        finally:
            consumer.close()
            producer.close(timeout=10)
        stats.seconds = time.monotonic() - started
        return stats

    def _open(self) -> tuple[KafkaConsumer, KafkaProducer]:
        from kafka import KafkaConsumer, KafkaProducer
        from kafka.errors import KafkaError

        cfg = self.config
        try:
            consumer = KafkaConsumer(
                bootstrap_servers=cfg.bootstrap, group_id=None, enable_auto_commit=False,
                auto_offset_reset="earliest", max_poll_records=cfg.batch_records,
                fetch_max_bytes=64 * 1024 * 1024, max_partition_fetch_bytes=16 * 1024 * 1024,
                client_id="headwater-landing",
            )  # fmt: skip
            producer = KafkaProducer(
                bootstrap_servers=cfg.bootstrap, acks="all", enable_idempotence=True, linger_ms=5,
                client_id="headwater-landing-dlq",
            )  # fmt: skip
        except KafkaError:
            msg = f"no Kafka broker at {cfg.bootstrap}; start it with `make services-up`"
            raise LandingError(msg) from None
        return consumer, producer

    def _assign(self, consumer: KafkaConsumer, checkpoint: Checkpoint) -> list[Any]:
        from kafka import TopicPartition

        ids = consumer.partitions_for_topic(self.config.topic)
        if not ids:
            msg = (f"topic {self.config.topic!r} not found on {self.config.bootstrap}; "
                   "create it with `headwater topics create`")  # fmt: skip
            raise LandingError(msg)
        partitions = [TopicPartition(self.config.topic, p) for p in sorted(ids)]
        consumer.assign(partitions)
        for tp in partitions:
            if tp.partition in checkpoint.offsets:
                consumer.seek(tp, checkpoint.offsets[tp.partition])
            else:
                consumer.seek_to_beginning(tp)
        return partitions

    def _poll(self, consumer: KafkaConsumer) -> list[ConsumerRecord]:
        records: list[ConsumerRecord] = []
        deadline = time.monotonic() + 5.0
        while len(records) < self.config.batch_records and time.monotonic() < deadline:
            polled = consumer.poll(
                timeout_ms=self.config.poll_timeout_ms, max_records=self.config.batch_records - len(records)
            )
            if not polled:
                break
            for batch in polled.values():
                records.extend(batch)
        return records

    def _land(
        self,
        records: list[ConsumerRecord],
        previous: Checkpoint,
        producer: KafkaProducer,
        stats: LandingStats,
    ) -> Checkpoint:
        # Step 2
        checkpoint = Checkpoint(previous.seq + 1, dict(previous.offsets), dict(previous.max_event_ms))
        columns: dict[str, list[Any]] = {name: [] for name in BRONZE_SCHEMA.names}
        futures = []
        for record in records:
            decoded = self.codec.decode(record.value, record.headers)
            part = record.partition
            checkpoint.offsets[part] = max(checkpoint.offsets.get(part, 0), record.offset + 1)
            if not isinstance(decoded, DecodedEvent):
                letter = dead_letter(record, decoded.reason, decoded.detail)
                futures.append(self._send(producer, letter))
                stats.malformed += 1
                stats.reasons[decoded.reason] = stats.reasons.get(decoded.reason, 0) + 1
                continue
            late = self._late(decoded, part, checkpoint)
            if late:
                detail = f"event_time {decoded.event['event_time']} behind the partition watermark"
                futures.append(self._send(producer, dead_letter(record, Reason.LATE, detail)))
                stats.late += 1
                stats.reasons[Reason.LATE] = stats.reasons.get(Reason.LATE, 0) + 1
            _append_row(columns, decoded, record, late)
        # Step 3
        producer.flush(timeout=60)
        for future in futures:
            future.get(timeout=60)  # raises the broker's error: never commit past an unsent letter
        # Step 4
        self._commit(pa.table(columns, schema=BRONZE_SCHEMA), checkpoint)
        stats.batches += 1
        stats.records += len(records)
        stats.landed += len(columns["event_id"])
        return checkpoint

    def _late(self, decoded: DecodedEvent, partition: int, checkpoint: Checkpoint) -> bool:
        ts = decoded.event["event_time"]
        seen = checkpoint.max_event_ms.get(partition)
        if seen is None or ts > seen:
            checkpoint.max_event_ms[partition] = ts
            return False
        watermark = seen - self.config.max_out_of_orderness_ms
        return ts < watermark - self.config.allowed_lateness_ms

    def _send(self, producer: KafkaProducer, letter: Any) -> Any:
        return producer.send(
            self.config.dlq_topic, value=letter.value, key=letter.key, headers=letter.kafka_headers()
        )

    def _commit(self, table: pa.Table, checkpoint: Checkpoint) -> None:
        with staging_dir(self.config.table.parent / "_staging") as folder:
            self._write(with_date(arrow_to_spark(self.spark, table, folder)), checkpoint)

    def _write(self, frame: DataFrame, checkpoint: Checkpoint) -> None:
        (
            frame.write.format("delta")
            .mode("append")
            .partitionBy("date")
            .option("txnAppId", self.config.app_id)
            .option("txnVersion", checkpoint.seq)
            .option("userMetadata", checkpoint.metadata(self.config.app_id))
            .save(str(self.config.table))
        )


def _append_row(
    columns: dict[str, list[Any]], decoded: DecodedEvent, record: ConsumerRecord, late: bool
) -> None:
    event: Mapping[str, Any] = decoded.event
    for name in EVENT_COLUMNS:
        columns[name].append(event[name])
    columns["produce_ts_ms"].append(decoded.produce_ts_ms)
    columns["kafka_topic"].append(record.topic)
    columns["kafka_partition"].append(record.partition)
    columns["kafka_offset"].append(record.offset)
    columns["late"].append(late)
