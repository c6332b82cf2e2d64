"""The landing lock without Spark or Kafka: one holder per table, released by the kernel on kill -9."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from headwater.pipelines.offline.landing_lock import LOCK_NAME, LandingLock
from headwater.pipelines.offline.landing_state import LandingError

HOLD = """
import sys, time
from pathlib import Path
from headwater.pipelines.offline.landing_lock import LandingLock
LandingLock(Path(sys.argv[1]), "events").acquire()
print("held", flush=True)
time.sleep(600)
"""


def test_a_second_lock_of_the_same_table_is_refused_naming_the_holder(tmp_path: Path) -> None:
    table = tmp_path / "bronze" / "events"
    with LandingLock(table, "events"):
        with pytest.raises(
            LandingError, match=rf"source 'events': another landing process holds .*pid {os.getpid()}"
        ):
            LandingLock(table, "events").acquire()
        LandingLock(tmp_path / "bronze" / "payments", "payments").acquire()  # another table: free
    with LandingLock(table, "events"):  # released: free again
        pass
    assert (table / LOCK_NAME).exists()


def test_a_holder_killed_with_sigkill_leaves_no_stale_lock(tmp_path: Path) -> None:
    table = tmp_path / "events"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(table)], stdout=subprocess.PIPE)
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline() == b"held\n"
        with pytest.raises(LandingError, match=f"pid {holder.pid}"):
            LandingLock(table, "events").acquire()
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait()
    lock = LandingLock(table, "events")
    lock.acquire()  # the kernel released it when the holder died: no expiry to wait for
    lock.release()
