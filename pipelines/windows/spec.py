"""Compiled window specs: a plan view turned into what the window code evaluates per event.

:func:`compile_view` reads a :class:`~headwater.registry.plans.PlanView` once and gives, per
feature, the window and slide in integer milliseconds, the filter as a fast predicate (the
registry's three-valued :mod:`~headwater.registry.expr_eval`), the field and ``k``; a ratio
gets one :class:`OperandSpec` per side. Every tier builds its windows from this, so the
arithmetic (epoch-aligned hopping windows, ``B = floor(T / S) * S``) lives in one place.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from headwater.registry.aggs import AGG_NAMES
from headwater.registry.errors import HeadwaterError
from headwater.registry.expr import Compare, InList, from_json
from headwater.registry.expr_eval import compile_predicate
from headwater.registry.plans import PlanFeature, PlanOperand, PlanView, PlanWhere

Event = Mapping[str, Any]
Predicate = Callable[[Event], bool]
ALL_AGGS = frozenset(AGG_NAMES)
SCALAR_AGGS = ALL_AGGS - {"top_k", "ratio"}


class WindowSpecError(HeadwaterError, ValueError):
    """A plan feature cannot be turned into a window (unknown aggregation, bad window)."""


@dataclass(frozen=True)
class OperandSpec:
    """One side of a ratio: a scalar aggregation with its own (already combined) filter."""

    agg: str
    field: str | None
    predicate: Predicate
    where_key: str | None = None
    """As :attr:`FeatureSpec.where_key`: ``""`` no filter, None unknown."""


@dataclass(frozen=True)
class FeatureSpec:
    """One feature, ready to evaluate: window/slide in ms, filter predicate, field, k, operands."""

    name: str
    agg: str
    window_ms: int
    slide_ms: int
    predicate: Predicate
    field: str | None = None
    k: int = 0
    numerator: OperandSpec | None = None
    denominator: OperandSpec | None = None
    where_key: str | None = None
    """Canonical text of the filter: features with the same key keep the same events, so a tier
    evaluates each distinct filter once per event. ``""``: no filter (every event passes);
    None: unknown (a hand-built spec), the predicate is called for this feature alone."""

    def boundary(self, as_of_ms: int) -> int:
        """Return the latest pane boundary ``B <= as_of_ms`` (epoch-aligned, UTC)."""
        return (as_of_ms // self.slide_ms) * self.slide_ms

    def window_start(self, as_of_ms: int) -> int:
        """Start of the window that is complete at ``as_of_ms``: ``B - W``."""
        return self.boundary(as_of_ms) - self.window_ms

    def pane(self, event_time_ms: int) -> int:
        """Start of the pane (of this feature's slide) that holds ``event_time_ms``."""
        return (event_time_ms // self.slide_ms) * self.slide_ms


@dataclass(frozen=True)
class ViewSpec:
    """A view's features plus what every tier needs: join key, tick and longest window."""

    name: str
    entity: str
    join_key: str
    features: tuple[FeatureSpec, ...]
    version: str = ""
    """The view's version (:func:`headwater.registry.plans.view_version`): stamped on every value and
    namespacing the streaming state, so an edit that does not change a view's values keeps both."""

    @property
    def tick_ms(self) -> int:
        """The view's publish step: gcd of its features' slides (each feature's B moves on a multiple)."""
        tick = 0
        for f in self.features:
            tick = math.gcd(tick, f.slide_ms)
        return tick

    @property
    def longest_window_ms(self) -> int:
        """The longest window of the view; state older than this (before the boundary) is dead."""
        return max(f.window_ms for f in self.features)


def _ms(seconds: float, what: str, where: str) -> int:
    ms = round(seconds * 1000)
    if ms <= 0:
        msg = f"{where}: {what} must be > 0 ms; the plan says {seconds} s (re-run `headwater apply`)"
        raise WindowSpecError(msg)
    return ms


def _predicate(where: PlanWhere | None) -> Predicate:
    """Return the filter as a closure; ``field = literal`` and ``field in (...)`` get a direct one.

    Both shortcuts keep the three-valued meaning: a null or missing field equals no literal
    (literals are never null), so ``unknown`` and ``false`` both drop the event, as in SQL.
    """
    expr = from_json(where.ast) if where is not None else None
    if isinstance(expr, Compare) and expr.op in ("=", "==") and expr.value is not None:
        name, value = expr.field, expr.value
        return lambda event: bool(event.get(name) == value)
    if isinstance(expr, InList) and not expr.negated and None not in expr.values:
        name, values = expr.field, frozenset(expr.values)
        return lambda event: event.get(name) in values
    return compile_predicate(expr)


def _where_key(where: PlanWhere | None) -> str:
    return "" if where is None else json.dumps(where.ast, sort_keys=True, separators=(",", ":"))


def _operand(op: PlanOperand | None, feature: str, side: str) -> OperandSpec:
    if op is None or op.agg not in SCALAR_AGGS:
        found = "nothing" if op is None else op.agg
        msg = f"feature {feature!r}: ratio {side} must be one of {sorted(SCALAR_AGGS)}; found {found}"
        raise WindowSpecError(msg)
    return OperandSpec(
        agg=op.agg, field=op.field, predicate=_predicate(op.where), where_key=_where_key(op.where)
    )


def compile_feature(f: PlanFeature, view: str) -> FeatureSpec:
    """Compile one plan feature (raises :class:`WindowSpecError` naming view and feature)."""
    where = f"view {view!r} feature {f.name!r}"
    if f.agg not in ALL_AGGS:
        msg = f"{where}: aggregation {f.agg!r} is not one of {sorted(ALL_AGGS)}; upgrade headwater"
        raise WindowSpecError(msg)
    window_ms, slide_ms = _ms(f.window_s, "window", where), _ms(f.slide_s, "slide", where)
    if window_ms % slide_ms:
        msg = f"{where}: slide {slide_ms} ms must divide window {window_ms} ms"
        raise WindowSpecError(msg)
    if f.agg == "top_k" and not (f.k or 0) > 0:
        msg = f"{where}: top_k needs k >= 1; found {f.k}"
        raise WindowSpecError(msg)
    num = den = None
    predicate = _predicate(f.where)
    where_key = _where_key(f.where)
    if f.agg == "ratio":
        num, den = _operand(f.numerator, f.name, "numerator"), _operand(f.denominator, f.name, "denominator")
        pn, pd = num.predicate, den.predicate
        predicate = lambda event: pn(event) or pd(event)  # noqa: E731  (each side keeps its own filter)
        where_key = "" if not num.where_key or not den.where_key else f"or({num.where_key},{den.where_key})"
    return FeatureSpec(
        name=f.name,
        agg=f.agg,
        window_ms=window_ms,
        slide_ms=slide_ms,
        predicate=predicate,
        field=f.field,
        k=f.k or 0,
        numerator=num,
        denominator=den,
        where_key=where_key,
    )


def compile_view(view: PlanView) -> ViewSpec:
    """Compile every feature of ``view`` in plan order."""
    return ViewSpec(
        name=view.name,
        entity=view.entity,
        join_key=view.join_key,
        features=tuple(compile_feature(f, view.name) for f in view.features),
        version=view.version,
    )
