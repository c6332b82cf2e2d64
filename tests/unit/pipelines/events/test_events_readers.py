"""The file readers (JSON Lines, CSV/TSV, Parquet, gzip) and a whole file run without a broker.

The run uses a recording stand-in for the Kafka producer (the real broker is in
tests/integration/pipelines/events/test_events_ingest_kafka.py).
"""

from __future__ import annotations

import gzip
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from headwater.pipelines.events.codec import DecodedEvent, EventCodec
from headwater.pipelines.events.ingest import (
    FileOptions,
    IngestError,
    RejectFile,
    produce_file,
    shift_delta_ms,
)
from headwater.pipelines.events.readers import FileFormatError, detect_format, open_rows
from headwater.pipelines.events.rows import RowChecker
from headwater.pipelines.events.sources import example_sources
from headwater.registry.plans import PlanSource

T0_US = 1_796_032_800_000_000  # 2026-11-30T10:00:00Z


@pytest.fixture(scope="module")
def payments() -> PlanSource:
    return next(s for s in example_sources() if s.name == "payments")


def payment(n: int, **change: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "payment_id": f"p-{n}",
        "account_id": f"acc-{n % 3}",
        "merchant_id": "m-1",
        "method": "card",
        "status": "captured",
        "amount": float(n),
        "currency": "EUR",
        "risk_score": None,
        "occurred_at": T0_US + n * 1_000_000,
    }
    row.update(change)
    return row


class Sent:
    """A stand-in for kafka.KafkaProducer that records what would be sent."""

    def __init__(self) -> None:
        self.records: list[tuple[str, bytes, bytes | None, list[tuple[str, bytes]]]] = []

    def send(self, topic: str, value: bytes, key: bytes | None = None, headers: Any = None) -> Any:
        self.records.append((topic, value, key, list(headers or ())))
        return self

    def add_errback(self, _callback: Any) -> Any:
        return self

    def flush(self, timeout: float | None = None) -> None:
        pass


def test_format_from_extension_or_option(tmp_path: Path) -> None:
    assert detect_format(Path("a.jsonl")) == "jsonl"
    assert detect_format(Path("a.ndjson.gz")) == "jsonl"
    assert detect_format(Path("a.CSV")) == "csv"
    assert detect_format(Path("a.tsv.gz")) == "tsv"
    assert detect_format(Path("a.parquet")) == "parquet"
    assert detect_format(Path("a.txt"), "csv") == "csv"
    with pytest.raises(FileFormatError, match=r"a\.txt: cannot tell the format .* pass --format"):
        detect_format(Path("a.txt"))
    with pytest.raises(FileFormatError, match=r"no such file"):
        open_rows(tmp_path / "absent.jsonl")


def test_jsonl_lines_numbers_blank_lines_bom_and_bad_lines(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"a": 1}\n\n{"a": 2}\r\nnot json\n[1]\n{"a": "\xff"}\n')
    with open_rows(path) as reader:
        rows = list(reader)
        assert reader.done == 1.0
    assert [(r.line, r.values, r.error is not None) for r in rows] == [
        (1, {"a": 1}, False),
        (3, {"a": 2}, False),
        (4, None, True),
        (5, [1], False),
        (6, None, True),
    ]
    assert rows[2].raw == "not json"
    assert rows[2].error is not None
    assert rows[2].error.startswith("not JSON")


def test_a_json_array_is_refused_with_the_fix(tmp_path: Path) -> None:
    path = tmp_path / "rows.json"
    path.write_text('[{"a": 1}]')
    with (
        open_rows(path) as reader,
        pytest.raises(FileFormatError, match=r"JSON array, not JSON Lines.*jq -c"),
    ):
        list(reader)


def test_csv_quoted_newlines_short_rows_and_gzip(tmp_path: Path) -> None:
    text = 'a,b\n1,"two\nlines"\n3\n\n4,5\n'
    for path in (tmp_path / "rows.csv", tmp_path / "rows.csv.gz"):
        data = text.encode()
        path.write_bytes(gzip.compress(data) if path.suffix == ".gz" else data)
        with open_rows(path) as reader:
            rows = list(reader)
        assert [(r.line, r.values) for r in rows] == [
            (2, {"a": "1", "b": "two\nlines"}),
            (4, None),
            (6, {"a": "4", "b": "5"}),
        ]
        assert rows[1].error == "1 cells, the header has 2 columns"


def test_csv_header_must_name_each_column_once(tmp_path: Path) -> None:
    path = tmp_path / "rows.tsv"
    path.write_text("a\ta\n1\t2\n")
    with (
        open_rows(path) as reader,
        pytest.raises(FileFormatError, match=r"rows\.tsv:1: the header has repeated column"),
    ):
        list(reader)


def test_parquet_rows_with_timestamps_and_nulls(tmp_path: Path, payments: PlanSource) -> None:
    path = tmp_path / "rows.parquet"
    table = pa.table(
        {
            "payment_id": ["p-1", "p-2"],
            "account_id": ["a", "b"],
            "merchant_id": ["m", "m"],
            "method": ["card", "wallet"],
            "status": ["captured", "declined"],
            "amount": [1.5, 2.0],
            "currency": ["EUR", "USD"],
            "risk_score": [None, 0.5],
            "occurred_at": pa.array(
                [datetime(2026, 11, 30, 10, tzinfo=UTC), datetime(2026, 11, 30, 10, 0, 1, tzinfo=UTC)],
                pa.timestamp("us", tz="UTC"),
            ),
        }
    )
    pq.write_table(table, path, row_group_size=1)
    checker = RowChecker(payments)
    with open_rows(path) as reader:
        rows = list(reader)
        assert reader.done == 1.0
        assert [r.values for r in reader.column("occurred_at")] == [
            {"occurred_at": datetime(2026, 11, 30, 10, tzinfo=UTC)},
            {"occurred_at": datetime(2026, 11, 30, 10, 0, 1, tzinfo=UTC)},
        ]
    assert [r.line for r in rows] == [1, 2]
    events = [checker.check(r.values) for r in rows]
    assert [e.event["occurred_at"] for e in events] == [T0_US, T0_US + 1_000_000]  # type: ignore[union-attr]
    assert [e.event["risk_score"] for e in events] == [None, 0.5]  # type: ignore[union-attr]


def test_a_file_that_is_not_parquet_is_named(tmp_path: Path) -> None:
    path = tmp_path / "rows.parquet"
    path.write_text("hello")
    with pytest.raises(FileFormatError, match=r"rows\.parquet: not a Parquet file"):
        open_rows(path)


def test_signed_durations_and_named_shifts() -> None:
    assert shift_delta_ms("+3650d") == 3650 * 86_400_000
    assert shift_delta_ms("-2h") == -7_200_000
    assert shift_delta_ms("90s") == 90_000
    assert shift_delta_ms("to-now") is None
    with pytest.raises(
        IngestError, match=r"--time-shift 'soon': expected to-now, from-now or a signed duration"
    ):
        shift_delta_ms("soon")


def _write_jsonl(path: Path, rows: list[Any]) -> None:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))


def test_a_run_sends_good_rows_keyed_and_lists_rejects_with_their_line(
    tmp_path: Path, payments: PlanSource
) -> None:
    path = tmp_path / "pay.jsonl"
    _write_jsonl(path, [payment(1), payment(2, amount=-5), "{oops", payment(3, method="cash"), payment(4)])
    kafka = Sent()
    rejects = RejectFile(tmp_path / "pay.rejects.jsonl")
    with open_rows(path) as reader:
        stats = produce_file(kafka, payments, reader, rejects)  # type: ignore[arg-type]
    rejects.close()
    assert (stats.read, stats.sent, stats.rejected, stats.failed) == (5, 2, 3, 0)
    codec = EventCodec(payments)
    decoded = [codec.decode(value, headers) for _, value, _, headers in kafka.records]
    assert all(isinstance(d, DecodedEvent) for d in decoded)
    assert [d.event["payment_id"] for d in decoded] == ["p-1", "p-4"]  # type: ignore[union-attr]
    assert [(t, k) for t, _, k, _ in kafka.records] == [("payments", b"acc-1"), ("payments", b"acc-1")]
    listed = [json.loads(line) for line in (tmp_path / "pay.rejects.jsonl").read_text().splitlines()]
    assert [(r["line"], r["field"]) for r in listed] == [(2, "amount"), (3, None), (4, "method")]
    assert listed[1]["raw"] == "{oops"
    assert listed[0]["row"]["amount"] == -5


def test_to_now_moves_the_newest_event_to_now_and_from_now_the_oldest(
    tmp_path: Path, payments: PlanSource
) -> None:
    path = tmp_path / "old.jsonl"
    old = [payment(n, occurred_at=f"1997-03-0{n}T00:00:00Z") for n in (1, 3, 2)]  # out of order, before 2000
    _write_jsonl(path, [*old, payment(9, occurred_at="not a time")])
    now_ms = 1_800_000_000_000
    for shift, (first, last) in {
        "to-now": (now_ms - 2 * 86_400_000, now_ms),
        "from-now": (now_ms, now_ms + 2 * 86_400_000),
    }.items():
        kafka = Sent()
        rejects = RejectFile(tmp_path / "r.jsonl")
        with open_rows(path) as reader:
            stats = produce_file(
                kafka, payments, reader, rejects, FileOptions(time_shift=shift), now_ms=now_ms
            )  # type: ignore[arg-type]
        rejects.close()
        assert (stats.sent, stats.rejected) == (3, 1)
        assert (stats.first_event_ms, stats.last_event_ms) == (first, last)
    # without a shift, the 1990s are before the source's min_event_time: every row is rejected
    rejects = RejectFile(tmp_path / "r.jsonl")
    with open_rows(path) as reader:
        stats = produce_file(Sent(), payments, reader, rejects)  # type: ignore[arg-type]
    assert (stats.sent, stats.rejected) == (0, 4)


def test_to_now_needs_one_readable_event_time(tmp_path: Path, payments: PlanSource) -> None:
    path = tmp_path / "none.csv"
    path.write_text("payment_id,occurred_at\np,never\n")
    with (
        open_rows(path) as reader,
        pytest.raises(IngestError, match=r"no row has a readable event time in field 'occurred_at'"),
    ):
        produce_file(
            Sent(), payments, reader, RejectFile(tmp_path / "r.jsonl"), FileOptions(time_shift="to-now")
        )  # type: ignore[arg-type]


def test_max_rows_stops_the_run(tmp_path: Path, payments: PlanSource) -> None:
    path = tmp_path / "many.jsonl"
    _write_jsonl(path, [payment(n) for n in range(10)])
    with open_rows(path) as reader:
        stats = produce_file(
            Sent(), payments, reader, RejectFile(tmp_path / "r.jsonl"), FileOptions(max_rows=4)
        )  # type: ignore[arg-type]
    assert (stats.read, stats.sent) == (4, 4)


def _dues(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Record when the run asks to send each row (seconds after its start) instead of sleeping."""
    from headwater.pipelines.events.sending import Sender

    dues: list[float] = []
    monkeypatch.setattr(Sender, "wait_until", lambda self, due: dues.append(round(due - self.started, 6)))
    return dues


def test_recorded_pacing_follows_the_gaps_between_event_times(
    tmp_path: Path, payments: PlanSource, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "paced.jsonl"
    _write_jsonl(path, [payment(n, occurred_at=T0_US + s * 1_000_000) for n, s in enumerate((0, 2, 1, 10))])
    dues = _dues(monkeypatch)
    with open_rows(path) as reader:
        options = FileOptions(pace="recorded", speed=2.0)
        stats = produce_file(Sent(), payments, reader, RejectFile(tmp_path / "r.jsonl"), options)  # type: ignore[arg-type]
    assert stats.sent == 4
    assert dues == [
        0.0,
        1.0,
        0.5,
        5.0,
    ]  # seconds after the first event, twice as fast; earlier ones go at once


def test_from_now_with_recorded_pacing_sends_each_row_at_its_shifted_time(
    tmp_path: Path, payments: PlanSource, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "live.jsonl"
    _write_jsonl(path, [payment(n, occurred_at=T0_US + s * 1_000_000) for n, s in enumerate((3, 0, 5))])
    dues = _dues(monkeypatch)
    kafka = Sent()
    with open_rows(path) as reader:
        options = FileOptions(time_shift="from-now", pace="recorded")
        produce_file(
            kafka, payments, reader, RejectFile(tmp_path / "r.jsonl"), options, now_ms=1_800_000_000_000
        )  # type: ignore[arg-type]
    assert dues == [3.0, 0.0, 5.0]  # the anchor is the file's oldest event (the second row), now
    codec = EventCodec(payments)
    times = [codec.decode(v, h).event_time_ms for _, v, _, h in kafka.records]  # type: ignore[union-attr]
    assert times == [1_800_000_003_000, 1_800_000_000_000, 1_800_000_005_000]


def test_rate_pacing_spaces_rows_evenly(
    tmp_path: Path, payments: PlanSource, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "rate.jsonl"
    _write_jsonl(path, [payment(n) for n in range(4)])
    dues = _dues(monkeypatch)
    with open_rows(path) as reader:
        produce_file(Sent(), payments, reader, RejectFile(tmp_path / "r.jsonl"), FileOptions(rate=4.0))  # type: ignore[arg-type]
    assert dues == [0.0, 0.25, 0.5, 0.75]


def test_a_first_line_that_is_a_bad_row_is_not_taken_for_an_array(
    tmp_path: Path, payments: PlanSource
) -> None:
    path = tmp_path / "rows.jsonl"
    _write_jsonl(path, ["[1, 2]", payment(1)])
    with open_rows(path) as reader:
        assert [(r.line, r.values) for r in reader] == [(1, [1, 2]), (2, payment(1))]
    for opening in ("[", '[{"a": 1},', '[{"a": 1}, {"a": 2}]'):
        path.write_text(opening + "\n")
        with open_rows(path) as reader, pytest.raises(FileFormatError, match="JSON array"):
            list(reader)
