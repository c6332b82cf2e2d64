"""Landing from real Kafka into Delta: exactly once across reruns; malformed, future-dated, late -> DLQ."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition

from headwater.pipelines.events.codec import EventCodec, parse_dead_letter
from headwater.pipelines.offline.landing import Lander, LandingConfig, read_checkpoint
from headwater.pipelines.offline.testing import T0, behaviour, event, payment, payments
from headwater.pipelines.settings import Settings
from headwater.pipelines.topics import ensure_topics
from headwater.registry.plans import PlanSource


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
    # A future-dated event first: were it to move the watermark, every later event would look late.
    future_ms = time.time_ns() // 1_000_000 + behaviour().max_future_ms + 3_600_000
    first = [(codec.encode(event(60, "u1", "click", future_ms, item_id="i1")), codec.headers(), 0)]  # type: ignore[arg-type]
    first += [good(codec, n, T0 + n * 1000, n % 2) for n in range(1, 7)]
    first.append((b"\x00garbage", codec.headers(), 0))
    first.append((codec.encode(event(50, "u1", "click", T0 - 600_000, item_id="i1")), codec.headers(), 1))  # type: ignore[arg-type]
    produce(kafka_bootstrap, topic, first)
    source = behaviour().model_copy(update={"topic": topic})
    config = LandingConfig(kafka_bootstrap, source, dlq, tmp_path / "bronze" / "events", batch_records=5)
    stats = Lander(spark, config).run()
    assert (stats.records, stats.landed, stats.malformed, stats.late, stats.future) == (9, 7, 1, 1, 1)
    landed = bronze_rows(spark, config.table)
    assert {r[2] for r in landed} == {f"e{n:05d}" for n in (1, 2, 3, 4, 5, 6, 50)}
    late = spark.read.format("delta").load(str(config.table)).where("late").collect()
    assert [r["event_id"] for r in late] == ["e00050"]
    letters = dead_letters(kafka_bootstrap, dlq)
    assert sorted(letter.reason for letter in letters) == ["corrupt_payload", "future_dated", "late"]
    future = next(letter for letter in letters if letter.reason == "future_dated")
    assert (future.source_partition, future.source_offset) == (0, 0)
    assert "ahead of the landing clock" in future.detail
    assert {(letter.source_topic, letter.source_partition) for letter in letters} == {(topic, 0), (topic, 1)}

    # Rerun: nothing new lands. A batch replayed with an already committed txnVersion is skipped by Delta.
    assert Lander(spark, config).run().records == 0
    checkpoint = read_checkpoint(spark, config)
    assert checkpoint.offsets == {0: 5, 1: 4}
    lander = Lander(spark, config)
    from headwater.pipelines.offline.bronze import events_table

    replay = checkpoint.__class__(checkpoint.seq, dict(checkpoint.offsets), dict(checkpoint.max_event_ms))
    lander._commit(events_table(source, [event(1, "u1", "click", T0 + 1000, item_id="i1")]), replay)
    assert bronze_rows(spark, config.table) == landed

    # New records land once, from where the table says landing stopped.
    produce(kafka_bootstrap, topic, [good(codec, 7, T0 + 7000, 0), good(codec, 8, T0 + 8000, 1)])
    stats = Lander(spark, config).run()
    assert (stats.records, stats.landed) == (2, 2)
    after = bronze_rows(spark, config.table)
    assert len(after) == 9
    assert len({(p, o) for p, o, _ in after}) == 9
    assert read_checkpoint(spark, config).offsets == {0: 6, 1: 5}


def test_landing_with_reader_processes_is_exactly_once(
    spark: Any, kafka_bootstrap: str, topics: tuple[str, str], tmp_path: Path
) -> None:
    topic, dlq = topics
    codec = EventCodec()
    future_ms = time.time_ns() // 1_000_000 + behaviour().max_future_ms + 3_600_000
    batch = [good(codec, n, T0 + n * 1000, n % 2) for n in range(1, 31)]
    batch.append((b"\x00garbage", codec.headers(), 1))
    batch.append((codec.encode(event(99, "u1", "click", future_ms, item_id="i1")), codec.headers(), 0))  # type: ignore[arg-type]
    produce(kafka_bootstrap, topic, batch)
    source = behaviour().model_copy(update={"topic": topic})
    config = LandingConfig(
        kafka_bootstrap, source, dlq, tmp_path / "bronze" / "events", batch_records=8, workers=2
    )
    stats = Lander(spark, config).run()
    assert (stats.records, stats.landed, stats.malformed, stats.future, stats.late) == (32, 30, 1, 1, 0)
    assert stats.batches >= 4  # 8 records per batch, dealt to 2 readers
    landed = bronze_rows(spark, config.table)
    assert [r[2] for r in sorted(landed, key=lambda r: r[2])] == [f"e{n:05d}" for n in range(1, 31)]
    assert read_checkpoint(spark, config).offsets == {0: 16, 1: 16}
    assert sorted(letter.reason for letter in dead_letters(kafka_bootstrap, dlq)) == [
        "corrupt_payload", "future_dated"]  # fmt: skip

    # A rerun, with readers or in-process, lands nothing; new records land once either way.
    assert Lander(spark, config).run().records == 0
    produce(kafka_bootstrap, topic, [good(codec, 40, T0 + 40_000, 0), good(codec, 41, T0 + 41_000, 1)])
    in_process = LandingConfig(kafka_bootstrap, source, dlq, config.table, batch_records=8, workers=1)
    assert Lander(spark, in_process).run().landed == 2
    after = bronze_rows(spark, config.table)
    assert len(after) == 32
    assert len({(p, o) for p, o, _ in after}) == 32
    assert read_checkpoint(spark, config).offsets == {0: 17, 1: 17}


def evolved_payments(root: Path) -> PlanSource:
    """The example payments source after a compatible change: field ``channel`` added with a default."""
    import json

    from headwater.pipelines.events.schema import example_repo
    from headwater.registry.plans import plan_source
    from headwater.registry.testing import ScratchRepo

    repo = ScratchRepo(root / "features", template=example_repo())
    schema = json.loads((repo.root / "schemas" / "payment_event.avsc").read_text(encoding="utf-8"))
    repo.write("schemas/payment_event.v1.avsc", json.dumps(schema))
    schema["fields"].append({"name": "channel", "type": ["null", "string"], "default": None})
    repo.write("schemas/payment_event.avsc", json.dumps(schema))
    text = (repo.root / "sources.yaml").read_text(encoding="utf-8")
    line = "    schema: schemas/payment_event.avsc\n"
    repo.write(
        "sources.yaml", text.replace(line, line + "    previous_schemas: [schemas/payment_event.v1.avsc]\n")
    )
    result = repo.check()
    assert "payments" in result.sources, [d.message for d in result.diagnostics.errors]
    return plan_source(result.sources["payments"])


def test_a_compatible_schema_change_keeps_landing_old_and_new_events(
    spark: Any, kafka_bootstrap: str, topics: tuple[str, str], tmp_path: Path
) -> None:
    topic, dlq = topics
    v1 = payments().model_copy(update={"topic": topic})
    v2 = evolved_payments(tmp_path).model_copy(update={"topic": topic})
    old, new = EventCodec(v1), EventCodec(v2)
    table = tmp_path / "bronze" / "payments"
    produce(kafka_bootstrap, topic, [(old.encode(payment(n, "a1", T0 + n * 1000)), old.headers(), 0)
                                     for n in range(1, 4)])  # fmt: skip
    assert Lander(spark, LandingConfig(kafka_bootstrap, v1, dlq, table)).run().landed == 3
    assert "channel" not in spark.read.format("delta").load(str(table)).columns

    # After apply: the landing reads with the new schema; producers of both versions still send.
    produce(kafka_bootstrap, topic, [
        (new.encode(payment(4, "a1", T0 + 4000, channel="app")), new.headers(), 0),
        (old.encode(payment(5, "a1", T0 + 5000)), old.headers(), 0),
    ])  # fmt: skip
    stats = Lander(spark, LandingConfig(kafka_bootstrap, v2, dlq, table)).run()
    assert (stats.records, stats.landed, stats.malformed) == (2, 2, 0)
    rows = (
        spark.read.format("delta").load(str(table)).select("payment_id", "channel", "occurred_at").collect()
    )
    channels = sorted((r[0], r[1]) for r in rows)
    assert channels == [(f"p0000{n}", "app" if n == 4 else None) for n in range(1, 6)]
    assert {r[0]: r[2] for r in rows}["p00005"] == (T0 + 5000) * 1000


def test_one_event_four_minutes_ahead_does_not_dead_letter_the_normal_traffic(
    spark: Any, kafka_bootstrap: str, topics: tuple[str, str], tmp_path: Path
) -> None:
    """Issue 16 item 1: an accepted event from the future is landed but does not move the watermark."""
    topic, dlq = topics
    codec = EventCodec()
    now = time.time_ns() // 1_000_000
    ahead = now + 240_000  # within max_future (5 min): accepted
    assert ahead - now < behaviour().max_future_ms
    times = [now - 3_000, ahead, *(now - 2_000 + i * 100 for i in range(10))]
    produce(kafka_bootstrap, topic, [good(codec, n, t, 0) for n, t in enumerate(times, start=1)])
    source = behaviour().model_copy(update={"topic": topic})
    config = LandingConfig(kafka_bootstrap, source, dlq, tmp_path / "bronze" / "events", batch_records=4)
    stats = Lander(spark, config).run()
    assert (stats.records, stats.landed, stats.late, stats.future, stats.malformed) == (12, 12, 0, 0, 0)
    assert spark.read.format("delta").load(str(config.table)).where("late").count() == 0
    assert dead_letters(kafka_bootstrap, dlq) == []
    assert read_checkpoint(spark, config).max_event_ms[0] <= time.time_ns() // 1_000_000
