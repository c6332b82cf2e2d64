"""A Spark session's console is headwater's alone (issue 37 item 4), on a real driver JVM.

The JVM announces the incubator module Spark's launcher adds (``WARNING: Using incubator modules``)
on its own stderr at every start, and log4j would print Spark's WARN lines there: neither reaches
the console. A process of its own, since the gateway of this pytest run is already up.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SCRIPT = """
from headwater.pipelines.jvm import spark_session
spark = spark_session("console-test")
print("rows", spark.range(3).count())
spark.stop()
"""


def test_a_spark_session_prints_no_engine_line_to_the_console(tmp_path: Path) -> None:
    env = {**os.environ, "HEADWATER_STATE_DIR": str(tmp_path)}
    env.pop("PYSPARK_GATEWAY_PORT", None)
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "rows 3"
    assert "incubator" not in done.stderr
    assert " WARN " not in done.stderr
    assert (tmp_path / "logs" / "spark-log4j2.properties").is_file()
