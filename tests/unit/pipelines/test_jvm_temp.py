"""The engines' JVM temporary folders: one per process, a dead process's folder removed at the next start."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from headwater.pipelines import jvm


@pytest.fixture
def tmp_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.delenv("JVM_ARGS", raising=False)
    return tmp_path / f"headwater-{os.getuid()}" / "flink"


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_a_killed_processs_folder_is_removed_and_a_live_ones_kept(tmp_root: Path) -> None:
    dead = tmp_root / str(dead_pid())
    (dead / "sub").mkdir(parents=True)
    (dead / "sub" / "flink-table-planner_1.jar").write_bytes(b"x" * 1000)
    alive = tmp_root / "1"  # init: always alive, another user's (PermissionError counts as alive)
    alive.mkdir()
    other = tmp_root / "notes"  # not a pid: left alone
    other.mkdir()

    mine = jvm.jvm_temp_dir("flink")

    assert mine == tmp_root / str(os.getpid())
    assert mine.is_dir()
    assert not dead.exists()
    assert alive.is_dir()
    assert other.is_dir()
    assert jvm.jvm_temp_dir("flink") == mine  # a second call keeps the folder


def test_the_gateway_gets_the_heap_and_the_process_folder(tmp_root: Path) -> None:
    jvm.set_flink_java_args("2g")

    assert os.environ["JVM_ARGS"] == f"-Xmx2g -XX:+UseG1GC -Djava.io.tmpdir={tmp_root / str(os.getpid())}"


def test_the_callers_jvm_args_win_and_get_the_folder(tmp_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JVM_ARGS", "-Xmx512m")
    jvm.set_flink_java_args("2g")
    assert os.environ["JVM_ARGS"] == f"-Xmx512m -Djava.io.tmpdir={tmp_root / str(os.getpid())}"

    monkeypatch.setenv("JVM_ARGS", "-Djava.io.tmpdir=/elsewhere")
    jvm.set_flink_java_args(None)
    assert os.environ["JVM_ARGS"] == "-Djava.io.tmpdir=/elsewhere"


def test_a_folder_inherited_from_a_parent_process_is_replaced_by_our_own(
    tmp_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("JVM_ARGS", f"-Xmx1g -Djava.io.tmpdir={tmp_root / '99999999'}")
    jvm.set_flink_java_args("2g")
    assert os.environ["JVM_ARGS"] == f"-Xmx1g -Djava.io.tmpdir={tmp_root / str(os.getpid())}"

    dead = tmp_root / str(dead_pid())  # a second start keeps its folder and sweeps nothing again
    dead.mkdir()
    jvm.set_flink_java_args("2g")
    assert os.environ["JVM_ARGS"] == f"-Xmx1g -Djava.io.tmpdir={tmp_root / str(os.getpid())}"
    assert dead.is_dir()
