"""docs/concepts/windows.md semantics on scripted events, every aggregation; incremental == reference."""

from __future__ import annotations

import math
import random
from typing import Any

import numpy as np
import pytest

from headwater.pipelines.windows import (
    PaneAggregator,
    ViewSpec,
    compile_view,
    empty_values,
    incremental_values,
    reference_values,
    slot_names,
    split_late,
    to_vectors,
)
from headwater.pipelines.windows.testing import plan_feature, plan_view, plan_where
from headwater.registry.plans import PlanFeature, PlanOperand

MIN = 60_000
T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z, a multiple of every slide used here


def view(*features: PlanFeature) -> ViewSpec:
    return compile_view(plan_view("v", list(features)))


def ev(i: int, t: int, user: str = "u1", **fields: Any) -> dict[str, Any]:
    base = {
        "event_id": f"e{i}",
        "user_id": user,
        "item_id": "i1",
        "event_type": "click",
        "event_time": t,
        "session_id": "s",
        "category": None,
        "price": None,
        "dwell_ms": None,
        "query": None,
        "position": None,
        "device": "web",
    }
    base.update(fields)
    return base


def test_count_window_boundaries_are_half_open_and_aligned() -> None:
    v = view(plan_feature("c", "count", 10, 5))
    events = [
        ev(1, T0 - 1),
        ev(2, T0),
        ev(3, T0 + 5 * MIN - 1),
        ev(4, T0 + 5 * MIN),
        ev(5, T0 + 10 * MIN - 1),
    ]
    # as of T0 + 10 min: B = T0 + 10 min, window [T0, T0 + 10 min): events 2..5
    assert reference_values(v, events, T0 + 10 * MIN)["u1"]["c"] == 4.0
    # as of T0 + 14:59: B is still T0 + 10 min (the open pane is not included)
    assert reference_values(v, events, T0 + 15 * MIN - 1)["u1"]["c"] == 4.0
    # as of T0 + 15 min: window [T0 + 5 min, T0 + 15 min): events 4 and 5
    assert reference_values(v, events, T0 + 15 * MIN)["u1"]["c"] == 2.0
    # as of T0 + 9:59: B = T0 + 5 min, window [T0 - 5 min, T0 + 5 min): events 1..3
    assert reference_values(v, events, T0 + 10 * MIN - 1)["u1"]["c"] == 3.0


def test_duplicates_count_once_and_filters_apply() -> None:
    v = view(
        plan_feature("clicks", "count", 10, 5, flt="event_type = 'click'"),
        plan_feature("likes", "count", 10, 5, flt="event_type = 'like'"),
    )
    events = [ev(1, T0), ev(1, T0), ev(2, T0 + 1, event_type="like"), ev(3, T0 + 2)]
    got = reference_values(v, events, T0 + 5 * MIN)["u1"]
    assert got == {"clicks": 2.0, "likes": 1.0}


def test_empty_window_values() -> None:
    v = view(
        plan_feature("c", "count", 5, 5),
        plan_feature("s", "sum", 5, 5, "price"),
        plan_feature("a", "avg", 5, 5, "price"),
        plan_feature("mn", "min", 5, 5, "price"),
        plan_feature("mx", "max", 5, 5, "price"),
        plan_feature("l", "last", 5, 5, "query"),
        plan_feature("d", "distinct_count", 5, 5, "category"),
        plan_feature("t", "top_k", 5, 5, "category", k=2),
        plan_feature(
            "r",
            "ratio",
            5,
            5,
            numerator=PlanOperand(agg="count", field=None, where=plan_where("event_type = 'click'")),
            denominator=PlanOperand(agg="count", field=None, where=plan_where("event_type = 'impression'")),
        ),
    )
    empty = empty_values(v)
    assert empty["c"] == 0.0
    assert empty["s"] == 0.0
    assert empty["d"] == 0.0
    assert empty["t"] == ()
    for name in ("a", "mn", "mx", "l", "r"):
        assert math.isnan(empty[name])  # type: ignore[arg-type]
    # an entity whose events are all outside the window is not returned (it has the empty values)
    assert reference_values(v, [ev(1, T0)], T0 + 10 * MIN) == {}
    vec = to_vectors(v, [list(empty.values())], lambda _f, vals: list(range(1, len(vals) + 1)))
    names = slot_names(v)
    assert names[7:11] == ("t.top1", "t.top2", "t.share1", "t.share2")
    assert np.isnan(vec[0, 7])
    assert np.isnan(vec[0, 8])
    assert vec[0, 9] == 0.0
    assert vec[0, 10] == 0.0


def test_numeric_aggregations_skip_nulls() -> None:
    v = view(
        plan_feature("s", "sum", 5, 5, "price"),
        plan_feature("a", "avg", 5, 5, "price"),
        plan_feature("mn", "min", 5, 5, "price"),
        plan_feature("mx", "max", 5, 5, "price"),
        plan_feature("cp", "count", 5, 5, "price"),
    )
    events = [
        ev(1, T0, price=2.0),
        ev(2, T0 + 1, price=None),
        ev(3, T0 + 2, price=7.5),
        ev(4, T0 + 3, price=0.5),
    ]
    got = reference_values(v, events, T0 + 5 * MIN)["u1"]
    assert got == {"s": 10.0, "a": 10.0 / 3, "mn": 0.5, "mx": 7.5, "cp": 3.0}


def test_last_takes_greatest_time_then_greatest_event_id() -> None:
    v = view(plan_feature("l", "last", 5, 5, "query"))
    events = [
        ev(5, T0 + 10, query="b"),
        ev(9, T0 + 20, query="c"),
        ev(8, T0 + 20, query="a"),
        ev(1, T0, query="z"),
    ]
    assert reference_values(v, events, T0 + 5 * MIN)["u1"]["l"] == "c"  # e9 > e8 at the same time
    later_null = [*events, ev(10, T0 + 30, query=None)]
    assert math.isnan(reference_values(v, later_null, T0 + 5 * MIN)["u1"]["l"])  # type: ignore[arg-type]


def test_distinct_count_and_top_k_order_and_share() -> None:
    v = view(
        plan_feature("d", "distinct_count", 5, 5, "category"),
        plan_feature("t", "top_k", 5, 5, "category", k=2),
    )
    cats = ["b", "a", "c", "b", "a", None, "c", "d"]
    events = [ev(i, T0 + i, category=c) for i, c in enumerate(cats)]
    got = reference_values(v, events, T0 + 5 * MIN)["u1"]
    assert got["d"] == 4.0
    # counts a=2, b=2, c=2, d=1 over 7 non-null: ties broken by value asc
    assert got["t"] == (("a", 2 / 7), ("b", 2 / 7))


def test_ratio_and_zero_denominator() -> None:
    num = PlanOperand(agg="count", field=None, where=plan_where("event_type = 'click'"))
    den = PlanOperand(agg="count", field=None, where=plan_where("event_type = 'impression'"))
    v = view(plan_feature("ctr", "ratio", 5, 5, numerator=num, denominator=den))
    events = [
        ev(1, T0, event_type="impression"),
        ev(2, T0 + 1, event_type="impression"),
        ev(3, T0 + 2, event_type="impression"),
        ev(4, T0 + 3, event_type="impression"),
        ev(5, T0 + 4),
    ]
    assert reference_values(v, events, T0 + 5 * MIN)["u1"]["ctr"] == 0.25
    assert math.isnan(reference_values(v, [ev(6, T0)], T0 + 5 * MIN)["u1"]["ctr"])  # type: ignore[arg-type]


def test_split_late_uses_watermark_minus_lateness() -> None:
    events = [ev(1, T0 + 100_000), ev(2, T0 + 100_000 - 5_000 - 60_000), ev(3, T0 + 100_000 - 5_000 - 60_001)]
    accepted, late = split_late(events, 5_000, 60_000)
    assert [e["event_id"] for e in accepted] == ["e1", "e2"]
    assert [e["event_id"] for e in late] == ["e3"]


ALL = view(
    plan_feature("c1", "count", 60, 1),
    plan_feature("c24", "count", 240, 10, flt="event_type = 'click'"),
    plan_feature("s", "sum", 30, 5, "dwell_ms"),
    plan_feature("a", "avg", 60, 5, "price"),
    plan_feature("mn", "min", 20, 5, "price"),
    plan_feature("mx", "max", 20, 1, "position"),
    plan_feature("l", "last", 60, 1, "query", flt="event_type = 'search'"),
    plan_feature("d", "distinct_count", 120, 10, "category"),
    plan_feature("t", "top_k", 120, 10, "category", k=3),
    plan_feature(
        "r",
        "ratio",
        60,
        5,
        numerator=PlanOperand(agg="count", field=None, where=plan_where("event_type = 'click'")),
        denominator=PlanOperand(agg="count", field=None, where=plan_where("event_type = 'impression'")),
    ),
)


def random_events(seed: int, n: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    out: list[dict[str, Any]] = []
    for i in range(n):
        kind = rng.choice(["click", "impression", "search", "dwell"])
        t = T0 + rng.randrange(0, 300 * MIN)
        out.append(
            ev(
                i,
                t,
                user=f"u{rng.randrange(6)}",
                event_type=kind,
                price=rng.choice([None, round(rng.uniform(0, 50), 2)]),
                dwell_ms=rng.randrange(0, 9000) if kind == "dwell" else None,
                position=rng.randrange(1, 10),
                query=rng.choice(["x", "y", "z"]) if kind == "search" else None,
                category=rng.choice([None, "a", "b", "c", "d", "e"]),
            )
        )
        if rng.random() < 0.05:
            out.append(dict(out[-1]))  # a duplicate
    return out


def assert_same(a: Any, b: Any) -> None:
    if isinstance(a, tuple):
        assert [v for v, _ in a] == [v for v, _ in b]
        assert [s for _, s in a] == pytest.approx([s for _, s in b])
    elif isinstance(a, float) and math.isnan(a):
        assert isinstance(b, float)
        assert math.isnan(b)
    elif isinstance(a, str):
        assert a == b
    else:
        assert a == pytest.approx(b, rel=1e-9)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_incremental_panes_equal_reference_for_every_aggregation(seed: int) -> None:
    from headwater.pipelines.windows import dedup

    events = random_events(seed, 1500)
    for as_of in (T0 + 30 * MIN, T0 + 125 * MIN + 17, T0 + 301 * MIN, T0 + 500 * MIN):
        ref = reference_values(ALL, events, as_of)
        inc = incremental_values(ALL, dedup(events), as_of)
        empty = list(empty_values(ALL).values())
        for entity in set(ref) | set(inc):
            want = list(ref[entity].values()) if entity in ref else empty
            got = inc.get(entity, empty)
            for a, b in zip(got, want, strict=True):
                assert_same(a, b)


def test_fold_is_idempotent_with_offsets_and_survives_dump_load() -> None:
    agg = PaneAggregator(ALL)
    events = random_events(9, 300)
    once: dict[int, list[Any]] = {}
    for off, e in enumerate(events):
        if e["user_id"] == "u1":
            agg.fold(once, e, off)
    replayed = {p: agg.load(agg.dump(r)) for p, r in once.items()}  # JSON round trip of every record
    for off, e in enumerate(events):  # replay everything: every record already holds these offsets
        if e["user_id"] == "u1":
            agg.fold(replayed, e, off)
    as_of = T0 + 200 * MIN
    from headwater.pipelines.windows import dedup

    # slides of 1, 5 and 10 min share pane starts (one record): with offsets, every slide's
    # features still take the event (the hw check is against the record's hw before this event)
    want = reference_values(ALL, dedup(e for e in events if e["user_id"] == "u1"), as_of)["u1"]
    for a, b in zip(agg.values(once, as_of), want.values(), strict=True):
        assert_same(a, b)
    for a, b in zip(agg.values(replayed, as_of), agg.values(once, as_of), strict=True):
        assert_same(a, b)
    assert agg.expire(replayed, T0 + 1000 * MIN)
    assert not replayed
