"""The window semantics (docs/concepts/windows.md) as Spark expressions: one view's values at boundaries.

Algorithm (no event is copied once per window it falls in):

1. Events of the view, read from its own source's bronze table: not ``late``, one per event id
   (when the source declares one), with a non-null entity id, and the event time in ms
   (:data:`EVENT_MS`, whatever the source's field and unit).
2. Partials per (entity, pane), a pane being ``Q`` ms wide, ``Q`` = gcd of the view's slides:
   for each feature, the part of its aggregation over the pane (count, sum, min, max, the
   ``(event time, tie-breaker, value)`` struct for ``last``, both operands of a ratio). Distinct
   counts and top-k (and a ratio's distinct-count operand) keep one row per (entity, pane, value)
   with its count.
3. Each pane is attached to the boundaries whose longest window holds it: a sequence of
   boundaries ``first + j * step`` (the daily job) or per-entity target times (consistency).
4. Per (entity, boundary) and feature, the panes inside that feature's own window
   ``[B_f - W_f, B_f)`` (``B_f = floor(T / S_f) * S_f``) are combined into the value.

Missing values are SQL nulls in the output (count/sum/distinct_count are 0 instead, top-k an
empty list); :mod:`headwater.pipelines.offline.vectors` turns nulls into NaN.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import reduce
from typing import TYPE_CHECKING

from headwater.registry.aggs import AGG_NAMES
from headwater.registry.errors import HeadwaterError
from headwater.registry.plans import PlanFeature, PlanOperand, PlanView, PlanWhere

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

VALUE_AGGS = frozenset({"distinct_count", "top_k"})
SCALAR_AGGS = frozenset(AGG_NAMES) - VALUE_AGGS
BOUNDARY = "event_time_ms"
"""Column of the boundary T (epoch ms) in the computed frames."""
EVENT_MS = "__event_ms"
"""Column of a view's events: the source's event time in UTC epoch ms."""
TIE = "__tie"
"""Column of a view's events: what orders two events of the same ms for ``last`` (the event id)."""
VALUE_OPERAND_AGGS = frozenset({"distinct_count"})
"""Ratio operands computed from per-value counts, not from per-pane partials."""


class AggregationError(HeadwaterError, ValueError):
    """A view cannot be computed as asked (unknown aggregation, slide not dividing the step)."""


@dataclass(frozen=True)
class Progression:
    """Boundaries ``first_ms + j * step_ms`` for ``j`` in ``0..count-1`` (the daily job)."""

    first_ms: int
    step_ms: int
    count: int

    @property
    def last_ms(self) -> int:
        """The last boundary."""
        return self.first_ms + (self.count - 1) * self.step_ms


def ms(seconds: float) -> int:
    """Seconds (from a plan) to integer milliseconds."""
    return round(seconds * 1000)


def pane_ms(view: PlanView) -> int:
    """Pane width: the gcd of the view's slides, in ms."""
    return reduce(math.gcd, (ms(f.slide_s) for f in view.features))


def max_window_ms(view: PlanView) -> int:
    """Return the view's longest window, in ms."""
    return max(ms(f.window_s) for f in view.features)


def _cond(where: PlanWhere | None) -> Column:
    from pyspark.sql import functions as F

    return F.expr(where.sql["spark"]) if where is not None else F.lit(True)


def _col(name: str | None) -> Column:
    from pyspark.sql import functions as F

    return F.col(f"`{name}`")


def _operand_partials(prefix: str, agg: str, field: str | None, where: PlanWhere | None) -> list[Column]:
    """Partial columns of one aggregation over one pane (named ``<prefix>__<part>``)."""
    from pyspark.sql import functions as F

    cond = _cond(where)
    if agg == "count":
        keep = cond if field is None else cond & _col(field).isNotNull()
        return [F.count(F.when(keep, F.lit(1))).alias(f"{prefix}__n")]
    value = F.when(cond, _col(field).cast("double"))
    if agg == "sum":
        return [F.sum(value).alias(f"{prefix}__s")]
    if agg == "avg":
        return [F.sum(value).alias(f"{prefix}__s"), F.count(value).alias(f"{prefix}__n")]
    if agg in ("min", "max"):
        return [getattr(F, agg)(value).alias(f"{prefix}__{agg}")]
    if agg == "last":
        record = F.struct(F.col(EVENT_MS), F.col(TIE), _col(field).cast("string").alias("v"))
        return [F.max(F.when(cond, record)).alias(f"{prefix}__last")]
    msg = (
        f"aggregation {agg!r} cannot be computed offline (operand {prefix!r}); "
        f"expected one of {sorted(SCALAR_AGGS)}"
    )
    raise AggregationError(msg)


def _operand_value(prefix: str, agg: str, inside: Column) -> Column:
    """Combine the partials of the panes where ``inside`` holds into the aggregation's value."""
    from pyspark.sql import functions as F

    def part(name: str, how: str = "sum") -> Column:
        combined: Column = getattr(F, how)(F.when(inside, F.col(f"{prefix}__{name}")))
        return combined

    if agg == "count":
        return F.coalesce(part("n"), F.lit(0)).cast("long")
    if agg == "sum":
        return F.coalesce(part("s"), F.lit(0.0))
    if agg == "avg":
        n = part("n")
        return F.when(n > 0, part("s") / n)
    if agg in ("min", "max"):
        return part(agg, agg)
    return part("last", "max").getField("v")


def ratio_sides(feature: PlanFeature) -> list[tuple[str, PlanOperand]]:
    """Return a ratio's operands, each with the prefix of its columns (``<name>__num``, ``__den``)."""
    num, den = _operands(feature)
    return [(f"{feature.name}__num", num), (f"{feature.name}__den", den)]


def feature_partials(feature: PlanFeature) -> list[Column]:
    """Partial columns of a scalar feature (a ratio's operands but those in :data:`VALUE_OPERAND_AGGS`)."""
    if feature.agg == "ratio":
        return [
            part
            for prefix, op in ratio_sides(feature)
            if op.agg not in VALUE_OPERAND_AGGS
            for part in _operand_partials(prefix, op.agg, op.field, op.where)
        ]
    return _operand_partials(feature.name, feature.agg, feature.field, feature.where)


def _operands(feature: PlanFeature) -> tuple[PlanOperand, PlanOperand]:
    if feature.numerator is None or feature.denominator is None:
        msg = (
            f"ratio feature {feature.name!r} has no numerator or denominator in the plan; "
            "re-run `headwater apply`"
        )
        raise AggregationError(msg)
    return feature.numerator, feature.denominator


def in_window(feature: PlanFeature, pane: int) -> Column:
    """Whether the pane ``[pane_start, pane_start + pane)`` lies in the feature's window of T."""
    from pyspark.sql import functions as F

    slide, window = ms(feature.slide_s), ms(feature.window_s)
    boundary = F.floor(F.col(BOUNDARY) / F.lit(slide)) * F.lit(slide)
    start = F.col("pane_start")
    return (start >= boundary - F.lit(window)) & (start + F.lit(pane) <= boundary)


def feature_values(feature: PlanFeature, pane: int) -> list[Column]:
    """Return the feature's value at T from the attached partials (a ratio: its scalar operands).

    A ratio's operands come out as ``<name>__num``/``<name>__den`` (doubles); :func:`ratio_value`
    divides them once the value operands (distinct counts) are joined in.
    """
    inside = in_window(feature, pane)
    if feature.agg != "ratio":
        return [_operand_value(feature.name, feature.agg, inside).alias(feature.name)]
    return [
        _operand_value(prefix, op.agg, inside).cast("double").alias(prefix)
        for prefix, op in ratio_sides(feature)
        if op.agg not in VALUE_OPERAND_AGGS
    ]


def ratio_value(feature: PlanFeature) -> Column:
    """``numerator / denominator`` from the operand columns (null when the denominator is 0 or null)."""
    from pyspark.sql import functions as F

    (num_name, num), (den_name, den) = ratio_sides(feature)

    def side(name: str, op: PlanOperand) -> Column:
        col = F.col(f"`{name}`").cast("double")
        # A distinct count over no value is 0 (its per-value frame simply has no row).
        return F.coalesce(col, F.lit(0.0)) if op.agg in VALUE_OPERAND_AGGS else col

    n, d = side(num_name, num), side(den_name, den)
    return F.when(d != 0, n / d).alias(feature.name)


def attach(partials: DataFrame, key: str, pane: int, window: int, at: Progression | DataFrame) -> DataFrame:
    """Pair each pane row with the boundaries T whose window of ``window`` ms may hold it.

    ``at`` is a :class:`Progression`, or a frame of (``key``, ``event_time_ms``) targets.
    """
    from pyspark.sql import functions as F

    start = F.col("pane_start")
    if isinstance(at, Progression):
        lo = F.greatest(F.ceil((start + F.lit(pane - at.first_ms)) / F.lit(at.step_ms)), F.lit(0))
        hi = F.least(F.floor((start + F.lit(window - at.first_ms)) / F.lit(at.step_ms)), F.lit(at.count - 1))
        j = F.explode(F.sequence(lo.cast("long"), hi.cast("long")))
        rows = partials.where(lo <= hi).select("*", j.alias("__j"))
        return rows.withColumn(BOUNDARY, F.lit(at.first_ms) + F.col("__j") * F.lit(at.step_ms)).drop("__j")
    targets = at.select(F.col(key).alias("__target"), F.col(BOUNDARY))
    t = F.col(BOUNDARY)
    cond = (F.col("__target") == F.col(key)) & (start + F.lit(pane) <= t) & (start >= t - F.lit(window))
    return partials.join(targets, cond).drop("__target")
