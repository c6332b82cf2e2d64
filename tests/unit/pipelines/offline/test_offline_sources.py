"""Offline reads any source from the plan: bronze columns, time rules, decoding, the labels source."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headwater.pipelines.events.codec import EventCodec
from headwater.pipelines.events.readers import FileRow
from headwater.pipelines.events.rows import RowChecker
from headwater.pipelines.events.testing import Record
from headwater.pipelines.events.timing import SourceTiming
from headwater.pipelines.offline.history import Reject, _check
from headwater.pipelines.offline.labels import LabelsError, labels_source
from headwater.pipelines.offline.landing_batch import decode_records
from headwater.pipelines.offline.source_columns import (
    META_COLUMNS,
    SourceColumnsError,
    bronze_schema,
    event_schema,
    source_of,
)
from headwater.pipelines.offline.testing import T0, behaviour, payment, payments, view
from headwater.registry.plans import PlanField


def test_payments_bronze_columns_come_from_its_avro_fields() -> None:
    schema = bronze_schema(payments())
    assert [(f.name, f.type) for f in schema] == [
        ("payment_id", pa.string()), ("account_id", pa.string()), ("merchant_id", pa.string()),
        ("method", pa.string()), ("status", pa.string()), ("amount", pa.float64()), ("currency", pa.string()),
        ("risk_score", pa.float64()), ("occurred_at", pa.int64()),
        *[(f.name, f.type) for f in META_COLUMNS],
    ]  # fmt: skip
    assert META_COLUMNS.names == ["produce_ts_ms", "kafka_topic", "kafka_partition", "kafka_offset", "late"]
    assert "event_time" in bronze_schema(behaviour()).names


def test_every_avro_kind_has_its_column_type() -> None:
    kinds = {"string": pa.string(), "enum": pa.string(), "int": pa.int32(), "long": pa.int64(),
             "float": pa.float32(), "double": pa.float64(), "boolean": pa.bool_(),
             "timestamp": pa.int64()}  # fmt: skip
    fields = [PlanField(name=f"f_{k}", kind=k, nullable=True, time_unit="us" if k == "timestamp" else "")
              for k in kinds]  # fmt: skip
    source = payments().model_copy(update={"fields": fields})
    assert {f.name: f.type for f in event_schema(source)} == {f"f_{k}": t for k, t in kinds.items()}


@pytest.mark.parametrize("name", ["late", "kafka_offset", "date"])
def test_a_field_named_like_a_bronze_column_is_refused_with_the_fix(name: str) -> None:
    source = payments().model_copy(update={"fields": [PlanField(name=name, kind="string", nullable=False)]})
    with pytest.raises(SourceColumnsError, match=rf"source 'payments': field '{name}' .* rename the field"):
        event_schema(source)


def test_time_rules_are_the_plans_not_the_landings() -> None:
    src = payments()
    rules = SourceTiming.of(src)
    assert (rules.max_out_of_orderness_ms, rules.allowed_lateness_ms) == (2_000, 30_000)
    assert rules.max_future_ms == src.max_future_ms


def test_payments_records_decode_with_micros_and_the_rules_in_ms() -> None:
    codec = EventCodec(payments())
    now = T0 + 86_400_000
    rules = SourceTiming.of(payments())

    def rec(offset: int, event: dict[str, Any]) -> Record:
        return Record(offset, codec.encode(event), codec.headers(), b"a1", topic="payments")

    records = [
        rec(0, payment(1, "a1", T0)),
        rec(1, payment(2, "a1", T0 - 33_000)),  # late: 33 s behind, 2 s + 30 s allowed
        rec(2, payment(3, "a1", T0 - 31_000)),  # on time
        rec(3, payment(4, "a1", now + rules.max_future_ms + 1_000)),  # future-dated
    ]
    seen: dict[int, int] = {}
    chunk = decode_records(codec, records, rules, seen, now)
    assert chunk.table.column_names == bronze_schema(payments()).names
    assert chunk.table.column("payment_id").to_pylist() == ["p00001", "p00002", "p00003"]
    assert chunk.table.column("occurred_at").to_pylist() == [
        T0 * 1000,
        (T0 - 33_000) * 1000,
        (T0 - 31_000) * 1000,
    ]
    assert chunk.table.column("late").to_pylist() == [False, True, False]
    assert sorted((r.record.offset, r.reason) for r in chunk.rejected) == [(1, "late"), (3, "future_dated")]
    assert seen == {0: T0}
    assert any("occurred_at" in r.detail for r in chunk.rejected)


def test_a_view_reads_the_source_it_names() -> None:
    v = view("spend", "account", "account_id", [], source="payments")
    assert source_of([behaviour(), payments()], v).name == "payments"
    with pytest.raises(SourceColumnsError, match="reads source 'payments', which the plan does not declare"):
        source_of([behaviour()], v)


def test_labels_come_from_the_source_with_the_behaviour_fields() -> None:
    assert labels_source([payments(), behaviour()]).name == "events"
    assert labels_source([payments(), behaviour()], "events").name == "events"
    with pytest.raises(LabelsError, match="0 source"):
        labels_source([payments()])
    with pytest.raises(LabelsError, match="lacks the field"):
        labels_source([payments(), behaviour()], "payments")


ROW_VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True), st.text(max_size=20),
    st.sampled_from(["card", "captured", "1999-05-01T00:00:00Z", "2026-01-01T00:00:00+02:00", ""]),
)  # fmt: skip
ROWS = st.dictionaries(st.sampled_from([f.name for f in payments().fields] + ["extra"]), ROW_VALUES)


@settings(max_examples=300, deadline=None)
@given(row=ROWS, line=st.integers(min_value=1, max_value=10**9))
def test_an_import_row_is_landed_valid_or_rejected_with_its_line(row: dict[str, Any], line: int) -> None:
    source = payments()
    checker = RowChecker(source, EventCodec(source))
    out: list[dict[str, Any]] = []
    bad = _check(checker, FileRow(line, row), source, T0, out)
    if bad is None:
        assert len(out) == 1
        assert EventCodec(source).validate(out[0]) is None
        assert out[0]["occurred_at"] // 1000 <= T0 + source.max_future_ms
    else:
        assert isinstance(bad, Reject)
        assert (bad.line, out) == (line, [])
        assert bad.reason in ("invalid_field", "future_dated")
        assert bad.detail


def test_landing_lands_every_source_of_the_plan_or_the_ones_named(tmp_path: Any) -> None:
    import click

    from headwater.cli.offline import _sources, tier_plan
    from headwater.pipelines.offline.testing import write_plan

    write_plan(tmp_path, "offline", [])
    plan = tier_plan(tmp_path, "offline")
    assert [s.name for s in _sources(plan, ())] == ["events", "payments"]
    assert [s.name for s in _sources(plan, ("payments",))] == ["payments"]
    with pytest.raises(
        click.ClickException, match=r"unknown source\(s\) \['nope'\] .* known: \['events', 'payments'\]"
    ):
        _sources(plan, ("nope",))
