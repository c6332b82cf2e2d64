"""Landing's columnar batch step without Kafka: decode, future-dated and late rules, positions."""

from __future__ import annotations

from typing import Any

import numpy as np

from headwater.pipelines.events.codec import EventCodec
from headwater.pipelines.events.testing import Record
from headwater.pipelines.events.timing import SourceTiming, late_verdicts
from headwater.pipelines.offline.landing_batch import decode_records, late_mask
from headwater.pipelines.offline.testing import T0, event

RULES = SourceTiming(max_out_of_orderness_ms=5_000, allowed_lateness_ms=60_000, max_future_ms=300_000)


def test_late_mask_equals_the_rule_one_record_at_a_time_across_batches() -> None:
    rng = np.random.default_rng(3)
    vector_seen: dict[int, int] = {}
    scalar_seen: dict[int, int] = {}
    for _ in range(5):
        n = 2_000
        partitions = rng.integers(0, 3, n)
        times = T0 + np.arange(n) * 100 - rng.integers(0, 200_000, n) * (rng.random(n) < 0.1)
        now = int(times.max()) - 20_000  # a few events ahead of the clock, accepted
        got = late_mask(times.astype(np.int64), partitions, RULES, vector_seen, now)
        read = zip(partitions.tolist(), times.tolist(), [now] * n, strict=True)
        want = late_verdicts(read, RULES, scalar_seen)
        assert got.tolist() == want
        assert vector_seen == scalar_seen
    assert 0 < sum(want) < n


def records(codec: EventCodec, now: int) -> list[Record]:
    def rec(offset: int, e: dict[str, Any] | None, partition: int = 0) -> Record:
        value = codec.encode(e) if e is not None else b"\x00junk"  # type: ignore[arg-type]
        return Record(offset, value, codec.headers(), b"k", partition=partition)

    return [
        rec(0, event(1, "u1", "click", T0, item_id="i1")),
        rec(1, event(2, "u1", "click", now + 301_000, item_id="i1")),  # future-dated
        rec(2, None),  # corrupt
        rec(3, event(3, "u1", "click", T0 - 70_000, item_id="i1")),  # late: behind T0 - 65 s
        rec(7, event(4, "u2", "click", T0 - 70_000, item_id="i1"), partition=1),  # first of partition 1
    ]


def test_decode_records_routes_each_record_and_advances_positions() -> None:
    codec = EventCodec()
    now = T0 + 86_400_000
    seen: dict[int, int] = {}
    chunk = decode_records(codec, records(codec, now), RULES, seen, now)
    assert chunk.table.column("event_id").to_pylist() == ["e00001", "e00003", "e00004"]
    assert chunk.table.column("late").to_pylist() == [False, True, False]
    assert chunk.table.column("kafka_offset").to_pylist() == [0, 3, 7]
    assert chunk.table.column("kafka_partition").to_pylist() == [0, 0, 1]
    assert sorted((r.record.offset, r.reason) for r in chunk.rejected) == [
        (1, "future_dated"), (2, "corrupt_payload"), (3, "late")]  # fmt: skip
    assert chunk.next_offsets == {0: 4, 1: 8}
    assert seen == {0: T0, 1: T0 - 70_000}  # the future-dated event did not move the watermark


def test_partitions_are_dealt_to_readers_without_empty_hands() -> None:
    from headwater.pipelines.offline.landing_workers import deal

    assert deal([0, 1, 2, 3], 2) == [[0, 2], [1, 3]]
    assert deal([0, 1, 2], 4) == [[0], [1], [2]]
    assert deal([5], 1) == [[5]]


def test_stats_count_dead_letter_reasons() -> None:
    from headwater.pipelines.offline.landing import LandingStats

    stats = LandingStats(reasons={"late": 3, "future_dated": 2, "corrupt_payload": 4, "invalid_field": 1})
    stats.count_reasons()
    assert (stats.late, stats.future, stats.malformed) == (3, 2, 5)
