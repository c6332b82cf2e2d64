"""Which days a late: heal view heals again: changed bronze days, the days whose windows they reach, runs."""

from __future__ import annotations

import itertools
from datetime import date, timedelta
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from headwater.pipelines.offline.heal import (
    BRONZE_MANIFEST,
    changed_days,
    consecutive,
    heals,
    reach_days,
    read_record,
    touched_days,
    write_record,
)
from headwater.pipelines.offline.testing import feature, view

D0 = date(2026, 1, 1)
some_days = st.sets(st.integers(0, 40).map(lambda i: D0 + timedelta(days=i)), max_size=15)


def test_reach_is_the_longest_window_plus_its_slide_in_days() -> None:
    two_days = view("v", "user", "user_id", [feature("c", "count", "2d"), feature("d", "count", "1h", "1h")])
    assert reach_days(two_days) == 3  # 2 d window + 1 d slide
    assert reach_days(view("w", "user", "user_id", [feature("c", "count", "30m", "1h")])) == 1


def test_policy_default_is_drop() -> None:
    plain = view("v", "user", "user_id", [feature("c", "count", "1d")])
    assert not heals(plain)
    assert heals(plain.model_copy(update={"late": "heal"}))


def test_a_late_event_two_days_back_heals_that_day_and_the_two_after() -> None:
    computed = [D0 + timedelta(days=i) for i in range(6)]
    assert touched_days([D0 + timedelta(days=2)], computed, 2) == computed[2:5]


@given(changed=some_days, computed=some_days, reach=st.integers(0, 5))
def test_touched_days_are_the_computed_days_reading_a_changed_day(
    changed: set[date], computed: set[date], reach: int
) -> None:
    got = touched_days(changed, computed, reach)
    assert got == sorted(got)
    for d in computed:  # D reads days D - reach .. D (what events_for scans)
        reads = {d - timedelta(days=r) for r in range(reach + 1)}
        assert (d in got) == bool(reads & changed)
    assert set(got) <= computed


@given(days=st.lists(st.integers(0, 40).map(lambda i: D0 + timedelta(days=i)), max_size=20))
def test_consecutive_runs_cover_each_day_once_in_order(days: list[date]) -> None:
    runs = consecutive(days)
    flat = [d for run in runs for d in run]
    assert flat == sorted(set(days))
    for run in runs:
        assert all(b - a == timedelta(days=1) for a, b in itertools.pairwise(run))
    for a, b in itertools.pairwise(runs):
        assert b[0] - a[-1] > timedelta(days=1)  # a gap between two runs, else they would be one


def test_changed_days_compare_each_fingerprint_and_no_record_changes_nothing() -> None:
    d1, d2, d3 = D0, D0 + timedelta(days=1), D0 + timedelta(days=2)
    current = {d1: "a", d2: "b2", d3: "c"}
    assert changed_days(current, {str(d1): "a", str(d2): "b"}) == {d2, d3}
    assert changed_days({d1: "a"}, {str(d1): "a", str(d2): "b"}) == {d2}  # files of a day gone: changed
    assert changed_days(current, None) == set()


def test_record_round_trips_and_a_torn_one_reads_as_none(tmp_path: Path) -> None:
    write_record(tmp_path, {D0: "x", D0 + timedelta(days=1): "y"})
    assert read_record(tmp_path) == {"2026-01-01": "x", "2026-01-02": "y"}
    (tmp_path / BRONZE_MANIFEST).write_text('{"days": [1, 2', encoding="utf-8")
    assert read_record(tmp_path) is None
    assert read_record(tmp_path / "nowhere") is None
