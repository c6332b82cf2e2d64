"""Issue 16 item 1: an accepted event from the future must not poison the landing's watermark.

An event up to ``max_future_ms`` ahead of the landing clock is accepted and landed, but the
partition's max event time (the watermark's base) is capped by the clock, so the normal events after
it are not flagged ``late`` nor dead-lettered.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from headwater.pipelines.events.codec import EventCodec
from headwater.pipelines.events.testing import Record
from headwater.pipelines.events.timing import SourceTiming
from headwater.pipelines.offline.landing_batch import decode_records, late_mask
from headwater.pipelines.offline.testing import T0, event

RULES = SourceTiming(max_out_of_orderness_ms=5_000, allowed_lateness_ms=60_000, max_future_ms=300_000)
SLACK = RULES.max_out_of_orderness_ms + RULES.allowed_lateness_ms


def test_one_event_four_minutes_ahead_does_not_make_the_next_ones_late() -> None:
    codec = EventCodec()
    now = T0
    times = [now - 2_000, now + 240_000, now - 1_000, now, now + 500, now + 1_000]
    recs = [
        Record(i, codec.encode(event(i + 1, "u1", "click", t, item_id="i1")), codec.headers(), b"u1")
        for i, t in enumerate(times)
    ]
    seen: dict[int, int] = {}
    chunk = decode_records(codec, recs, RULES, seen, now)
    assert chunk.rejected == []
    assert chunk.table.column("kafka_offset").to_pylist() == [0, 1, 2, 3, 4, 5]  # the future one is landed
    assert chunk.table.column("late").to_pylist() == [False] * 6
    assert seen == {0: now}  # capped by the clock, not now + 4 min
    # The next poll, a second later, still trusts only the clock.
    later = now + 1_000
    nxt = [
        Record(6, codec.encode(event(7, "u1", "click", later - 3_000, item_id="i1")), codec.headers(), b"u1")
    ]
    chunk = decode_records(codec, nxt, RULES, seen, later)
    assert chunk.rejected == []
    assert chunk.table.column("late").to_pylist() == [False]
    assert seen == {0: now}


def test_late_mask_caps_the_running_max_by_the_clock() -> None:
    now = T0
    times = np.asarray([now, now + 240_000, now - 60_000, now - SLACK - 1], dtype=np.int64)
    seen: dict[int, int] = {}
    got = late_mask(times, np.zeros(4, dtype=np.int32), RULES, seen, now)
    assert got.tolist() == [False, False, False, True]  # only the truly late one
    assert seen == {0: now}


@settings(max_examples=200, deadline=None)
@given(
    offsets=st.lists(st.integers(-3_600_000, RULES.max_future_ms), min_size=1, max_size=60),
    partitions=st.lists(st.integers(0, 2), min_size=60, max_size=60),
    seen_before=st.dictionaries(st.integers(0, 2), st.integers(-3_600_000, 0), max_size=3),
)
def test_no_event_within_the_lateness_of_the_clock_is_ever_late(
    offsets: list[int], partitions: list[int], seen_before: dict[int, int]
) -> None:
    """Whatever accepted events came before (up to max_future ahead), an event no older than
    ``now - max_out_of_orderness - allowed_lateness`` is never late."""
    now = T0
    times = np.asarray([now + o for o in offsets], dtype=np.int64)
    parts = np.asarray(partitions[: len(offsets)], dtype=np.int32)
    seen = {p: now + o for p, o in seen_before.items()}
    late = late_mask(times, parts, RULES, seen, now)
    assert not (late & (times >= now - SLACK)).any()
    assert all(t <= now for t in seen.values())
