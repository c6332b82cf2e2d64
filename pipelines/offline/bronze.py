"""Write events into the bronze table directly (tests, benchmarks, imports of history).

Landing from Kafka is :mod:`.landing`; this module is for events already in hand: a scripted
history in a test, generated events in a benchmark, an export from another system.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from headwater.pipelines.offline.arrow_io import arrow_to_spark, staging_dir
from headwater.pipelines.offline.lake import BRONZE_SCHEMA, EVENT_COLUMNS

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


def events_table(events: Iterable[Mapping[str, Any]], late: Iterable[bool] | None = None) -> pa.Table:
    """Bronze rows for ``events`` (BehaviorEvent dicts); no Kafka coordinates."""
    rows = list(events)
    columns: dict[str, list[Any]] = {name: [e.get(name) for e in rows] for name in EVENT_COLUMNS}
    n = len(rows)
    columns["produce_ts_ms"] = [None] * n
    columns["kafka_topic"] = [None] * n
    columns["kafka_partition"] = [None] * n
    columns["kafka_offset"] = [None] * n
    columns["late"] = list(late) if late is not None else [False] * n
    return pa.table(columns, schema=BRONZE_SCHEMA)


def with_date(frame: DataFrame) -> DataFrame:
    """Add the ``date`` partition column (UTC date of ``event_time``)."""
    from pyspark.sql import functions as F

    return frame.withColumn("date", F.to_date(F.timestamp_millis(F.col("event_time"))))


def append_table(spark: SparkSession, table: pa.Table, path: Path) -> None:
    """Append Arrow bronze rows to the bronze Delta table at ``path`` (created when missing)."""
    with staging_dir(path.parent / "_staging") as folder:
        frame = with_date(arrow_to_spark(spark, table, folder))
        frame.write.format("delta").mode("append").partitionBy("date").save(str(path))


def append_events(
    spark: SparkSession, events: Iterable[Mapping[str, Any]], path: Path, late: Iterable[bool] | None = None
) -> None:
    """Append ``events`` to the bronze Delta table at ``path``."""
    append_table(spark, events_table(events, late), path)
