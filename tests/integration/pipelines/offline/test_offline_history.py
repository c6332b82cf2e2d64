"""`headwater events import`: history of any age and order into bronze, exactly once (Spark, Delta)."""

from __future__ import annotations

import csv
import json
import math
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from headwater.cli.events_import import import_cmd
from headwater.pipelines.offline.history import import_history, read_rejects
from headwater.pipelines.offline.job import read_bronze, run_view
from headwater.pipelines.offline.lake import bronze_path, feature_path
from headwater.pipelines.offline.testing import feature, payments, view, write_plan
from headwater.pipelines.windows import compile_view, reference_values
from headwater.registry.plans import PlanSource, plan_source
from headwater.registry.testing import ScratchRepo

DAY_MS = 86_400_000
D1995 = int(datetime(1995, 3, 1, tzinfo=UTC).timestamp() * 1000)
SPEND = view("old_spend", "account", "account_id", [
    feature("captured_7d", "sum", "7d", field="amount", filter_="status = 'captured'"),
    feature("payments_7d", "count", "7d", dtype="int64"),
    feature("top_method_7d", "top_k", "7d", field="method", k=2),
], source="payments")  # fmt: skip


@pytest.fixture(scope="module")
def old_payments(tmp_path_factory: pytest.TempPathFactory) -> PlanSource:
    """The example payments source with ``min_event_time: 1990-01-01`` in sources.yaml, as apply plans it."""
    from headwater.pipelines.events.schema import example_repo

    repo = ScratchRepo(tmp_path_factory.mktemp("repo") / "features", template=example_repo())
    text = (repo.root / "sources.yaml").read_text(encoding="utf-8")
    marker = "    allowed_lateness: 30s\n"
    assert text.count(marker) == 1
    repo.write("sources.yaml", text.replace(marker, marker + "    min_event_time: 1990-01-01\n"))
    result = repo.check()
    assert "payments" in result.sources, [d.message for d in result.diagnostics.errors]
    return plan_source(result.sources["payments"])


def row(n: int, account: str, t_ms: int, **fields: Any) -> dict[str, Any]:
    """A row as a user's export has it: ISO-8601 times, every field as JSON."""
    base = {"payment_id": f"h{n:04d}", "account_id": account, "merchant_id": f"m{n % 3}", "method": "card",
            "status": "captured", "amount": float(n), "currency": "USD", "risk_score": None,
            "occurred_at": datetime.fromtimestamp(t_ms / 1000, tz=UTC).isoformat()}  # fmt: skip
    base.update(fields)
    return base


def history() -> list[dict[str, Any]]:
    """Six days of 1995 for two accounts, written newest first (a bulk export is rarely in time order)."""
    rows = [
        row(n, f"a{n % 2}", D1995 + (n % 6) * DAY_MS + n * 60_000,
            method=["card", "wallet", "bank_transfer"][n % 3],
            status="refunded" if n % 5 == 0 else "captured")
        for n in range(1, 31)
    ]  # fmt: skip
    return sorted(rows, key=lambda r: r["occurred_at"], reverse=True)


def write_jsonl(path: Path, rows: list[Any]) -> Path:
    path.write_text(
        "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8"
    )
    return path


def test_old_history_lands_once_in_any_order_and_rejects_name_line_and_reason(
    spark: Any, old_payments: PlanSource, tmp_path: Path
) -> None:
    lake = tmp_path / "lake"
    good = history()
    bad = [
        "{not json",  # line 31
        row(90, "a1", int(datetime(1985, 6, 1, tzinfo=UTC).timestamp() * 1000)),  # before min_event_time
        row(91, "a1", D1995, method="cheque"),  # not an enum symbol
        row(92, "a1", D1995, amount=-5.0),  # breaks the rule amount >= 0
        row(93, "a1", 4_000_000_000_000),  # 2096: far in the future
    ]
    source = write_jsonl(tmp_path / "payments.jsonl", [*good, *bad])
    rejects = tmp_path / "rejects.jsonl"
    first = import_history(spark, lake, old_payments, source, reject_file=rejects, chunk_rows=7)
    assert (first.rows, first.valid, first.landed, first.rejected) == (35, 30, 30, 5)
    assert first.reasons == {"unparsable": 1, "invalid_field": 3, "future_dated": 1}
    assert first.chunks == 5
    found = {(r["line"], r["reason"], r["field"]) for r in read_rejects(rejects)}
    assert found == {(31, "unparsable", None), (32, "invalid_field", "occurred_at"),
                     (33, "invalid_field", "method"), (34, "invalid_field", "amount"),
                     (35, "future_dated", "occurred_at")}  # fmt: skip
    details = {r["line"]: r["detail"] for r in read_rejects(rejects)}
    assert "min_event_time" in details[32]
    assert "amount >= 0" in details[34]

    bronze = read_bronze(spark, lake, old_payments)
    landed = bronze.select("payment_id", "occurred_at", "late", "date", "kafka_offset").collect()
    assert sorted(r["payment_id"] for r in landed) == sorted(r["payment_id"] for r in good)
    assert not any(r["late"] for r in landed)  # no watermark: order does not matter
    assert {str(r["date"]) for r in landed} == {f"1995-03-0{d}" for d in range(1, 7)}
    assert all(r["kafka_offset"] is None for r in landed)
    micros = {r["payment_id"]: r["occurred_at"] for r in landed}
    assert micros["h0001"] == (D1995 + DAY_MS + 60_000) * 1000

    # The same file again (another name, another chunk size asked): nothing lands twice.
    copy = tmp_path / "again.jsonl"
    copy.write_bytes(source.read_bytes())
    again = import_history(spark, lake, old_payments, copy, reject_file=tmp_path / "r2.jsonl", chunk_rows=100)
    assert (again.landed, again.skipped_chunks, again.chunks, again.rejected) == (0, 5, 5, 5)
    # The same events in CSV and Parquet: every event id is already there.
    fields = [f.name for f in old_payments.fields]
    with (tmp_path / "p.csv").open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fields)
        writer.writeheader()
        writer.writerows({k: ("" if v is None else v) for k, v in r.items()} for r in good)
    from_csv = import_history(spark, lake, old_payments, tmp_path / "p.csv")
    assert (from_csv.valid, from_csv.landed, from_csv.duplicates, from_csv.rejected) == (30, 0, 30, 0)
    pq.write_table(pa.Table.from_pylist(good), tmp_path / "p.parquet")
    from_parquet = import_history(spark, lake, old_payments, tmp_path / "p.parquet")
    assert (from_parquet.landed, from_parquet.duplicates) == (0, 30)
    assert read_bronze(spark, lake, old_payments).count() == 30

    # The offline job computes 1995 as it computes yesterday: equal to the reference.
    run_view(spark, read_bronze(spark, lake, old_payments), SPEND, old_payments, lake,
             [date(1995, 3, 6)], zorder=False)  # fmt: skip
    events = [{**e, "event_time": e["occurred_at"] // 1000, "event_id": e["payment_id"]}
              for e in (r.asDict() for r in read_bronze(spark, lake, old_payments).collect())]  # fmt: skip
    expected = reference_values(compile_view(SPEND), events, D1995 + 6 * DAY_MS)
    rows = {
        r["account_id"]: r
        for r in spark.read.format("delta").load(str(feature_path(lake, SPEND.name))).collect()
    }
    assert set(rows) == set(expected) == {"a0", "a1"}
    for account, values in expected.items():
        assert rows[account]["captured_7d"] == pytest.approx(values["captured_7d"])
        assert rows[account]["payments_7d"] == values["payments_7d"] == 15
        top = [(e["value"], e["share"]) for e in rows[account]["top_method_7d"]]
        assert [v for v, _ in top] == [v for v, _ in values["top_method_7d"]]
        assert all(math.isclose(a, b) for (_, a), (_, b) in zip(top, values["top_method_7d"], strict=True))


def test_the_default_lower_bound_rejects_the_1990s_and_a_source_without_event_id_is_once_per_file(
    spark: Any, tmp_path: Path
) -> None:
    lake = tmp_path / "lake"
    rows = history()[:6]
    source = write_jsonl(tmp_path / "h.jsonl", rows)
    refused = import_history(spark, lake, payments(), source, reject_file=tmp_path / "r.jsonl")
    assert (refused.landed, refused.rejected) == (0, 6)
    assert all("min_event_time" in r["detail"] for r in read_rejects(tmp_path / "r.jsonl"))

    no_ids = payments().model_copy(update={"event_id": None, "min_event_time_ms": 0})
    first = import_history(spark, lake, no_ids, source, chunk_rows=4)
    assert (first.landed, first.chunks) == (6, 2)
    again = import_history(spark, lake, no_ids, source, chunk_rows=4)
    assert (again.landed, again.skipped_chunks) == (0, 2)
    assert read_bronze(spark, lake, no_ids).count() == 6


def test_import_command(spark: Any, old_payments: PlanSource, tmp_path: Path) -> None:
    state, lake = tmp_path / "state", tmp_path / "lake"
    write_plan(state, "offline", [], sources=[old_payments])
    source = write_jsonl(tmp_path / "h.jsonl", [*history()[:4], row(99, "a1", D1995, status="lost")])
    args = ["--source", "payments", "--from", str(source), "--lake", str(lake), "--state-dir", str(state)]
    run = CliRunner().invoke(import_cmd, [*args, "--reject-file", str(tmp_path / "rej.jsonl")])
    assert run.exit_code == 0, run.output
    summary = json.loads(run.stdout.strip().splitlines()[-1])
    assert (summary["landed"], summary["rejected"], summary["reject_file"]) == (
        4,
        1,
        str(tmp_path / "rej.jsonl"),
    )
    assert [(r["line"], r["field"]) for r in read_rejects(tmp_path / "rej.jsonl")] == [(5, "status")]
    assert bronze_path(lake, "payments").is_dir()
    rerun = CliRunner().invoke(import_cmd, args)
    assert rerun.exit_code == 0, rerun.output
    assert json.loads(rerun.stdout.strip().splitlines()[-1])["landed"] == 0
    unknown = CliRunner().invoke(
        import_cmd, ["--source", "nope", "--from", str(source), "--state-dir", str(state)]
    )
    assert unknown.exit_code == 1
    assert "source 'nope' is not in the applied plan" in unknown.output
