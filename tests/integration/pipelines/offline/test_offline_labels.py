"""Labels from bronze with real Spark and Delta: exact labels and slates on a scripted history."""

from __future__ import annotations

from datetime import date
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from headwater.cli.labels import labels
from headwater.pipelines.offline.bronze import append_events
from headwater.pipelines.offline.labels import LabelsError, derive_labels, write_labels
from headwater.pipelines.offline.lake import DAY_MS, bronze_path
from headwater.pipelines.offline.testing import T0, behaviour, event, write_plan

HORIZON_S = 600


def imp(n: int, user: str, item: str, position: int, t: int, session: str | None = None) -> dict[str, Any]:
    return event(n, user, "impression", t, item_id=item, position=position, session_id=session or f"s-{user}")


def click(n: int, user: str, item: str, t: int, session: str | None = None) -> dict[str, Any]:
    return event(n, user, "click", t, item_id=item, session_id=session or f"s-{user}")


def history() -> tuple[list[dict[str, Any]], list[bool]]:
    """A scripted history; comments give each impression's expected label."""
    s = 1000
    events = [
        imp(1, "u1", "i1", 1, T0 + 1 * s),  # page 1
        imp(2, "u1", "i2", 2, T0 + 1 * s),
        imp(3, "u1", "i3", 3, T0 + 1 * s),
        click(4, "u1", "i2", T0 + 10 * s),  # i2 page 1 -> 1
        click(5, "u1", "i3", T0 + 1 * s + HORIZON_S * s + 1),  # beyond the horizon: i3 -> 0
        click(6, "u1", "i1", T0 + 5 * s, session="s-other"),  # other session: i1 -> 0
        imp(7, "u1", "i5", 1, T0 + 20 * s), imp(8, "u1", "i4", 2, T0 + 20 * s),  # page 2
        click(9, "u1", "i4", T0 + 19 * s),  # before its impression: i4 -> 0
        imp(10, "u1", "i5", 1, T0 + 30 * s),  # page 3 shows i5 again
        click(11, "u1", "i5", T0 + 31 * s),  # credited to page 3 only: page 2 i5 -> 0, page 3 i5 -> 1
        imp(12, "u2", "i1", 1, T0 + 2 * s),
        click(13, "u2", "i1", T0 + 3 * s),  # flagged late: ignored, i1 -> 0
        imp(14, "u2", "i2", 2, T0 + 2 * s),
        click(15, "u1", "i2", T0 + 4 * s, session="s-u2"),  # another user: i2 -> 0
        imp(16, "u3", "i9", 1, T0 + DAY_MS - 5 * s),
        click(17, "u3", "i9", T0 + DAY_MS + 5 * s),  # after midnight, within the horizon: i9 -> 1
        imp(18, "u3", "i8", 1, T0 + DAY_MS + 60 * s),  # day 2
    ]  # fmt: skip
    events.append(dict(events[0]))  # a duplicate of event 1 counts once
    late = [e["event_id"] == "e00013" for e in events]
    return events, late


EXPECTED = {
    "e00001": 0.0, "e00002": 1.0, "e00003": 0.0, "e00007": 0.0, "e00008": 0.0, "e00010": 1.0,
    "e00012": 0.0, "e00014": 0.0, "e00016": 1.0,
}  # fmt: skip


@pytest.fixture
def lake(spark: Any, tmp_path: Path) -> Path:
    events, late = history()
    append_events(spark, behaviour(), events, bronze_path(tmp_path / "lake", "events"), late)
    return tmp_path / "lake"


def test_labels_are_exact_and_slates_are_session_pages(spark: Any, lake: Path) -> None:
    bronze = spark.read.format("delta").load(str(bronze_path(lake, "events")))
    rows = derive_labels(bronze, behaviour(), date(2026, 1, 1), date(2026, 1, 1), HORIZON_S).collect()
    ids = {(e["user_id"], e["item_id"], e["event_time"]): e["event_id"]
           for e in history()[0] if e["event_type"] == "impression"}  # fmt: skip
    assert len(rows) == len(EXPECTED)
    assert {ids[(r["user_id"], r["item_id"], r["event_time"])]: r["label"] for r in rows} == EXPECTED
    group = {(r["user_id"], r["item_id"], r["event_time"]): r["group"] for r in rows}
    page1 = {group[("u1", i, T0 + 1000)] for i in ("i1", "i2", "i3")}
    page2 = {group[("u1", i, T0 + 20_000)] for i in ("i5", "i4")}
    page3 = group[("u1", "i5", T0 + 30_000)]
    assert len(page1) == 1
    assert len(page2) == 1
    assert len(page1 | page2 | {page3}) == 3
    assert group[("u2", "i1", T0 + 2000)] == group[("u2", "i2", T0 + 2000)]


def test_labels_cli_writes_what_training_set_reads(spark: Any, lake: Path, tmp_path: Path) -> None:
    from headwater.ranking.training_set import read_labels

    out = tmp_path / "labels.parquet"
    write_plan(tmp_path / "state", "offline", [])  # two sources: the one with behaviour fields is labelled
    result = CliRunner().invoke(
        labels, ["--from", "2026-01-01", "--to", "2026-01-02", "--horizon", str(HORIZON_S), "--lake",
                 str(lake), "--out", str(out), "--state-dir", str(tmp_path / "state")],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    table = pq.read_table(out)
    assert table.column_names == [
        "group",
        "user_id",
        "item_id",
        "event_time",
        "label",
        "session_id",
        "position",
    ]
    assert table.num_rows == len(EXPECTED) + 1
    assert sorted(table.column("label").to_pylist()).count(1.0) == 3
    frame = read_labels(spark, out)
    assert frame.count() == len(EXPECTED) + 1
    assert frame.columns == ["group", "user_id", "item_id", "event_time", "label", "position"]


def test_labels_of_an_empty_range_is_a_clear_error(spark: Any, lake: Path, tmp_path: Path) -> None:
    bronze = spark.read.format("delta").load(str(bronze_path(lake, "events")))
    frame = derive_labels(bronze, behaviour(), date(2026, 3, 1), date(2026, 3, 1))
    with pytest.raises(LabelsError, match="no impressions to label"):
        write_labels(frame, tmp_path / "x.parquet", tmp_path)
    assert not (tmp_path / "x.parquet").exists()
