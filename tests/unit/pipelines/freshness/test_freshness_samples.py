"""Decoding the entries that write.lua appends to a view's freshness log."""

from __future__ import annotations

import pytest

from headwater.pipelines.freshness.samples import Entry, SampleFormatError, parse_entry


def test_parse_entry_reads_every_field() -> None:
    fields = {b"w": b"2000", b"n": b"5", b"r": b"7", b"lo": b"1000", b"hi": b"1500", b"s": b"1000:2,1500:3"}
    assert parse_entry(fields) == Entry(2000, 5, 7, 1500, ((1000, 2), (1500, 3)))
    assert parse_entry({**fields, b"v": b"v0123456789abcdef"}).version == "v0123456789abcdef"


def test_parse_entry_without_rows_has_no_samples() -> None:
    fields = {b"w": b"2000", b"n": b"0", b"r": b"0", b"lo": b"0", b"hi": b"1500", b"s": b""}
    assert parse_entry(fields) == Entry(2000, 0, 0, 1500, ())


def test_malformed_entry_names_the_stream_and_the_expected_fields() -> None:
    with pytest.raises(SampleFormatError, match=r"hw:fresh:\{v\} entry 1-0: expected the fields w, n, r"):
        parse_entry({b"w": b"x"}, "hw:fresh:{v} entry 1-0")
    with pytest.raises(SampleFormatError, match="'B:count"):
        parse_entry({b"w": b"1", b"n": b"1", b"r": b"1", b"lo": b"1", b"hi": b"1", b"s": b"12"})
