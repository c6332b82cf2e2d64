"""The source's event-time rules (pipelines/events/timing.py): the edges, and the landing's columns agree."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from headwater.pipelines.events.timing import SourceTiming, counted_time, late_verdicts
from headwater.pipelines.offline.landing_batch import late_mask

TIMING = SourceTiming(max_out_of_orderness_ms=5_000, allowed_lateness_ms=60_000, max_future_ms=300_000)
T0 = 1_700_000_000_000


def test_the_horizon_is_the_greatest_time_less_both_slacks_and_its_edge_is_not_late() -> None:
    assert TIMING.slack_ms == 65_000
    assert TIMING.horizon(T0) == T0 - 65_000
    records = [(0, T0, T0), (0, T0 - 65_000, T0), (0, T0 - 65_001, T0), (1, T0 - 65_001, T0)]
    # at the horizon: accepted; 1 ms before it: late; another partition has its own horizon
    assert late_verdicts(records, TIMING) == [False, False, True, False]


def test_time_from_the_future_counts_only_up_to_the_clock() -> None:
    assert TIMING.is_future(T0 + 300_001, T0)
    assert not TIMING.is_future(T0 + 300_000, T0)
    assert counted_time(T0 + 240_000, T0) == T0
    # one event 4 min ahead, then the normal traffic after it: nothing late (issue 16 item 1)
    records = [(0, T0 + 240_000, T0), (0, T0 - 30_000, T0), (0, T0 - 64_000, T0 + 1)]
    assert late_verdicts(records, TIMING) == [False, False, False]


def test_a_late_record_does_not_move_the_horizon_and_state_carries_between_batches() -> None:
    greatest: dict[int, int] = {}
    assert late_verdicts([(0, T0, T0)], TIMING, greatest) == [False]
    assert late_verdicts([(0, T0 - 70_000, T0), (0, T0 - 65_000, T0)], TIMING, greatest) == [True, False]
    assert greatest == {0: T0}


batches = st.lists(
    st.tuples(
        st.integers(0, 30_000),  # how far the clock moves before this batch (ms)
        st.lists(st.tuples(st.integers(0, 2), st.integers(-200_000, 300_000)), min_size=1, max_size=40),
    ),
    min_size=1,
    max_size=6,
)


@settings(max_examples=150, deadline=None)
@given(batches)
def test_the_landings_columnar_verdicts_equal_the_rule_one_record_at_a_time(plan: list) -> None:
    """Batches with the clock moving forward, events up to max_future ahead of it, partitions interleaved."""
    columns: dict[int, int] = {}
    rule: dict[int, int] = {}
    now = T0
    for step, offsets in plan:
        now += step
        partitions = np.asarray([p for p, _ in offsets], dtype=np.int32)
        times = np.asarray([now + d - 150_000 for _, d in offsets], dtype=np.int64)
        got = late_mask(times, partitions, TIMING, columns, now)
        read = [(int(p), int(t), now) for p, t in zip(partitions, times, strict=True)]
        want = late_verdicts(read, TIMING, rule)
        assert got.tolist() == want
        assert columns == rule
