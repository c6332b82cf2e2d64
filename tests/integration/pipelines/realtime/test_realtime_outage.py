"""The online store goes away mid-stream: the realtime job waits, retries, and loses nothing.

The job writes to a Redis of the test's own, which the test stops while events keep coming and
starts again (with its data, as a Redis with persistence would). The sink retries with backoff, so
the job stalls instead of dropping values; once Redis is back, the values equal the reference's.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from headwater.pipelines.store.testing import OwnRedis
from headwater.registry.plans import TierPlan

from .conftest import (
    T0,
    Feed,
    JobProcess,
    Names,
    assert_store_exact,
    event,
    read_store,
    wait_for,
)

B_FINAL = T0 + 30_000


def before() -> list[dict[str, Any]]:
    return [
        event(1, "u1", "impression", 500, position=1, category="c1"),
        event(2, "u1", "click", 1_500, position=1, category="c1"),
        event(3, "u2", "impression", 4_500, position=3, category="c3"),
        event(4, "u2", "click", 9_000, position=3, category="c3"),
    ]


def during() -> list[dict[str, Any]]:
    return [
        event(5, "u1", "purchase", 12_000, price=7.5, category="c2"),
        event(6, "u1", "dwell", 14_000, dwell_ms=2000),
        event(7, "u2", "click", 16_000, position=2, category="c1"),
        event(8, "u1", "click", 21_000, position=4, category="c2"),
        event(9, "u1", "click", 29_000, position=5, category="c2"),  # u1 changes at T0+30 s
    ]


def test_redis_outage_mid_stream_stalls_the_job_and_loses_nothing(
    plan: tuple[TierPlan, Path], names: Names, kafka_bootstrap: str, own_redis: OwnRedis, tmp_path: Path
) -> None:
    tier_plan, state = plan
    feed = Feed(kafka_bootstrap, names.topic)
    log = tmp_path / "job.log"
    url = own_redis.url

    def published(b_ms: int, user: str) -> bool:
        _, res = read_store(url, names.namespace, tier_plan, "rt_all", [user])
        return bool(res.found[0]) and int(res.event_time_ms[0]) >= b_ms

    flink_logs = tmp_path / "flink"
    job = JobProcess(state, names, tmp_path / "checkpoints", log, redis_url=url, flink_log_dir=flink_logs)
    try:
        feed.send(*before())
        wait_for(lambda: published(T0 + 5_000, "u2"), 240, "u2's value at T0+5 s (clock T0+9 s)", log)
        own_redis.stop()
        feed.send(*during())  # aggregated while the store is down; the sink holds and retries them
        time.sleep(6)  # several retries (100 ms, doubling)
        own_redis.start()
        feed.send(event(10, "zz", "impression", 30_000))  # moves the job's clock to T0+30 s
        wait_for(lambda: published(B_FINAL, "u1"), 120, "boundary T0+30 s after the outage", log)
    finally:
        job.kill()
        feed.close()

    sink_log = "".join(f.read_text(errors="replace") for f in flink_logs.glob("*.log"))
    assert f"online store at {url} unreachable" in sink_log  # the sink saw the outage and retried
    events = [*before(), *during()]
    assert_store_exact(url, names.namespace, tier_plan, events, B_FINAL)
