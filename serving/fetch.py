"""Feature vectors for one ranking request: the user's row and the candidates' rows.

Item vectors are kept in an in-process LRU cache keyed by (item id, registry version), each
entry valid for ``ttl_s``; when the item view's registry version changes, the cache is
emptied. Cache look-ups run on the event loop (no lock needed); the store read of the user
and of the cache misses is one round trip in an I/O thread, bounded by the request's deadline.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from headwater.serving.config import ViewSpec
from headwater.serving.store import FeatureReader, FeatureReadError, now_ms


@dataclass(frozen=True)
class FeatureAges:
    """Ages (seconds) of the features a ranking used; None where no feature was used."""

    user: float | None
    items_p50: float | None
    items_max: float | None


@dataclass(frozen=True)
class RequestFeatures:
    """The vectors of one request. ``user`` is None when the user has no row in the store."""

    user: npt.NDArray[np.float32] | None
    user_event_ms: int
    items: npt.NDArray[np.float32]
    items_found: npt.NDArray[np.bool_]
    items_event_ms: npt.NDArray[np.int64]

    def ages(self, at_ms: int | None = None) -> FeatureAges:
        """Feature ages at ``at_ms`` (default now)."""
        now = now_ms() if at_ms is None else at_ms
        user = None if self.user is None else max(0.0, (now - self.user_event_ms) / 1000.0)
        if not self.items_found.any():
            return FeatureAges(user, None, None)
        ages = np.maximum(0.0, (now - self.items_event_ms[self.items_found]) / 1000.0)
        return FeatureAges(user, float(np.median(ages)), float(ages.max()))

    @property
    def missing_item_fraction(self) -> float:
        """Share of candidates without item features."""
        n = len(self.items_found)
        return 0.0 if n == 0 else 1.0 - float(np.count_nonzero(self.items_found)) / n


class ItemVectorCache:
    """LRU of item vectors keyed by (item id, registry version), entries valid ``ttl_s`` seconds."""

    def __init__(self, max_entries: int, ttl_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_entries = max_entries
        self.ttl_s = ttl_s
        self._clock = clock
        self._entries: OrderedDict[tuple[str, str], tuple[npt.NDArray[np.float32], int, float]] = (
            OrderedDict()
        )
        self.version: str | None = None
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)

    def use_version(self, version: str) -> None:
        """Empty the cache when the registry version of the item view changes."""
        if version != self.version:
            self._entries.clear()
            self.version = version

    def lookup(self, ids: Sequence[str], version: str) -> list[tuple[npt.NDArray[np.float32], int] | None]:
        """Cached (vector, event_ms) per id, or None for a miss or an expired entry."""
        self.use_version(version)
        now = self._clock()
        out: list[tuple[npt.NDArray[np.float32], int] | None] = []
        entries = self._entries
        for item_id in ids:
            key = (item_id, version)
            entry = entries.get(key)
            if entry is None or entry[2] < now:
                out.append(None)
                continue
            entries.move_to_end(key)
            out.append((entry[0], entry[1]))
        found = sum(1 for e in out if e is not None)
        self.hits += found
        self.misses += len(out) - found
        return out

    def put(
        self, ids: Sequence[str], rows: npt.NDArray[np.float32], event_ms: npt.NDArray[np.int64], version: str
    ) -> None:
        """Cache found rows of ``ids`` (missing rows are not cached, they are read again)."""
        if self.max_entries == 0 or self.ttl_s == 0:
            return
        self.use_version(version)
        expires = self._clock() + self.ttl_s
        entries = self._entries
        for item_id, row, ev in zip(ids, rows, event_ms, strict=True):
            entries[(item_id, version)] = (row, int(ev), expires)
            entries.move_to_end((item_id, version))
        while len(entries) > self.max_entries:
            entries.popitem(last=False)


class FeatureFetcher:
    """Reads a request's vectors through the item cache and one store round trip."""

    def __init__(
        self,
        reader: FeatureReader,
        user_view: ViewSpec,
        item_view: ViewSpec,
        cache: ItemVectorCache,
        io: Executor,
    ) -> None:
        self.reader = reader
        self.user_view = user_view
        self.item_view = item_view
        self.cache = cache
        self._io = io

    async def fetch(self, user_id: str, candidates: Sequence[str], timeout_s: float) -> RequestFeatures:
        """The request's vectors; :class:`FeatureReadError` when the store fails or is too slow."""
        version = self.item_view.version
        cached = self.cache.lookup(candidates, version)
        miss_idx = [i for i, hit in enumerate(cached) if hit is None]
        miss_ids = [candidates[i] for i in miss_idx]
        requests = [(self.user_view, [user_id])]
        if miss_ids:
            requests.append((self.item_view, miss_ids))
        loop = asyncio.get_running_loop()
        try:
            rows = await asyncio.wait_for(
                loop.run_in_executor(self._io, self.reader.read_many, requests), max(timeout_s, 0.0)
            )
        except TimeoutError as exc:
            msg = (
                f"online store did not answer within the request's deadline ({timeout_s * 1000:.1f} ms left)"
            )
            raise FeatureReadError(msg) from exc
        n, d = len(candidates), len(self.item_view.features)
        items = np.full((n, d), np.nan, dtype=np.float32)
        found = np.zeros(n, dtype=bool)
        event_ms = np.zeros(n, dtype=np.int64)
        hit_idx = [i for i, hit in enumerate(cached) if hit is not None]
        if hit_idx:
            hits = [h for h in cached if h is not None]
            items[hit_idx] = np.stack([h[0] for h in hits])
            event_ms[hit_idx] = [h[1] for h in hits]
            found[hit_idx] = True
        if miss_ids:
            got = rows[1]
            idx = np.asarray(miss_idx, dtype=np.intp)
            items[idx], found[idx], event_ms[idx] = got.values, got.found, got.event_time_ms
            keep = np.flatnonzero(got.found)
            self.cache.put([miss_ids[i] for i in keep], got.values[keep], got.event_time_ms[keep], version)
        user_rows = rows[0]
        user = user_rows.values[0] if bool(user_rows.found[0]) else None
        return RequestFeatures(user, int(user_rows.event_time_ms[0]), items, found, event_ms)


__all__ = ["FeatureAges", "FeatureFetcher", "FeatureReadError", "ItemVectorCache", "RequestFeatures"]
