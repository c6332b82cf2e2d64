"""The daily job on real Spark + Delta: exact values per aggregation kind against the shared reference."""

from __future__ import annotations

import math
from datetime import date
from pathlib import Path
from typing import Any

import pytest

from headwater.pipelines.offline.bronze import append_events
from headwater.pipelines.offline.job import read_bronze, run_view
from headwater.pipelines.offline.lake import bronze_path, days, feature_path
from headwater.pipelines.offline.testing import DAY_MS, HOUR_MS, T0, behaviour, event, feature, view
from headwater.pipelines.windows import compile_view, empty_values, reference_values

D0 = date(2026, 1, 1)
USER_VIEW = view("scripted_user", "user", "user_id", [
    feature("clicks_2d", "count", "2d", filter_="event_type = 'click'", dtype="int64"),
    feature("priced_2d", "count", "2d", field="price", dtype="int64"),
    feature("spend_2d", "sum", "2d", field="price", filter_="event_type = 'purchase'"),
    feature("dwell_avg_1d", "avg", "1d", field="dwell_ms", filter_="event_type = 'dwell'"),
    feature("price_min_2d", "min", "2d", field="price"),
    feature("price_max_2d", "max", "2d", field="price", filter_="price is not null"),
    feature("last_item_2d", "last", "2d", field="item_id", filter_="event_type = 'click'", dtype="string"),
    feature("last_price_1d", "last", "1d", field="price"),
    feature("sessions_2d", "distinct_count", "2d", field="session_id", dtype="int64"),
    feature("top_cat_2d", "top_k", "2d", field="category", k=2, filter_="category is not null"),
    feature("ctr_2d", "ratio", "2d", num=("count", None, "event_type = 'click'"),
            den=("count", None, "event_type = 'impression'")),
    feature("clicks_3h", "count", "3h", slide="1h", filter_="event_type = 'click'", dtype="int64"),
])  # fmt: skip
ITEM_VIEW = view("scripted_item", "item", "item_id", [
    feature("item_clicks_1d", "count", "1d", filter_="event_type = 'click'", dtype="int64"),
    feature("item_users_2d", "distinct_count", "2d", field="user_id", dtype="int64"),
])  # fmt: skip


def history() -> tuple[list[dict[str, Any]], list[bool]]:
    """Three days, two users, items with categories; a duplicate, a late event, boundary cases."""
    h = HOUR_MS
    ev = [
        event(1, "u1", "impression", T0 + 1 * h, item_id="i1", category="music", price=10.0, position=1),
        event(2, "u1", "click", T0 + 2 * h, item_id="i1", category="music", price=10.0, position=1),
        event(3, "u1", "dwell", T0 + 2 * h + 5, item_id="i1", category="music", dwell_ms=3000),
        event(4, "u1", "purchase", T0 + 3 * h, item_id="i1", category="music", price=10.0),
        event(5, "u1", "impression", T0 + 22 * h, item_id="i2", category="books", price=4.5, position=2),
        event(6, "u1", "click", T0 + 23 * h, item_id="i2", category="books", price=4.5, position=2),
        event(7, "u1", "click", T0 + 23 * h, item_id="i3", category="books", price=7.0, position=3),
        event(8, "u1", "dwell", T0 + 23 * h + 10, item_id="i2", category="books", dwell_ms=1000),
        event(9, "u1", "search", T0 + 23 * h + 20, query="jazz", category="music", session_id="s-u1b"),
        event(10, "u1", "impression", T0 + DAY_MS, item_id="i1", category="music", price=10.0, position=1),
        event(11, "u2", "impression", T0 + 5 * h, item_id="i1", category="music", price=10.0, position=4),
        event(12, "u2", "impression", T0 + DAY_MS + 2 * h, item_id="i2", category="books", price=4.5),
        event(13, "u2", "click", T0 + DAY_MS + 2 * h, item_id="i2", category="books", price=4.5),
        event(14, "u2", "like", T0 + DAY_MS + 23 * h, item_id="i2", category="books"),
        event(15, "u2", "purchase", T0 + 2 * DAY_MS + h, item_id="i2", category="books", price=4.5),
        event(16, "u1", "purchase", T0 + 2 * DAY_MS + 22 * h, item_id="i3", category="books", price=7.0),
        event(17, "u1", "dwell", T0 + 2 * DAY_MS + 23 * h, item_id="i3", category="books", dwell_ms=2500),
    ]
    duplicate = dict(ev[5])  # same event_id as e00006: counts once
    late = event(18, "u2", "click", T0 + 2 * h, item_id="i9", category="art", price=1.0)
    return [*ev, duplicate, late], [False] * (len(ev) + 1) + [True]


@pytest.fixture(scope="module")
def lake(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("lake")
    events, late = history()
    append_events(spark, behaviour(), events, bronze_path(root, "events"), late)
    bronze = read_bronze(spark, root, behaviour())
    for v in (USER_VIEW, ITEM_VIEW):
        run_view(spark, bronze, v, behaviour(), root, days(D0, date(2026, 1, 3)), zorder=v is USER_VIEW)
    return root


def table_rows(spark: Any, lake: Path, name: str, key: str) -> dict[tuple[str, str], dict[str, Any]]:
    rows = spark.read.format("delta").load(str(feature_path(lake, name))).collect()
    return {(str(r["date"]), r[key]): r.asDict(recursive=True) for r in rows}


def same(expected: Any, found: Any) -> bool:
    if isinstance(expected, tuple):
        pairs = [(e["value"], e["share"]) for e in found]
        return len(pairs) == len(expected) and all(
            str(v) == fv and math.isclose(s, fs, rel_tol=1e-12)
            for (v, s), (fv, fs) in zip(expected, pairs, strict=True)
        )
    if isinstance(expected, str):
        return expected == found
    if math.isnan(expected):
        return found is None
    return found is not None and math.isclose(expected, float(found), rel_tol=1e-12)


@pytest.mark.parametrize("plan_view", [USER_VIEW, ITEM_VIEW], ids=lambda v: v.name)
def test_every_row_equals_the_reference(spark: Any, lake: Path, plan_view: Any) -> None:
    spec = compile_view(plan_view)
    events, late = history()
    on_time = [e for e, is_late in zip(events, late, strict=True) if not is_late]
    rows = table_rows(spark, lake, plan_view.name, plan_view.join_key)
    checked = 0
    for d in range(3):
        as_of = T0 + (d + 1) * DAY_MS
        day = str(date(2026, 1, 1 + d))
        expected = reference_values(spec, on_time, as_of)
        mine = {k[1]: r for k, r in rows.items() if k[0] == day}
        assert set(expected) <= set(mine), f"{day}: entities missing from the table"
        for entity, row in mine.items():
            assert row["event_time"].timestamp() * 1000 == as_of
            want = expected.get(entity, empty_values(spec))
            for name, value in want.items():
                assert same(value, row[name]), (
                    f"{day} {entity} {name}: expected {value!r}, found {row[name]!r}"
                )
                checked += 1
    assert checked >= 6 * len(plan_view.features)


def test_hand_computed_values(spark: Any, lake: Path) -> None:
    rows = table_rows(spark, lake, "scripted_user", "user_id")
    day1 = rows[("2026-01-01", "u1")]
    assert day1["clicks_2d"] == 3  # the duplicate of e00006 counts once
    assert day1["ctr_2d"] == pytest.approx(3 / 2)
    assert day1["dwell_avg_1d"] == pytest.approx(2000.0)
    assert day1["last_item_2d"] == "i3"  # same time as e00006, greater event_id
    assert day1["sessions_2d"] == 2
    assert [(e["value"], e["share"]) for e in day1["top_cat_2d"]] == [("music", 5 / 9), ("books", 4 / 9)]
    assert day1["clicks_3h"] == 2
    u2 = rows[("2026-01-01", "u2")]
    assert u2["clicks_2d"] == 0  # the late click is not counted
    assert u2["price_min_2d"] == 10.0
    assert u2["ctr_2d"] == 0.0
    day3 = rows[("2026-01-03", "u1")]
    assert day3["dwell_avg_1d"] == 2500.0
    assert day3["spend_2d"] == 7.0
    assert day3["last_price_1d"] is None  # the latest event (a dwell) has no price
    items = table_rows(spark, lake, "scripted_item", "item_id")
    assert items[("2026-01-02", "i2")]["item_users_2d"] == 2
    assert ("2026-01-01", None) not in items  # the search has no item


def test_rerun_changes_nothing_and_tables_are_zordered(spark: Any, lake: Path) -> None:
    from delta.tables import DeltaTable

    before = table_rows(spark, lake, "scripted_user", "user_id")
    bronze = read_bronze(spark, lake, behaviour())
    one_day = days(date(2026, 1, 3), date(2026, 1, 3))
    runs = run_view(spark, bronze, USER_VIEW, behaviour(), lake, one_day, zorder=False)
    assert [r.rows for r in runs] == [sum(1 for k in before if k[0] == "2026-01-03")]
    assert table_rows(spark, lake, "scripted_user", "user_id") == before
    history = DeltaTable.forPath(spark, str(feature_path(lake, "scripted_user"))).history().collect()
    zorders = [h["operationParameters"].get("zOrderBy") for h in history if h["operation"] == "OPTIMIZE"]
    assert zorders
    assert all(z == '["user_id"]' for z in zorders)
    partitions = {
        r["date"] for r in spark.read.format("delta").load(str(feature_path(lake, "scripted_user"))).collect()
    }
    assert sorted(map(str, partitions)) == ["2026-01-01", "2026-01-02", "2026-01-03"]
