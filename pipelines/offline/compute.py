"""Compute one view's feature values at a set of boundaries (see :mod:`.aggregate` for the method)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from headwater.pipelines.offline.aggregate import (
    BOUNDARY,
    EVENT_MS,
    SCALAR_AGGS,
    TIE,
    VALUE_AGGS,
    VALUE_OPERAND_AGGS,
    AggregationError,
    Progression,
    attach,
    feature_partials,
    feature_values,
    in_window,
    ms,
    pane_ms,
    ratio_sides,
    ratio_value,
)
from headwater.pipelines.offline.source_columns import event_ms
from headwater.registry.plans import PlanFeature, PlanSource, PlanView, PlanWhere

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

TOP_K_TYPE = "array<struct<value:string,share:double>>"


def view_events(bronze: DataFrame, view: PlanView, source: PlanSource, with_late: bool = False) -> DataFrame:
    """Return the events a view aggregates, from its source's bronze rows.

    On time (not ``late``; ``with_late``: the late ones too, the healed values of a ``late: heal``
    view), one per event id when the source declares one (``event_id``; none: every row counts),
    with an entity id; plus :data:`EVENT_MS` (the event time in ms) and :data:`TIE` (the event id,
    else the Kafka position: what orders two events of one ms for ``last``).
    """
    from pyspark.sql import functions as F

    key = view.join_key
    on_time = (
        bronze.where(~F.coalesce(F.col("late"), F.lit(False)))
        if "late" in bronze.columns and not with_late
        else bronze
    )
    rows = on_time.where(F.col(f"`{key}`").isNotNull())
    if source.event_id is not None:
        rows = rows.dropDuplicates([source.event_id])
        tie = F.col(f"`{source.event_id}`").cast("string")
    else:
        tie = F.format_string("%010d/%020d", F.coalesce("kafka_partition", F.lit(-1)),
                              F.coalesce("kafka_offset", F.lit(-1)))  # fmt: skip
    return rows.select("*", event_ms(source).alias(EVENT_MS), tie.alias(TIE))


def _check(view: PlanView) -> None:
    for f in view.features:
        if f.agg not in SCALAR_AGGS | VALUE_AGGS:
            msg = (f"view {view.name} ({view.defined_at}): feature {f.name!r} has aggregation {f.agg!r}, "
                   f"which the offline tier cannot compute; expected one of "
                   f"{sorted(SCALAR_AGGS | VALUE_AGGS)}")  # fmt: skip
            raise AggregationError(msg)


def attach_window_ms(view: PlanView) -> int:
    """How far back from T a pane may be and still be in some feature's window of T."""
    return max(ms(f.window_s) + ms(f.slide_s) for f in view.features)


def compute_view(events: DataFrame, view: PlanView, at: Progression | DataFrame) -> DataFrame:
    """Values of ``view`` per (entity, T): columns ``<join_key>``, ``event_time_ms``, then the features.

    ``events`` come from :func:`view_events`. With a :class:`Progression`, rows exist for the entities
    with an event in the longest window before each T; with a frame of targets (``<join_key>``,
    ``event_time_ms``), one row per target.
    """
    from pyspark.sql import functions as F

    _check(view)
    key, pane = view.join_key, pane_ms(view)
    panes = events.withColumn("pane_start", F.floor(F.col(EVENT_MS) / F.lit(pane)) * F.lit(pane))
    partials = panes.groupBy(key, "pane_start").agg(*scalar_partials(view))

    def counts(prefix: str, field: str | None, where: PlanWhere | None) -> DataFrame:
        return pane_value_counts(panes, key, field, where)

    return combine_partials(partials, counts, view, pane, at)


ValueCounts = Callable[[str, str | None, PlanWhere | None], "DataFrame"]
"""Given a counted column's prefix (a value feature's name, a ratio side's ``<name>__num``), its field
and filter: the frame of (``<join_key>``, ``pane_start``, ``value``, ``c``) counts per pane."""


def scalar_partials(view: PlanView) -> list[Column]:
    """Return the per-pane partial columns of the view: ``__events`` then each scalar feature's parts."""
    from pyspark.sql import functions as F

    cols = [F.count(F.lit(1)).alias("__events")]
    for f in view.features:
        if f.agg in SCALAR_AGGS:
            cols.extend(feature_partials(f))
    return cols


def counted_columns(view: PlanView) -> list[tuple[str, str | None, PlanWhere | None]]:
    """Return (prefix, field, filter) of what is counted per value: value features, value ratio operands."""
    out: list[tuple[str, str | None, PlanWhere | None]] = []
    for f in view.features:
        if f.agg in VALUE_AGGS:
            out.append((f.name, f.field, f.where))
        elif f.agg == "ratio":
            out.extend(
                (prefix, op.field, op.where) for prefix, op in ratio_sides(f) if op.agg in VALUE_OPERAND_AGGS
            )
    return out


def combine_partials(
    partials: DataFrame, counts: ValueCounts, view: PlanView, pane: int, at: Progression | DataFrame,
    live: Column | None = None, reach: int | None = None,
) -> DataFrame:  # fmt: skip
    """Values of ``view`` per (entity, T) from per-pane partials (:func:`scalar_partials`) ``pane`` ms wide.

        ``counts`` gives each counted column's per-pane value counts (:data:`ValueCounts`); ``live``, when
        given, keeps only the attached (pane, T) pairs where it holds (the tiles' row rule); ``reach``: how
    far after a pane's start a T may be attached (default :func:`attach_window_ms`).
    """
    from pyspark.sql import functions as F

    key = view.join_key
    scalars = [f for f in view.features if f.agg in SCALAR_AGGS]
    attached = attach(partials, key, pane, reach or attach_window_ms(view), at)
    if live is not None:
        attached = attached.where(live)
    values = attached.groupBy(key, BOUNDARY).agg(
        F.sum("__events").alias("__events"), *[c for f in scalars for c in feature_values(f, pane)]
    )
    if not isinstance(at, Progression):
        values = at.select(key, BOUNDARY).join(values, [key, BOUNDARY], "left")
    for f in view.features:
        if f.agg in VALUE_AGGS:
            windowed = _windowed(counts(f.name, f.field, f.where), key, f, pane, at)
            values = values.join(_value_feature(windowed, key, f), [key, BOUNDARY], "left")
        elif f.agg == "ratio":
            for prefix, op in ratio_sides(f):
                if op.agg in VALUE_OPERAND_AGGS:
                    windowed = _windowed(counts(prefix, op.field, op.where), key, f, pane, at)
                    distinct = windowed.groupBy(key, BOUNDARY).agg(F.count(F.lit(1)).alias(prefix))
                    values = values.join(distinct, [key, BOUNDARY], "left")
            values = values.withColumn(f.name, ratio_value(f))
    return values.select(
        key, F.col(BOUNDARY).cast("long").alias(BOUNDARY), *[empty_filled(f) for f in view.features]
    )


def empty_filled(feature: PlanFeature) -> Column:
    """Empty windows: count, sum, distinct_count -> 0; top_k -> []; the rest stay null."""
    from pyspark.sql import functions as F

    col = F.col(f"`{feature.name}`")
    if feature.agg in ("count", "distinct_count"):
        col = F.coalesce(col, F.lit(0)).cast("long")
    elif feature.agg == "sum":
        col = F.coalesce(col.cast("double"), F.lit(0.0))
    elif feature.agg == "top_k":
        col = F.coalesce(col, F.expr(f"cast(array() as {TOP_K_TYPE})"))
    elif feature.agg == "last" and feature.dtype == "string":
        col = col.cast("string")
    else:
        col = col.cast("double")
    return col.alias(feature.name)


def pane_value_counts(panes: DataFrame, key: str, field: str | None, where: PlanWhere | None) -> DataFrame:
    """Count each non-null value of ``field`` (rows passing ``where``) per (entity, pane)."""
    from pyspark.sql import functions as F

    cond = F.expr(where.sql["spark"]) if where is not None else F.lit(True)
    column = F.col(f"`{field}`")
    return (
        panes.where(cond & column.isNotNull())
        .groupBy(key, "pane_start", column.cast("string").alias("value"))
        .agg(F.count(F.lit(1)).alias("c"))
    )


def _windowed(
    counts: DataFrame, key: str, f: PlanFeature, pane: int, at: Progression | DataFrame
) -> DataFrame:
    """Per (entity, T, value), the count of the value in ``f``'s window (from per-pane counts)."""
    from pyspark.sql import functions as F

    attached = attach(counts, key, pane, ms(f.window_s) + ms(f.slide_s), at).where(in_window(f, pane))
    return attached.groupBy(key, BOUNDARY, "value").agg(F.sum("c").alias("c"))


def _value_feature(per_value: DataFrame, key: str, f: PlanFeature) -> DataFrame:
    """distinct_count or top_k of one feature per (entity, T), from its per-value counts."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    if f.agg == "distinct_count":
        return per_value.groupBy(key, BOUNDARY).agg(F.count(F.lit(1)).alias(f.name))
    group = Window.partitionBy(key, BOUNDARY)
    ranked = per_value.select(
        "*",
        F.row_number().over(group.orderBy(F.col("c").desc(), F.col("value").asc())).alias("rank"),
        F.sum("c").over(group).alias("total"),
    ).where(F.col("rank") <= F.lit(f.k or 1))
    entries = F.struct(F.col("rank"), F.col("value"), (F.col("c") / F.col("total")).alias("share"))
    listed = ranked.groupBy(key, BOUNDARY).agg(F.array_sort(F.collect_list(entries)).alias("__list"))
    return listed.select(
        key,
        BOUNDARY,
        F.expr("transform(__list, x -> struct(x.value as value, x.share as share))").alias(f.name),
    )
