"""Feature values as of each label's own time, recomputed from the bronze events, for views of any tier.

The offline tier's daily tables hold each view at day boundaries, which is what a daily view means
but not what a realtime or nearline view served at time T held: "clicks in the last 30 s" read at a
daily boundary is almost always 0, a train/serve skew. For those views a training row gets the value
the view defines as of the label time T itself (docs/concepts/windows.md:
``B_f = floor(T / S_f) * S_f``, events in
``[B_f - W_f, B_f)``), computed by the same Spark code as the daily tables
(:func:`headwater.pipelines.offline.compute.compute_view` with one target per (entity, T)), so no
event at or after the boundary, and therefore none from the label's future, can enter a value.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from headwater.pipelines.offline.aggregate import BOUNDARY
from headwater.pipelines.offline.compute import attach_window_ms, compute_view, view_events
from headwater.pipelines.offline.source_columns import time_between
from headwater.registry.plans import PlanSource, PlanView

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

LABEL_TIME = "event_time"
"""Column of the label time (epoch ms) in the labels frame (what ``headwater labels`` writes)."""


def values_at_label_time(
    bronze: DataFrame, labels: DataFrame, view: PlanView, source: PlanSource, with_late: bool = False
) -> DataFrame:
    """Return ``view``'s values per distinct (entity, label time): ``__key``, ``__t``, ``<view>.<feature>``.

    ``bronze`` is the table of the view's own ``source``. Only the events that can fall in a window of
    some label are read: from the earliest label time minus the view's reach to the latest label time.
    ``with_late``: the ``late`` rows count too (a ``late: heal`` view's as-corrected values).
    """
    from pyspark.sql import functions as F

    key = view.join_key
    targets = (
        labels.where(F.col(key).isNotNull())
        .select(F.col(key), F.col(LABEL_TIME).cast("long").alias(BOUNDARY))
        .distinct()
    )
    span = targets.agg(F.min(BOUNDARY).alias("lo"), F.max(BOUNDARY).alias("hi")).first()
    if span is None or span["lo"] is None:
        events = view_events(bronze, view, source, with_late).limit(0)
    else:
        window = time_between(source, int(span["lo"]) - attach_window_ms(view), int(span["hi"]))
        events = view_events(bronze.where(window), view, source, with_late)
    values = compute_view(events, view, targets)
    return values.select(
        F.col(key).alias("__key"),
        F.col(BOUNDARY).alias("__t"),
        *[F.col(f"`{f.name}`").alias(f"{view.name}.{f.name}") for f in view.features],
    )


def join_at_label_time(
    labels: DataFrame,
    bronze: DataFrame,
    view: PlanView,
    source: PlanSource,
    targets_from: DataFrame | None = None,
    with_late: bool = False,
) -> DataFrame:
    """Add ``<view>.<feature>`` columns to ``labels``: the view's values as of each label's time.

    Every label keeps exactly one row: an entity without events in a window gets the empty value
    (count 0, avg NaN, empty top_k), never an older one. ``targets_from`` (default ``labels``) is
    where the (entity, time) targets are read: pass the plain, cached labels when ``labels`` already
    carries other views' joins, or Spark recomputes those joins for every view that follows.
    ``with_late``: see :func:`values_at_label_time`.
    """
    from pyspark.sql import functions as F

    targets = labels if targets_from is None else targets_from
    values = values_at_label_time(bronze, targets, view, source, with_late)
    on = (F.col(view.join_key) == F.col("__key")) & (F.col(LABEL_TIME) == F.col("__t"))
    return labels.join(values, on, "left").drop("__key", "__t")
