"""Landing from real Kafka into Delta: exactly once across reruns, malformed and late -> DLQ with reasons."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition

from headwater.pipelines.events.codec import EventCodec, parse_dead_letter
from headwater.pipelines.offline.landing import Lander, LandingConfig, read_checkpoint
from headwater.pipelines.offline.testing import T0, event
from headwater.pipelines.settings import Settings
from headwater.pipelines.topics import ensure_topics


@pytest.fixture
def topics(kafka_bootstrap: str) -> Iterator[tuple[str, str]]:
    name = f"offline-landing-{uuid.uuid4().hex[:8]}"
    ensure_topics(Settings.from_env(), {name: {}, f"{name}.dlq": {}}, partitions=2)
    yield name, f"{name}.dlq"
    admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    admin.delete_topics([name, f"{name}.dlq"])
    admin.close()


def produce(bootstrap: str, topic: str, records: list[tuple[bytes, list[tuple[str, bytes]], int]]) -> None:
    producer = KafkaProducer(bootstrap_servers=bootstrap)
    for value, headers, partition in records:
        producer.send(topic, value=value, headers=headers, partition=partition, key=b"k")
    producer.flush()
    producer.close()


def good(codec: EventCodec, n: int, t: int, partition: int = 0) -> tuple[bytes, list[tuple[str, bytes]], int]:
    return codec.encode(event(n, f"u{n % 3}", "click", t, item_id="i1")), codec.headers(), partition  # type: ignore[arg-type]


def dead_letters(bootstrap: str, topic: str) -> list[Any]:
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap, auto_offset_reset="earliest", consumer_timeout_ms=3000
    )
    consumer.assign([TopicPartition(topic, 0), TopicPartition(topic, 1)])
    consumer.seek_to_beginning()
    letters = [parse_dead_letter(r.value, r.key, r.headers) for r in consumer]
    consumer.close()
    return letters


def bronze_rows(spark: Any, table: Path) -> list[tuple[int, int, str]]:
    rows = (
        spark.read.format("delta")
        .load(str(table))
        .select("kafka_partition", "kafka_offset", "event_id")
        .collect()
    )
    return sorted((r[0], r[1], r[2]) for r in rows)


def test_landing_is_exactly_once_and_dead_letters_bad_records(
    spark: Any, kafka_bootstrap: str, topics: tuple[str, str], tmp_path: Path
) -> None:
    topic, dlq = topics
    codec = EventCodec()
    first = [good(codec, n, T0 + n * 1000, n % 2) for n in range(1, 7)]
    first.append((b"\x00garbage", codec.headers(), 0))
    first.append((codec.encode(event(50, "u1", "click", T0 - 600_000, item_id="i1")), codec.headers(), 1))  # type: ignore[arg-type]
    produce(kafka_bootstrap, topic, first)
    config = LandingConfig(kafka_bootstrap, topic, dlq, tmp_path / "bronze" / "events", batch_records=5)
    stats = Lander(spark, config).run()
    assert (stats.records, stats.landed, stats.malformed, stats.late) == (8, 7, 1, 1)
    landed = bronze_rows(spark, config.table)
    assert {r[2] for r in landed} == {f"e{n:05d}" for n in (1, 2, 3, 4, 5, 6, 50)}
    late = spark.read.format("delta").load(str(config.table)).where("late").collect()
    assert [r["event_id"] for r in late] == ["e00050"]
    letters = dead_letters(kafka_bootstrap, dlq)
    assert sorted(letter.reason for letter in letters) == ["corrupt_payload", "late"]
    assert {(letter.source_topic, letter.source_partition) for letter in letters} == {(topic, 0), (topic, 1)}

    # Rerun: nothing new lands. A batch replayed with an already committed txnVersion is skipped by Delta.
    assert Lander(spark, config).run().records == 0
    checkpoint = read_checkpoint(spark, config)
    assert checkpoint.offsets == {0: 4, 1: 4}
    lander = Lander(spark, config)
    from headwater.pipelines.offline.bronze import events_table

    replay = checkpoint.__class__(checkpoint.seq, dict(checkpoint.offsets), dict(checkpoint.max_event_ms))
    lander._commit(events_table([event(1, "u1", "click", T0 + 1000, item_id="i1")]), replay)
    assert bronze_rows(spark, config.table) == landed

    # New records land once, from where the table says landing stopped.
    produce(kafka_bootstrap, topic, [good(codec, 7, T0 + 7000, 0), good(codec, 8, T0 + 8000, 1)])
    stats = Lander(spark, config).run()
    assert (stats.records, stats.landed) == (2, 2)
    after = bronze_rows(spark, config.table)
    assert len(after) == 9
    assert len({(p, o) for p, o, _ in after}) == 9
    assert read_checkpoint(spark, config).offsets == {0: 5, 1: 5}
