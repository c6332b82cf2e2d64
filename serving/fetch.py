"""Feature vectors for one ranking request: the user's row and the candidates' rows.

Both sides are read from every view of the applied registry (:mod:`headwater.ranking.features`)
in one round trip to the store (one ``MGET`` per view); a view without a row for an entity gives
its empty-window vector, as in a training set.

Item vectors are kept in an in-process cache (:class:`ItemVectorCache`) keyed by item id for
one registry version, each entry valid for ``ttl_s``; when the item view's registry version
changes, the cache is emptied. The cache is a numpy slab (one row per cached item) and a dict
from item id to row, so a look-up of 2,000 candidates is a few C-level passes, not a Python
loop per item. Look-ups run on the event loop (no lock needed); the store read of the user
and of the cache misses is one round trip in an I/O thread, bounded by the request's deadline.

When the funnel's index refresher keeps the item views' rows of the whole catalog in memory
(:class:`~headwater.serving.item_mirror.ItemMirror`), the views it serves now (its age within
their freshness bound) are taken from there, exact as of its last confirmation, and only the
other views (a realtime view with a seconds SLA) and the items it does not hold are read from
the store; the item cache is then not used.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from headwater.pipelines.store import ViewLayout
from headwater.ranking.features import BoundRegistry, SideViews
from headwater.serving.item_mirror import ItemMirror, MirrorLookup
from headwater.serving.slots import SlotMap
from headwater.serving.store import FeatureReader, FeatureReadError, ViewRows, now_ms


@dataclass(frozen=True)
class FeatureAges:
    """Ages (seconds) of the features a ranking used; None where no feature was used."""

    user: float | None
    items_p50: float | None
    items_max: float | None


@dataclass(frozen=True)
class RequestFeatures:
    """The vectors of one request, in the model's column order.

    ``user`` is None when no user view has a row for the user (an unknown user);
    ``user_event_ms`` holds the event time (window boundary) of each user view that has one.
    An item is found when any item view has a row for it; its event time is the oldest of them.
    """

    user: npt.NDArray[np.float32] | None
    user_event_ms: dict[str, int]
    items: npt.NDArray[np.float32]
    items_found: npt.NDArray[np.bool_]
    items_event_ms: npt.NDArray[np.int64]
    items_view_ms: npt.NDArray[np.int64] | None = None
    """(n, item views) event time of each item's row in each view, 0 where that view has none
    (the prediction log records it: each value is compared offline at its own time); None: unknown."""
    at_ms: int = 0
    """When the vectors were read: the time the on-demand features were computed at."""

    def ages(self, at_ms: int | None = None) -> FeatureAges:
        """Return the feature ages at ``at_ms`` (default now); the user's is its oldest view's."""
        now = now_ms() if at_ms is None else at_ms
        user = None
        if self.user is not None and self.user_event_ms:
            user = max(0.0, (now - min(self.user_event_ms.values())) / 1000.0)
        if not self.items_found.any():
            return FeatureAges(user, None, None)
        ages = np.maximum(0.0, (now - self.items_event_ms[self.items_found]) / 1000.0)
        return FeatureAges(user, float(np.median(ages)), float(ages.max()))

    @property
    def missing_item_fraction(self) -> float:
        """Share of candidates without item features."""
        n = len(self.items_found)
        return 0.0 if n == 0 else 1.0 - float(np.count_nonzero(self.items_found)) / n


def assemble(
    side: SideViews, rows: Sequence[ViewRows]
) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.bool_], npt.NDArray[np.int64]]:
    """Concatenate one side's per-view rows: (vectors, found in any view, oldest event time or 0).

    A view without a row for an entity contributes its empty-window vector, as in a training set.
    """
    n = len(rows[0].found)
    out = np.empty((n, side.dim), dtype=np.float32)
    found = np.zeros(n, dtype=bool)
    oldest = np.full(n, np.iinfo(np.int64).max, dtype=np.int64)
    offsets = side.offsets
    for j, (empty, got) in enumerate(zip(side.empty, rows, strict=True)):
        block = got.values if got.found.all() else np.where(got.found[:, None], got.values, empty)
        out[:, offsets[j] : offsets[j + 1]] = block
        found |= got.found
        np.minimum(oldest, np.where(got.found, got.event_time_ms, oldest), out=oldest)
    oldest[~found] = 0
    return out, found, oldest


def view_times(rows: Sequence[ViewRows]) -> npt.NDArray[np.int64]:
    """Return one side's (n, views) event times: each view's row time, 0 where the view has none."""
    if not rows:
        return np.zeros((0, 0), dtype=np.int64)
    out: npt.NDArray[np.int64] = np.stack([np.where(r.found, r.event_time_ms, 0) for r in rows], axis=1)
    return out.astype(np.int64)


@dataclass(frozen=True)
class CacheLookup:
    """Where each requested id is in the cache: ``slots[j]`` is its row where ``hit[j]``."""

    slots: npt.NDArray[np.intp]
    hit: npt.NDArray[np.bool_]


class ItemVectorCache:
    """Item vectors of one registry version, each valid ``ttl_s`` seconds, at most ``max_entries``.

    Rows live in numpy arrays (vector, event time, expiry, last use) and a dict maps an item id
    to its row. When the slab is full, the least recently used eighth of it is evicted at once,
    so eviction costs one partial sort now and then rather than work on every look-up.
    """

    def __init__(
        self, max_entries: int, ttl_s: float, dim: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.max_entries = max_entries
        self.ttl_s = ttl_s
        self.dim = dim
        self._clock = clock
        self._slots = SlotMap()
        self._values = np.empty((0, dim), dtype=np.float32)
        self._event_ms = np.empty(0, dtype=np.int64)
        self._view_ms = np.empty((0, 0), dtype=np.int64)  # per item view; its width set by the first put
        self._expires = np.empty(0, dtype=np.float64)
        self._used = np.empty(0, dtype=np.float64)
        self.version: str | None = None
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._slots)

    def use_version(self, version: str) -> None:
        """Empty the cache when the registry version of the item view changes."""
        if version != self.version:
            self._slots.clear()
            self._values = np.empty((0, self.dim), dtype=np.float32)
            self._event_ms = np.empty(0, dtype=np.int64)
            self._view_ms = np.empty((0, 0), dtype=np.int64)
            self._expires = np.empty(0, dtype=np.float64)
            self._used = np.empty(0, dtype=np.float64)
            self.version = version

    def lookup(self, ids: Sequence[str], version: str) -> CacheLookup:
        """Find ``ids``: a hit is a cached, unexpired row of ``version``."""
        self.use_version(version)
        slots = self._slots.find(ids)
        hit = slots >= 0
        if hit.any():
            now = self._clock()
            cached = slots[hit]
            hit[hit] = self._expires[cached] >= now
            self._used[slots[hit]] = now
        found = int(np.count_nonzero(hit))
        self.hits += found
        self.misses += len(ids) - found
        return CacheLookup(slots, hit)

    def rows(self, slots: npt.NDArray[np.intp]) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.int64]]:
        """Return the vectors and event times in ``slots`` (from :meth:`lookup` hits)."""
        return self._values[slots], self._event_ms[slots]

    def view_times(self, slots: npt.NDArray[np.intp]) -> npt.NDArray[np.int64] | None:
        """Return the per-view event times in ``slots``; None when the rows were cached without them."""
        if self._view_ms.shape[1] == 0:
            return None
        return self._view_ms[slots]

    def put(
        self,
        ids: Sequence[str],
        rows: npt.NDArray[np.float32],
        event_ms: npt.NDArray[np.int64],
        version: str,
        view_ms: npt.NDArray[np.int64] | None = None,
    ) -> None:
        """Cache found rows of ``ids`` (missing rows are not cached, they are read again).

        ``view_ms``: (n, item views) each row's time in each view (:func:`view_times`), kept for the
        prediction log.
        """
        if self.max_entries == 0 or self.ttl_s == 0 or not len(ids):
            return
        self.use_version(version)
        if len(ids) > self.max_entries:
            ids, rows, event_ms = (
                ids[-self.max_entries :],
                rows[-self.max_entries :],
                event_ms[-self.max_entries :],
            )
            view_ms = None if view_ms is None else view_ms[-self.max_entries :]
        if view_ms is not None and self._view_ms.shape[1] != view_ms.shape[1]:
            self._view_ms = np.zeros((len(self._event_ms), view_ms.shape[1]), dtype=np.int64)
        slots = self._slots.find(ids)
        new = np.flatnonzero(slots < 0)
        if len(new):
            slots[new] = self._allocate([ids[j] for j in new.tolist()])
        now = self._clock()
        self._values[slots] = rows
        self._event_ms[slots] = event_ms
        if view_ms is not None:
            self._view_ms[slots] = view_ms
        self._expires[slots] = now + self.ttl_s
        self._used[slots] = now

    def _allocate(self, new_ids: list[str]) -> npt.NDArray[np.intp]:
        """Give each of ``new_ids`` (not cached yet) a row: free rows, new rows, then evicted rows."""
        need = len(new_ids) - len(self._slots.free)
        if need > 0:
            self._grow(min(need, self.max_entries - self._slots.capacity))
        need = len(new_ids) - len(self._slots.free)
        if need > 0:
            self._evict(max(need, self.max_entries // 8))
        return self._slots.take(new_ids)

    def _grow(self, extra: int) -> None:
        if extra <= 0:
            return
        size = self._slots.capacity
        target = min(self.max_entries, max(size + extra, 2 * size, 1024))
        grow = target - size
        self._values = np.concatenate([self._values, np.empty((grow, self.dim), dtype=np.float32)])
        self._event_ms = np.concatenate([self._event_ms, np.zeros(grow, dtype=np.int64)])
        width = self._view_ms.shape[1]
        self._view_ms = np.concatenate([self._view_ms, np.zeros((grow, width), dtype=np.int64)])
        self._expires = np.concatenate([self._expires, np.full(grow, -np.inf)])
        self._used = np.concatenate([self._used, np.full(grow, np.inf)])  # free rows are never victims
        self._slots.add_rows(grow)

    def _evict(self, count: int) -> None:
        """Free the ``count`` least recently used rows (free rows have ``_used`` = +inf)."""
        count = min(count, self._slots.capacity - len(self._slots.free))
        if count <= 0:
            return
        victims = np.argpartition(self._used, count - 1)[:count]
        self._slots.release(victims.tolist())
        self._used[victims] = np.inf
        self._expires[victims] = -np.inf


class FeatureFetcher:
    """Reads a request's vectors through the item cache: one round trip, one ``MGET`` per view."""

    def __init__(
        self,
        reader: FeatureReader,
        registry: BoundRegistry,
        cache: ItemVectorCache,
        io: Executor,
        columns: tuple[npt.NDArray[np.intp] | None, npt.NDArray[np.intp] | None] = (None, None),
        mirror: ItemMirror | None = None,
    ) -> None:
        """Read through ``cache`` and ``mirror`` in ``io`` threads.

        ``columns``: the model's (user, item) column order as indexes into the registry's, or None;
        ``mirror``: the item views' rows in memory (:mod:`.item_mirror`), used for the views it serves.
        """
        self.reader = reader
        self.registry = registry
        self.cache = cache
        self.mirror = mirror
        self._io = io
        self.user_columns, self.item_columns = columns
        item_cols, on_demand = self.item_columns, registry.on_demand
        self._pairs = None  # on-demand features, when the model's item columns reach past the stored slots
        if on_demand is not None and item_cols is not None and len(item_cols):
            self._pairs = on_demand if int(item_cols.max()) >= registry.item.dim else None

    async def fetch(
        self,
        user_id: str,
        candidates: Sequence[str],
        timeout_s: float,
        user_rows: Sequence[ViewRows] | None = None,
    ) -> RequestFeatures:
        """Read the request's vectors; raise :class:`FeatureReadError` when the store fails or is slow.

        ``user_rows``: the user's rows of every user view, already read for this request (the
        funnel reads them for retrieval); then only the item cache misses are read, and when the
        cache holds every candidate no store read (and no hop to an I/O thread) happens at all.

        When the model reads on-demand features, they are computed here for every candidate from
        the user's and the candidates' vectors and the request time
        (:mod:`headwater.ranking.on_demand`), appended after the stored item slots, then all columns
        are put in the model's order.
        """
        started_ms = now_ms()
        user_side, item_side = self.registry.user, self.registry.item
        mirrored = self.mirror.lookup(candidates, started_ms) if self.mirror is not None else None
        if mirrored is not None:
            return await self._fetch_mirrored(user_id, candidates, timeout_s, user_rows, mirrored, started_ms)
        version = self.registry.vectors_version
        look = self.cache.lookup(candidates, version)
        miss_idx = np.flatnonzero(~look.hit)
        miss_ids = [candidates[i] for i in miss_idx.tolist()]
        requests: list[tuple[ViewLayout, Sequence[str]]] = (
            [(lay, [user_id]) for lay in user_side.layouts] if user_rows is None else []
        )
        if miss_ids:
            requests += [(lay, miss_ids) for lay in item_side.layouts]
        rows = await self._read(requests, timeout_s)
        n_user = len(user_side.layouts) if user_rows is None else 0
        if user_rows is None:
            user_rows = rows[:n_user]
        items, event_ms, found, view_ms = self._items(candidates, look, miss_idx, miss_ids, rows[n_user:],
                                                      version)  # fmt: skip
        return self._finish(user_rows, items, found, event_ms, started_ms, view_ms)

    async def _read(
        self, requests: list[tuple[ViewLayout, Sequence[str]]], timeout_s: float
    ) -> Sequence[ViewRows]:
        """One round trip in an I/O thread, bounded by ``timeout_s``; nothing to read, no hop."""
        if not requests:
            return []
        loop = asyncio.get_running_loop()
        try:
            return await asyncio.wait_for(
                loop.run_in_executor(self._io, self.reader.read_many, requests), max(timeout_s, 0.0)
            )
        except TimeoutError as exc:
            msg = (
                f"online store did not answer within the request's deadline ({timeout_s * 1000:.1f} ms left)"
            )
            raise FeatureReadError(msg) from exc

    async def _fetch_mirrored(
        self,
        user_id: str,
        candidates: Sequence[str],
        timeout_s: float,
        user_rows: Sequence[ViewRows] | None,
        mirrored: MirrorLookup,
        started_ms: int,
    ) -> RequestFeatures:
        """:meth:`fetch` with the item views the mirror serves taken from memory.

        The store is read for the user (unless given), every candidate of the views the mirror does
        not serve now, and the candidates it does not know in the views it serves; one round trip.
        """
        user_side, item_side = self.registry.user, self.registry.item
        unknown = np.flatnonzero(~mirrored.known)
        unknown_ids = [candidates[i] for i in unknown.tolist()]
        requests: list[tuple[ViewLayout, Sequence[str]]] = (
            [(lay, [user_id]) for lay in user_side.layouts] if user_rows is None else []
        )
        wanted: list[int] = []
        for j, (lay, held) in enumerate(zip(item_side.layouts, mirrored.rows, strict=True)):
            if held is None or unknown_ids:
                requests.append((lay, candidates if held is None else unknown_ids))
                wanted.append(j)
        rows = await self._read(requests, timeout_s)
        n_user = len(user_side.layouts) if user_rows is None else 0
        if user_rows is None:
            user_rows = rows[:n_user]
        got = dict(zip(wanted, rows[n_user:], strict=True))
        views: list[ViewRows] = []
        for j, held in enumerate(mirrored.rows):
            if held is None:
                views.append(got[j])
                continue
            if j in got and len(unknown):
                held.values[unknown], held.found[unknown] = got[j].values, got[j].found
                held.event_time_ms[unknown] = got[j].event_time_ms
            views.append(held)
        items, found, event_ms = assemble(item_side, views)
        return self._finish(user_rows, items, found, event_ms, started_ms, view_times(views))

    def _finish(
        self,
        user_rows: Sequence[ViewRows],
        items: npt.NDArray[np.float32],
        found: npt.NDArray[np.bool_],
        event_ms: npt.NDArray[np.int64],
        started_ms: int,
        view_ms: npt.NDArray[np.int64] | None = None,
    ) -> RequestFeatures:
        """Assemble the user, add the on-demand features, put the columns in the model's order."""
        user_side = self.registry.user
        user_matrix, user_found, _ = assemble(user_side, user_rows)
        user_times = {
            lay.view: int(r.event_time_ms[0])
            for lay, r in zip(user_side.layouts, user_rows, strict=True)
            if bool(r.found[0])
        }
        user = user_matrix[0] if bool(user_found[0]) else None
        if self._pairs is not None:  # per (user, candidate, request): never cached
            items = np.hstack([items, self._pairs.compute(user_matrix[0], items, started_ms)])
        if user is not None and self.user_columns is not None:
            user = user[self.user_columns]
        if self.item_columns is not None:
            items = items[:, self.item_columns]
        return RequestFeatures(user, user_times, items, found, event_ms, view_ms, started_ms)

    def _items(
        self,
        candidates: Sequence[str],
        look: CacheLookup,
        miss_idx: npt.NDArray[np.intp],
        miss_ids: list[str],
        rows: Sequence[ViewRows],
        version: str,
    ) -> tuple[
        npt.NDArray[np.float32], npt.NDArray[np.int64], npt.NDArray[np.bool_], npt.NDArray[np.int64] | None
    ]:
        n = len(candidates)
        if not miss_ids:
            items, event_ms = self.cache.rows(look.slots)
            return items, event_ms, np.ones(n, dtype=bool), self.cache.view_times(look.slots)
        item_side = self.registry.item
        items = np.empty((n, item_side.dim), dtype=np.float32)
        event_ms = np.zeros(n, dtype=np.int64)
        view_ms: npt.NDArray[np.int64] | None = np.zeros((n, len(item_side.layouts)), dtype=np.int64)
        found = look.hit.copy()
        hit_idx = np.flatnonzero(look.hit)
        if len(hit_idx):
            items[hit_idx], event_ms[hit_idx] = self.cache.rows(look.slots[hit_idx])
            cached = self.cache.view_times(look.slots[hit_idx])
            if cached is None or view_ms is None:
                view_ms = None
            else:
                view_ms[hit_idx] = cached
        got, got_found, got_ms = assemble(item_side, rows)
        got_views = view_times(rows)
        items[miss_idx], found[miss_idx], event_ms[miss_idx] = got, got_found, got_ms
        if view_ms is not None:
            view_ms[miss_idx] = got_views
        keep = np.flatnonzero(got_found)
        self.cache.put(
            [miss_ids[i] for i in keep.tolist()], got[keep], got_ms[keep], version, got_views[keep]
        )
        return items, event_ms, found, view_ms


__all__ = [
    "CacheLookup",
    "FeatureAges",
    "FeatureFetcher",
    "FeatureReadError",
    "ItemVectorCache",
    "RequestFeatures",
    "assemble",
    "view_times",
]
