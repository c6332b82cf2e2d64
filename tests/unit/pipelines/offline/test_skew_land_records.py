"""Property tests of the prediction-log record boundary: any Kafka record becomes one landable row.

`headwater skew` lands whatever is on the prediction topic (:func:`row_of`); a record of any bytes, or a
JSON object with any values, must give a row of the table's schema (never an exception that would stop
the landing and leave the topic unlanded), and a malformed one keeps its text with a null request id.
"""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from headwater.pipelines.offline.skew_land import SCHEMA, row_of

FIELDS = ("request_id", "at_ms", "user_id", "model_version", "fallback", "v", "views")  # v, views: record v2
texts = st.text() | st.text(st.characters(categories=["Cs"]), max_size=3)  # lone surrogates: "\\ud800"
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | texts,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)


def _landable(row: dict[str, Any]) -> None:
    assert set(row) == set(SCHEMA.names)
    pa.Table.from_pylist([row], schema=SCHEMA)  # what the landing appends; raises on a bad type


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300), st.integers(0, 63), st.integers(0, 2**40))
def test_any_bytes_give_a_landable_row(value: bytes, partition: int, offset: int) -> None:
    row = row_of(partition, offset, value)
    _landable(row)
    assert (row["kafka_partition"], row["kafka_offset"]) == (partition, offset)


@settings(max_examples=300, deadline=None)
@given(st.fixed_dictionaries({}, optional=dict.fromkeys(FIELDS, json_values)))
def test_any_json_object_gives_a_landable_row_with_its_fields(record: dict[str, Any]) -> None:
    text = json.dumps(record)
    row = row_of(0, 7, text.encode())
    _landable(row)
    assert row["record"] == text
    at = record.get("at_ms")
    if row["at_ms"] is not None:
        assert row["at_ms"] == at
        assert row["day"] is not None
    request_id = json.loads(text).get("request_id")  # two escaped surrogates read back as one character
    if request_id is not None:
        assert row["request_id"] == str(request_id).encode("utf-8", "replace").decode("utf-8")


@given(st.one_of(st.binary(max_size=40).filter(lambda b: not b.strip().startswith(b"{")), st.just(b"[1, 2]")))
def test_a_record_that_is_not_a_json_object_keeps_its_text_and_no_request_id(value: bytes) -> None:
    row = row_of(1, 2, value)
    assert row["request_id"] is None
    assert row["record"] == value.decode("utf-8", errors="replace")


def test_a_time_past_what_a_date_holds_is_no_time() -> None:
    row = row_of(0, 0, json.dumps({"request_id": "r1", "at_ms": 300_000_000_000_000}).encode())
    assert (row["at_ms"], row["day"]) == (None, None)
    assert row["request_id"] == "r1"


def test_a_version_2_record_lands_its_version_and_view_versions() -> None:
    views = {
        "user_rt": {"side": "user", "version": "u1", "event_ms": 5},
        "item_rt": {"side": "item", "version": "i1"},
    }
    row = row_of(0, 1, json.dumps({"v": 2, "request_id": "r", "views": views}).encode())
    _landable(row)
    assert row["record_version"] == 2
    assert json.loads(row["view_versions"]) == {"item_rt": "i1", "user_rt": "u1"}
    old = row_of(0, 2, json.dumps({"v": 1, "request_id": "r"}).encode())
    assert (old["record_version"], old["view_versions"]) == (1, None)
