"""kill -9 mid-stream, restart from the latest checkpoint: online values equal the reference's.

One extra job start: the values after the restart are compared with the reference semantics
(:func:`headwater.pipelines.windows.reference_values`, what a clean run must publish, as the
other realtime test checks) over the same events, instead of running a second clean job.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import redis

from headwater.registry.plans import TierPlan

from .conftest import (
    T0,
    Feed,
    JobProcess,
    Names,
    assert_store_exact,
    event,
    expected_vectors,
    read_store,
    wait_for,
)

B_FINAL = T0 + 30_000
"""Boundary checked at the end: its 20 s windows [10 s, 30 s) hold events from before and after the kill."""


def before_kill() -> list[dict[str, Any]]:
    return [
        event(1, "u1", "impression", 500, position=1, category="c1"),
        event(2, "u1", "click", 1500, position=1, category="c1"),
        event(3, "u2", "impression", 4500, position=3, category="c3"),
        event(4, "u1", "purchase", 11_000, price=7.5, category="c2"),
        event(5, "u1", "click", 12_500, position=2, category="c2"),
        event(6, "u2", "click", 13_000, position=3, category="c3"),
        event(7, "u1", "dwell", 14_000, dwell_ms=2000),
        event(8, "u1", "impression", 16_000, position=4, category="c1"),
        event(9, "u2", "purchase", 18_000, price=3.0, category="c3"),
        event(10, "u1", "click", 19_500, position=4, category="c1"),
    ]


def after_kill() -> list[dict[str, Any]]:
    return [
        event(7, "u1", "dwell", 14_000, dwell_ms=2000),  # duplicate of a pre-kill event: counts once
        event(11, "u1", "click", 21_000, position=1, category="c2"),
        event(12, "u1", "dwell", 22_000, dwell_ms=4000),
        event(13, "u2", "impression", 23_000, position=2, category="c1"),
        event(14, "u1", "impression", 24_500, position=5, category="c2"),
        event(15, "u2", "click", 26_000, position=2, category="c1"),
        event(16, "u1", "click", 27_500, position=5, category="c2"),
        event(17, "u1", "purchase", 29_000, price=12.0, category="c2"),
        event(18, "zz", "impression", 30_000),  # moves the job's clock to T0+30 s
    ]


def checkpoints(folder: Path) -> list[tuple[int, str, float]]:
    """Complete checkpoints under ``folder`` (``<job id>/chk-N``): (N, job id, mtime of _metadata)."""
    out = []
    for meta in folder.glob("*/chk-*/_metadata"):
        n = int(meta.parent.name.removeprefix("chk-"))
        out.append((n, meta.parent.parent.name, meta.stat().st_mtime))
    return out


def test_kill_9_and_restart_from_checkpoint_gives_the_reference_values(
    plan: tuple[TierPlan, Path], names: Names, kafka_bootstrap: str, redis_url: str, tmp_path: Path
) -> None:
    tier_plan, state = plan
    feed = Feed(kafka_bootstrap, names.topic)
    log = tmp_path / "job.log"
    chk_dir = tmp_path / "checkpoints"

    def published(b_ms: int, user: str = "u1") -> bool:
        # values are written when they change: u2 changes at T0+14 s (its event at 13 s enters),
        # u1 at T0+30 s (its event at 29 s enters)
        _, res = read_store(redis_url, names.namespace, tier_plan, "rt_all", [user])
        return bool(res.found[0]) and int(res.event_time_ms[0]) >= b_ms

    job = JobProcess(state, names, chk_dir, log)
    try:
        feed.send(*before_kill())
        first_start = "boundary T0+14 s (first start)"
        wait_for(lambda: published(T0 + 14_000, "u2"), 240, first_start, log)
        seen_at = time.time()
        wait_for(
            lambda: any(mtime > seen_at for _, _, mtime in checkpoints(chk_dir)),
            60,
            "a checkpoint completed after boundary T0+14 s was published",
            log,
        )
        job.kill()  # SIGKILL to the whole process group: client JVM, mini-cluster and Python workers
        first = checkpoints(chk_dir)
        first_jobs = {job_id for _, job_id, _ in first}
        assert len(first_jobs) == 1, first
        newest = max(n for n, _, _ in first)

        feed.send(*after_kill())
        job = JobProcess(state, names, chk_dir, log)
        wait_for(lambda: published(B_FINAL), 240, "boundary T0+30 s after the restart", log)
        wait_for(
            lambda: any(j not in first_jobs for _, j, _ in checkpoints(chk_dir)),
            60,
            "a checkpoint of the restarted job",
            log,
        )
    finally:
        job.kill()
        feed.close()

    text = log.read_text(errors="replace")
    restored = re.findall(r"restoring from checkpoint (\S+)", text)
    assert len(restored) == 1, text[-3000:]
    assert restored[0].endswith(f"/chk-{newest}"), (restored, newest)
    # Flink numbers a restored job's checkpoints after the one it restored: proof the state was loaded
    second = [n for n, j, _ in checkpoints(chk_dir) if j not in first_jobs]
    assert min(second) > newest, (second, newest)

    accepted = list({e["event_id"]: e for e in [*before_kill(), *after_kill()]}.values())
    assert_store_exact(redis_url, names.namespace, tier_plan, accepted, B_FINAL)
    client = redis.Redis.from_url(redis_url)
    try:
        ref = expected_vectors(tier_plan, "rt_all", accepted, ["u1"], client, names.namespace, B_FINAL)[0]
        u1 = ref["u1"]
        assert u1["sessions_20s"] == 2.0
        assert u1["dwell_avg_20s"] == 3000.0  # 2000 (pre-kill, its duplicate once) and 4000 (post-kill)
        assert u1["price_sum_20s"] == 19.5  # 7.5 before the kill + 12.0 after
    finally:
        client.close()
