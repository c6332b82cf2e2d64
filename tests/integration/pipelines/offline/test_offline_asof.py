"""Label-time values of realtime-style views: the reference value as of each label, never a future event."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from headwater.pipelines.offline.asof import join_at_label_time
from headwater.pipelines.offline.bronze import append_events
from headwater.pipelines.offline.job import read_bronze
from headwater.pipelines.offline.lake import bronze_path
from headwater.pipelines.offline.testing import T0, behaviour, event, feature, view
from headwater.pipelines.windows import compile_view, reference_values
from headwater.pipelines.windows.reference import empty_values

SESSION = view("asof_session", "user", "user_id", [
    feature("clicks_30s", "count", "30s", slide="1s", filter_="event_type = 'click'", dtype="int64"),
    feature("dwell_avg_5m", "avg", "5m", slide="5s", field="dwell_ms"),
    feature("ctr_5m", "ratio", "5m", slide="5s",
            num=("count", None, "event_type = 'click'"), den=("count", None, "event_type = 'impression'")),
], tier="realtime")  # fmt: skip
S = 1000


def history() -> list[dict[str, Any]]:
    """u1 browses for two minutes; u2 clicks once; a duplicate and an event exactly at a label time."""
    ev = [
        event(1, "u1", "impression", T0 + 5 * S, item_id="i1"),
        event(2, "u1", "click", T0 + 10 * S, item_id="i1"),
        event(3, "u1", "dwell", T0 + 12 * S, item_id="i1", dwell_ms=4000),
        event(4, "u1", "impression", T0 + 20 * S, item_id="i2"),
        event(5, "u1", "click", T0 + 45 * S, item_id="i2"),  # exactly at a label time: not yet counted
        event(6, "u1", "dwell", T0 + 50 * S, item_id="i2", dwell_ms=1000),
        event(7, "u2", "click", T0 + 100 * S, item_id="i3"),
        event(8, "u1", "click", T0 + 119 * S, item_id="i2"),
    ]
    return [*ev, dict(ev[1])]  # a duplicate of the first click counts once


LABELS = [("u1", T0 + 30_500), ("u1", T0 + 45 * S), ("u1", T0 + 46 * S), ("u1", T0 + 118_999),
          ("u1", T0 + 200 * S), ("u2", T0 + 99 * S), ("u2", T0 + 101_500), ("u3", T0 + 50 * S)]  # fmt: skip


@pytest.fixture(scope="module")
def bronze(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    root: Path = tmp_path_factory.mktemp("asof-lake")
    append_events(spark, behaviour(), history(), bronze_path(root, "events"))
    return read_bronze(spark, root, behaviour())


def labels_frame(spark: Any, rows: list[tuple[str, int]]) -> Any:
    data = [(u, f"i{n}", t, 1.0) for n, (u, t) in enumerate(rows)]
    return spark.createDataFrame(data, "user_id string, item_id string, event_time long, label double")


def test_label_time_values_equal_the_reference_at_each_label(spark: Any, bronze: Any) -> None:
    rows = join_at_label_time(labels_frame(spark, LABELS), bronze, SESSION, behaviour()).collect()
    assert len(rows) == len(LABELS)  # one row per label, also for u3 who has no event at all
    spec = compile_view(SESSION)
    for row in rows:
        t, user = row["event_time"], row["user_id"]
        expected = reference_values(spec, history(), t).get(user) or empty_values(spec)
        for f in SESSION.features:
            got, want = row[f"asof_session.{f.name}"], expected[f.name]
            if want is None or (isinstance(want, float) and math.isnan(want)):
                assert got is None or math.isnan(got), (user, t, f.name, got)
            else:
                assert got == pytest.approx(want), (user, t, f.name, got, want)


def test_no_event_at_or_after_the_label_boundary_is_counted(spark: Any, bronze: Any) -> None:
    labels = labels_frame(spark, [("u1", T0 + 45 * S), ("u1", T0 + 45_999), ("u1", T0 + 46 * S)])
    rows = join_at_label_time(labels, bronze, SESSION, behaviour()).collect()
    got = sorted((r["event_time"], r["asof_session.clicks_30s"]) for r in rows)
    # The click at 45 s is at the boundary of a label at 45 s and in the open pane at 45.999 s: only the
    # label at 46 s counts it (the click at 10 s has left the 30 s window by then).
    assert got == [(T0 + 45 * S, 0), (T0 + 45_999, 0), (T0 + 46 * S, 1)]
