"""Materialize: the latest offline values of each view -> the online store, through the shared writer.

For each view, the newest ``date`` partition of its feature table is exported by Spark to
Parquet, read back by pyarrow file by file, packed column-wise into online vectors and written
with :meth:`OnlineStore.write_batch` (idempotent: a key holding a newer boundary keeps it).
The event time of each value is its boundary T, so freshness is ``now - T``.

Redis outages: a chunk (dictionary ids, then the write) that fails because Redis is unreachable is
retried with back-off (:func:`~headwater.pipelines.retry.retry_call`) for up to ``REDIS_PATIENCE_S``
before the run fails. Both steps are idempotent (an id is assigned once; a write of the same
boundary and value is a no-op), so a retried chunk lands its values once. Retries are counted.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from headwater.pipelines.offline.arrow_io import spark_batches, staging_dir
from headwater.pipelines.offline.lake import FEATURE_TIME, feature_path, is_delta_table
from headwater.pipelines.offline.vectors import pack
from headwater.pipelines.retry import retry_call
from headwater.pipelines.store import OnlineStore
from headwater.pipelines.store.layout import ViewLayout
from headwater.pipelines.store.transport import StoreUnavailableError
from headwater.pipelines.windows import RedisDictionary, ViewSpec, compile_view, view_layout
from headwater.registry.errors import HeadwaterError
from headwater.registry.plans import PlanView

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

CHUNK_ROWS = 50_000
REDIS_PATIENCE_S = 300.0
"""How long a chunk is retried while Redis is unreachable before materialize fails."""
REDIS_DOWN = (StoreUnavailableError, RedisConnectionError, RedisTimeoutError)


class MaterializeError(HeadwaterError, RuntimeError):
    """A view has no feature table to materialize; the message says which command makes it."""


@dataclass(frozen=True)
class Materialized:
    """One view's materialization."""

    view: str
    date: date | None
    rows: int
    written: int
    seconds: float
    retries: int = 0
    """Chunk writes retried because Redis was unreachable."""

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


def export_latest(
    spark: SparkSession, view: PlanView, lake: Path, path: Path | None = None
) -> tuple[DataFrame, date | None]:
    """Return the rows of the newest partition, with ``event_time_ms`` (epoch ms of T).

    ``path``: another table of the view's rows (its healed values); default its feature table.
    """
    from pyspark.sql import functions as F

    path = path or feature_path(lake, view.name)
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


@dataclass(frozen=True)
class WriteCounts:
    """Counts of what the store did with some rows (:class:`~headwater.pipelines.store.WriteResult`)."""

    written: int = 0
    stale: int = 0
    """Rows whose key holds a newer event time: kept as stored."""
    unchanged: int = 0
    """Rows whose key holds the same event time and value already."""

    def __add__(self, other: WriteCounts) -> WriteCounts:
        return WriteCounts(
            self.written + other.written, self.stale + other.stale, self.unchanged + other.unchanged
        )


def write_table(
    store: OnlineStore,
    view: PlanView,
    table: pa.Table,
    dictionary: RedisDictionary,
    on_retry: Callable[[BaseException, float], None] | None = None,
) -> WriteCounts:
    """Pack and write Arrow rows (``__entity``, ``event_time_ms``, features); return what the store did.

    A chunk is retried while Redis is unreachable (module docstring); ``on_retry`` hears each retry.
    A retried chunk counts once: the counts are those of its successful attempt.
    """
    spec = compile_view(view)
    layout = view_layout(spec)
    counts = WriteCounts()
    for s in range(0, table.num_rows, CHUNK_ROWS):
        chunk = table.slice(s, CHUNK_ROWS)
        write = functools.partial(_write_chunk, store, layout, spec, chunk, dictionary)
        what = f"view {view.name}: writing rows {s}..{s + chunk.num_rows} to the online store"
        counts += retry_call(write, REDIS_DOWN, what, give_up_after_s=REDIS_PATIENCE_S, on_retry=on_retry)
    return counts


def _write_chunk(
    store: OnlineStore, layout: ViewLayout, spec: ViewSpec, chunk: pa.Table, dictionary: RedisDictionary
) -> WriteCounts:
    vectors = pack(spec, chunk, dictionary.ids)
    times = np.asarray(chunk.column("event_time_ms").to_numpy(), dtype=np.int64)
    entities = chunk.column("__entity").cast(pa.string()).to_numpy(zero_copy_only=False).tolist()
    result = store.write_batch(layout, entities, vectors, times)
    return WriteCounts(result.written, result.stale, result.unchanged)


@dataclass(frozen=True)
class Exported:
    """The newest partition of a view's table written to the online store (:func:`write_latest`)."""

    date: date | None
    rows: int
    counts: WriteCounts
    seconds: float
    """Packing and writing (the export excluded)."""
    retries: int


def write_latest(
    spark: SparkSession, store: OnlineStore, view: PlanView, lake: Path, path: Path | None = None
) -> Exported:
    """Export the newest partition of ``view``'s table (``path``: another table of its rows) and write it."""
    dictionary = RedisDictionary(store.client, store.namespace)
    frame, day = export_latest(spark, view, lake, path)
    rows, counts, seconds = 0, WriteCounts(), 0.0
    retries: list[BaseException] = []
    with staging_dir(lake / "_staging") as folder:
        for part in spark_batches(frame, folder):
            started = time.monotonic()
            counts += write_table(store, view, part, dictionary, lambda exc, _: retries.append(exc))
            seconds += time.monotonic() - started
            rows += part.num_rows
    return Exported(day, rows, counts, seconds, len(retries))


def materialize_view(spark: SparkSession, store: OnlineStore, view: PlanView, lake: Path) -> Materialized:
    """Write the newest offline values of ``view`` to the online store."""
    e = write_latest(spark, store, view, lake)
    return Materialized(view.name, e.date, e.rows, e.counts.written, e.seconds, e.retries)


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
