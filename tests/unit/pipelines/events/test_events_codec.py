"""The generic event codec on the example repo's two sources (`events`, `payments`).

Round trips, every rejection reason, the wire walk that agrees with Avro's Java decoder
(out-of-range enum and union indices, negative lengths, over-long varints), the size bounds, and
schema evolution (a payments v2 with a nullable field read alongside v1).
"""

import json
import random
import shutil
from dataclasses import dataclass, field
from pathlib import Path

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
from headwater.pipelines.events.schema import BehaviorEvent
from headwater.registry.plans import PlanSource, plan_source
from headwater.registry.validate import check_repo

EXAMPLE = Path(__file__).resolve().parents[4] / "features"
EVENTS_FP = "9b1c41fd8f13e589"  # schema version 2 (the experiment arm)

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
    "arm": "ranker-v2/treatment",
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
    "arm": None,
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
    assert result.fingerprint == EVENTS_FP
    assert result.event_time_ms == event["event_time"]
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
    assert hdrs == {HEADER_SCHEMA_FP: EVENTS_FP.encode(), HEADER_PRODUCE_TS: b"1700000000000"}
    stamped = int(dict(codec.headers())[HEADER_PRODUCE_TS])
    assert stamped > 1_700_000_000_000


def test_encoding_reuses_its_buffer_without_leaking_bytes(codec: EventCodec) -> None:
    long_one = codec.encode(FULL)
    short_one = codec.encode(SEARCH_WITH_NULLS)
    assert len(short_one) < len(long_one)
    assert codec.encode(FULL) == long_one
    assert codec.decode(short_one, headers(codec)) == DecodedEvent(
        SEARCH_WITH_NULLS, EVENTS_FP, 1_767_225_600_999, SEARCH_WITH_NULLS["event_time"]
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
    hdrs = [(HEADER_SCHEMA_FP, codec.fingerprint_header), (HEADER_PRODUCE_TS, raw_ts)]
    result = codec.decode(codec.encode(FULL), hdrs)
    assert isinstance(result, DecodeError)
    assert result.reason is Reason.INVALID_HEADER


def test_produce_ts_is_optional(codec: EventCodec) -> None:
    result = codec.decode(codec.encode(FULL), [(HEADER_SCHEMA_FP, codec.fingerprint_header)])
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
    ("change", "detail"),
    [
        ({"event_time": 0}, "event_time: expected UTC ms in [946684800000, 4102444800000)"),
        ({"event_time": 4_102_444_800_000}, "event_time: expected UTC ms"),
        ({"session_id": ""}, "rule \"session_id != ''\""),
        ({"event_type": "click", "item_id": None}, "rule \"event_type = 'search' or item_id is not null\""),
        ({"event_type": "search", "query": None}, "rule \"event_type != 'search' or (query"),
        ({"event_type": "search", "query": ""}, "rule \"event_type != 'search' or (query"),
        ({"event_type": "dwell", "dwell_ms": None}, "rule \"event_type != 'dwell' or dwell_ms is not null\""),
        ({"dwell_ms": -1}, "rule 'dwell_ms is null or dwell_ms >= 0'"),
        ({"price": -0.01}, "rule 'price is null or price >= 0'"),
        ({"price": float("nan")}, "rule 'price is null or price >= 0'"),
        ({"position": 0}, "rule 'position is null or position >= 1'"),
    ],
)
def test_field_rules(codec: EventCodec, change: dict[str, object], detail: str) -> None:
    result = codec.decode(codec.encode({**FULL, **change}), headers(codec))  # type: ignore[typeddict-item]
    assert isinstance(result, DecodeError)
    assert result.reason is Reason.INVALID_FIELD
    assert result.detail.startswith(detail), result.detail


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
    assert set(reasons) <= {"corrupt_payload", "invalid_field", "invalid_id"}  # invalid_id: a NUL in an id
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


# --- the wire walk: what Avro's Java decoder rejects is corrupt here too ------------------------


def varint(n: int) -> bytes:
    """Avro's zig-zag varint of ``n``."""
    z = (n << 1) ^ (n >> 63)
    out = bytearray()
    while z > 0x7F:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


def text(s: str) -> bytes:
    raw = s.encode()
    return varint(len(raw)) + raw


def full_raw(**parts: bytes) -> bytes:
    """FULL encoded by hand, field by field; ``parts`` replaces the bytes of named fields."""
    fields = {
        "event_id": text(FULL["event_id"]),
        "user_id": text(FULL["user_id"]),
        "item_id": varint(1) + text("i001337"),
        "event_type": varint(4),  # purchase
        "event_time": varint(FULL["event_time"]),
        "session_id": text(FULL["session_id"]),
        "category": varint(1) + text("music"),
        "price": varint(1) + bytes.fromhex("48e17a14ae3f6040"),  # 129.99 little-endian
        "dwell_ms": varint(1) + varint(8_500),
        "query": varint(1) + text("jazz vinyl é 🎷"),
        "position": varint(1) + varint(3),
        "device": varint(1),  # android
        "arm": varint(1) + text("ranker-v2/treatment"),
    }
    return b"".join({**fields, **parts}.values())


def test_hand_encoding_matches_the_codec(codec: EventCodec) -> None:
    assert full_raw() == codec.encode(FULL)


@pytest.mark.parametrize(
    ("parts", "fragment"),
    [
        # fastavro alone read these as symbols[-1] = 'dwell' / 'web' (the JVM rejects them)
        ({"event_type": varint(-1)}, "enum EventType index -1 at byte"),
        ({"device": varint(-3)}, "enum Device index -3 at byte"),
        ({"event_type": varint(7)}, "enum EventType index 7"),
        # ... and this as branch [-1] = string, i.e. a null written as a value
        ({"item_id": varint(-1) + text("i001337")}, "union branch index -1"),
        ({"category": varint(2) + text("music")}, "union branch index 2"),
        ({"event_id": varint(-5) + b"abcde"}, "negative length -5"),
        ({"event_time": b"\xff" * 10 + b"\x01"}, "invalid long encoding"),
        ({"position": varint(1) + b"\x80\x80\x80\x80\x80\x00"}, "more than 5 varint bytes"),
        ({"query": varint(1) + varint(10_000) + b"short"}, "the payload ends inside"),
    ],
)
def test_out_of_range_indices_and_lengths_are_corrupt(
    codec: EventCodec, parts: dict[str, bytes], fragment: str
) -> None:
    result = codec.decode(full_raw(**parts), headers(codec))
    assert isinstance(result, DecodeError), result
    assert result.reason is Reason.CORRUPT_PAYLOAD
    assert fragment in result.detail


@pytest.mark.parametrize(
    ("parts", "field", "expected"),
    [
        # Java's BinaryDecoder keeps 4 bits of an int's 5th byte and 1 bit of a long's 10th: so do we
        ({"position": varint(1) + b"\xfe\xff\xff\xff\x7f"}, "position", 2**31 - 1),
        ({"position": varint(1) + b"\x82\x80\x80\x80\x70"}, "position", 1),
    ],
)
def test_bits_past_the_width_are_dropped_as_java_does(
    codec: EventCodec, parts: dict[str, bytes], field: str, expected: int
) -> None:
    result = codec.decode(full_raw(**parts), headers(codec))
    assert isinstance(result, DecodedEvent), result
    assert result.event[field] == expected


def test_every_in_range_index_decodes_to_its_symbol(codec: EventCodec) -> None:
    symbols = ("impression", "click", "like", "share", "purchase", "search", "dwell")
    for index, symbol in enumerate(symbols):
        event = {**FULL, "event_type": symbol}
        result = codec.decode(full_raw(event_type=varint(index)), headers(codec))
        assert isinstance(result, DecodedEvent), (symbol, result)
        assert result.event["event_type"] == symbol
        assert codec.encode(result.event) == codec.encode(event)  # type: ignore[arg-type]


# --- size bounds -----------------------------------------------------------------------------


def test_payload_over_the_byte_limit_is_oversized(events_source: PlanSource) -> None:
    small = EventCodec(events_source, max_event_bytes=120)
    fits = {**FULL, "query": "q", "arm": None}
    assert isinstance(small.decode(small.encode(fits), headers(small)), DecodedEvent)
    big = {**FULL, "query": "q" * 200}
    result = small.decode(small.encode(big), headers(small))
    assert isinstance(result, DecodeError)
    assert result.reason is Reason.OVERSIZED
    assert result.detail.startswith(f"a {len(small.encode(big))}-byte payload is over the 120-byte limit")


def test_default_byte_limit(codec: EventCodec) -> None:
    assert codec.max_event_bytes == 64 * 1024
    huge = codec.encode({**FULL, "query": "q" * 3000, "category": "c" * 3000}) + b"\x00" * (64 * 1024)
    result = codec.decode(huge, headers(codec))
    assert isinstance(result, DecodeError)
    assert result.reason is Reason.OVERSIZED


@pytest.mark.parametrize("name", ["query", "category", "session_id"])
def test_string_over_the_char_limit_is_oversized(events_source: PlanSource, name: str) -> None:
    codec = EventCodec(events_source, max_string_chars=40)
    ok = codec.decode(codec.encode({**FULL, name: "é" * 40}), headers(codec))
    assert isinstance(ok, DecodedEvent)
    result = codec.decode(codec.encode({**FULL, name: "é" * 41}), headers(codec))
    assert isinstance(result, DecodeError)
    assert result.reason is Reason.OVERSIZED
    assert result.detail.startswith(f"{name}: 41 characters")
    assert "over the limit of 40 characters of source 'events'" in result.detail
    assert codec.validate({**FULL, name: "é" * 41}) == result.detail


# --- the second source: payments (micros event time, enums, a nullable double) -----------------

PAYMENT = {
    "payment_id": "p-1",
    "account_id": "a-1",
    "merchant_id": "m-1",
    "method": "wallet",
    "status": "captured",
    "amount": 12.5,
    "currency": "EUR",
    "risk_score": 0.25,
    "occurred_at": 1_767_225_600_123_456,
}


@pytest.fixture(scope="module")
def example_sources() -> dict[str, PlanSource]:
    result = check_repo(EXAMPLE)
    return {name: plan_source(src) for name, src in result.sources.items()}


@pytest.fixture(scope="module")
def events_source(example_sources: dict[str, PlanSource]) -> PlanSource:
    return example_sources["events"]


@pytest.fixture(scope="module")
def payments(example_sources: dict[str, PlanSource]) -> EventCodec:
    return EventCodec(example_sources["payments"])


def test_payment_round_trip_in_micros(payments: EventCodec) -> None:
    result = payments.decode(payments.encode(PAYMENT), payments.headers(produce_ts_ms=7))
    assert isinstance(result, DecodedEvent)
    assert result.event == PAYMENT
    assert result.event_time_ms == 1_767_225_600_123
    assert payments.key(PAYMENT) == b"a-1"


@pytest.mark.parametrize(
    ("change", "detail"),
    [
        ({"amount": -1.0}, "rule 'amount >= 0'"),
        ({"risk_score": 1.5}, "rule 'risk_score is null or (risk_score >= 0 and risk_score <= 1)'"),
        ({"occurred_at": 1_000}, "occurred_at: expected UTC ms in"),
    ],
)
def test_payment_rules(payments: EventCodec, change: dict[str, object], detail: str) -> None:
    result = payments.decode(payments.encode({**PAYMENT, **change}), payments.headers())
    assert isinstance(result, DecodeError)
    assert result.reason is Reason.INVALID_FIELD
    assert result.detail.startswith(detail)


def test_payment_negative_enum_index_is_corrupt(payments: EventCodec) -> None:
    good = payments.encode(PAYMENT)
    start = len(text("p-1") + text("a-1") + text("m-1"))
    assert good[start] == varint(1)[0]  # method = wallet
    bad = good[:start] + varint(-1) + good[start + 1 :]
    result = payments.decode(bad, payments.headers())
    assert isinstance(result, DecodeError)
    assert result.reason is Reason.CORRUPT_PAYLOAD
    assert "enum PaymentMethod index -1" in result.detail


# --- schema evolution: payments v2 adds a nullable field with a default ------------------------


@pytest.fixture(scope="module")
def payments_v2(tmp_path_factory: pytest.TempPathFactory) -> PlanSource:
    root = tmp_path_factory.mktemp("evolution") / "features"
    shutil.copytree(EXAMPLE, root)
    v1 = json.loads((root / "schemas/payment_event.avsc").read_text())
    v2 = {**v1, "fields": [*v1["fields"], {"name": "channel", "type": ["null", "string"], "default": None}]}
    (root / "schemas/payment_event_v2.avsc").write_text(json.dumps(v2, indent=2))
    sources = (root / "sources.yaml").read_text()
    sources = sources.replace(
        "    schema: schemas/payment_event.avsc\n",
        "    schema: schemas/payment_event_v2.avsc\n    previous_schemas: [schemas/payment_event.avsc]\n",
    )
    (root / "sources.yaml").write_text(sources)
    result = check_repo(root)
    assert list(result.diagnostics.errors) == [], [d.format() for d in result.diagnostics.errors]
    return plan_source(result.sources["payments"])


def test_v1_and_v2_events_decode_through_a_source_listing_both(
    payments: EventCodec, payments_v2: PlanSource
) -> None:
    v2 = EventCodec(payments_v2)
    assert payments_v2.schemas[0].fingerprint == payments.fingerprint
    assert v2.fingerprint != payments.fingerprint
    old = v2.decode(payments.encode(PAYMENT), payments.headers(produce_ts_ms=1))
    assert isinstance(old, DecodedEvent), old
    assert old.event == {**PAYMENT, "channel": None}
    assert old.fingerprint == payments.fingerprint
    assert old.event_time_ms == 1_767_225_600_123
    new_event = {**PAYMENT, "channel": "app"}
    new = v2.decode(v2.encode(new_event), v2.headers(produce_ts_ms=1))
    assert isinstance(new, DecodedEvent)
    assert new.event == new_event
    assert new.fingerprint == v2.fingerprint


def test_a_v1_reader_refuses_v2_events_by_fingerprint(payments: EventCodec, payments_v2: PlanSource) -> None:
    v2 = EventCodec(payments_v2)
    result = payments.decode(v2.encode({**PAYMENT, "channel": "app"}), v2.headers())
    assert isinstance(result, DecodeError)
    assert result.reason is Reason.UNKNOWN_FINGERPRINT
    assert "list the new schema in sources.yaml" in result.detail


def test_v1_corruption_is_caught_with_the_v1_writer_schema(
    payments: EventCodec, payments_v2: PlanSource
) -> None:
    v2 = EventCodec(payments_v2)
    good = payments.encode(PAYMENT)
    start = len(text("p-1") + text("a-1") + text("m-1")) + 1  # status
    bad = good[:start] + varint(-2) + good[start + 1 :]
    result = v2.decode(bad, payments.headers())
    assert isinstance(result, DecodeError)
    assert result.reason is Reason.CORRUPT_PAYLOAD
    assert "enum PaymentStatus index -2" in result.detail
    # a v1 payload with a trailing v2 field is not a v1 record
    extra = v2.decode(good + varint(0), payments.headers())
    assert isinstance(extra, DecodeError)
    assert extra.reason is Reason.CORRUPT_PAYLOAD
