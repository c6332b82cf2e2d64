"""Property-based tests of EventCodec.decode on both example sources (`events`, `payments`).

No input makes decode raise, and every answer is a DecodedEvent or a DecodeError with a Reason.
Records are built field by field from the source's Avro schema, with or without one defect that
Avro's Java decoder rejects (an enum or union index out of range, a negative length, an over-long
varint): a record with a defect must be ``corrupt_payload``, one without must decode to exactly the
values written or be rejected for its values (never as corrupt). Random bytes, random headers and
mutations of good records must end in a verdict too.
"""

from __future__ import annotations

import io
import json
import math
import struct
from functools import cache
from pathlib import Path
from typing import Any

import fastavro
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from headwater.pipelines.events.codec import (
    HEADER_PRODUCE_TS,
    HEADER_SCHEMA_FP,
    DecodedEvent,
    DecodeError,
    EventCodec,
    Reason,
)
from headwater.pipelines.events.wire_check import WireError, _Compiler, compile_checker
from headwater.registry.plans import plan_source
from headwater.registry.validate import check_repo

EXAMPLE = Path(__file__).resolve().parents[4] / "features"
SOURCES = ("events", "payments")
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@cache
def codec_for(name: str) -> EventCodec:
    result = check_repo(EXAMPLE)
    return EventCodec(plan_source(result.sources[name]))


def varint(n: int) -> bytes:
    z = (n << 1) ^ (n >> 63) if -(2**63) <= n < 2**63 else n
    out = bytearray()
    while z > 0x7F:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


def overlong(max_bytes: int) -> bytes:
    """A varint with more continuation bytes than Java's decoder allows for its type."""
    return b"\x80" * max_bytes + b"\x00"


# One generated field: (its bytes, its decoded value, whether it carries a defect).
Part = tuple[bytes, Any, bool]


def _bad_index(draw: st.DrawFn, count: int) -> int:
    """An index outside [0, count): mostly just outside, where Python-style indexing would 'work'."""
    near = st.one_of(st.integers(-(count + 2), -1), st.integers(count, count + 2))
    far = st.one_of(st.integers(-(2**31), -1), st.integers(count, 2**31 - 1))
    return draw(st.one_of(near, far))


def _string(draw: st.DrawFn) -> Part:
    value = draw(st.text(max_size=30))
    raw = value.encode()
    return varint(len(raw)) + raw, value, False


def _value(draw: st.DrawFn, avro_type: Any, defects: bool) -> Part:
    """Draw one value of ``avro_type``; with ``defects``, maybe an encoding Avro rejects."""
    if isinstance(avro_type, list):
        if defects and draw(st.integers(0, 5)) == 0:
            bad = _bad_index(draw, len(avro_type))
            # followed by a value of the branch Python-style indexing would pick, when there is one
            rest = _value(draw, avro_type[bad], defects=False)[0] if -len(avro_type) <= bad < 0 else b""
            return varint(bad) + rest, None, True
        index = draw(st.integers(0, len(avro_type) - 1))
        raw, value, defect = _value(draw, avro_type[index], defects)
        return varint(index) + raw, value, defect
    kind = avro_type["type"] if isinstance(avro_type, dict) else avro_type
    if kind == "enum":
        symbols = avro_type["symbols"]
        if defects and draw(st.integers(0, 3)) == 0:
            return varint(_bad_index(draw, len(symbols))), None, True
        index = draw(st.integers(0, len(symbols) - 1))
        return varint(index), symbols[index], False
    if kind == "null":
        return b"", None, False
    if kind == "string":
        if defects and draw(st.integers(0, 8)) == 0:
            return varint(-draw(st.integers(1, 2**40))) + b"xyz", None, True
        return _string(draw)
    if kind in ("int", "long"):
        if defects and draw(st.integers(0, 8)) == 0:
            return overlong(5 if kind == "int" else 10), None, True
        bits = 31 if kind == "int" else 63
        value = draw(st.integers(-(2**bits), 2**bits - 1))
        return varint(value), value, False
    if kind == "double":
        raw = draw(st.binary(min_size=8, max_size=8))
        return raw, struct.unpack("<d", raw)[0], False
    if kind == "float":
        raw = draw(st.binary(min_size=4, max_size=4))
        return raw, struct.unpack("<f", raw)[0], False
    if kind == "boolean":
        flag = draw(st.booleans())
        return bytes([flag]), flag, False
    msg = f"no strategy for Avro type {avro_type!r}"
    raise AssertionError(msg)


@st.composite
def records(draw: st.DrawFn, name: str, defects: bool) -> tuple[bytes, dict[str, Any], bool]:
    """A record of source ``name``'s current schema: (bytes, values, whether it has a defect)."""
    source = codec_for(name).source
    schema = json.loads(source.current.json_text)
    scale = 1000 if source.event_time_unit == "us" else 1
    in_range = st.integers(source.min_event_time_ms * scale, source.max_event_time_ms * scale - 1)
    raw = bytearray()
    values: dict[str, Any] = {}
    found = False
    for entry in schema["fields"]:
        # At most one defect; the fields after it are well formed, so only the defect can be blamed.
        part, value, defect = _value(draw, entry["type"], defects and not found)
        if entry["name"] == source.event_time and not defect and draw(st.integers(0, 9)):
            value = draw(in_range)  # mostly a valid event time, so records get past validation
            part = varint(value)
        raw += part
        found = found or defect
        values[entry["name"]] = value
    return bytes(raw), values, found


def same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a):
        return math.isnan(b)
    return bool(a == b)


def assert_verdict(codec: EventCodec, result: object) -> None:
    """Every answer is one of the two types; a decoded event is valid and re-encodes to itself."""
    if isinstance(result, DecodeError):
        assert isinstance(result.reason, Reason)
        assert result.detail
        return
    assert isinstance(result, DecodedEvent)
    for f in codec.source.fields:
        value = result.event[f.name]
        if f.kind == "enum":
            assert value in f.symbols
        if value is None:
            assert f.nullable, f.name
    assert codec.validate(result.event) is None
    again = codec.decode(codec.encode(result.event), codec.headers())
    assert isinstance(again, DecodedEvent)
    assert all(same(again.event[k], v) for k, v in result.event.items())


@pytest.mark.parametrize("name", SOURCES)
@FUZZ
@given(data=st.data())
def test_well_formed_records_decode_to_their_values_or_a_value_reason(name: str, data: st.DataObject) -> None:
    codec = codec_for(name)
    raw, values, _ = data.draw(records(name, defects=False))
    result = codec.decode(raw, codec.headers())
    assert_verdict(codec, result)
    if isinstance(result, DecodeError):
        assert result.reason in (Reason.INVALID_FIELD, Reason.INVALID_ID, Reason.OVERSIZED), result
    else:
        assert all(same(result.event[k], v) for k, v in values.items())


@pytest.mark.parametrize("name", SOURCES)
@FUZZ
@given(data=st.data())
def test_a_defect_avro_rejects_is_corrupt(name: str, data: st.DataObject) -> None:
    codec = codec_for(name)
    raw, _, defect = data.draw(records(name, defects=True))
    result = codec.decode(raw, codec.headers())
    if defect:
        assert isinstance(result, DecodeError)
        assert result.reason is Reason.CORRUPT_PAYLOAD, result
    else:
        assert_verdict(codec, result)


@pytest.mark.parametrize("name", SOURCES)
@FUZZ
@given(data=st.data())
def test_mutated_good_records_end_in_a_verdict(name: str, data: st.DataObject) -> None:
    codec = codec_for(name)
    raw, _, _ = data.draw(records(name, defects=False))
    blob = bytearray(raw)
    for _ in range(data.draw(st.integers(1, 4))):
        op = data.draw(st.sampled_from(["flip", "set", "insert", "delete", "truncate"]))
        at = data.draw(st.integers(0, max(len(blob) - 1, 0)))
        if op == "flip" and blob:
            blob[at] ^= 1 << data.draw(st.integers(0, 7))
        elif op == "set" and blob:
            blob[at] = data.draw(st.integers(0, 255))
        elif op == "insert":
            blob[at:at] = data.draw(st.binary(min_size=1, max_size=4))
        elif op == "delete" and blob:
            del blob[at]
        elif op == "truncate":
            del blob[at:]
    assert_verdict(codec, codec.decode(bytes(blob), codec.headers()))


HEADER_NAMES = st.sampled_from([HEADER_SCHEMA_FP, HEADER_PRODUCE_TS, "other", ""])


@pytest.mark.parametrize("name", SOURCES)
@FUZZ
@given(
    value=st.one_of(st.none(), st.binary(max_size=200)),
    headers=st.one_of(
        st.none(),
        st.lists(st.tuples(HEADER_NAMES, st.one_of(st.none(), st.binary(max_size=24))), max_size=4),
    ),
    use_fp=st.booleans(),
)
def test_random_values_and_headers_end_in_a_verdict(
    name: str, value: bytes | None, headers: list[tuple[str, bytes | None]] | None, use_fp: bool
) -> None:
    codec = codec_for(name)
    if use_fp:
        headers = [(HEADER_SCHEMA_FP, codec.fingerprint_header), *(headers or [])]
    assert_verdict(codec, codec.decode(value, headers))


# --- the wire walk itself: the generated checker and the composed one agree --------------------


def _verdict(check: Any, blob: bytes) -> bool:
    try:
        check(blob)
    except WireError:
        return False
    return True


@pytest.mark.parametrize("name", SOURCES)
@FUZZ
@given(data=st.data())
def test_generated_and_composed_walks_agree(name: str, data: st.DataObject) -> None:
    schema = json.loads(codec_for(name).source.current.json_text)
    generated = compile_checker(schema)
    step = _Compiler().step(schema)

    def composed(blob: bytes) -> None:
        if step(blob, 0) != len(blob):
            msg = "trailing"
            raise WireError(msg)

    raw, _, _ = data.draw(records(name, defects=True))
    blob = data.draw(st.one_of(st.just(raw), st.binary(max_size=80), st.just(raw[: len(raw) // 2])))
    assert _verdict(generated, blob) == _verdict(composed, blob)


NESTED = {
    "type": "record",
    "name": "Node",
    "fields": [
        {"name": "tags", "type": {"type": "array", "items": "string"}},
        {"name": "attrs", "type": {"type": "map", "values": ["null", "long"]}},
        {"name": "id", "type": {"type": "fixed", "name": "Id", "size": 4}},
        {"name": "next", "type": ["null", "Node"]},
    ],
}


@FUZZ
@given(
    tags=st.lists(st.text(max_size=5), max_size=3),
    attrs=st.dictionaries(
        st.text(max_size=3), st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1)), max_size=3
    ),
    depth=st.integers(0, 3),
    cut=st.integers(0, 200),
)
def test_composed_walk_reads_arrays_maps_fixed_and_recursion(
    tags: list[str], attrs: dict[str, int | None], depth: int, cut: int
) -> None:
    node: dict[str, Any] | None = None
    for _ in range(depth + 1):
        node = {"tags": tags, "attrs": attrs, "id": b"abcd", "next": node}
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(NESTED), node)
    raw = out.getvalue()
    check = compile_checker(NESTED)
    check(raw)  # a real encoding passes
    if cut < len(raw):
        with pytest.raises(WireError):
            check(raw[:cut])
