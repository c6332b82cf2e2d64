"""The offline tier's Spark session: :func:`headwater.pipelines.jvm.spark_session` plus Delta tuning."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

from headwater.pipelines.jvm import spark_session

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def offline_session(app_name: str, master: str | None = None) -> SparkSession:
    """Return a Spark session with Delta; the Delta log is read with few tasks (local runs have 2 cores).

    ``master`` (``spark://HOST:PORT``) sends the jobs to a standalone cluster; its executors start
    Python UDF workers with this interpreter (PySpark's default is ``python3`` from the PATH, which
    has no headwater outside an activated venv) unless ``PYSPARK_PYTHON`` says otherwise. Spark's
    own log goes to ``<state folder>/logs/spark.log`` (:func:`headwater.pipelines.jvm.engine_log_dir`).
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = spark_session(app_name, master)
    spark.conf.set("spark.databricks.delta.snapshotPartitions", "2")
    return spark
