"""The training set reads the user side at the slate's start (Spark + Delta): every row of a slate has the
user values as of its first impression, none from after it; item values stay at each row's own time."""

from __future__ import annotations

from datetime import date
from pathlib import Path
from typing import Any

import numpy as np

from headwater.pipelines.offline.bronze import append_events
from headwater.pipelines.offline.job import BronzeTables, read_bronze, run_view
from headwater.pipelines.offline.lake import bronze_path, days
from headwater.pipelines.offline.testing import DAY_MS, T0, behaviour, event, feature, view
from headwater.pipelines.windows import compile_view, reference_values
from headwater.pipelines.windows.reference import empty_values
from headwater.ranking.training_set import build_training_set
from headwater.ranking.trainset import read_parquet

REGISTRY = "sha256:" + "cd" * 32
S = 1000
USER_RT = view("slate_user", "user", "user_id", [
    feature("impressions_5m", "count", "5m", slide="1s", filter_="event_type = 'impression'", dtype="int64"),
    feature("clicks_5m", "count", "5m", slide="1s", filter_="event_type = 'click'", dtype="int64"),
], tier="realtime")  # fmt: skip
USER_DAILY = view("slate_user_daily", "user", "user_id", [
    feature("impressions_1d", "count", "1d", filter_="event_type = 'impression'", dtype="int64"),
])  # fmt: skip
ITEM_RT = view("slate_item", "item", "item_id", [
    feature("item_impressions_5m", "count", "5m", slide="1s",
            filter_="event_type = 'impression'", dtype="int64"),
], tier="realtime")  # fmt: skip
D2 = T0 + 2 * DAY_MS
# (group, user, slot items, first impression time): slot j is shown 1 s after slot j - 1. Slate 2
# straddles midnight (its first impression on day 1, the other on day 2).
SLATES = [(1, "u1", ["i1", "i2", "i3"], D2 + 100 * S), (2, "u1", ["i1", "i4"], D2 - 1 * S),
          (3, "u2", ["i2", "i3"], D2 + 100 * S)]  # fmt: skip


def history() -> list[dict[str, Any]]:
    """The slates' impressions, a click inside slate 1 (after its start), and earlier browsing."""
    ev = [event(1, "u1", "impression", T0 + 5 * 3600 * S, item_id="i8"),
          event(2, "u1", "impression", D2 - 3600 * S, item_id="i9"),
          event(3, "u1", "click", D2 - 3599 * S, item_id="i9"),
          event(4, "u2", "impression", D2 + 50 * S, item_id="i2")]  # fmt: skip
    n = 10
    for group, user, items, start in SLATES:
        for pos, item in enumerate(items):
            ev.append(event(n, user, "impression", start + pos * S, item_id=item, session_id=f"g{group}"))
            n += 1
    ev.append(event(n, "u1", "click", D2 + 100 * S + 500, item_id="i1", session_id="g1"))  # inside slate 1
    return ev


def labels(spark: Any) -> Any:
    rows = [
        (group, user, item, start + pos * S, float(pos == 0), pos + 1)
        for group, user, items, start in SLATES
        for pos, item in enumerate(items)
    ]
    schema = "group long, user_id string, item_id string, event_time long, label float, position long"
    return spark.createDataFrame(rows, schema)


def ids(_field: str, values: Any) -> list[int]:
    return list(range(len(values)))  # no categorical feature here


def reference(spec: Any, t: int, entity: str) -> dict[str, Any]:
    return reference_values(spec, history(), t).get(entity) or empty_values(spec)


def test_every_row_of_a_slate_has_the_user_values_of_its_first_impression(spark: Any, tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    source = behaviour()
    append_events(spark, source, history(), bronze_path(lake, source.name))
    bronze = read_bronze(spark, lake, source)
    run_view(spark, bronze, USER_DAILY, source, lake, days(date(2026, 1, 1), date(2026, 1, 2)), zorder=False)
    out = tmp_path / "train.parquet"
    views = [USER_RT, USER_DAILY, ITEM_RT]
    tables = BronzeTables(spark, lake, [source])
    result = build_training_set(spark, labels(spark), views, lake, out, REGISTRY, ids, tables)
    assert result.rows == sum(len(items) for _, _, items, _ in SLATES)

    ts = read_parquet(out)
    user = dict(zip(ts.user_features, ts.user.T, strict=True))
    item = dict(zip(ts.item_features, ts.item.T, strict=True))
    rt, daily, it = compile_view(USER_RT), compile_view(USER_DAILY), compile_view(ITEM_RT)
    for group, who, items, start in SLATES:
        rows = np.flatnonzero(ts.group == group)
        rows = rows[np.argsort(ts.event_time_ms[rows])]
        # The label's own time stays in event_time (the click joins its impression by it).
        assert list(ts.event_time_ms[rows]) == [start + j * S for j in range(len(items))]
        at_start = reference(rt, start, who)
        for j, r in enumerate(rows):
            # Every row: the user as of the slate's start (what the service read once for the page) ...
            assert user["impressions_5m"][r] == at_start["impressions_5m"], (group, j)
            assert user["clicks_5m"][r] == at_start["clicks_5m"], (group, j)
            # ... the daily view at the start's day boundary (slate 2 started on day 1) ...
            boundary = start // DAY_MS * DAY_MS
            assert user["impressions_1d"][r] == reference(daily, boundary, who)["impressions_1d"], (group, j)
            # ... and each item as of its own row.
            own = reference(it, start + j * S, items[j])
            assert item["item_impressions_5m"][r] == own["item_impressions_5m"], (group, j)
        # Without the slate's start the slot would leak in: the last row's own-time value counts the
        # slate's earlier impressions.
        last = reference(rt, start + (len(items) - 1) * S, who)["impressions_5m"]
        assert last == at_start["impressions_5m"] + len(items) - 1

    # Point in time: nothing from at or after the slate's start. Slate 1 starts at D2 + 100 s: u1's
    # impressions before it are slate 2's two (D2 - 1 s, D2) and the one of D2 - 3600 s is out of
    # the 5-minute window; the click at D2 + 100.5 s (inside the slate) is not counted.
    g1 = np.flatnonzero(ts.group == 1)
    assert set(user["impressions_5m"][g1]) == {2.0}
    assert set(user["clicks_5m"][g1]) == {0.0}
    assert set(user["impressions_1d"][g1]) == {2.0}  # day 1: D2 - 3600 s and slate 2's first
    # Slate 2 straddles midnight: day 0's one impression for both rows (day 1's are not yet closed).
    g2 = np.flatnonzero(ts.group == 2)
    assert set(user["impressions_1d"][g2]) == {1.0}
    # u2's slate 3 sees the impression at D2 + 50 s only.
    assert set(user["impressions_5m"][np.flatnonzero(ts.group == 3)]) == {1.0}


def test_labels_without_a_group_are_each_their_own_slate(spark: Any, tmp_path: Path) -> None:
    from headwater.ranking.training_set import read_labels

    frame = labels(spark).drop("group")
    path = tmp_path / "labels.parquet"
    frame.write.parquet(str(path))
    read = read_labels(spark, path).collect()
    assert len({r["group"] for r in read}) == len(read)  # one slate per label: no shared start
