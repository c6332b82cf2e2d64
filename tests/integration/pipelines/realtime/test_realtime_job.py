"""The realtime job end to end: Kafka -> Flink (SQL + JVM operators) -> Redis, exact values, DLQ.

The job publishes a boundary as soon as its clock (the newest event time) passes it, and revises
values when an out-of-order event arrives within the allowed lateness; later events are dead letters.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import redis

from headwater.pipelines.events.codec import HEADER_SCHEMA_FP, EventCodec
from headwater.registry.plans import TierPlan

from .conftest import (
    T0,
    Feed,
    JobProcess,
    Names,
    dead_letters,
    event,
    expected_vectors,
    last_change_ms,
    read_store,
    wait_for,
)

B_FINAL = T0 + 25_000
"""The boundary checked at the end: the last event moves the job's clock to it."""


def phase_one() -> list[dict[str, Any]]:
    return [
        event(1, "u1", "impression", 500, position=1, category="c1"),
        event(2, "u1", "click", 1500, position=1, category="c1"),
        event(3, "u1", "impression", 2500, position=2, category="c2"),
        event(4, "u1", "click", 3500, position=2, category="c2"),
        event(5, "u1", "dwell", 4500, dwell_ms=1000),
        event(6, "u1", "purchase", 6500, price=9.5, category="c1"),
        event(7, "u2", "impression", 7500, position=5, category="c3"),
        event(8, "u2", "click", 8500, position=5, category="c3"),
        event(9, "u1", "click", 12500, position=3, category="c1"),
        event(10, "u1", "dwell", 13500, dwell_ms=3000),
        event(11, "u2", "purchase", 14500, price=20.0, category="c3"),
        event(12, "u2", "search", 15500),
        event(13, "u1", "impression", 16500, position=4, category="c2"),
        event(14, "u1", "click", 18500, position=2, category="c2"),
        event(14, "u1", "click", 18500, position=2, category="c2"),  # duplicate: counts once
        event(15, "u2", "click", 17000, position=1, category="c3"),  # 1.5 s out of order: accepted
        event(16, "u1", "impression", 19500, position=6, category="c1"),
    ]


def test_scripted_events_give_exact_values_and_bad_ones_reach_the_dlq(
    plan: tuple[TierPlan, Path], names: Names, kafka_bootstrap: str, redis_url: str, tmp_path: Path
) -> None:
    tier_plan, state = plan
    feed = Feed(kafka_bootstrap, names.topic)
    log = tmp_path / "job.log"
    job = JobProcess(state, names, tmp_path / "checkpoints", log)
    try:
        codec = EventCodec()
        garbage_offset = feed.send_raw(b"\x00\xff not avro", codec.headers())
        missing_offset = feed.send_raw(codec.encode(event(90, "u9", "click", 1000)), [("produce-ts", b"1")])
        feed.send(*phase_one())

        def published(b_ms: int) -> bool:
            _, res = read_store(redis_url, names.namespace, tier_plan, "rt_all", ["u1"])
            return bool(res.found[0]) and int(res.event_time_ms[0]) >= b_ms

        # the clock is at T0+19.5 s (the newest event): boundary T0+19 s is out, 0.5 s after its
        # last event, not after the 5 s out-of-orderness (the watermark is at T0+14.5 s)
        wait_for(lambda: published(T0 + 19_000), 240, "boundary T0+19 s (clock T0+19.5 s)", log)
        # 9.5 s behind the newest event, within the allowed lateness (60 s): it revises u1's values
        feed.send(event(17, "u1", "click", 10_000, price=100.0, category="late"))
        late_offset = feed.offset
        feed.send(event(19, "u1", "click", -50_000, price=1000.0))  # 69.5 s behind: beyond 5 s + 60 s
        feed.send(event(18, "zz", "impression", 25_000))  # moves the clock to T0+25 s
        wait_for(lambda: published(B_FINAL), 120, "boundary T0+25 s", log)

        accepted = [e for e in feed.sent if e["event_id"] != "e19"]
        client = redis.Redis.from_url(redis_url)
        stale: list[int] = []
        try:
            for view, ids in (("rt_all", ["u1", "u2"]), ("rt_items", ["i0", "i1", "i2"])):
                _, res = read_store(redis_url, names.namespace, tier_plan, view, ids)
                assert res.found.all(), (view, res.found)
                # a value is written only when it changes: the stored event time is its last change
                changed = last_change_ms(tier_plan, view, accepted, ids, client, names.namespace, B_FINAL)
                assert res.event_time_ms.tolist() == changed, (view, changed)
                stale.extend(b for b in changed if b < B_FINAL)
                version = next(v.version for v in tier_plan.views if v.name == view)
                assert res.versions == [version] * len(ids)  # each value names its view's version
                _, want = expected_vectors(tier_plan, view, accepted, ids, client, names.namespace, B_FINAL)
                np.testing.assert_allclose(res.values, want, rtol=1e-6, equal_nan=True, err_msg=view)
            assert stale, "every value changed at B_FINAL: the test shows nothing about unchanged values"
            u1_ref = expected_vectors(tier_plan, "rt_all", accepted, ["u1"], client, names.namespace, B_FINAL)
            u1 = u1_ref[0]["u1"]
            assert u1["clicks_10s"] == 1.0  # e14 and its duplicate: one click in [15 s, 25 s)
            assert u1["price_sum_20s"] == 109.5  # 9.5 + the out-of-order click's 100; not e19's 1000
            # 3 of c1, 2 of c2 (the duplicate once), 1 of "late"
            assert u1["top_categories_20s"] == (("c1", 0.5), ("c2", 2 / 6))
        finally:
            client.close()

        # letters are committed with checkpoints (every 2 s), slower under load: wait for all three (the
        # wait ends as soon as they are there). e19's verdict itself is no race: it is judged against its
        # partition's greatest accepted event time (T0+19.5 s), in offset order, checkpointed (LateCheck)
        letters = dead_letters(kafka_bootstrap, names.dlq, expected=3, timeout_s=180)
        by_offset = {d.source_offset: d for d in letters}
        got = {o: (d.reason, d.detail) for o, d in by_offset.items()}
        assert set(by_offset) == {garbage_offset, missing_offset, late_offset}, got
        assert by_offset[garbage_offset].reason == "corrupt_payload"
        assert by_offset[missing_offset].reason == "missing_fingerprint"
        assert by_offset[late_offset].reason == "late"
        horizon = T0 + 19_500 - 5_000 - 60_000  # newest accepted - out-of-orderness - allowed lateness
        assert f"is 4500 ms before the horizon {horizon} of partition 0" in by_offset[late_offset].detail
        assert by_offset[late_offset].source_topic == names.topic
        assert HEADER_SCHEMA_FP in dict(by_offset[late_offset].original_headers)
    finally:
        job.kill()
        feed.close()
