import random
from dataclasses import dataclass, field

import pytest

from headwater.pipelines.events.codec import (
    HEADER_PRODUCE_TS,
    HEADER_SCHEMA_FP,
    DecodedEvent,
    DecodeError,
    EncodeError,
    EventCodec,
    Reason,
    dead_letter,
    parse_dead_letter,
)
from headwater.pipelines.events.schema import BehaviorEvent, load_schema

FULL: BehaviorEvent = {
    "event_id": "0f8fad5b-d9cb-469f-a165-70867728950e",
    "user_id": "u000042",
    "item_id": "i001337",
    "event_type": "purchase",
    "event_time": 1_767_225_600_123,
    "session_id": "s-00ff00ff00ff00ff",
    "category": "music",
    "price": 129.99,
    "dwell_ms": 8_500,
    "query": "jazz vinyl é 🎷",
    "position": 3,
    "device": "android",
}
SEARCH_WITH_NULLS: BehaviorEvent = {
    "event_id": "e-1",
    "user_id": "u-1",
    "item_id": None,
    "event_type": "search",
    "event_time": 946_684_800_000,
    "session_id": "s-1",
    "category": None,
    "price": None,
    "dwell_ms": None,
    "query": "q",
    "position": None,
    "device": "web",
}


@pytest.fixture(scope="module")
def codec() -> EventCodec:
    return EventCodec()


def headers(codec: EventCodec, ts: int = 1_767_225_600_999) -> list[tuple[str, bytes]]:
    return codec.headers(produce_ts_ms=ts)


@pytest.mark.parametrize("event", [FULL, SEARCH_WITH_NULLS], ids=["all-fields", "nulls"])
def test_round_trip_keeps_every_field(codec: EventCodec, event: BehaviorEvent) -> None:
    result = codec.decode(codec.encode(event), headers(codec))
    assert isinstance(result, DecodedEvent)
    assert result.event == event
    assert type(result.event["event_time"]) is int
    assert result.fingerprint == load_schema().fingerprint
    assert result.produce_ts_ms == 1_767_225_600_999


def test_every_event_type_and_device_round_trips(codec: EventCodec) -> None:
    for kind in ("impression", "click", "like", "share", "purchase", "search", "dwell"):
        for device in ("ios", "android", "web"):
            event = {**FULL, "event_type": kind, "device": device}
            result = codec.decode(codec.encode(event), headers(codec))  # type: ignore[arg-type]
            assert isinstance(result, DecodedEvent), (kind, result)
            assert result.event == event


def test_headers_carry_fingerprint_and_produce_time(codec: EventCodec) -> None:
    hdrs = dict(codec.headers(produce_ts_ms=1_700_000_000_000))
    assert hdrs == {HEADER_SCHEMA_FP: b"5335328fdc7bb5ab", HEADER_PRODUCE_TS: b"1700000000000"}
    stamped = int(dict(codec.headers())[HEADER_PRODUCE_TS])
    assert stamped > 1_700_000_000_000


def test_encoding_reuses_its_buffer_without_leaking_bytes(codec: EventCodec) -> None:
    long_one = codec.encode(FULL)
    short_one = codec.encode(SEARCH_WITH_NULLS)
    assert len(short_one) < len(long_one)
    assert codec.encode(FULL) == long_one
    assert codec.decode(short_one, headers(codec)) == DecodedEvent(
        SEARCH_WITH_NULLS, load_schema().fingerprint, 1_767_225_600_999
    )


def test_encode_error_names_the_event(codec: EventCodec) -> None:
    with pytest.raises(EncodeError, match="0f8fad5b"):
        codec.encode({**FULL, "event_type": "bookmark"})  # type: ignore[typeddict-item]


def test_missing_fingerprint(codec: EventCodec) -> None:
    only_ts = [(HEADER_PRODUCE_TS, b"1")]
    for hdrs in (None, [], only_ts):
        result = codec.decode(codec.encode(FULL), hdrs)
        assert isinstance(result, DecodeError)
        assert result.reason is Reason.MISSING_FINGERPRINT


def test_unknown_fingerprint_names_both_fingerprints(codec: EventCodec) -> None:
    result = codec.decode(codec.encode(FULL), [(HEADER_SCHEMA_FP, b"deadbeefdeadbeef")])
    assert isinstance(result, DecodeError)
    assert result.reason is Reason.UNKNOWN_FINGERPRINT
    assert "deadbeefdeadbeef" in result.detail
    assert "5335328fdc7bb5ab" in result.detail


@pytest.mark.parametrize("raw_ts", [b"soon", b"-5", b"", b"12345678901234567890"])
def test_invalid_produce_ts_header(codec: EventCodec, raw_ts: bytes) -> None:
    hdrs = [(HEADER_SCHEMA_FP, load_schema().fingerprint_header), (HEADER_PRODUCE_TS, raw_ts)]
    result = codec.decode(codec.encode(FULL), hdrs)
    assert isinstance(result, DecodeError)
    assert result.reason is Reason.INVALID_HEADER


def test_produce_ts_is_optional(codec: EventCodec) -> None:
    result = codec.decode(codec.encode(FULL), [(HEADER_SCHEMA_FP, load_schema().fingerprint_header)])
    assert isinstance(result, DecodedEvent)
    assert result.produce_ts_ms is None


@pytest.mark.parametrize("value", [None, b""])
def test_empty_payload(codec: EventCodec, value: bytes | None) -> None:
    result = codec.decode(value, headers(codec))
    assert isinstance(result, DecodeError)
    assert result.reason is Reason.EMPTY_PAYLOAD


def test_every_truncation_is_corrupt(codec: EventCodec) -> None:
    data = codec.encode(FULL)
    for cut in range(1, len(data)):
        result = codec.decode(data[:cut], headers(codec))
        assert isinstance(result, DecodeError), cut
        assert result.reason is Reason.CORRUPT_PAYLOAD, (cut, result)


def test_trailing_bytes_are_corrupt(codec: EventCodec) -> None:
    result = codec.decode(codec.encode(FULL) + b"\x00\x01", headers(codec))
    assert isinstance(result, DecodeError)
    assert result.reason is Reason.CORRUPT_PAYLOAD
    assert "2 trailing bytes" in result.detail


def test_invalid_utf8_is_corrupt(codec: EventCodec) -> None:
    data = bytearray(codec.encode(FULL))
    data[1] = 0xFF  # first byte of event_id's characters
    result = codec.decode(bytes(data), headers(codec))
    assert isinstance(result, DecodeError)
    assert result.reason is Reason.CORRUPT_PAYLOAD
    assert "UnicodeDecodeError" in result.detail


@pytest.mark.parametrize(
    ("change", "field_name"),
    [
        ({"event_id": ""}, "event_id"),
        ({"user_id": "u" * 129}, "user_id"),
        ({"session_id": ""}, "session_id"),
        ({"event_time": 0}, "event_time"),
        ({"event_time": 4_102_444_800_000}, "event_time"),
        ({"event_type": "click", "item_id": None}, "item_id"),
        ({"event_type": "search", "query": None}, "query"),
        ({"event_type": "search", "query": ""}, "query"),
        ({"event_type": "dwell", "dwell_ms": None}, "dwell_ms"),
        ({"dwell_ms": -1}, "dwell_ms"),
        ({"price": -0.01}, "price"),
        ({"price": float("nan")}, "price"),
        ({"price": float("inf")}, "price"),
        ({"position": 0}, "position"),
    ],
)
def test_field_rules(codec: EventCodec, change: dict[str, object], field_name: str) -> None:
    result = codec.decode(codec.encode({**FULL, **change}), headers(codec))  # type: ignore[typeddict-item]
    assert isinstance(result, DecodeError)
    assert result.reason is Reason.INVALID_FIELD
    assert result.detail.startswith(f"{field_name}:")


def test_fuzzed_bytes_never_raise(codec: EventCodec) -> None:
    rng = random.Random(2024)
    data = codec.encode(FULL)
    reasons: dict[str, int] = {}
    decoded = 0
    for i in range(20_000):
        if i % 3 == 0:
            blob = rng.randbytes(rng.randint(1, 120))
        elif i % 3 == 1:
            mutated = bytearray(data)
            for _ in range(rng.randint(1, 4)):
                mutated[rng.randrange(len(mutated))] = rng.getrandbits(8)
            blob = bytes(mutated)
        else:
            blob = data[: rng.randrange(1, len(data))] + rng.randbytes(rng.randint(0, 8))
        result = codec.decode(blob, headers(codec))
        if isinstance(result, DecodeError):
            reasons[result.reason.value] = reasons.get(result.reason.value, 0) + 1
        else:
            decoded += 1
            assert result.event["event_type"] in (
                "impression",
                "click",
                "like",
                "share",
                "purchase",
                "search",
                "dwell",
            )
    assert set(reasons) <= {"corrupt_payload", "invalid_field"}
    assert reasons["corrupt_payload"] > 10_000
    assert decoded + sum(reasons.values()) == 20_000


@dataclass
class FakeRecord:
    topic: str = "events"
    partition: int = 3
    offset: int = 12_345
    key: bytes | None = b"u000042"
    value: bytes | None = b"\x00\xffbroken"
    headers: list[tuple[str, bytes | None]] = field(
        default_factory=lambda: [(HEADER_SCHEMA_FP, b"5335328fdc7bb5ab"), (HEADER_PRODUCE_TS, b"17")]
    )


def test_dead_letter_keeps_the_original_and_round_trips(codec: EventCodec) -> None:
    record = FakeRecord()
    error = codec.decode(record.value, record.headers)
    assert isinstance(error, DecodeError)
    letter = dead_letter(record, error.reason, error.detail, now_ms=1_800_000_000_000)
    hdrs = letter.kafka_headers()
    assert hdrs[:2] == [(HEADER_SCHEMA_FP, b"5335328fdc7bb5ab"), (HEADER_PRODUCE_TS, b"17")]
    assert dict(hdrs)["dlq-reason"] == b"corrupt_payload"
    assert dict(hdrs)["dlq-source-offset"] == b"12345"
    back = parse_dead_letter(record.value, record.key, hdrs)
    assert back == letter
    assert back.source_topic == "events"
    assert back.source_partition == 3
    assert back.failed_at_ms == 1_800_000_000_000


def test_dead_letter_for_a_tombstone_and_a_late_event() -> None:
    letter = dead_letter(
        FakeRecord(value=None, headers=[]), Reason.LATE, "event_time 10 min behind", now_ms=5
    )
    back = parse_dead_letter(None, b"u000042", letter.kafka_headers())
    assert back.value is None
    assert back.reason == "late"
    assert back.original_headers == []


def test_parse_dead_letter_rejects_other_records() -> None:
    with pytest.raises(ValueError, match=r"not a headwater dead letter: missing header\(s\) \['dlq-reason'"):
        parse_dead_letter(b"x", None, [(HEADER_SCHEMA_FP, b"5335328fdc7bb5ab")])
    letter = dead_letter(FakeRecord(), Reason.CORRUPT_PAYLOAD, "x", now_ms=1)
    hdrs = [(k, b"three" if k == "dlq-source-offset" else v) for k, v in letter.kafka_headers()]
    with pytest.raises(ValueError, match="is not an integer"):
        parse_dead_letter(b"x", None, hdrs)
