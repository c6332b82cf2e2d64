"""A realtime start that recovers (``recovery``): a broken newest checkpoint falls back to the previous one.

The JVM check itself (``verify_checkpoint``: every state file ``_metadata`` names is there, at its size)
runs on real checkpoints in tests/integration/pipelines/realtime/test_realtime_fallback.py; here the
choice and the supervision around it, with fakes for the check and the job.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from headwater.pipelines.realtime.job import (
    RESTART_STRATEGY,
    RunOptions,
    checkpoint_to_restore,
    complete_checkpoints,
    configuration,
    latest_checkpoint,
    lost_state_report,
)
from headwater.pipelines.realtime.recovery import (
    UNRESTORABLE,
    Choice,
    choose_checkpoint,
    is_marked,
    job_checkpointed,
    restore_failed,
    summary,
    supervise,
)
from headwater.registry.plans import TierPlan


def completed(folder: Path, job: str, n: int, at_s: int) -> Path:
    """Write ``<job>/chk-<n>/_metadata`` and one state file, completed at ``at_s``."""
    chk = folder / job / f"chk-{n}"
    chk.mkdir(parents=True)
    (chk / "state-file").write_bytes(b"s")
    (chk / "_metadata").write_bytes(b"m")
    for path in (chk / "state-file", chk / "_metadata", chk):
        os.utime(path, ns=(at_s * 10**9, at_s * 10**9))
    return chk


def files_present(chk: Path) -> str | None:
    """A stand-in for the JVM check: the checkpoint's one state file must be there."""
    return None if (chk / "state-file").is_file() else f"state file {chk / 'state-file'} is missing"


@pytest.fixture
def three(tmp_path: Path) -> list[Path]:
    """Three retained checkpoints of one job, oldest first."""
    return [completed(tmp_path, "job-a", n, at_s=1_000 + n) for n in (7, 8, 9)]


def test_a_corrupt_newest_checkpoint_falls_back_to_the_previous_one_and_is_marked(
    tmp_path: Path, three: list[Path], caplog: pytest.LogCaptureFixture
) -> None:
    old, previous, newest = three
    (newest / "state-file").unlink()
    candidates = complete_checkpoints(tmp_path)
    assert candidates == [newest, previous, old]
    with caplog.at_level(logging.WARNING):
        choice = choose_checkpoint(candidates, files_present)
    assert choice.checkpoint == previous
    assert [c for c, _ in choice.skipped] == [newest]
    assert "is missing" in choice.skipped[0][1]
    assert is_marked(newest)
    assert "state-file is missing" in (newest / UNRESTORABLE).read_text()
    assert f"checkpoint {newest} cannot be restored" in caplog.text
    assert f"falling back to checkpoint {previous}" in caplog.text
    # the next start does not check it again, and the plain choice passes over it too
    checked: list[Path] = []
    again = choose_checkpoint(complete_checkpoints(tmp_path), lambda c: checked.append(c) or files_present(c))
    assert again.checkpoint == previous
    assert checked == [previous]
    assert "marked unrestorable earlier" in again.skipped[0][1]
    assert latest_checkpoint(tmp_path) == previous


def test_when_every_checkpoint_fails_the_start_is_empty_and_says_so_loudly(
    tmp_path: Path, three: list[Path], caplog: pytest.LogCaptureFixture
) -> None:
    for chk in three:
        (chk / "state-file").unlink()
    with caplog.at_level(logging.ERROR):
        choice = choose_checkpoint(complete_checkpoints(tmp_path), files_present)
    assert choice.checkpoint is None
    assert len(choice.skipped) == 3
    assert choice.candidates == 3
    assert "NO RESTORABLE CHECKPOINT: all 3 retained checkpoints failed" in caplog.text
    assert all(is_marked(c) for c in three)


def test_a_fresh_start_has_nothing_to_skip_and_logs_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        choice = choose_checkpoint(complete_checkpoints(tmp_path / "none"), files_present)
    assert choice == Choice(None, (), 0)
    assert caplog.text == ""


@dataclass
class FakeJob:
    job_id: str
    error: str | None

    def wait(self) -> str | None:
        return self.error


RESTORE_ERROR = """org.apache.flink.runtime.client.JobExecutionException: Job execution failed.
Caused by: org.apache.flink.runtime.JobException: Recovery is suppressed by ExponentialDelayRestartBackoffTimeStrategy
Caused by: java.lang.Exception: Exception while creating StreamOperatorStateContext.
Caused by: org.apache.flink.util.FlinkException: Could not restore keyed state backend for ViewOperator_2242 from any of the 1 provided restore options.
Caused by: java.io.FileNotFoundException: {chk}/0c0fdc5e-4485-495a-8a3e-18635cee30c7 (No such file or directory)
"""  # noqa: E501
OTHER_ERROR = """org.apache.flink.runtime.client.JobExecutionException: Job execution failed.
Caused by: java.io.IOException: the online store at redis://127.0.0.1:6390/0 does not answer
"""


def test_a_job_that_fails_restoring_is_submitted_again_from_the_previous_checkpoint(
    tmp_path: Path, three: list[Path]
) -> None:
    _, previous, newest = three
    errors = iter([RESTORE_ERROR.format(chk=newest), None])
    started: list[Path | None] = []

    def start(choice: Choice) -> FakeJob:
        started.append(choice.checkpoint)
        return FakeJob(f"job-{len(started)}", next(errors))

    sleeps: list[float] = []
    done = supervise(
        lambda: choose_checkpoint(complete_checkpoints(tmp_path), files_present),
        start,
        has_checkpointed=lambda job_id: False,
        sleep=sleeps.append,
    )
    assert started == [newest, previous] == done.restored
    assert is_marked(newest)
    assert "the restore failed" in (newest / UNRESTORABLE).read_text()
    assert "FileNotFoundException" in (newest / UNRESTORABLE).read_text()
    assert sleeps == []  # no wait: another restore of the same checkpoint would fail the same way


def test_other_failures_restart_from_the_newest_with_a_growing_backoff_and_mark_nothing(
    tmp_path: Path, three: list[Path]
) -> None:
    newest = three[-1]
    errors = iter([OTHER_ERROR, OTHER_ERROR, OTHER_ERROR, None])
    sleeps: list[float] = []
    done = supervise(
        lambda: choose_checkpoint(complete_checkpoints(tmp_path), files_present),
        lambda choice: FakeJob("job", next(errors)),
        has_checkpointed=lambda job_id: False,
        sleep=sleeps.append,
    )
    assert done.restored == [newest] * 4
    assert sleeps == [1.0, 2.0, 4.0]
    assert not any(is_marked(c) for c in three)


def test_a_job_that_checkpointed_before_failing_did_restore_its_checkpoint(
    tmp_path: Path, three: list[Path]
) -> None:
    newest = three[-1]
    errors = iter([RESTORE_ERROR.format(chk=newest), None])
    supervise(
        lambda: choose_checkpoint(complete_checkpoints(tmp_path), files_present),
        lambda choice: FakeJob("job", next(errors)),
        has_checkpointed=lambda job_id: True,
        sleep=lambda s: None,
    )
    assert not is_marked(newest)


def test_restore_failures_are_told_from_other_failures(tmp_path: Path) -> None:
    chk = tmp_path / "job" / "chk-4"
    assert restore_failed(RESTORE_ERROR.format(chk="/elsewhere"), chk)
    assert restore_failed(f"java.io.IOException: {chk}/_metadata: unexpected magic number", chk)
    assert not restore_failed(OTHER_ERROR, chk)
    assert summary(RESTORE_ERROR.format(chk=chk)).startswith("Caused by: java.io.FileNotFoundException")
    assert summary("one line") == "one line"


def test_job_checkpointed_looks_in_the_jobs_own_folder(tmp_path: Path, three: list[Path]) -> None:
    assert job_checkpointed(tmp_path, "job-a")
    assert not job_checkpointed(tmp_path, "job-b")


def test_the_restart_strategy_is_bounded_and_conf_wins(tmp_path: Path) -> None:
    plan = TierPlan.model_construct(registry_hash="sha256:" + "ab" * 32, views=[], sources=[])
    run = RunOptions(
        redis_url="redis://x",
        checkpoint_dir=tmp_path,
        extra_conf=(("execution.checkpointing.unaligned.enabled", "true"),),
    )
    conf = configuration(run, plan, None)
    assert conf["restart-strategy.type"] == "exponential-delay"
    assert int(conf["restart-strategy.exponential-delay.attempts-before-reset-backoff"]) <= 10
    assert {k: conf[k] for k in RESTART_STRATEGY} == RESTART_STRATEGY
    assert conf["execution.checkpointing.unaligned.enabled"] == "true"
    assert "execution.state-recovery.path" not in conf
    override = RunOptions(
        redis_url="r", checkpoint_dir=tmp_path, extra_conf=(("restart-strategy.type", "none"),)
    )
    assert configuration(override, plan, None)["restart-strategy.type"] == "none"


def test_the_default_choice_passes_over_a_marked_checkpoint(tmp_path: Path, three: list[Path]) -> None:
    plan = TierPlan.model_construct(registry_hash="sha256:" + "ab" * 32, views=[], sources=[])
    run = RunOptions(redis_url="r", checkpoint_dir=tmp_path)
    (three[-1] / UNRESTORABLE).write_text("gone\n")
    assert checkpoint_to_restore(run, plan) == three[-2].resolve()
    conf = configuration(run, plan)
    assert conf["execution.state-recovery.path"] == three[-2].resolve().as_uri()


def test_the_lost_state_report_names_every_view_and_its_window() -> None:
    view = type(
        "V", (), {"name": "v1", "source": "events", "features": [type("F", (), {"window_s": 300.0})()]}
    )
    plan = TierPlan.model_construct(registry_hash="sha256:" + "ab" * 32, views=[view()], sources=[])
    lines = lost_state_report(plan, ["events"]).lines()
    assert lines[0] == "state kept (windows go on): -"
    want = "state empty (LOST, no restorable checkpoint): v1: partial values until 300 s of stream after"
    assert lines[1] == want + " the restore (its longest window)"


def test_conf_pairs_parse_key_value_and_name_the_form() -> None:
    import click

    from headwater.cli.realtime import _conf_pairs

    pairs = _conf_pairs(("execution.checkpointing.unaligned.enabled=true", "a.b = 2 s"))
    assert pairs == (("execution.checkpointing.unaligned.enabled", "true"), ("a.b", "2 s"))
    with pytest.raises(click.UsageError, match="write KEY=VALUE"):
        _conf_pairs(("no-equals",))
