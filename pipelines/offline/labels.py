"""Ranker labels from the behaviour source's bronze table: an impression clicked soon after is positive.

This module is ranking-specific: it reads the fields of a behaviour stream (:data:`LABEL_FIELDS`). The
source is the plan's, found by those fields (:func:`labels_source`), and its event time and event id
are the ones the plan declares; the output keeps the column names the ranker's training set reads.

Rule: an impression (user, item, session, position, event_time t) gets label 1 when the same
user clicked the same item in the same session at a time c with ``t <= c <= t + horizon``, else
0. A click is credited to one impression only: the latest matching one at or before it (an item
shown on two pages of a session is clicked on the later page). Duplicates (same ``event_id``)
count once; events flagged ``late`` at landing are left out, as the feature jobs leave them out.

``group`` identifies a slate: one page of a session. A page starts at each position-1
impression, in the order the session's events were produced (Kafka offset, which keeps one
user's events in order; event time where bronze rows have no offset). Its value is a 64-bit
hash of (session_id, page number).

Output columns (what ``headwater training-set --labels`` reads): ``group``, ``user_id``,
``item_id``, ``event_time`` (ms), ``label`` (float 0/1), plus ``session_id`` and ``position``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow.parquet as pq

from headwater.pipelines.offline.arrow_io import spark_batches, staging_dir
from headwater.pipelines.offline.lake import day_start_ms
from headwater.pipelines.offline.source_columns import event_ms
from headwater.registry.errors import HeadwaterError
from headwater.registry.plans import PlanSource

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

DEFAULT_HORIZON_S = 1_800
"""A click counts for an impression shown at most this long before it (30 minutes)."""
LABEL_COLUMNS = ("group", "user_id", "item_id", "event_time", "label", "session_id", "position")
LABEL_FIELDS = ("user_id", "item_id", "session_id", "event_type", "position")
"""The behaviour fields labels are derived from: a source with all of them is a behaviour stream."""


class LabelsError(HeadwaterError, ValueError):
    """No labels can be derived (empty range); the message says what to do."""


@dataclass(frozen=True)
class LabelsResult:
    """What was written."""

    path: Path
    rows: int
    positives: int


def labels_source(sources: Sequence[PlanSource], name: str | None = None) -> PlanSource:
    """Return the plan source labels are derived from: ``name``, else the one with every :data:`LABEL_FIELDS`.

    Raises:
        LabelsError: no source (or more than one) has the behaviour fields, or ``name`` lacks them.
    """
    if name is not None:
        found = next((s for s in sources if s.name == name), None)
        if found is None:
            msg = f"source {name!r} is not in the applied plan (sources: {sorted(s.name for s in sources)})"
            raise LabelsError(msg)
        missing = [f for f in LABEL_FIELDS if found.field(f) is None]
        if missing:
            msg = (
                f"source {name!r} lacks the field(s) {missing} labels are derived from ({list(LABEL_FIELDS)})"
            )
            raise LabelsError(msg)
        return found
    fits = [s for s in sources if all(s.field(f) is not None for f in LABEL_FIELDS)]
    if len(fits) != 1:
        msg = (f"{len(fits)} source(s) of the plan have the behaviour fields {list(LABEL_FIELDS)} "
               f"({sorted(s.name for s in fits)}); name the one to label with --source")  # fmt: skip
        raise LabelsError(msg)
    return fits[0]


def derive_labels(
    bronze: DataFrame,
    source: PlanSource,
    first: date | None = None,
    last: date | None = None,
    horizon_s: int = DEFAULT_HORIZON_S,
) -> DataFrame:
    """Return labelled impressions of days ``first..last`` (UTC, inclusive; None = unbounded).

    ``bronze`` is the table of the behaviour ``source`` (:func:`labels_source`).

    Steps: 1. keep on-time, de-duplicated events of the day range (clicks up to ``horizon_s`` past
    its end); 2. number each session's pages; 3. match clicks to impressions and credit each click
    to its latest impression; 4. label every impression.
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    # Step 1: the source's event time as ms in `event_time`, its event id in `event_id` (from here on).
    on_time = bronze.where(~F.coalesce(F.col("late"), F.lit(False)))
    if source.event_id is not None:
        on_time = on_time.dropDuplicates([source.event_id])
        ident = F.col(f"`{source.event_id}`").cast("string")
    else:
        ident = F.format_string("%d/%d", F.col("kafka_partition"), F.col("kafka_offset"))
    events = on_time.select(
        *[F.col(f"`{f}`") for f in LABEL_FIELDS], "kafka_offset",
        event_ms(source).alias("event_time"), ident.alias("event_id"),
    )  # fmt: skip
    horizon_ms = horizon_s * 1000
    lo = day_start_ms(first) if first is not None else None
    hi = day_start_ms(last + timedelta(days=1)) if last is not None else None
    if lo is not None:
        events = events.where(F.col("event_time") >= F.lit(lo))
    if hi is not None:
        events = events.where(F.col("event_time") < F.lit(hi + horizon_ms))
    shown = events.where((F.col("event_type") == "impression") & F.col("item_id").isNotNull())
    # Step 2
    order = Window.partitionBy("session_id").orderBy(
        F.col("kafka_offset").asc_nulls_last(), "event_time", "event_id"
    )
    shown = shown.withColumn("__page", F.sum(F.when(F.col("position") == 1, 1).otherwise(0)).over(order))
    if hi is not None:
        shown = shown.where(F.col("event_time") < F.lit(hi))
    shown = shown.select(
        "event_id", "user_id", "item_id", "session_id", "position", "event_time",
        F.xxhash64("session_id", "__page").alias("group"),
    )  # fmt: skip
    # Step 3
    clicks = events.where(F.col("event_type") == "click").select(
        F.col("event_id").alias("__click"), F.col("user_id").alias("__cu"), F.col("item_id").alias("__ci"),
        F.col("session_id").alias("__cs"), F.col("event_time").alias("__ct"),
    )  # fmt: skip
    match = (
        (F.col("user_id") == F.col("__cu")) & (F.col("item_id") == F.col("__ci"))
        & (F.col("session_id") == F.col("__cs")) & (F.col("__ct") >= F.col("event_time"))
        & (F.col("__ct") <= F.col("event_time") + F.lit(horizon_ms))
    )  # fmt: skip
    latest = Window.partitionBy("__click").orderBy(F.col("event_time").desc(), F.col("event_id").desc())
    credited = (
        shown.join(clicks, match, "inner")
        .withColumn("__rank", F.row_number().over(latest))
        .where(F.col("__rank") == 1)
        .select(F.col("event_id").alias("__imp"))
        .distinct()
        .withColumn("__clicked", F.lit(1.0))
    )
    # Step 4
    labelled = shown.join(credited, shown.event_id == credited.__imp, "left")
    return labelled.select(
        "group", "user_id", "item_id", F.col("event_time").cast("long").alias("event_time"),
        F.coalesce(F.col("__clicked"), F.lit(0.0)).cast("float").alias("label"),
        "session_id", F.col("position").cast("long").alias("position"),
    )  # fmt: skip


def write_labels(labels: DataFrame, out: Path, staging: Path) -> LabelsResult:
    """Write ``labels`` to one Parquet file ``out`` (through files staged under ``staging``)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    rows = positives = 0
    writer: pq.ParquetWriter | None = None
    ordered = labels.orderBy("group", "position", "event_time")
    with staging_dir(staging) as folder:
        for part in spark_batches(ordered, folder, list(LABEL_COLUMNS)):
            if writer is None:
                writer = pq.ParquetWriter(out, part.schema)
            writer.write_table(part)
            rows += part.num_rows
            positives += int(np.count_nonzero(part.column("label").to_numpy() > 0))
    if writer is not None:
        writer.close()
    if rows == 0:
        out.unlink(missing_ok=True)
        msg = (f"no impressions to label in the bronze table for the days asked: nothing written to "
               f"{out}; check --date/--from/--to against the landed days (land with "
               "`headwater run landing` first)")  # fmt: skip
        raise LabelsError(msg)
    return LabelsResult(out, rows, positives)
