"""A broken newest checkpoint: ``headwater run realtime`` restores an older one, and values stay exact.

The job is killed after it read two batches of events; every checkpoint that holds the second batch is
then broken, and the restarted job must fall back to the last one taken before it, replay the second
batch (its values were written already: the store's fences make the rewrite a no-op) and go on with a
third batch: the online values equal the reference's, each at the event time of its last change.

- ``test_a_missing_state_file_is_found_before_the_restore``: one state file of each is deleted; the
  check before the restore (Flink's loader reads ``_metadata``, every file it names must be there)
  skips them without a failed start.
- ``test_a_restore_that_fails_falls_back_after_the_failure`` (slow): one state file of each gets
  other bytes of the same size, which the check cannot see; the restore fails, Flink's bounded restarts
  (one here) give up, and the command marks the checkpoint and submits again from the previous one.

Every checkpoint is kept (``num-retained``), and written to files however small (inline threshold 0),
so the test knows which ones hold the second batch.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Any

import pytest

from headwater.pipelines.realtime.recovery import UNRESTORABLE
from headwater.registry.plans import TierPlan

from .conftest import (
    T0,
    Feed,
    JobProcess,
    Names,
    assert_store_exact,
    checkpoints,
    read_store,
    unique,
    wait_for,
)
from .test_realtime_restore import B_FINAL, after_kill, before_kill

TEST_CONF = (
    "--conf", "execution.checkpointing.num-retained=50",
    "--conf", "execution.checkpointing.data-inline-threshold=0 b",
    "--conf", "restart-strategy.exponential-delay.attempts-before-reset-backoff=1",
)  # fmt: skip


def published(redis_url: str, names: Names, plan: TierPlan, user: str, b_ms: int) -> bool:
    _, res = read_store(redis_url, names.namespace, plan, "rt_all", [user])
    return bool(res.found[0]) and int(res.event_time_ms[0]) >= b_ms


def state_files(chk: Path) -> list[Path]:
    return sorted(p for p in chk.iterdir() if p.is_file() and p.name not in ("_metadata", UNRESTORABLE))


def run_with_broken_checkpoints(
    plan: tuple[TierPlan, Path],
    names: Names,
    kafka_bootstrap: str,
    redis_url: str,
    tmp_path: Path,
    break_file: Any,
) -> tuple[str, Path, list[Path], set[str]]:
    """Two batches, kill, break every checkpoint that holds the second, third batch, restart, wait.

    Returns the job log, the checkpoint the restart must restore, the broken ones, the first job's id.
    """
    tier_plan, state = plan
    feed = Feed(kafka_bootstrap, names.topic)
    log = tmp_path / "job.log"
    chk_dir = tmp_path / "checkpoints"
    first, second = before_kill()[:8], before_kill()[8:]

    def at(user: str, b_ms: int) -> bool:
        return published(redis_url, names, tier_plan, user, b_ms)

    job = JobProcess(state, names, chk_dir, log, extra=TEST_CONF)
    try:
        feed.send(*first)
        # the job's clock is its newest event time (16 s): u2 changes at T0+14 s (its event at 13 s enters)
        wait_for(lambda: at("u2", T0 + 14_000), 240, "the first batch", log)
        seen_at = time.time()
        wait_for(
            lambda: any(mtime > seen_at for _, _, mtime in checkpoints(chk_dir)),
            60,
            "a checkpoint after the first batch",
            log,
        )
        # a checkpoint completed after the first batch was seen: it holds the first batch, not the second
        before_second = max(n for n, _, _ in checkpoints(chk_dir))
        feed.send(*second)
        # the clock at 19.5 s: u2 changes at T0+19 s (its purchase at 18 s enters)
        wait_for(lambda: at("u2", T0 + 19_000), 120, "the second batch", log)
        seen_at = time.time()
        wait_for(
            lambda: any(mtime > seen_at for _, _, mtime in checkpoints(chk_dir)),
            60,
            "a checkpoint after the second batch",
            log,
        )
    finally:
        job.kill()
    found = checkpoints(chk_dir)
    jobs = {j for _, j, _ in found}
    assert len(jobs) == 1, found
    (job_id,) = jobs
    target = chk_dir / job_id / f"chk-{before_second}"
    assert (target / "_metadata").is_file(), found
    broken = [chk_dir / job_id / f"chk-{n}" for n, _, _ in sorted(found) if n > before_second]
    assert broken, found
    for chk in broken:
        files = state_files(chk)
        assert files, f"{chk} has no state file (inline threshold)"
        break_file(files[0])

    feed.send(*after_kill())
    job = JobProcess(state, names, chk_dir, log, extra=TEST_CONF)
    try:
        wait_for(lambda: at("u1", B_FINAL), 300, "T0+30 s after restart", log)
        wait_for(
            lambda: any(j not in jobs for _, j, _ in checkpoints(chk_dir)),
            60,
            "a checkpoint of the restarted job",
            log,
        )
    finally:
        job.kill()
        feed.close()
    return log.read_text(errors="replace"), target, broken, jobs


def check_restored(
    text: str,
    target: Path,
    broken: list[Path],
    first_jobs: set[str],
    chk_dir: Path,
    plan: TierPlan,
    names: Names,
    redis_url: str,
) -> None:
    restored = re.findall(r"checkpoint to restore: (\S+)", text)
    assert restored, text[-3000:]
    assert restored[-1].endswith(f"/{target.parent.name}/{target.name}"), (restored, target)
    for chk in broken:
        assert (chk / UNRESTORABLE).is_file(), chk
    assert not (target / UNRESTORABLE).exists()
    # Flink numbers a restored job's checkpoints after the one it loaded
    n = int(target.name.removeprefix("chk-"))
    later = [m for m, j, _ in checkpoints(chk_dir) if j not in first_jobs]
    assert min(later) > n, (later, n)
    accepted = unique([*before_kill(), *after_kill()])
    assert_store_exact(redis_url, names.namespace, plan, accepted, B_FINAL)


def test_a_missing_state_file_is_found_before_the_restore(
    plan: tuple[TierPlan, Path], names: Names, kafka_bootstrap: str, redis_url: str, tmp_path: Path
) -> None:
    text, target, broken, jobs = run_with_broken_checkpoints(
        plan, names, kafka_bootstrap, redis_url, tmp_path, lambda f: f.unlink()
    )
    for chk in broken:
        assert re.search(rf"checkpoint \S*/{chk.name} cannot be restored: state file \S+ is missing", text), (
            chk
        )
    assert f"falling back to checkpoint {target.resolve()}" in text
    assert "failed restoring checkpoint" not in text  # found before any start
    check_restored(text, target, broken, jobs, tmp_path / "checkpoints", plan[0], names, redis_url)


@pytest.mark.slow
def test_a_restore_that_fails_falls_back_after_the_failure(
    plan: tuple[TierPlan, Path], names: Names, kafka_bootstrap: str, redis_url: str, tmp_path: Path
) -> None:
    def scramble(path: Path) -> None:
        path.write_bytes(os.urandom(path.stat().st_size))

    text, target, broken, jobs = run_with_broken_checkpoints(
        plan, names, kafka_bootstrap, redis_url, tmp_path, scramble
    )
    failed = re.findall(r"failed restoring checkpoint (\S+)", text)
    assert sorted(failed) == sorted(str(c.resolve()) for c in broken), (failed, text[-3000:])
    check_restored(text, target, broken, jobs, tmp_path / "checkpoints", plan[0], names, redis_url)
