"""The offline tier's Spark session: :func:`headwater.pipelines.jvm.spark_session` plus Delta tuning."""

from __future__ import annotations

from typing import TYPE_CHECKING

from headwater.pipelines.jvm import spark_session

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def offline_session(app_name: str, master: str | None = None) -> SparkSession:
    """Return a Spark session with Delta; the Delta log is read with few tasks (local runs have 2 cores)."""
    spark = spark_session(app_name, master)
    spark.conf.set("spark.databricks.delta.snapshotPartitions", "2")
    spark.sparkContext.setLogLevel("ERROR")
    return spark
