"""Which checkpoint a realtime restart restores (``job.latest_checkpoint``)."""

from __future__ import annotations

import os
from pathlib import Path

from headwater.pipelines.realtime.job import checkpoint_number, latest_checkpoint


def completed(folder: Path, job: str, n: int, at_s: int) -> Path:
    """Write ``<job>/chk-<n>/_metadata`` and one state file, completed at ``at_s`` (file times)."""
    chk = folder / job / f"chk-{n}"
    chk.mkdir(parents=True)
    (chk / "state-file").write_bytes(b"s")
    (chk / "_metadata").write_bytes(b"m")
    for path in (chk / "state-file", chk / "_metadata", chk):
        os.utime(path, ns=(at_s * 10**9, at_s * 10**9))
    return chk


def test_a_half_discarded_older_checkpoint_is_not_chosen_for_its_fresh_folder_time(tmp_path: Path) -> None:
    # chk-160 was being discarded (subsumed) when the job was killed: a state file gone, _metadata left,
    # and the folder's time is the deletion's, later than chk-163's completion.
    old = completed(tmp_path, "job-a", 160, at_s=1_000)
    newest = completed(tmp_path, "job-a", 163, at_s=1_030)
    (old / "state-file").unlink()
    os.utime(old, ns=(1_040 * 10**9, 1_040 * 10**9))
    assert latest_checkpoint(tmp_path) == newest


def test_the_newest_job_wins_and_within_a_job_the_highest_number(tmp_path: Path) -> None:
    completed(tmp_path, "job-a", 9, at_s=1_000)
    completed(tmp_path, "job-b", 2, at_s=2_000)
    later = completed(tmp_path, "job-b", 3, at_s=2_000)  # same second: the number decides
    assert latest_checkpoint(tmp_path) == later


def test_an_incomplete_checkpoint_or_an_empty_folder_gives_none(tmp_path: Path) -> None:
    assert latest_checkpoint(tmp_path / "absent") is None
    (tmp_path / "job-a" / "chk-5").mkdir(parents=True)  # no _metadata: never completed
    assert latest_checkpoint(tmp_path) is None
    assert checkpoint_number(Path("chk-12")) == 12
    assert checkpoint_number(Path("chk-x")) == -1
