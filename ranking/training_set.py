"""Point-in-time training sets: labelled impressions joined to the feature values valid at their time.

As-of rule (never a future value): a label at time t gets, for each offline view, the row whose
boundary B is the latest daily boundary ``<= t`` (``B = floor(t / 1 day) * 1 day``; that row
aggregates events strictly before B). The daily job writes a row for every entity with an event in
the view's longest window, so a missing row means empty windows (count 0, NaN, empty top_k), never
an older value. A label whose day has no computed partition is an error, not an empty value.
Realtime and nearline views are recomputed from their own source's bronze table as of t itself (each
feature's ``B_f = floor(t / S_f) * S_f``, :mod:`headwater.pipelines.offline.asof`): what serving reads
at t.

The user's side is read at the slate's start. A slate (one ``group`` of one user: a page the service
answered) was scored with ONE user vector read when the request came, so every row of a slate takes
the user views as of the slate's first impression ``s = min(event_time)`` over the slate, and the
on-demand features are computed at ``s`` too (the request's time). Joined at each row's own time
instead, a page's impressions seconds apart count into the later rows (``impressions_5m`` rose by one
per slot inside 99% of the demo's slates): the slot leaks into a user input, which no served ranker
can use. ``s <= t``, so the point-in-time rule holds a fortiori. Item views keep each row's own time
(an item's values do not count the slate's other items). Labels without a ``group`` column make
every row its own slate.

Output: the Parquet format ``headwater model train --training-set`` reads
(:mod:`headwater.ranking.trainset`): ``group``, ``user_id``, ``item_id``, ``event_time`` (ms),
``label``, then ``user.<slot>`` and ``item.<slot>`` float columns (the online vector slots of
the user and item views), registry version in the file metadata. On-demand features (``tier:
on_demand`` views) follow as ``pair.<feature>`` columns, computed from those slots and each label's
time by the service's own evaluator (:class:`headwater.ranking.on_demand.OnDemandProgram`).
When the labels carry ``position`` (``headwater labels`` writes it: the slot shown at), it follows
too (training only: the ranker's position-bias term, never a serving input).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from headwater.pipelines.offline.arrow_io import spark_batches, staging_dir
from headwater.pipelines.offline.asof import join_at_label_time
from headwater.pipelines.offline.compute import empty_filled
from headwater.pipelines.offline.heal import heals
from headwater.pipelines.offline.job import BronzeTables, computed_days
from headwater.pipelines.offline.lake import DAY_MS, FEATURE_TIME, feature_path, healed_path, is_delta_table
from headwater.pipelines.offline.vectors import IdLookup, pack
from headwater.pipelines.windows import compile_view, slot_names
from headwater.ranking.trainset_format import VERSION_KEY, VIEW_VERSIONS_KEY
from headwater.registry.errors import HeadwaterError
from headwater.registry.plans import PlanOnDemandView, PlanView, short_version, view_versions

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

LABEL_COLUMNS = ("group", "user_id", "item_id", "event_time", "label")
ENTITY_PREFIX = {"user_id": "user", "item_id": "item"}
LABEL_TIME_TIERS = frozenset({"realtime", "nearline"})
AS_SERVED, AS_CORRECTED = "as-served", "as-corrected"
"""``build_training_set(values=...)``: what the tiers served, or the healed values of ``late: heal`` views."""
"""Tiers whose views a training row takes as of the label time itself, recomputed from bronze."""
SLATE_TIME = "__slate_time"
"""Column of the slate's start (epoch ms): the time of the user views and of the on-demand features."""
_ROW_TIME = "__row_time"


class TrainingSetError(HeadwaterError, ValueError):
    """Labels or feature tables do not allow a point-in-time join; the message says what to do."""


@dataclass(frozen=True)
class TrainingSetResult:
    """What was written."""

    path: Path
    rows: int
    positives: int
    columns: list[str]


def read_labels(spark: SparkSession, path: Path) -> DataFrame:
    """Read labels (Parquet file/folder or Delta table): user_id, item_id, event_time ms, label[, group]."""
    from pyspark.sql import functions as F

    fmt = "delta" if is_delta_table(path) else "parquet"
    frame = spark.read.format(fmt).load(str(path))
    missing = [c for c in ("user_id", "item_id", "event_time", "label") if c not in frame.columns]
    if missing:
        msg = (f"labels {path}: missing column(s) {missing}; expected user_id, item_id, event_time "
               f"(epoch ms), label and optionally group; found {frame.columns}")  # fmt: skip
        raise TrainingSetError(msg)
    if "group" not in frame.columns:  # no slates known: every label is its own slate
        frame = frame.withColumn("group", F.monotonically_increasing_id())
    position = [F.col("position").cast("long")] if "position" in frame.columns else []
    return frame.select(
        F.col("group").cast("long"), "user_id", "item_id", F.col("event_time").cast("long"),
        F.col("label").cast("float"), *position,
    )  # fmt: skip


def join_view(
    spark: SparkSession, labels: DataFrame, view: PlanView, lake: Path, prefix: str, healed: bool = False
) -> DataFrame:
    """Add ``view``'s values valid at each label's time (columns ``<prefix>.<feature>``).

    ``healed``: from the view's healed table (late events counted, :mod:`headwater.pipelines.offline.heal`).

    Raises:
        TrainingSetError: the feature table is missing or lacks a partition the labels need.
    """
    from pyspark.sql import functions as F

    path = healed_path(lake, view.name) if healed else feature_path(lake, view.name)
    if not is_delta_table(path):
        what = "healed values" if healed else "feature table"
        msg = f"view {view.name}: no {what} at {path}; compute it with `headwater run offline`"
        raise TrainingSetError(msg)
    table = spark.read.format("delta").load(str(path))
    _check_coverage(computed_days(spark, path), labels, view)
    key = view.join_key
    features = table.select(
        F.col(key).alias(f"__{prefix}_key"),
        F.unix_millis(F.col(FEATURE_TIME)).alias("__asof"),
        *[F.col(f"`{f.name}`").alias(f"{prefix}.{f.name}") for f in view.features],
    )
    on = (F.col(key) == F.col(f"__{prefix}_key")) & (F.col("__asof") == F.col("__boundary"))
    joined = labels.join(features, on, "left").drop(f"__{prefix}_key", "__asof")
    renamed = [empty_filled(f.model_copy(update={"name": f"{prefix}.{f.name}"})) for f in view.features]
    keep = [F.col(f"`{c}`") for c in labels.columns]
    return joined.select(*keep, *renamed)


def _check_coverage(have: set[date], labels: DataFrame, view: PlanView) -> None:
    from pyspark.sql import functions as F

    need = {
        r["d"]
        for r in labels.select(F.to_date(F.timestamp_millis(F.col("__boundary") - F.lit(1))).alias("d"))
        .distinct()
        .collect()
    }
    missing = sorted(need - have)
    if missing:
        msg = (f"view {view.name}: the labels need the values as of the end of {len(missing)} day(s) the "
               f"feature table does not have ({', '.join(map(str, missing[:5]))}...); run "
               f"`headwater run offline --backfill {missing[0]} {missing[-1]}`")  # fmt: skip
        raise TrainingSetError(msg)


def build_training_set(
    spark: SparkSession,
    labels: DataFrame,
    views: Sequence[PlanView],
    lake: Path,
    out: Path,
    registry_hash: str,
    ids: IdLookup,
    bronze: BronzeTables | None = None,
    on_demand: Sequence[PlanOnDemandView] = (),
    values: str = AS_SERVED,
) -> TrainingSetResult:
    """Join ``labels`` to the user and item ``views`` point in time; write Parquet to ``out``.

    User views are joined as of each slate's start and item views as of each label's own time (see
    the module docstring). Offline views are read from their daily tables (the value as of the
    day boundary is what a daily view serves). Realtime and nearline views are recomputed from their
    own source's table in ``bronze`` as of the time itself (:mod:`.asof`), since their daily values
    would not be what serving reads.

    ``values``: :data:`AS_SERVED` (late events dropped, as served) or :data:`AS_CORRECTED` (a ``late:
    heal`` view's values count its late events: its healed table, or its recomputation with them;
    the other views as served).

    Raises:
        TrainingSetError: a streaming view is asked for without ``bronze``, or a table lacks a day,
            or ``values`` is neither.
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    if values not in (AS_SERVED, AS_CORRECTED):
        msg = f"training-set values {values!r}: expected {AS_SERVED!r} or {AS_CORRECTED!r}"
        raise TrainingSetError(msg)
    labels = labels.cache()  # read once: every label-time view takes its (entity, time) targets from it
    # The user side at the slate's start: event_time holds the slate's start while the user views join.
    slate = Window.partitionBy("group", "user_id")
    at_start = (
        labels.withColumn(_ROW_TIME, F.col("event_time"))
        .withColumn("event_time", F.min("event_time").over(slate))
        .cache()
    )
    joins = [v for v in views if v.join_key in ENTITY_PREFIX]
    frame = at_start
    for side, targets in (("user_id", at_start), ("item_id", labels)):
        if side == "item_id":  # back to each row's own time; the slate's start stays for on-demand
            frame = frame.withColumn(SLATE_TIME, F.col("event_time")).withColumn(
                "event_time", F.col(_ROW_TIME)
            )
            frame = frame.drop(_ROW_TIME)
        frame = frame.withColumn("__boundary", F.floor(F.col("event_time") / F.lit(DAY_MS)) * F.lit(DAY_MS))
        for view in (v for v in joins if v.join_key == side):
            frame = _join(spark, frame, targets, view, lake, bronze, values == AS_CORRECTED and heals(view))
        frame = frame.drop("__boundary")
    used = joins
    out.parent.mkdir(parents=True, exist_ok=True)
    rows = positives = 0
    writer: pq.ParquetWriter | None = None
    columns: list[str] = []
    with staging_dir(lake / "_staging") as folder:
        for part in spark_batches(frame, folder):
            table = _flatten(part, used, ids, registry_hash, on_demand)
            if writer is None:
                writer = pq.ParquetWriter(out, table.schema)
                columns = table.column_names
            writer.write_table(table)
            rows += table.num_rows
            positives += int(np.count_nonzero(table.column("label").to_numpy() > 0))
    if writer is None:
        msg = "no label rows: nothing to write"
        raise TrainingSetError(msg)
    writer.close()
    return TrainingSetResult(out, rows, positives, columns)


def _join(
    spark: SparkSession,
    frame: DataFrame,
    targets: DataFrame,
    view: PlanView,
    lake: Path,
    bronze: BronzeTables | None,
    healed: bool = False,
) -> DataFrame:
    """Add ``view``'s columns as of ``frame``'s ``event_time`` (``targets``: the same times, plain).

    ``healed``: the values with the late events counted.
    """
    if view.tier not in LABEL_TIME_TIERS:
        return join_view(spark, frame, view, lake, f"{view.name}", healed)
    if bronze is None:
        msg = f"view {view.name} ({view.tier}): its label-time values need the bronze events"
        raise TrainingSetError(msg)
    table, source = bronze.for_view(view)
    return join_at_label_time(frame, table, view, source, targets_from=targets, with_late=healed)


def _on_demand_columns(
    columns: dict[str, pa.Array], views: Sequence[PlanView], on_demand: Sequence[PlanOnDemandView]
) -> dict[str, pa.Array]:
    """Compute the ``pair.<feature>`` columns with the service's evaluator, at each slate's start.

    ``columns[SLATE_TIME]`` is the time the service computed them at (the request's); without it,
    each label's own time.
    """
    from headwater.ranking.on_demand import PAIR_PREFIX, OnDemandBindingError, OnDemandProgram

    by_side: dict[str, list[tuple[str, tuple[str, ...]]]] = {"user": [], "item": []}
    for view in views:
        if view.join_key in ENTITY_PREFIX:
            by_side[ENTITY_PREFIX[view.join_key]].append((view.name, slot_names(compile_view(view))))
    ref = {
        side: {f"{v}.{s}": f"{side}.{s}" for v, slots in pairs for s in slots}
        for side, pairs in by_side.items()
    }
    try:
        program = OnDemandProgram.bind(
            on_demand, dict.fromkeys(ref["user"], 0), dict.fromkeys(ref["item"], 0)
        )
    except OnDemandBindingError as exc:
        raise TrainingSetError(str(exc)) from exc
    slots = {**ref["user"], **ref["item"]}
    values = {
        name: np.asarray(columns[slots[name]].to_numpy(zero_copy_only=False), dtype=np.float64)
        for name in (*program.user_columns, *program.item_columns)
    }
    at = SLATE_TIME if SLATE_TIME in columns else "event_time"
    times = np.asarray(columns[at].to_numpy(zero_copy_only=False), dtype=np.int64)
    computed = program.compute_columns(values, times, len(times))
    return {PAIR_PREFIX + name: pa.array(v.astype(np.float32)) for name, v in computed.items()}


def _flatten(
    part: pa.Table,
    views: Sequence[PlanView],
    ids: IdLookup,
    registry_hash: str,
    on_demand: Sequence[PlanOnDemandView] = (),
) -> pa.Table:
    """Label columns, each view's online-vector slots as float32 ``user.<slot>``/``item.<slot>``.

    Then the on-demand features, as ``pair.<feature>``.
    """
    columns: dict[str, pa.Array] = {name: part.column(name) for name in LABEL_COLUMNS}
    if "position" in part.column_names:  # the slot shown at, when the labels carry it (training only)
        columns["position"] = part.column("position")
    for view in views:
        spec = compile_view(view)
        renamed = part.select([f"{view.name}.{f.name}" for f in view.features]).rename_columns(
            [f.name for f in view.features]
        )
        matrix = pack(spec, renamed, ids)
        prefix = ENTITY_PREFIX[view.join_key]
        for j, slot in enumerate(slot_names(spec)):
            name = f"{prefix}.{slot}"
            if name in columns:
                msg = f"feature slot {slot!r} of view {view.name} repeats another {prefix} view's slot"
                raise TrainingSetError(msg)
            columns[name] = pa.array(matrix[:, j])
    if on_demand:
        times = {SLATE_TIME: part.column(SLATE_TIME)} if SLATE_TIME in part.column_names else {}
        columns.update(_on_demand_columns({**columns, **times}, views, on_demand))
    table = pa.table(columns)
    return table.replace_schema_metadata(
        {
            VERSION_KEY: short_version(registry_hash).encode(),
            VIEW_VERSIONS_KEY: json.dumps(view_versions(views), sort_keys=True).encode(),
        }
    )
