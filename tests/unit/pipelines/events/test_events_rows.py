"""Rows of a user's file -> events of a source: coercion per field kind, time shift, rules, keys.

Property-based: any JSON-like row, and any line of text, ends as a valid event or a reject with a
reason, never an exception.
"""

from __future__ import annotations

import json
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from headwater.pipelines.events.codec import DecodedEvent, EventCodec
from headwater.pipelines.events.ingest import Reject, check_row
from headwater.pipelines.events.readers import FileRow
from headwater.pipelines.events.rows import CheckedRow, RowChecker, RowError, to_timestamp
from headwater.pipelines.events.sources import example_sources
from headwater.registry.plans import PlanSource

T0_US = 1_796_032_800_000_000  # 2026-11-30T10:00:00Z in micros


@pytest.fixture(scope="module")
def payments() -> PlanSource:
    return next(s for s in example_sources() if s.name == "payments")


@pytest.fixture(scope="module")
def behaviour() -> PlanSource:
    return next(s for s in example_sources() if s.name == "events")


def good_row(**change: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "payment_id": "p-1",
        "account_id": "acc-7",
        "merchant_id": "m-3",
        "method": "card",
        "status": "captured",
        "amount": 12.5,
        "currency": "EUR",
        "risk_score": 0.25,
        "occurred_at": "2026-11-30T10:00:00Z",
    }
    row.update(change)
    return row


def test_a_good_row_is_encoded_keyed_by_the_source_key_and_decodes_to_its_values(
    payments: PlanSource,
) -> None:
    checker = RowChecker(payments)
    result = checker.check(good_row())
    assert isinstance(result, CheckedRow)
    assert result.key == b"acc-7"
    assert result.event_time_ms == T0_US // 1000
    decoded = EventCodec(payments).decode(result.value, EventCodec(payments).headers(1))
    assert isinstance(decoded, DecodedEvent)
    assert decoded.event == {**good_row(), "occurred_at": T0_US}


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("2026-11-30T10:00:00Z", T0_US),
        ("2026-11-30T11:00:00+01:00", T0_US),
        ("2026-11-30 10:00:00", T0_US),  # no offset: UTC
        ("2026-11-30T10:00:00.000123Z", T0_US + 123),
        (T0_US, T0_US),  # a number is in the field's unit (micros here)
        (str(T0_US), T0_US),
        (float(T0_US), T0_US),
        (datetime(2026, 11, 30, 10, tzinfo=UTC), T0_US),
        (datetime(2026, 11, 30, 10), T0_US),  # noqa: DTZ001 - naive, as Parquet without a tz gives: read as UTC
        (date(2026, 11, 30), T0_US - 10 * 3_600_000_000),
    ],
)
def test_timestamps_from_iso_text_numbers_and_datetimes(
    payments: PlanSource, value: Any, expected: int
) -> None:
    event = RowChecker(payments).coerce(good_row(occurred_at=value))
    assert not isinstance(event, RowError), event
    assert event["occurred_at"] == expected


def test_timestamp_in_millis_for_a_millis_field() -> None:
    assert to_timestamp("2026-11-30T10:00:00.5Z", "ms") == T0_US // 1000 + 500
    assert to_timestamp(1_796_032_800_000, "ms") == 1_796_032_800_000


@pytest.mark.parametrize(
    ("change", "field", "reason"),
    [
        ({"method": "Card"}, "method", "did you mean 'card'?"),
        ({"method": "cash"}, "method", "expected one of card, wallet, bank_transfer, found 'cash'"),
        ({"amount": "twelve"}, "amount", "expected a finite number, found text 'twelve'"),
        ({"amount": float("nan")}, "amount", "expected a finite number"),
        ({"amount": True}, "amount", "found a boolean"),
        ({"amount": None}, "amount", "null, but the field (double) is not nullable"),
        ({"amount": -1}, "amount", "rule 'amount >= 0' of source 'payments' does not hold (amount = -1.0)"),
        ({"risk_score": 1.5}, "risk_score", "risk_score = 1.5"),
        (
            {"occurred_at": "yesterday"},
            "occurred_at",
            "expected an ISO-8601 time such as 2024-05-01T12:00:00Z",
        ),
        ({"occurred_at": "1999-12-31T23:59:59Z"}, "occurred_at", "min_event_time in sources.yaml"),
        ({"account_id": ""}, "account_id", "id-empty: key account_id is empty"),
        ({"account_id": ["a"]}, "account_id", "expected text, found a list"),
        ({"currency": {"code": "EUR"}}, "currency", "expected text, found an object"),
    ],
)
def test_bad_values_are_rejected_naming_field_and_fix(
    payments: PlanSource, change: dict[str, Any], field: str, reason: str
) -> None:
    result = RowChecker(payments).check(good_row(**change))
    assert isinstance(result, RowError)
    assert result.field == field
    assert reason in result.reason


def test_missing_fields_take_null_or_are_rejected(payments: PlanSource) -> None:
    checker = RowChecker(payments)
    row = good_row()
    del row["risk_score"]
    event = checker.check(row)
    assert isinstance(event, CheckedRow)
    assert event.event["risk_score"] is None
    del row["merchant_id"]
    missing = checker.check(row)
    assert missing == RowError(
        "merchant_id", "missing (string, not nullable): add a column 'merchant_id' to the file"
    )


def test_numbers_as_ids_and_text_as_numbers(payments: PlanSource) -> None:
    result = RowChecker(payments).check(good_row(account_id=42, amount="3.50", risk_score=Decimal("0.5")))
    assert isinstance(result, CheckedRow)
    assert result.key == b"42"
    assert result.event["amount"] == 3.5
    assert result.event["risk_score"] == 0.5


def test_csv_cells_are_text_and_an_empty_cell_is_null_when_nullable(payments: PlanSource) -> None:
    checker = RowChecker(payments, text_cells=True)
    cells = {k: str(v) for k, v in good_row().items()}
    result = checker.check({**cells, "risk_score": ""})
    assert isinstance(result, CheckedRow)
    assert result.event["risk_score"] is None
    assert result.event["amount"] == 12.5
    assert checker.check({**cells, "amount": ""}) == RowError(
        "amount", "empty cell, but the field is a double that is not nullable"
    )


def test_whole_numbers_and_booleans_of_the_behaviour_source(behaviour: PlanSource) -> None:
    checker = RowChecker(behaviour, text_cells=True)
    row = {
        "event_id": "e1",
        "user_id": "u1",
        "item_id": "i1",
        "event_type": "click",
        "event_time": "1796032800000",
        "session_id": "s1",
        "category": "",
        "price": "",
        "dwell_ms": "",
        "query": "",
        "position": "3",
        "device": "ios",
    }
    result = checker.check(row)
    assert isinstance(result, CheckedRow), result
    assert result.event["position"] == 3
    assert result.event["event_time"] == 1_796_032_800_000
    assert result.key == b"u1"
    assert checker.check({**row, "position": "3.5"}) == RowError(
        "position", "expected a whole number (int), found Decimal('3.5')"
    )
    assert "expected a whole number (int) in [-2147483648, 2147483647]" in str(
        checker.check({**row, "position": str(2**31)})
    )
    assert "1" * 41 not in str(checker.check({**row, "position": "1" * 5_000}))  # a huge number stays cheap
    rule = checker.check({**row, "event_type": "click", "item_id": ""})
    assert isinstance(rule, RowError)
    assert rule.field == "event_type, item_id"


def test_time_shift_moves_every_timestamp_and_keeps_the_unit(payments: PlanSource) -> None:
    checker = RowChecker(payments, shift_ms=86_400_000)
    result = checker.check(good_row())
    assert isinstance(result, CheckedRow)
    assert result.event["occurred_at"] == T0_US + 86_400_000_000
    assert result.event_time_ms == T0_US // 1000 + 86_400_000
    # a shift may bring old history into the source's allowed range
    old = good_row(occurred_at="1995-06-01T00:00:00Z")
    assert isinstance(RowChecker(payments).check(old), RowError)
    assert isinstance(RowChecker(payments, shift_ms=30 * 365 * 86_400_000).check(old), CheckedRow)


def test_unknown_columns_are_ignored_and_listed(payments: PlanSource) -> None:
    checker = RowChecker(payments)
    assert isinstance(checker.check(good_row(note="x", **{"region": "eu"})), CheckedRow)
    assert checker.ignored_columns == {"note", "region"}


def test_a_row_that_is_not_an_object_is_rejected(payments: PlanSource) -> None:
    for value in ([1, 2], "text", 3, None):
        result = RowChecker(payments).check(value)
        assert isinstance(result, RowError)
        assert result.field is None
        assert result.reason.startswith("expected an object with the source's fields")


# --- property-based: nothing ends in a traceback -----------------------------------------------

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=30)
    | st.sampled_from(["card", "wallet", "2026-11-30T10:00:00Z", "", "1e400", "-0", "NaN", "1_0", "+5"])
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6,
)
FIELDS = list(good_row())


def _mutated_rows() -> st.SearchStrategy[dict[str, Any]]:
    """Mostly valid rows with some fields replaced, dropped or added: both outcomes get exercised."""
    return st.builds(
        lambda replace, drop, extra: {
            k: v for k, v in {**good_row(), **replace, **extra}.items() if k not in drop
        },
        st.dictionaries(st.sampled_from(FIELDS), json_values | st.datetimes(), max_size=3),
        st.sets(st.sampled_from(FIELDS), max_size=2),
        st.dictionaries(st.text(max_size=8), json_values, max_size=2),
    )


ids = st.text(min_size=1, max_size=20) | st.integers(min_value=0, max_value=10**12)
# hypothesis takes naive bounds and attaches the timezone itself
times = st.datetimes(min_value=datetime(2001, 1, 1), max_value=datetime(2099, 1, 1), timezones=st.just(UTC))  # noqa: DTZ001
valid_rows = st.fixed_dictionaries(
    {
        "payment_id": ids,
        "account_id": ids,
        "merchant_id": ids,
        "method": st.sampled_from(["card", "wallet", "bank_transfer"]),
        "status": st.sampled_from(["authorized", "captured", "declined", "refunded"]),
        "amount": st.floats(min_value=0, max_value=1e9) | st.integers(0, 10**6).map(str),
        "currency": st.text(max_size=3),
        "occurred_at": times.map(datetime.isoformat) | times | times.map(lambda t: int(t.timestamp() * 1e6)),
    },
    optional={"risk_score": st.none() | st.floats(min_value=0, max_value=1)},
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    row=valid_rows
    | _mutated_rows()
    | st.dictionaries(st.text(max_size=12), json_values, max_size=12)
    | json_values
)
def test_any_row_is_an_event_or_a_reject_with_a_reason(payments: PlanSource, row: Any) -> None:
    checker = RowChecker(payments)
    result = check_row(checker, FileRow(7, row))
    event("rejected" if isinstance(result, Reject) else "sent")
    if isinstance(result, Reject):
        assert result.line == 7
        assert result.reason
        assert "a bug in headwater" not in result.reason
        json.loads(result.json())  # the reject file can always hold it
    else:
        codec = EventCodec(payments)
        decoded = codec.decode(result.value, codec.headers(1))
        assert isinstance(decoded, DecodedEvent)
        assert decoded.event == result.event
        assert result.key == result.event["account_id"].encode()


@settings(max_examples=300, deadline=None)
@given(line=st.binary(max_size=200) | st.text(max_size=200).map(str.encode))
def test_any_line_of_a_jsonl_file_is_sent_or_rejected(
    payments: PlanSource, tmp_path_factory: Any, line: bytes
) -> None:
    from headwater.pipelines.events.readers import open_rows

    path = tmp_path_factory.mktemp("rows") / "one.jsonl"
    good = json.dumps(good_row()).encode()
    path.write_bytes(good + b"\n" + line.replace(b"\n", b" ").replace(b"\r", b" ") + b"\n" + good + b"\n")
    checker = RowChecker(payments)
    with open_rows(path) as reader:
        results = [check_row(checker, row) for row in reader]
    assert isinstance(results[0], CheckedRow)
    assert isinstance(results[-1], CheckedRow)
    assert len(results) in (2, 3)  # a blank middle line is skipped
    for result in results[1:-1]:
        assert isinstance(result, CheckedRow) or (result.line == 2 and result.reason)


@settings(max_examples=300, deadline=None)
@given(middle=st.binary(max_size=300), fmt=st.sampled_from(["csv", "tsv"]))
def test_any_bytes_in_a_csv_file_end_as_rows_sent_or_rejected(
    payments: PlanSource, tmp_path_factory: Any, middle: bytes, fmt: str
) -> None:
    from headwater.pipelines.events.readers import open_rows

    sep = "," if fmt == "csv" else "\t"
    header = sep.join(FIELDS).encode()
    good = sep.join(str(v) for v in good_row().values()).encode()
    path = tmp_path_factory.mktemp("rows") / f"rows.{fmt}"
    path.write_bytes(header + b"\n" + good + b"\n" + middle + b"\n" + good + b"\n")
    checker = RowChecker(payments, text_cells=True)
    with open_rows(path) as reader:
        results = [(row.line, check_row(checker, row)) for row in reader]
    assert results[0][0] == 2
    assert isinstance(results[0][1], CheckedRow)  # the row before the bytes is never affected
    for line, result in results[1:]:
        assert line >= 3
        assert isinstance(result, CheckedRow) or (result.reason and result.line == line)


def test_a_source_with_numeric_key_booleans_floats_and_two_time_units() -> None:
    from headwater.pipelines.events.testing import orders_source

    orders = orders_source()
    checker = RowChecker(orders, text_cells=True)
    row = {
        "order_id": "9007199254740993",  # above 2**53: kept exact, never through a float
        "customer_id": "42",
        "qty": "3",
        "total": "19.5",
        "paid": "true",
        "channel": "web",
        "created_at": "2026-11-30T10:00:00.250Z",
        "shipped_at": "2026-11-30T12:00:00.000001Z",
    }
    result = checker.check(row)
    assert isinstance(result, CheckedRow), result
    assert result.key == b"42"
    assert result.event == {
        "order_id": 9_007_199_254_740_993,
        "customer_id": 42,
        "qty": 3,
        "total": 19.5,
        "paid": True,
        "channel": "web",
        "created_at": T0_US // 1000 + 250,
        "shipped_at": T0_US + 2 * 3_600_000_000 + 1,
    }
    assert checker.check({**row, "paid": "perhaps"}) == RowError(
        "paid", "expected true or false, found text 'perhaps'"
    )
    assert checker.check({**row, "total": "1e39"}) == RowError(
        "total", "expected a finite number (float), found '1e39'"
    )
    assert checker.check({**row, "customer_id": str(2**31)}).field == "customer_id"  # type: ignore[union-attr]
    unpaid = checker.check({**row, "paid": "0"})
    assert isinstance(unpaid, RowError)
    assert unpaid.field == "shipped_at, paid"
    assert isinstance(checker.check({**row, "paid": "0", "shipped_at": ""}), CheckedRow)
