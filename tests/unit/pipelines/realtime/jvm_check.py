"""Run the JVM operators' check drivers (``dev.headwater.flink...Check``) from the unit tests.

Each driver reads JSON lines on stdin (its set-up first) and writes one JSON line per result, so a
test compares the JVM's answer with the Python reference without a Flink job. A machine without
``java`` or without the built jars skips the test rather than failing it.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from headwater.pipelines import jvm


def classpath() -> str:
    """The functions' jars plus PyFlink's own (Avro logs through the slf4j that Flink ships)."""
    try:
        ours = jvm.jars("flink-udfs")
    except jvm.MissingJarsError as exc:
        pytest.skip(f"the JVM operators are not built here: {exc}")
    spec = importlib.util.find_spec("pyflink")
    assert spec is not None, "pyflink is a dependency of headwater"
    assert spec.origin is not None
    flink = sorted((Path(spec.origin).parent / "lib").glob("*.jar"))
    return ":".join(str(j) for j in [*ours, *flink])


def run_driver(main_class: str, lines: Sequence[Any], header: str | None = None) -> list[Any]:
    """Run ``main_class`` on ``header`` (a text line: a program) and ``lines`` (JSON); parse its output.

    The driver must exit 0 (its stderr is the assertion's message).
    """
    java = shutil.which("java")
    if java is None:
        pytest.skip("no `java` on PATH")
    text = "".join(json.dumps(x) + "\n" for x in lines)
    if header is not None:
        text = header + "\n" + text
    cmd = [java, "-cp", classpath(), main_class]
    done = subprocess.run(cmd, input=text, capture_output=True, text=True, check=False, timeout=120)
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]
