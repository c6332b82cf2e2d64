"""The JVM engines log to files under the state folder, not the console (issue 37 item 4)."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest

from headwater.pipelines import jvm


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HEADWATER_STATE_DIR", str(tmp_path))
    return tmp_path


def test_spark_gets_a_log4j2_file_that_writes_to_the_state_folder(state: Path) -> None:
    option = jvm.spark_log_options()
    config = state / "logs" / "spark-log4j2.properties"
    assert option == f"-Dlog4j2.configurationFile={config.as_uri()}"
    lines = config.read_text(encoding="utf-8").splitlines()
    assert f"appender.file.fileName = {state / 'logs' / 'spark.log'}" in lines
    assert "rootLogger.appenderRef.file.ref = file" in lines
    assert not any("console" in line.lower() for line in lines if not line.startswith("#"))
    assert jvm.spark_log_options() == option  # a second session reuses the same file


def test_flink_logs_to_the_state_folder_unless_told_otherwise(
    state: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("FLINK_LOG_DIR", "JVM_ARGS"):  # set, then removed: monkeypatch restores them after
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    jvm.set_flink_java_args()
    assert os.environ["FLINK_LOG_DIR"] == str(state / "logs")
    monkeypatch.setenv("FLINK_LOG_DIR", "/elsewhere")
    jvm.set_flink_java_args()
    assert os.environ["FLINK_LOG_DIR"] == "/elsewhere"


def test_the_jvm_notice_is_dropped_and_other_stderr_lines_kept(capsys: pytest.CaptureFixture[str]) -> None:
    stream = io.BytesIO(
        b"WARNING: Using incubator modules: jdk.incubator.vector\n"
        b"Error: Could not reserve enough space for object heap\n"
        b"WARNING: Using incubator modules: jdk.incubator.vector\r\n"
        b"\xff not utf-8\n"
        b"last line, no newline"
    )
    jvm._copy_stderr(stream)
    assert capsys.readouterr().err == (
        "Error: Could not reserve enough space for object heap\n\ufffd not utf-8\nlast line, no newline"
    )
