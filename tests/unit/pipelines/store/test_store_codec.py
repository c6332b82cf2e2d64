"""The packed value format: header fields, offsets used by write.lua, decode of MGET replies."""

from __future__ import annotations

import struct
from importlib import resources

import numpy as np
import pytest

from headwater.pipelines.store import codec
from headwater.pipelines.store.layout import ViewLayout, schema_hash
from headwater.pipelines.store.store import ReadResult

D = 5
HASH = schema_hash([f"f{i}" for i in range(D)])


def _records(n: int = 3) -> tuple[list[bytes], np.ndarray]:
    values = (np.arange(n * D, dtype=np.float32) - 4.5).reshape(n, D)
    rec = codec.pack(values, np.array([100, 200, 300][:n]), 1_000, 9_000, HASH, "reg-7")
    blob = rec.tobytes()
    size = codec.record_size(D)
    return [blob[i * size : (i + 1) * size] for i in range(n)], values


def test_header_fields_sit_at_documented_offsets() -> None:
    raw, values = _records(1)
    value = raw[0]
    assert len(value) == codec.HEADER_BYTES + 4 * D == 92
    magic, fmt, vlen, n, event, write, expire, shash, reserved = struct.unpack_from("<2sBBIqqqII", value)
    assert (magic, fmt, vlen, n) == (b"HW", 1, 5, D)
    assert (event, write, expire, shash, reserved) == (100, 1_000, 9_000, HASH, 0)
    assert value[40:72] == b"reg-7".ljust(32, b"\0")
    assert struct.unpack_from(f"<{D}f", value, 72) == tuple(values[0].tolist())
    assert struct.unpack_from("<q", value, codec.EVENT_TIME_OFFSET)[0] == 100
    assert struct.unpack_from("<q", value, codec.EXPIRE_AT_OFFSET)[0] == 9_000


def test_lua_script_reads_the_same_offsets() -> None:
    script = resources.files("headwater.pipelines.store").joinpath("write.lua").read_text("utf-8")
    # Lua strings are 1-based: offset 8 is position 9, offset 24 is 25, offset 32 is 33.
    assert f"unpack('<i8', rec, {codec.EVENT_TIME_OFFSET + 1})" in script
    assert f"unpack('<i8', old, {codec.EXPIRE_AT_OFFSET + 1})" in script
    assert "sub(old, 33) == sub(rec, 33)" in script
    assert f"#old >= {codec.HEADER_BYTES}" in script


def test_unpack_round_trips_and_fills_missing_with_nan() -> None:
    raw, values = _records(3)
    out = codec.unpack([raw[0], None, raw[2], raw[1]], D, HASH)
    assert out.found.tolist() == [True, False, True, True]
    assert out.mismatch.tolist() == [False, False, False, False]
    np.testing.assert_array_equal(out.values[[0, 2, 3]], values[[0, 2, 1]])
    assert np.isnan(out.values[1]).all()
    assert out.event_time_ms.tolist() == [100, 0, 300, 200]
    assert out.write_time_ms.tolist() == [1_000, 0, 1_000, 1_000]
    assert codec.decode_versions(out.version_raw, out.found) == ["reg-7", None, "reg-7", "reg-7"]


def test_all_found_result_is_writable_and_independent_of_the_reply() -> None:
    raw, values = _records(2)
    out = codec.unpack(raw, D, HASH)
    out.values[0, 0] = 42.0
    assert out.values.flags.writeable
    assert codec.unpack(raw, D, HASH).values[0, 0] == values[0, 0]


@pytest.mark.parametrize(
    ("mutate", "why"),
    [
        (lambda v: v[:-4], "shorter value"),
        (lambda v: b"XX" + v[2:], "bad magic"),
        (lambda v: v[:2] + b"\x02" + v[3:], "unknown format"),
        (lambda v: v[:32] + b"\0\0\0\0" + v[36:], "other feature order"),
        (lambda v: b"not a headwater value", "foreign value"),
    ],
)
def test_unreadable_values_are_mismatches_not_found(mutate: object, why: str) -> None:
    raw, values = _records(2)
    bad = mutate(raw[0])  # type: ignore[operator]
    out = codec.unpack([bad, raw[1], None], D, HASH)
    assert out.found.tolist() == [False, True, False], why
    assert out.mismatch.tolist() == [True, False, False], why
    assert np.isnan(out.values[0]).all()
    np.testing.assert_array_equal(out.values[1], values[1])


def test_empty_reply() -> None:
    out = codec.unpack([], D, HASH)
    assert out.values.shape == (0, D)
    assert codec.decode_versions(out.version_raw, out.found) == []


@pytest.mark.parametrize(
    ("replies", "other"),
    [
        ([None, None, None], 0),
        ([0, None, 2, None], 0),
        ([0, None, 1, 2], 0),
    ],
)
def test_rows_of_another_version_count_found_rows_only(replies: list[int | None], other: int) -> None:
    """Some keys missing is the common case (new items): counting must not assume every key was found."""
    raw, _ = _records(3)
    out = codec.unpack([None if r is None else raw[r] for r in replies], D, HASH)
    mine = ViewLayout("v", "user", tuple(f"f{i}" for i in range(D)), version="reg-7")
    theirs = ViewLayout("v", "user", mine.features, version="reg-8")
    for layout, expected in ((mine, other), (theirs, int(out.found.sum()))):
        result = ReadResult(
            layout, out.values, out.found, out.event_time_ms, out.write_time_ms, out.mismatch, out.version_raw
        )
        assert result.other_version_rows() == expected
