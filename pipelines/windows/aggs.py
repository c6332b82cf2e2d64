"""Incremental aggregators: the partial state of one pane, how events fold in, how panes merge.

Every aggregation of docs/concepts/windows.md is a :class:`Agg` with a partial per pane: ``add`` folds one
event into a partial, ``merge`` combines the partials of the panes of a window, ``result``
gives the value (NaN for a missing value, the top_k list for top_k). Partials are plain
JSON-able data after :meth:`Agg.dump`, so a tier can keep them in RocksDB or Flink state and
ship them on a changelog. Semantics (binding, see docs/concepts/windows.md):

- ``count``: events (with a field: events where it is not null); empty -> 0.
- ``sum``/``avg``/``min``/``max``: over non-null values; empty -> 0 (sum) or NaN.
- ``last``: the field of the event with the greatest (event_time, event_id), even when that
  field is null (then NaN); empty -> NaN. String values are returned as str (the online vector
  maps them to dictionary ids).
- ``distinct_count``: distinct non-null values; empty -> 0.
- ``top_k``: the k most frequent non-null values, count desc then value asc, with
  share = count / non-null count; empty -> ().
- ``ratio``: numerator result / denominator result; NaN when the denominator is 0 or NaN.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from headwater.pipelines.windows.spec import FeatureSpec, OperandSpec

NAN = float("nan")
Ranked = tuple[tuple[Any, float], ...]
Value = float | str | Ranked
"""A feature value: a float (NaN = missing), a str (``last`` of a text field) or a top_k list."""


class Agg:
    """Base: a partial is created by :meth:`zero` and folded by :meth:`add` (returns the new partial)."""

    def __init__(self, field: str | None) -> None:
        self.field = field

    def zero(self) -> Any:
        """Return the partial of an empty pane."""
        return 0

    def add(self, p: Any, event: Mapping[str, Any]) -> Any:
        """Fold ``event`` (which passed the filter) into ``p``; return the new partial."""
        raise NotImplementedError

    def merge(self, a: Any, b: Any) -> Any:
        """Combine two partials (``a`` may be reused)."""
        return a + b

    def result(self, p: Any) -> Value:
        """Return the value of a window whose merged partial is ``p``."""
        return float(p)

    def dump(self, p: Any) -> Any:
        """Return a JSON-able form of ``p``."""
        return p

    def load(self, data: Any) -> Any:
        """Return the inverse of :meth:`dump`."""
        return data


class Count(Agg):
    """count, or count of non-null ``field``."""

    def add(self, p: Any, event: Mapping[str, Any]) -> Any:
        """Count the event (when the field, if any, is not null)."""
        if self.field is None or event.get(self.field) is not None:
            return p + 1
        return p


class Sum(Agg):
    """sum of non-null values; an empty window sums to 0."""

    def zero(self) -> Any:
        """0.0."""
        return 0.0

    def add(self, p: Any, event: Mapping[str, Any]) -> Any:
        """Add the field's value."""
        v = event.get(self.field or "")
        return p if v is None else p + v


class Avg(Agg):
    """Mean of non-null values: partial ``[sum, n]``."""

    def zero(self) -> Any:
        """[0.0, 0]."""
        return [0.0, 0]

    def add(self, p: Any, event: Mapping[str, Any]) -> Any:
        """Add the value to the sum and count it."""
        v = event.get(self.field or "")
        if v is not None:
            p[0] += v
            p[1] += 1
        return p

    def merge(self, a: Any, b: Any) -> Any:
        """Add sums and counts."""
        return [a[0] + b[0], a[1] + b[1]]

    def result(self, p: Any) -> Value:
        """Return sum / n, NaN when empty."""
        return p[0] / p[1] if p[1] else NAN

    def load(self, data: Any) -> Any:
        """Return a fresh list (partials are mutated in place)."""
        return list(data)


class _Extreme(Agg):
    pick = staticmethod(min)

    def zero(self) -> Any:
        return None

    def add(self, p: Any, event: Mapping[str, Any]) -> Any:
        v = event.get(self.field or "")
        if v is None:
            return p
        return v if p is None else self.pick(p, v)

    def merge(self, a: Any, b: Any) -> Any:
        if a is None:
            return b
        return a if b is None else self.pick(a, b)

    def result(self, p: Any) -> Value:
        return NAN if p is None else float(p)


class Min(_Extreme):
    """Smallest non-null value."""

    pick = staticmethod(min)


class Max(_Extreme):
    """Largest non-null value."""

    pick = staticmethod(max)


class Last(Agg):
    """Field of the event with the greatest (event_time, event_id): partial ``[t, id, value]``."""

    def zero(self) -> Any:
        """None (no event)."""
        return None

    def add(self, p: Any, event: Mapping[str, Any]) -> Any:
        """Keep the later event."""
        cand = [event["event_time"], event["event_id"], event.get(self.field or "")]
        return cand if p is None or (cand[0], cand[1]) > (p[0], p[1]) else p

    def merge(self, a: Any, b: Any) -> Any:
        """Return the later of both."""
        if a is None:
            return b
        return a if b is None or (a[0], a[1]) >= (b[0], b[1]) else b

    def result(self, p: Any) -> Value:
        """Return the kept value (str stays str), NaN when empty or null."""
        if p is None or p[2] is None:
            return NAN
        return p[2] if isinstance(p[2], str) else float(p[2])


class Counter(Agg):
    """Base of distinct_count and top_k: partial ``{value: count}`` over non-null values."""

    def zero(self) -> Any:
        """{}."""
        return {}

    def add(self, p: Any, event: Mapping[str, Any]) -> Any:
        """Count the value."""
        v = event.get(self.field or "")
        if v is not None:
            p[v] = p.get(v, 0) + 1
        return p

    def merge(self, a: Any, b: Any) -> Any:
        """Add counts."""
        out = dict(a)
        for v, c in b.items():
            out[v] = out.get(v, 0) + c
        return out

    def dump(self, p: Any) -> Any:
        """[[value, count], ...] (JSON keys would turn ints into strings)."""
        return [[v, c] for v, c in p.items()]

    def load(self, data: Any) -> Any:
        """{value: count}."""
        return {v: c for v, c in data}


class DistinctCount(Counter):
    """Number of distinct non-null values."""

    def result(self, p: Any) -> Value:
        """Return len of the counter."""
        return float(len(p))


class TopK(Counter):
    """The k most frequent values with their share."""

    def __init__(self, field: str | None, k: int) -> None:
        super().__init__(field)
        self.k = k

    def result(self, p: Any) -> Value:
        """((value, share), ...), count desc then value asc."""
        total = sum(p.values())
        ranked = sorted(p.items(), key=lambda vc: (-vc[1], vc[0]))[: self.k]
        return tuple((v, c / total) for v, c in ranked)


class Ratio(Agg):
    """numerator / denominator, each a scalar aggregation with its own filter: partial ``[num, den]``."""

    def __init__(self, num: OperandSpec, den: OperandSpec) -> None:
        super().__init__(None)
        self.num, self.den = num, den
        self.num_agg, self.den_agg = scalar_agg(num.agg, num.field), scalar_agg(den.agg, den.field)

    def zero(self) -> Any:
        """[num zero, den zero]."""
        return [self.num_agg.zero(), self.den_agg.zero()]

    def add(self, p: Any, event: Mapping[str, Any]) -> Any:
        """Fold the event into each side whose filter keeps it."""
        if self.num.predicate(event):
            p[0] = self.num_agg.add(p[0], event)
        if self.den.predicate(event):
            p[1] = self.den_agg.add(p[1], event)
        return p

    def merge(self, a: Any, b: Any) -> Any:
        """Merge side by side."""
        return [self.num_agg.merge(a[0], b[0]), self.den_agg.merge(a[1], b[1])]

    def result(self, p: Any) -> Value:
        """Return num / den; NaN when den is 0 or missing."""
        num, den = self.num_agg.result(p[0]), self.den_agg.result(p[1])
        if not isinstance(num, float) or not isinstance(den, float) or den == 0 or math.isnan(den):
            return NAN
        return num / den

    def dump(self, p: Any) -> Any:
        """[num dump, den dump]."""
        return [self.num_agg.dump(p[0]), self.den_agg.dump(p[1])]

    def load(self, data: Any) -> Any:
        """[num, den]."""
        return [self.num_agg.load(data[0]), self.den_agg.load(data[1])]


_SCALARS: dict[str, type[Agg]] = {
    "count": Count,
    "sum": Sum,
    "avg": Avg,
    "min": Min,
    "max": Max,
    "last": Last,
    "distinct_count": DistinctCount,
}


def scalar_agg(agg: str, field: str | None) -> Agg:
    """Return the aggregator of a scalar aggregation (ratio operands use these)."""
    return _SCALARS[agg](field)


def make_agg(f: FeatureSpec) -> Agg:
    """Return the aggregator of feature ``f``."""
    if f.agg == "top_k":
        return TopK(f.field, f.k)
    if f.agg == "ratio" and f.numerator is not None and f.denominator is not None:
        return Ratio(f.numerator, f.denominator)
    return scalar_agg(f.agg, f.field)
