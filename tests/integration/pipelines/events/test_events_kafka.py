"""The event stream through the real broker: fields, headers, keys, and bad records survived."""

import json
import time
import uuid
from collections.abc import Callable

import pytest
from click.testing import CliRunner
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from headwater.cli.events import events
from headwater.pipelines.events.codec import (
    HEADER_PRODUCE_TS,
    HEADER_SCHEMA_FP,
    DecodedEvent,
    DecodeError,
    EventCodec,
    Reason,
    dead_letter,
    parse_dead_letter,
)
from headwater.pipelines.events.generator import EventGenerator, GeneratorConfig
from headwater.pipelines.events.producer import ProduceError, ProducerSettings, produce
from headwater.pipelines.events.tail import TailedRecord, tail


def read_all(bootstrap: str, topic: str, expected: int) -> list:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False)
    partitions = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())]
    consumer.assign(partitions)
    consumer.seek_to_beginning(*partitions)
    records: list = []
    deadline = time.monotonic() + 30
    while len(records) < expected and time.monotonic() < deadline:
        for batch in consumer.poll(timeout_ms=500).values():
            records.extend(batch)
    consumer.close()
    return records


def test_events_round_trip_with_every_field_and_header(
    kafka_bootstrap: str, new_topic: Callable[[int], str]
) -> None:
    topic = new_topic(3)
    codec = EventCodec()
    config = GeneratorConfig(
        seed=21, late_share=0, out_of_order_share=0, duplicate_share=0, malformed_share=0
    )
    sent = [e.event for e in EventGenerator(config, codec).take(1_500) if e.event is not None]
    sent[0] = {**sent[0], "item_id": None, "event_type": "search", "query": "jazz é", "category": None}
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap, linger_ms=5)
    before_ms = time.time_ns() // 1_000_000
    for event in sent:
        producer.send(topic, codec.encode(event), key=event["user_id"].encode(), headers=codec.headers())
    producer.flush()
    producer.close()
    after_ms = time.time_ns() // 1_000_000

    records = read_all(kafka_bootstrap, topic, len(sent))
    assert len(records) == len(sent)
    by_id = {e["event_id"]: e for e in sent}
    partition_of_user: dict[str, int] = {}
    for record in records:
        headers = dict(record.headers)
        assert headers[HEADER_SCHEMA_FP] == codec.fingerprint_header
        assert before_ms <= int(headers[HEADER_PRODUCE_TS]) <= after_ms
        result = codec.decode(record.value, record.headers)
        assert isinstance(result, DecodedEvent), result
        # the generator writes no experiment arm: the current schema's default (null) fills it
        assert result.event == {"arm": None, **by_id.pop(result.event["event_id"])}
        assert record.key == result.event["user_id"].encode()
        user = result.event["user_id"]
        assert partition_of_user.setdefault(user, record.partition) == record.partition
    assert not by_id
    assert len(set(partition_of_user.values())) == 3


def test_bad_records_are_detected_and_the_consumer_goes_on(
    kafka_bootstrap: str, new_topic: Callable[[int], str]
) -> None:
    topic, dlq = new_topic(1), new_topic(1)
    codec = EventCodec()
    good = [
        e.event
        for e in EventGenerator(GeneratorConfig(seed=3, malformed_share=0, duplicate_share=0), codec).take(3)
    ]
    fp = (HEADER_SCHEMA_FP, codec.fingerprint_header)
    payloads: list[tuple[bytes | None, list[tuple[str, bytes]]]] = [
        (codec.encode(good[0]), codec.headers()),  # type: ignore[arg-type]
        (codec.encode(good[1]), [(HEADER_SCHEMA_FP, b"00000000deadbeef")]),  # type: ignore[arg-type]
        (b"\x02\xff\xfe\x00garbage", [fp]),
        (codec.encode(good[1]), []),  # type: ignore[arg-type]
        (codec.encode(good[2])[:-3], [fp]),  # type: ignore[arg-type]
        (codec.encode(good[2]), codec.headers()),  # type: ignore[arg-type]
    ]
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap)
    for value, headers in payloads:
        producer.send(topic, value, headers=headers)
    producer.flush()

    seen: list[TailedRecord] = []
    summary = tail(kafka_bootstrap, topic, from_beginning=True, timeout_s=3, on_record=seen.append)
    assert [r.offset for r in seen] == list(range(6))
    kinds = [r.result.reason if isinstance(r.result, DecodeError) else "ok" for r in seen]
    assert kinds == [
        "ok",
        Reason.UNKNOWN_FINGERPRINT,
        Reason.CORRUPT_PAYLOAD,
        Reason.MISSING_FINGERPRINT,
        Reason.CORRUPT_PAYLOAD,
        "ok",
    ]
    assert isinstance(seen[5].result, DecodedEvent)
    assert seen[5].result.event == {"arm": None, **good[2]}  # type: ignore[dict-item]
    assert summary.records == 6
    assert dict(summary.invalid) == {"unknown_fingerprint": 1, "corrupt_payload": 2, "missing_fingerprint": 1}

    # The dead letters built from the rejects carry the original bytes and where they came from.
    consumer = KafkaConsumer(bootstrap_servers=kafka_bootstrap, group_id=None, enable_auto_commit=False)
    partition = TopicPartition(topic, 0)
    consumer.assign([partition])
    consumer.seek_to_beginning(partition)
    raw = [r for batch in consumer.poll(timeout_ms=5_000).values() for r in batch]
    consumer.close()
    for record, tailed in zip(raw, seen, strict=False):
        if isinstance(tailed.result, DecodeError):
            letter = dead_letter(record, tailed.result.reason, tailed.result.detail)
            producer.send(dlq, letter.value, key=letter.key, headers=letter.kafka_headers())
    producer.flush()
    producer.close()
    letters = [parse_dead_letter(r.value, r.key, r.headers) for r in read_all(kafka_bootstrap, dlq, 4)]
    assert [(d.source_topic, d.source_offset, d.reason) for d in letters] == [
        (topic, 1, "unknown_fingerprint"),
        (topic, 2, "corrupt_payload"),
        (topic, 3, "missing_fingerprint"),
        (topic, 4, "corrupt_payload"),
    ]
    assert letters[1].value == b"\x02\xff\xfe\x00garbage"
    assert letters[0].original_headers == [(HEADER_SCHEMA_FP, b"00000000deadbeef")]


def test_producer_counts_match_what_the_topic_holds(
    kafka_bootstrap: str, new_topic: Callable[[int], str]
) -> None:
    topic = new_topic(4)
    config = GeneratorConfig(
        seed=8, late_share=0.05, out_of_order_share=0.05, duplicate_share=0.03, malformed_share=0.02
    )
    settings = ProducerSettings(
        bootstrap=kafka_bootstrap, topic=topic, rate=0, duration_s=120, max_events=3_000
    )
    stats = produce(settings, config)
    assert stats.sent == 3_000
    assert stats.failed == 0
    assert stats.malformed > 20
    assert stats.duplicates > 30
    assert stats.late > 50
    assert stats.out_of_order > 50

    summary = tail(kafka_bootstrap, topic, from_beginning=True, timeout_s=3)
    assert summary.records == 3_000
    assert sum(summary.invalid.values()) == stats.malformed
    assert summary.duplicate_ids == stats.duplicates
    assert sum(summary.by_type.values()) == 3_000 - stats.malformed
    assert len(summary.ages_ms) == 3_000 - stats.malformed

    # Event time is the wall clock at send minus the intended lag: exactly produce-ts when on time.
    codec = EventCodec()
    lags = []
    for record in read_all(kafka_bootstrap, topic, 3_000):
        result = codec.decode(record.value, record.headers)
        if isinstance(result, DecodedEvent):
            assert result.produce_ts_ms is not None
            lags.append(result.produce_ts_ms - result.event["event_time"])
    on_time = 3_000 - stats.malformed - stats.late - stats.out_of_order - stats.duplicates
    assert min(lags) >= 0
    assert sum(lag == 0 for lag in lags) >= on_time
    assert stats.late <= sum(lag >= 120_000 for lag in lags) <= stats.late + stats.duplicates


def test_producer_names_a_missing_topic(kafka_bootstrap: str) -> None:
    settings = ProducerSettings(
        bootstrap=kafka_bootstrap, topic=f"absent.{uuid.uuid4().hex}", max_events=1, connect_timeout_s=2
    )
    with pytest.raises(
        ProduceError, match=r"topic 'absent\.[0-9a-f]+' not found on .*headwater topics create"
    ):
        produce(settings)


def test_cli_produce_then_tail(kafka_bootstrap: str, new_topic: Callable[[int], str]) -> None:
    topic = new_topic(2)
    runner = CliRunner()
    env = {"HEADWATER_KAFKA_BOOTSTRAP": kafka_bootstrap}
    produced = runner.invoke(
        events,
        [
            "produce",
            "--rate",
            "400",
            "--duration",
            "2",
            "--seed",
            "3",
            "--topic",
            topic,
            "--malformed-share",
            "0.05",
        ],
        env=env,
    )
    assert produced.exit_code == 0, produced.output
    counts = json.loads(produced.stdout.strip().splitlines()[-1])
    assert counts["topic"] == topic
    assert counts["sent"] > 100
    assert counts["failed"] == 0

    tailed = runner.invoke(events, ["tail", "--from-beginning", "--topic", topic, "--timeout", "3"], env=env)
    assert tailed.exit_code == 0, tailed.output
    lines = [json.loads(line) for line in tailed.stdout.splitlines()]
    assert len(lines) == counts["sent"] - counts["malformed"]
    assert all(set(line) >= {"event_id", "user_id", "event_type", "event_time", "device"} for line in lines)
    assert f"records {counts['sent']:,}" in tailed.stderr
    assert "invalid:" in tailed.stderr


def test_history_mode_spreads_event_times_over_the_span_before_now(
    kafka_bootstrap: str, new_topic: Callable[[int], str]
) -> None:
    topic = new_topic(2)
    config = GeneratorConfig(seed=3, late_share=0, out_of_order_share=0, duplicate_share=0, malformed_share=0)
    settings = ProducerSettings(
        bootstrap=kafka_bootstrap, topic=topic, rate=0, max_events=2_000, history_s=2 * 86_400
    )
    before_ms = time.time_ns() // 1_000_000
    stats = produce(settings, config)
    after_ms = time.time_ns() // 1_000_000
    assert (stats.sent, stats.failed) == (2_000, 0)

    codec = EventCodec()
    times = sorted(
        result.event["event_time"]
        for record in read_all(kafka_bootstrap, topic, 2_000)
        if isinstance(result := codec.decode(record.value, record.headers), DecodedEvent)
    )
    assert len(times) == 2_000
    # 2,000 events over 2 days: the first near the start of the span, the last near now, none in the future.
    assert before_ms - 2 * 86_400_000 <= times[0] < before_ms - 2 * 86_400_000 + 3_600_000
    assert before_ms - 3 * 3_600_000 < times[-1] <= after_ms
    days = {t // 86_400_000 for t in times}
    assert len(days) >= 2


def test_history_mode_needs_an_event_budget(kafka_bootstrap: str) -> None:
    with pytest.raises(ValueError, match="--max-events"):
        ProducerSettings(bootstrap=kafka_bootstrap, topic="events", history_s=3600)
