"""Materialize: the latest offline values of each view -> the online store, through the shared writer.

For each view, the newest ``date`` partition of its feature table is exported by Spark to
Parquet, read back by pyarrow file by file, packed column-wise into online vectors and written
with :meth:`OnlineStore.write_batch` (idempotent: a key holding a newer boundary keeps it).
The event time of each value is its boundary T, so freshness is ``now - T``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from headwater.pipelines.offline.arrow_io import spark_batches, staging_dir
from headwater.pipelines.offline.lake import FEATURE_TIME, feature_path, is_delta_table
from headwater.pipelines.offline.vectors import pack
from headwater.pipelines.store import OnlineStore
from headwater.pipelines.windows import RedisDictionary, compile_view, view_layout
from headwater.registry.plans import PlanView

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

CHUNK_ROWS = 50_000


class MaterializeError(RuntimeError):
    """A view has no feature table to materialize; the message says which command makes it."""


@dataclass(frozen=True)
class Materialized:
    """One view's materialization."""

    view: str
    date: date | None
    rows: int
    written: int
    seconds: float

    @property
    def rows_per_s(self) -> float:
        """Rows packed and written per second (export excluded)."""
        return self.rows / self.seconds if self.seconds > 0 else 0.0


def latest_date(frame: DataFrame) -> date | None:
    """Return the newest ``date`` partition of a feature table (None when empty)."""
    from pyspark.sql import functions as F

    row = frame.agg(F.max("date").alias("d")).collect()[0]
    found: date | None = row["d"]
    return found


def export_latest(spark: SparkSession, view: PlanView, lake: Path) -> tuple[DataFrame, date | None]:
    """Return the rows of the newest partition, with ``event_time_ms`` (epoch ms of T)."""
    from pyspark.sql import functions as F

    path = feature_path(lake, view.name)
    if not is_delta_table(path):
        msg = f"view {view.name}: no feature table at {path}; compute it with `headwater run offline`"
        raise MaterializeError(msg)
    table = spark.read.format("delta").load(str(path))
    day = latest_date(table)
    rows = table.where(F.col("date") == F.lit(day)).select(
        F.col(view.join_key).alias("__entity"),
        F.unix_millis(F.col(FEATURE_TIME)).alias("event_time_ms"),
        *[F.col(f"`{f.name}`") for f in view.features],
    )
    return rows, day


def write_table(store: OnlineStore, view: PlanView, table: pa.Table, dictionary: RedisDictionary) -> int:
    """Pack and write Arrow rows (``__entity``, ``event_time_ms``, features); return rows written."""
    spec = compile_view(view)
    layout = view_layout(spec)
    written = 0
    for s in range(0, table.num_rows, CHUNK_ROWS):
        chunk = table.slice(s, CHUNK_ROWS)
        vectors = pack(spec, chunk, dictionary.ids)
        times = np.asarray(chunk.column("event_time_ms").to_numpy(), dtype=np.int64)
        entities = chunk.column("__entity").cast(pa.string()).to_numpy(zero_copy_only=False).tolist()
        written += store.write_batch(layout, entities, vectors, times).written
    return written


def materialize_view(spark: SparkSession, store: OnlineStore, view: PlanView, lake: Path) -> Materialized:
    """Write the newest offline values of ``view`` to the online store."""
    dictionary = RedisDictionary(store.client, store.namespace)
    frame, day = export_latest(spark, view, lake)
    rows = written = 0
    seconds = 0.0
    with staging_dir(lake / "_staging") as folder:
        for part in spark_batches(frame, folder):
            started = time.monotonic()
            written += write_table(store, view, part, dictionary)
            seconds += time.monotonic() - started
            rows += part.num_rows
    return Materialized(view.name, day, rows, written, seconds)


def materialize(
    spark: SparkSession,
    store: OnlineStore,
    views: list[PlanView],
    lake: Path,
    progress: Callable[[Materialized], None] | None = None,
) -> list[Materialized]:
    """Materialize each of ``views``."""
    out = []
    for view in views:
        done = materialize_view(spark, store, view, lake)
        out.append(done)
        if progress is not None:
            progress(done)
    return out
