"""Write a source's events into its bronze table directly (tests, benchmarks).

Landing from Kafka is :mod:`.landing`, importing a history file is :mod:`.history`; this module is
for events already in hand as dicts of the source's fields: a scripted history in a test, generated
events in a benchmark.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from headwater.pipelines.offline.arrow_io import arrow_to_spark, staging_dir
from headwater.pipelines.offline.source_columns import (
    BRONZE_WRITE_OPTIONS,
    META_COLUMNS,
    bronze_schema,
    event_schema,
    with_date,
)
from headwater.registry.plans import PlanSource

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def events_table(
    source: PlanSource, events: Iterable[Mapping[str, Any]], late: Iterable[bool] | None = None
) -> pa.Table:
    """Return bronze rows of ``source`` for ``events`` (dicts of its fields; missing: null)."""
    rows = list(events)
    names = event_schema(source).names
    columns: dict[str, list[Any]] = {name: [e.get(name) for e in rows] for name in names}
    n = len(rows)
    for name in META_COLUMNS.names:
        columns[name] = [None] * n
    columns["late"] = list(late) if late is not None else [False] * n
    return pa.table(columns, schema=bronze_schema(source))


def append_table(spark: SparkSession, source: PlanSource, table: pa.Table, path: Path) -> None:
    """Append Arrow bronze rows of ``source`` to its Delta table at ``path`` (created when missing)."""
    with staging_dir(path.parent / "_staging") as folder:
        frame = with_date(arrow_to_spark(spark, table, folder), source)
        frame.write.format("delta").mode("append").options(**BRONZE_WRITE_OPTIONS).partitionBy("date").save(
            str(path)
        )


def append_events(
    spark: SparkSession,
    source: PlanSource,
    events: Iterable[Mapping[str, Any]],
    path: Path,
    late: Iterable[bool] | None = None,
) -> None:
    """Append ``events`` of ``source`` to its bronze Delta table at ``path``."""
    append_table(spark, source, events_table(source, events, late), path)
