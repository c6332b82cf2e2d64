"""The reference computation of docs/concepts/windows.md: slow, obvious, and the oracle of every tier's tests.

:func:`reference_values` evaluates a view over a list of events AS OF a time T, straight from
the definition (no panes, no state): for each feature, B = floor(T / S) * S, keep the events of
the entity with ``B - W <= event_time < B`` that pass the feature's filter, count each
``event_id`` once, aggregate. :func:`split_late` applies the lateness rule to a stream in
arrival order, so a test can compute what a streaming tier must have accepted.
It deliberately shares no code with :mod:`headwater.pipelines.windows.aggs`, so a test that
compares them checks one against the other.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from headwater.pipelines.events.timing import SourceTiming, late_verdicts
from headwater.pipelines.windows.aggs import NAN, Value
from headwater.pipelines.windows.spec import FeatureSpec, OperandSpec, ViewSpec

Event = Mapping[str, Any]


def dedup(events: Iterable[Event]) -> list[Event]:
    """Return the events with each ``event_id`` kept once (its first occurrence)."""
    seen: set[str] = set()
    out = []
    for e in events:
        if e["event_id"] not in seen:
            seen.add(e["event_id"])
            out.append(e)
    return out


def split_late(
    events: Iterable[Event], max_out_of_orderness_ms: int, allowed_lateness_ms: int | None
) -> tuple[list[Event], list[Event]]:
    """Split one partition's events, in arrival order, into (accepted, late).

    The rule is :func:`headwater.pipelines.events.timing.late_verdicts`, with no event ahead of the
    clock: an event is late when it is before the greatest accepted event time minus
    ``max_out_of_orderness_ms`` and ``allowed_lateness_ms``. ``None`` = never late.
    """
    events = list(events)
    if allowed_lateness_ms is None:
        return events, []
    timing = SourceTiming(max_out_of_orderness_ms, allowed_lateness_ms, max_future_ms=0)
    verdicts = late_verdicts(((0, e["event_time"], e["event_time"]) for e in events), timing)
    accepted = [e for e, late in zip(events, verdicts, strict=True) if not late]
    late = [e for e, late in zip(events, verdicts, strict=True) if late]
    return accepted, late


def _scalar(agg: str, field: str | None, events: Sequence[Event]) -> Value:
    if agg == "count":
        return float(len(events) if field is None else sum(e.get(field) is not None for e in events))
    if agg == "last":
        if not events:
            return NAN
        v = max(events, key=lambda e: (e["event_time"], e["event_id"])).get(field or "")
        return NAN if v is None else v if isinstance(v, str) else float(v)
    values = [e.get(field or "") for e in events]
    present = [v for v in values if v is not None]
    if agg == "sum":
        return float(math.fsum(present))
    if agg == "distinct_count":
        return float(len(set(present)))
    if not present:
        return NAN
    if agg == "avg":
        return math.fsum(present) / len(present)
    return float(min(present) if agg == "min" else max(present))


def _top_k(field: str | None, k: int, events: Sequence[Event]) -> Value:
    counts = Counter(v for e in events if (v := e.get(field or "")) is not None)
    total = sum(counts.values())
    ranked = sorted(counts.items(), key=lambda vc: (-vc[1], vc[0]))[:k]
    return tuple((v, c / total) for v, c in ranked)


def _operand(op: OperandSpec, events: Sequence[Event]) -> Value:
    return _scalar(op.agg, op.field, [e for e in events if op.predicate(e)])


def feature_value(f: FeatureSpec, entity_events: Sequence[Event], as_of_ms: int) -> Value:
    """Return the value of ``f`` over one entity's (deduplicated) events, as of ``as_of_ms``."""
    end = f.boundary(as_of_ms)
    start = end - f.window_ms
    inside = [e for e in entity_events if start <= e["event_time"] < end]
    if f.agg == "ratio" and f.numerator is not None and f.denominator is not None:
        num, den = _operand(f.numerator, inside), _operand(f.denominator, inside)
        if not isinstance(num, float) or not isinstance(den, float) or den == 0 or math.isnan(den):
            return NAN
        return num / den
    kept = [e for e in inside if f.predicate(e)]
    if f.agg == "top_k":
        return _top_k(f.field, f.k, kept)
    return _scalar(f.agg, f.field, kept)


def empty_values(view: ViewSpec) -> dict[str, Value]:
    """Return the values of an entity with no event in any window (count 0, NaN, empty top_k, ...)."""
    return {f.name: feature_value(f, [], 0) for f in view.features}


def reference_values(view: ViewSpec, events: Iterable[Event], as_of_ms: int) -> dict[str, dict[str, Value]]:
    """Per entity id, per feature name, the value AS OF ``as_of_ms`` (docs/concepts/windows.md, literally).

    ``events`` are accepted events (apply :func:`split_late` first for a streaming tier); events
    whose join key is null are skipped; duplicates (same event_id) count once. Only entities with
    at least one event in some feature's window that passes that feature's filter are returned;
    every other entity has :func:`empty_values`.
    """
    by_entity: dict[str, list[Event]] = {}
    for e in dedup(events):
        key = e.get(view.join_key)
        if key is not None:
            by_entity.setdefault(str(key), []).append(e)
    out: dict[str, dict[str, Value]] = {}
    for entity, evs in by_entity.items():
        live = False
        for f in view.features:
            end = f.boundary(as_of_ms)
            if any(end - f.window_ms <= e["event_time"] < end and f.predicate(e) for e in evs):
                live = True
                break
        if live:
            out[entity] = {f.name: feature_value(f, evs, as_of_ms) for f in view.features}
    return out
