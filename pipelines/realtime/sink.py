"""Turn a batch of merged window rows of one view into online vectors and write them in one go.

The SQL job hands each view's merged rows (entity, boundary B, one column per slot of
:class:`~headwater.pipelines.realtime.sql.SlotSpec`) to a vectorised UDF in batches; this module
converts the columns to the feature values of :mod:`headwater.pipelines.windows` (the shared
semantics: empty count 0, empty avg NaN, top_k as (value, share) pairs), packs them with the
shared vector layout (dictionary ids from Redis) and writes them with
:meth:`~headwater.pipelines.store.OnlineStore.write_batch`: a few Redis round trips per batch,
idempotent per boundary (replaying a batch after a restart rewrites the same bytes).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from headwater.pipelines.realtime.decode import EVENT_COLUMNS
from headwater.pipelines.realtime.sql import NUMERIC_TYPES, SlotSpec
from headwater.pipelines.store import ViewLayout, WriteResult
from headwater.pipelines.windows import NAN, Value, ViewSpec, to_vectors

_FIELD_TYPES = dict(EVENT_COLUMNS)
ZERO_WHEN_EMPTY = frozenset({"count", "sum", "distinct_count"})
LAST_SEP = "\x01"


class Store(Protocol):
    """The part of :class:`~headwater.pipelines.store.OnlineStore` the sink uses."""

    def write_batch(  # noqa: D102
        self,
        layout: ViewLayout,
        entity_ids: Sequence[str],
        values: npt.ArrayLike,
        event_time_ms: npt.ArrayLike,
        write_time_ms: int | None = None,
    ) -> WriteResult: ...

    def close(self) -> None: ...  # noqa: D102


class Dictionary(Protocol):
    """Dictionary ids of field values (``headwater.pipelines.windows.RedisDictionary``)."""

    def ids(self, field: str, values: Sequence[Any]) -> list[int]: ...  # noqa: D102


def parse_last(encoded: str | None, numeric: bool) -> Value:
    """Decode a ``last`` key (``time SEP event_id SEP 'v'value | 'n'``) into the feature value."""
    if encoded is None:
        return NAN
    tail = encoded.rsplit(LAST_SEP, 1)[-1]
    if not tail.startswith("v"):
        return NAN
    return float(tail[1:]) if numeric else tail[1:]


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


@dataclass
class ViewSink:
    """Writes one view's merged rows: values -> vectors -> one batched store write."""

    spec: ViewSpec
    slots: tuple[SlotSpec, ...]
    layout: ViewLayout
    store: Store
    dictionary: Dictionary

    def rows(self, columns: dict[str, Sequence[Any]], n: int) -> list[list[Value]]:
        """Per row, the feature values in plan order, from the slot columns."""
        by_feature: dict[str, list[SlotSpec]] = {}
        for slot in self.slots:
            by_feature.setdefault(slot.feature, []).append(slot)
        out: list[list[Value]] = [[] for _ in range(n)]
        for f in self.spec.features:
            slots = by_feature[f.name]
            if f.agg == "top_k":
                tops = [columns[s.name] for s in slots if s.role == "top"]
                cnts = [columns[s.name] for s in slots if s.role == "cnt"]
                totals = next(columns[s.name] for s in slots if s.role == "total")
                for r in range(n):
                    out[r].append(_top_pairs(tops, cnts, totals, r))
            elif f.agg == "last":
                numeric = _FIELD_TYPES.get(f.field or "") in NUMERIC_TYPES
                col = columns[slots[0].name]
                for r in range(n):
                    out[r].append(parse_last(col[r], numeric))
            else:
                col = columns[slots[0].name]
                empty = 0.0 if f.agg in ZERO_WHEN_EMPTY else NAN
                for r in range(n):
                    v = col[r]
                    out[r].append(empty if _missing(v) else float(v))
        return out

    def write(
        self, entities: Sequence[str], boundaries_ms: npt.NDArray[np.int64], columns: dict[str, Sequence[Any]]
    ) -> WriteResult:
        """Write the rows of one batch; returns the store's per-row status."""
        n = len(entities)
        values = to_vectors(self.spec, self.rows(columns, n), self.dictionary.ids)
        return self.store.write_batch(self.layout, list(entities), values, boundaries_ms)


def _top_pairs(
    tops: list[Sequence[Any]], cnts: list[Sequence[Any]], totals: Sequence[Any], r: int
) -> tuple[tuple[Any, float], ...]:
    total = totals[r]
    if _missing(total) or not total:
        return ()
    pairs = []
    for top, cnt in zip(tops, cnts, strict=True):
        if not _missing(top[r]) and not _missing(cnt[r]):
            pairs.append((top[r], float(cnt[r]) / float(total)))
    return tuple(pairs)
