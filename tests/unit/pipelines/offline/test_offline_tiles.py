"""Daily tiles merge to the reference semantics: random events, views of every aggregation kind, any day.

The property: for every aggregation the registry has (``AGG_NAMES``), over random events, windows of
whole days and day-aligned slides, the values merged from per-day tiles (:mod:`.tiles`) equal
:func:`reference_values` computed straight from the events (sums to float rounding: they add in
another order).
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headwater.pipelines.offline.tiles import (
    DAY_MS,
    day_tiles,
    feature_tile,
    merge_tiles,
    tiled_values,
    view_tiled,
    window_days,
)
from headwater.pipelines.windows import compile_view, empty_values, reference_values
from headwater.pipelines.windows.aggs import Value
from headwater.pipelines.windows.testing import plan_feature, plan_view, plan_where
from headwater.registry.aggs import AGG_NAMES, OPERAND_AGG_NAMES
from headwater.registry.plans import PlanFeature, PlanOperand

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z
DAY_MIN = 1440
FIELDS = {  # per aggregation, the fields it may read (the test events' columns)
    "count": [None, "price", "category"],
    "sum": ["price"],
    "avg": ["price"],
    "min": ["price"],
    "max": ["price"],
    "last": ["item_id", "price"],
    "distinct_count": ["session_id", "category"],
    "top_k": ["category", "item_id"],
}
FILTERS = [None, "event_type = 'click'", "event_type in ('click', 'purchase')", "price is not null"]


@st.composite
def tiled_feature(draw: st.DrawFn, name: str, agg: str) -> PlanFeature:
    """A feature of ``agg`` with a window of 1-4 days and a slide of 1 h, 6 h, 1 d (or 2 d)."""
    days = draw(st.integers(1, 4))
    slides = [60, 360, DAY_MIN] + ([2 * DAY_MIN] if days % 2 == 0 else [])
    slide = draw(st.sampled_from(slides))
    flt = draw(st.sampled_from(FILTERS))
    if agg == "ratio":

        def operand(side: str) -> PlanOperand:
            op = draw(st.sampled_from(OPERAND_AGG_NAMES), label=side)
            return PlanOperand(agg=op, field=draw(st.sampled_from(FIELDS[op])),
                               where=plan_where(draw(st.sampled_from(FILTERS))))  # fmt: skip

        return plan_feature(name, agg, days * DAY_MIN, slide, numerator=operand("num"),
                            denominator=operand("den"))  # fmt: skip
    k = draw(st.integers(1, 3)) if agg == "top_k" else None
    return plan_feature(
        name, agg, days * DAY_MIN, slide, field=draw(st.sampled_from(FIELDS[agg])), flt=flt, k=k
    )


@st.composite
def views(draw: st.DrawFn) -> Any:
    """A compiled view with one or two features of every aggregation kind."""
    features = [
        draw(tiled_feature(f"{agg}_{i}", agg)) for agg in AGG_NAMES for i in range(draw(st.integers(1, 2)))
    ]
    return plan_view("tiled", features)


@st.composite
def histories(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Up to 40 events of 3 users over 6 days (some a few ms apart, some duplicated)."""
    n = draw(st.integers(0, 40))
    events = []
    for i in range(n):
        at = draw(
            st.one_of(st.integers(0, 6 * DAY_MS - 1), st.sampled_from([0, DAY_MS - 1, DAY_MS, 3 * DAY_MS]))
        )
        events.append({
            "event_id": f"e{i:03d}",
            "user_id": draw(st.sampled_from(["u1", "u2", "u3", None])),
            "event_type": draw(st.sampled_from(["click", "impression", "purchase"])),
            "event_time": T0 + at,
            "price": draw(st.sampled_from([None, 0.25, 1.5, 4.0, 10.75])),
            "category": draw(st.sampled_from([None, "art", "books", "music"])),
            "session_id": draw(st.sampled_from(["s1", "s2", "s3"])),
            "item_id": draw(st.sampled_from(["i1", "i2", "i3"])),
        })  # fmt: skip
    dups = draw(st.lists(st.integers(0, max(n - 1, 0)), max_size=3)) if n else []
    return events + [dict(events[i]) for i in dups]


def same(a: Value, b: Value) -> bool:
    """Equal values: NaN equals NaN, floats to rounding, top-k lists entry by entry."""
    if isinstance(a, tuple) and isinstance(b, tuple):
        return len(a) == len(b) and all(
            x[0] == y[0] and math.isclose(x[1], y[1]) for x, y in zip(a, b, strict=True)
        )
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)
    return a == b


@settings(max_examples=300, deadline=None)
@given(plan=views(), events=histories(), as_of_day=st.integers(0, 8))
def test_merged_day_tiles_equal_the_reference_for_every_aggregation(
    plan: Any, events: list[dict[str, Any]], as_of_day: int
) -> None:
    assert view_tiled(plan)
    view = compile_view(plan)
    as_of = T0 + as_of_day * DAY_MS
    expected = reference_values(view, events, as_of)
    merged = tiled_values(view, day_tiles(view, events), as_of)
    empty = empty_values(view)
    for entity in set(expected) | set(merged):
        want, got = expected.get(entity, empty), merged.get(entity, empty)
        for f in view.features:
            assert same(got[f.name], want[f.name]), (entity, f.name, f.agg, got[f.name], want[f.name])


@settings(max_examples=100, deadline=None)
@given(plan=views(), events=histories())
def test_merging_is_associative_and_commutative_so_days_merge_in_any_order(
    plan: Any, events: list[dict[str, Any]]
) -> None:
    view = compile_view(plan)
    thirds = [events[i::3] for i in range(3)]
    for f in view.features:
        a, b, c = (feature_tile(f, part) for part in thirds)
        left, right = merge_tiles(f, merge_tiles(f, a, b), c), merge_tiles(f, a, merge_tiles(f, c, b))
        assert left == right or f.agg in ("sum", "avg", "ratio")  # sums: float order
        assert same(tiled_values_of(view, f.name, left), tiled_values_of(view, f.name, right))


def tiled_values_of(view: Any, name: str, tile: Any) -> Value:
    from headwater.pipelines.offline.tiles import tile_value

    return tile_value(next(f for f in view.features if f.name == name), tile)


def test_a_window_that_is_not_whole_days_is_not_tiled() -> None:
    hourly = plan_view(
        "hourly", [plan_feature("c", "count", 180, 60), plan_feature("d", "count", DAY_MIN, 60)]
    )
    assert not view_tiled(hourly)
    daily = plan_view(
        "daily",
        [
            plan_feature("d", "count", 7 * DAY_MIN, 60),
            plan_feature("w", "sum", 14 * DAY_MIN, 7 * DAY_MIN, "price"),
        ],
    )
    assert view_tiled(daily)
    with pytest.raises(ValueError, match="not whole UTC days"):
        window_days(compile_view(hourly).features[0], T0)
    week = compile_view(daily).features[1]
    # a 7-day slide: the boundary of a midnight is the last multiple of 7 days since the epoch
    days = window_days(week, T0)
    assert len(days) == 14
    assert days[-1] + DAY_MS == (T0 // (7 * DAY_MS)) * 7 * DAY_MS
