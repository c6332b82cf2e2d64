"""The incremental daily job on Spark + Delta: runs from tiles equal --full; a late day re-tiles alone."""

from __future__ import annotations

import math
from datetime import date, timedelta
from pathlib import Path
from typing import Any

import pytest

from headwater.pipelines.offline.bronze import append_events
from headwater.pipelines.offline.job import read_bronze, run_view
from headwater.pipelines.offline.lake import bronze_path, feature_path, tiles_path
from headwater.pipelines.offline.testing import DAY_MS, HOUR_MS, T0, behaviour, event, feature, view
from headwater.pipelines.offline.tiles import view_tiled

pytestmark = pytest.mark.integration

D0 = date(2026, 1, 1)
FEATURES = [
    feature("clicks_2d", "count", "2d", filter_="event_type = 'click'", dtype="int64"),
    feature("priced_1d", "count", "1d", slide="1h", field="price", dtype="int64"),
    feature("spend_2d", "sum", "2d", field="price", filter_="event_type = 'purchase'"),
    feature("dwell_avg_1d", "avg", "1d", field="dwell_ms", filter_="event_type = 'dwell'"),
    feature("price_min_2d", "min", "2d", field="price"),
    feature("price_max_2d", "max", "2d", field="price"),
    feature("last_item_2d", "last", "2d", field="item_id", filter_="event_type = 'click'", dtype="string"),
    feature("sessions_2d", "distinct_count", "2d", field="session_id", dtype="int64"),
    feature("top_cat_2d", "top_k", "2d", field="category", k=2, filter_="category is not null"),
    feature("ctr_2d", "ratio", "2d", num=("count", None, "event_type = 'click'"),
            den=("count", None, "event_type = 'impression'")),
    feature("item_ratio_2d", "ratio", "2d", num=("distinct_count", "item_id", None),
            den=("count", None, None)),
]  # fmt: skip
TILED = view("tiled_user", "user", "user_id", FEATURES)
FULL = view("full_user", "user", "user_id", FEATURES)
DAYS = [D0 + timedelta(days=i) for i in range(4)]


def history() -> list[dict[str, Any]]:
    """Four days, three users: clicks, impressions, purchases, dwell; sessions, categories, items."""
    kinds = ["impression", "click", "purchase", "dwell", "impression", "click"]
    out = []
    for n in range(60):
        user, kind = f"u{n % 3}", kinds[n % len(kinds)]
        t = T0 + (n * 37 % 96) * HOUR_MS + n  # spread over four days, a few at the same hour
        out.append(event(n, user, kind, t, item_id=f"i{n % 4}", category=["music", "books", None][n % 3],
                         price=None if kind == "dwell" else float(n % 5) + 0.5, session_id=f"s{n % 5}",
                         dwell_ms=1000 * (n % 4) if kind == "dwell" else None))  # fmt: skip
    return out


def rows(spark: Any, name: str, lake: Path) -> dict[tuple[str, str], dict[str, Any]]:
    table = spark.read.format("delta").load(str(feature_path(lake, name))).collect()
    return {(str(r["date"]), r["user_id"]): r.asDict(recursive=True) for r in table}


def assert_same(
    got: dict[tuple[str, str], dict[str, Any]], want: dict[tuple[str, str], dict[str, Any]]
) -> None:
    assert set(got) == set(want)
    for at, row in want.items():
        for f in FEATURES:
            a, b = got[at][f.name], row[f.name]
            if isinstance(b, float) and isinstance(a, float):
                assert math.isclose(a, b, rel_tol=1e-9), (at, f.name, a, b)
            elif f.agg == "top_k":
                assert [x["value"] for x in a] == [x["value"] for x in b], (at, f.name, a, b)
                assert [x["share"] for x in a] == pytest.approx([x["share"] for x in b]), (at, f.name)
            else:
                assert a == b, (at, f.name, a, b)


def tile_rows(spark: Any, lake: Path) -> dict[tuple[str, str], str]:
    path = tiles_path(lake, TILED.name, TILED.version)
    return {(str(r["date"]), r["user_id"]): str(sorted(r.asDict(recursive=True).items()))
            for r in spark.read.format("delta").load(str(path)).collect()}  # fmt: skip


def test_incremental_days_equal_full_and_a_late_day_retiles_alone(spark: Any, tmp_path: Path) -> None:
    assert view_tiled(TILED)
    source = behaviour()
    append_events(spark, source, history(), bronze_path(tmp_path, "events"))
    bronze = read_bronze(spark, tmp_path, source)
    incremental = [run_view(spark, bronze, TILED, source, tmp_path, [d], zorder=False)[0] for d in DAYS]
    assert all(r.tiled for r in incremental)
    # the first run tiles its whole reach; each later day tiles only that new day
    assert incremental[0].retiled[-1] == DAYS[0]
    assert [r.retiled for r in incremental[1:]] == [(d,) for d in DAYS[1:]]
    run_view(spark, bronze, FULL, source, tmp_path, DAYS, zorder=False, full=True)
    assert_same(rows(spark, TILED.name, tmp_path), rows(spark, FULL.name, tmp_path))
    assert len(rows(spark, FULL.name, tmp_path)) >= 9

    # a late event lands for day 1: the next run re-tiles day 1 only, and its values equal --full
    before = tile_rows(spark, tmp_path)
    clicks = rows(spark, TILED.name, tmp_path)[(str(DAYS[2]), "u1")]["clicks_2d"]
    late = event(999, "u1", "click", T0 + DAY_MS + 5 * HOUR_MS, item_id="i9", category="art", price=9.5,
                 session_id="s-late")  # fmt: skip
    append_events(spark, source, [late], bronze_path(tmp_path, "events"))
    bronze = read_bronze(spark, tmp_path, source)
    again = run_view(spark, bronze, TILED, source, tmp_path, [DAYS[2]], zorder=False)[0]
    assert again.retiled == (DAYS[1],)
    after = tile_rows(spark, tmp_path)
    changed = {at for at in set(before) | set(after) if before.get(at) != after.get(at)}
    assert changed == {(str(DAYS[1]), "u1")}
    run_view(spark, bronze, FULL, source, tmp_path, [DAYS[2]], zorder=False, full=True)
    got, want = rows(spark, TILED.name, tmp_path), rows(spark, FULL.name, tmp_path)
    day2 = {at: r for at, r in want.items() if at[0] == str(DAYS[2])}
    assert_same({at: got[at] for at in day2 if at in got}, day2)
    assert got[(str(DAYS[2]), "u1")]["clicks_2d"] == clicks + 1  # the late click is in day 2's window
