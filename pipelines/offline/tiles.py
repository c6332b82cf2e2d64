"""Daily tiles: per (entity, UTC day), each feature's partial aggregate, merged into any window of whole days.

The offline job's incremental path (:mod:`.tile_table`) stores one tile per entity and day and
computes a day's values by merging the tiles of each feature's window, instead of re-reading the
window's events. This module is the merge algebra in plain Python (what a tile of each
aggregation holds, how two tiles merge, what value a merged tile gives), so a property test can
check it against the reference semantics (:func:`headwater.pipelines.windows.reference_values`)
without Spark; :mod:`.tile_table` is the same algebra as Spark columns.

A tile per aggregation kind (``None``: no event of the day passed the feature's filter):

================  ==========================================  ===============================
kind              tile                                        merge
================  ==========================================  ===============================
count             number of kept events (field not null)      sum
sum               sum of the field's values                   sum
avg               (sum, number of values)                     sum of each
min / max         the day's min / max                         min / max
last              (event time, event id, value) of the latest max
distinct_count    the exact set of values                     union
top_k             the exact count per value                   sum per value
ratio             (numerator's tile, denominator's tile)      each side by its kind
================  ==========================================  ===============================

Every kind merges exactly (distinct_count and top_k through exact sets, as issue 35 allows), so a
window's value from its days' tiles equals the value from its events. Sums merge in another order
than one pass over the events, so they agree to float rounding, not bit for bit.

A view is tiled (:func:`view_tiled`) when every window is whole days and every boundary at a UTC
midnight is a UTC midnight (:func:`headwater.registry.cost.windows_tiled`): then each feature's
window of a daily run is a set of whole days. Other views keep the full computation.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from headwater.pipelines.windows.aggs import NAN, Value
from headwater.pipelines.windows.spec import FeatureSpec, OperandSpec, ViewSpec
from headwater.registry.cost import windows_tiled
from headwater.registry.plans import PlanView

DAY_MS = 86_400_000
Event = Mapping[str, Any]
Tile = Any
TILE_KINDS = ("count", "sum", "avg", "min", "max", "last", "distinct_count", "top_k")
"""The scalar aggregations a tile holds (a ratio: a tile of each operand)."""
"""One feature's partial aggregate over one entity's events of one day (see the module's table)."""


def view_tiled(view: PlanView) -> bool:
    """Whether the daily job computes ``view`` from daily tiles (every window whole days, day-aligned).

    The cost model's rule too (:func:`headwater.registry.cost.windows_tiled`): what it charges as
    tiled is what the job tiles.
    """
    return windows_tiled((f.window_s, f.slide_s) for f in view.features)


def operand_tile(agg: str, field: str | None, events: Sequence[Event]) -> Tile:
    """Return the tile of a scalar aggregation over ``events`` (already filtered)."""
    if agg == "count":
        n = len(events) if field is None else sum(e.get(field) is not None for e in events)
        return n or None
    if agg == "last":
        if not events:
            return None
        latest = max(events, key=lambda e: (e["event_time"], e["event_id"]))
        return (latest["event_time"], latest["event_id"], latest.get(field or ""))
    present = [v for e in events if (v := e.get(field or "")) is not None]
    if not present:
        return None
    if agg == "sum":
        return math.fsum(present)
    if agg == "avg":
        return (math.fsum(present), len(present))
    if agg == "min":
        return min(present)
    if agg == "max":
        return max(present)
    if agg == "distinct_count":
        return frozenset(present)
    if agg == "top_k":
        return Counter(present)
    msg = f"aggregation {agg!r} has no tile; expected one of {list(TILE_KINDS)}"
    raise ValueError(msg)


def merge_operand(agg: str, a: Tile, b: Tile) -> Tile:
    """Merge two tiles of one scalar aggregation (either may be ``None``: no event)."""
    if a is None:
        return b
    if b is None:
        return a
    if agg in ("count", "sum"):
        return a + b
    if agg == "avg":
        return (a[0] + b[0], a[1] + b[1])
    if agg == "min":
        return min(a, b)
    if agg == "max":
        return max(a, b)
    if agg == "last":  # the later event; one ms: the greater event id (what the job's struct max does)
        return max(a, b, key=lambda t: (t[0], t[1]))
    if agg == "distinct_count":
        return a | b
    return a + b  # top_k: Counter addition keeps each value's count


def operand_value(agg: str, tile: Tile, k: int = 0) -> Value:
    """Return the aggregation's value from a (merged) tile, as the reference gives it."""
    if agg in ("count", "sum"):
        return float(tile or 0)
    if agg == "distinct_count":
        return float(len(tile or ()))
    if agg == "top_k":
        counts: Counter[Any] = tile or Counter()
        total = sum(counts.values())
        ranked = sorted(counts.items(), key=lambda vc: (-vc[1], vc[0]))[:k]
        return tuple((v, c / total) for v, c in ranked)
    if tile is None:
        return NAN
    if agg == "avg":
        return float(tile[0] / tile[1])
    if agg == "last":
        v = tile[2]
        return NAN if v is None else v if isinstance(v, str) else float(v)
    return float(tile)


def _side(op: OperandSpec, events: Sequence[Event]) -> Tile:
    return operand_tile(op.agg, op.field, [e for e in events if op.predicate(e)])


def feature_tile(f: FeatureSpec, events: Sequence[Event]) -> Tile:
    """Return the tile of feature ``f`` over one entity's events of one day."""
    if f.agg == "ratio" and f.numerator is not None and f.denominator is not None:
        return (_side(f.numerator, events), _side(f.denominator, events))
    return operand_tile(f.agg, f.field, [e for e in events if f.predicate(e)])


def merge_tiles(f: FeatureSpec, a: Tile, b: Tile) -> Tile:
    """Merge two tiles of feature ``f``."""
    if f.agg == "ratio" and f.numerator is not None and f.denominator is not None:
        num = merge_operand(f.numerator.agg, a[0], b[0])
        return (num, merge_operand(f.denominator.agg, a[1], b[1]))
    return merge_operand(f.agg, a, b)


def empty_tile(f: FeatureSpec) -> Tile:
    """Return the tile of a day without events."""
    return (None, None) if f.agg == "ratio" else None


def tile_value(f: FeatureSpec, tile: Tile) -> Value:
    """Return the value of feature ``f`` from its window's merged tile."""
    if f.agg == "ratio" and f.numerator is not None and f.denominator is not None:
        num, den = operand_value(f.numerator.agg, tile[0]), operand_value(f.denominator.agg, tile[1])
        if not isinstance(num, float) or not isinstance(den, float) or den == 0 or math.isnan(den):
            return NAN
        return num / den
    return operand_value(f.agg, tile, f.k)


def window_days(f: FeatureSpec, as_of_ms: int) -> range:
    """Return the day starts (epoch ms) of the tiles of feature ``f``'s window as of midnight ``as_of_ms``.

    Raises:
        ValueError: the window is not whole days at this time (the feature is not tiled).
    """
    end = f.boundary(as_of_ms)
    start = end - f.window_ms
    if start % DAY_MS or end % DAY_MS:
        msg = f"feature {f.name!r}: window [{start}, {end}) is not whole UTC days; it cannot be tiled"
        raise ValueError(msg)
    return range(start, end, DAY_MS)


DayTiles = dict[tuple[str, int], dict[str, Tile]]
"""Tiles of a view: per (entity id, day start ms), per feature name, the tile."""


def day_tiles(view: ViewSpec, events: Iterable[Event]) -> DayTiles:
    """Return the tiles of ``view`` over ``events``: one per (entity, day) with an event.

    Events with a null join key are skipped; an ``event_id`` counts once per day (its first
    occurrence), as the job deduplicates each day it tiles.
    """
    grouped: dict[tuple[str, int], list[Event]] = {}
    seen: set[tuple[int, str]] = set()
    for e in events:
        key = e.get(view.join_key)
        day = e["event_time"] // DAY_MS * DAY_MS
        if key is None or (day, e["event_id"]) in seen:
            continue
        seen.add((day, e["event_id"]))
        grouped.setdefault((str(key), day), []).append(e)
    return {at: {f.name: feature_tile(f, evs) for f in view.features} for at, evs in grouped.items()}


def tiled_values(view: ViewSpec, tiles: DayTiles, as_of_ms: int) -> dict[str, dict[str, Value]]:
    """Per entity with a tile in some feature's window, per feature, the value as of ``as_of_ms``.

    The merge of :func:`reference_values`: entities without a tile in any window are left out
    (their values are :func:`headwater.pipelines.windows.empty_values`).
    """
    by_entity: dict[str, dict[int, dict[str, Tile]]] = {}
    for (entity, day), tile in tiles.items():
        by_entity.setdefault(entity, {})[day] = tile
    out: dict[str, dict[str, Value]] = {}
    for entity, days in by_entity.items():
        merged: dict[str, Tile] = {}
        touched = False
        for f in view.features:
            acc = empty_tile(f)
            for day in window_days(f, as_of_ms):
                if day in days:
                    acc = merge_tiles(f, acc, days[day][f.name])
            merged[f.name] = acc
            touched = touched or acc != empty_tile(f)
        if touched:
            out[entity] = {f.name: tile_value(f, merged[f.name]) for f in view.features}
    return out
