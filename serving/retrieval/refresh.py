"""Keep the item index in step with the online store: a full build, then incremental refreshes.

The item vectors come from the registry's item views in Redis, exactly as the ranker reads them
(one key per (view, item), :mod:`headwater.pipelines.store`). A refresh never re-embeds what did
not change; its steps (:meth:`IndexRefresher.refresh`):

1. List the item views' keys (one ``SCAN`` of the namespace, keys only). An item is in the catalog
   while any item view holds a key for it; ids indexed before and now in no view (deleted, or
   expired by the view's TTL) are removed from the index.
2. Read each present item's write time, the header field every tier stamps on each write
   (offset 16 of the packed value), with a read-only script that returns 8 bytes per key instead
   of the whole vector (``HEADER_SCRIPT``), ``batch`` keys per call. An item changed when its
   newest write time across the item views differs from the one recorded when it was indexed
   (exact: no clock comparison between writers and this process, so no skew margin).
3. Read the vectors of the new and changed items only (one ``MGET`` per view and batch, through
   :meth:`OnlineStore.read_many`), assemble them as serving does (a view without a row gives its
   empty-window vector), embed them with the item tower and upsert them.
4. Record the write times and bump the index version: ``<tower version>.<refresh number>``.

The freshness log of the item views (``<ns>:fresh:{view}``, one entry per write call, with the
rows it wrote) is not enough on its own: it says how many rows a call wrote, not which keys, and
expiry writes nothing. It is the cheap "did anything change" test that saves the scan when nothing
did (:meth:`IndexRefresher.changed`, a few ``XRANGE`` replies instead of a ``SCAN`` and a header
read of the whole catalog): :meth:`~headwater.serving.retrieval.runtime.RetrievalRuntime.start`
skips a refresh when no item view wrote a row since the last one, and still refreshes every
``full_scan_s`` to drop the items whose keys expired.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

from headwater.pipelines.keycodec import KeyFormatError
from headwater.pipelines.store import OnlineStore, ViewLayout, freshness_key
from headwater.pipelines.store.layout import changes_key, feed_entry_ids, glob_escape, key_pattern, key_prefix
from headwater.ranking.features import SideViews
from headwater.ranking.towers import TwoTowerModel
from headwater.serving.fetch import assemble
from headwater.serving.item_mirror import ItemMirror
from headwater.serving.retrieval.index import ItemIndexLike
from headwater.serving.store import ViewRows, now_ms

HEADER_SCRIPT = """
local out = {}
for i, key in ipairs(KEYS) do
  out[i] = redis.call('GETRANGE', key, 16, 31)
end
return out
"""
"""Each key's write time and absolute expiry (two int64 little-endian at offsets 16 and 24 of the packed
value, codec.py; expiry 0 = none), or ''."""


FEED_MAXLEN = 1000
"""Entries a view's change feed keeps (about: ``MAXLEN ~``); a refresher further behind scans instead."""
FEED_SCRIPT = """
local fresh = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)
local feed = redis.call('XREVRANGE', KEYS[2], '+', '-', 'COUNT', 1)
local first = redis.call('XRANGE', KEYS[2], '-', '+', 'COUNT', 1)
return {fresh[1] and fresh[1][1] or '', feed[1] and feed[1][1] or '', first[1] and first[1][1] or ''}
"""
"""One view's freshness-log and change-feed positions at the same moment (both keys share its slot),
and the feed's oldest entry (a feed trimmed past a refresher's position cannot say what it missed)."""


@dataclass(frozen=True)
class FeedPosition:
    """Per item view, the freshness log's and the change feed's newest entry ids at one moment."""

    fresh: tuple[bytes, ...]
    feed: tuple[bytes, ...]


@dataclass(frozen=True)
class RefreshReport:
    """What one refresh did."""

    version: str
    catalog: int
    added: int
    updated: int
    removed: int
    unchanged: int
    seconds: float


class ItemSource(Protocol):
    """What a refresh reads: the item views' catalog, each key's header, the rows, a change log.

    :class:`StoreItemSource` is the online store's; tests implement it in memory. A source without
    a change log answers None from :meth:`log_position` (every look then scans).
    """

    side: SideViews

    def catalog(self) -> set[str]:
        """Every item id with a key in any of the side's views."""
        ...

    def headers(
        self, layout: ViewLayout, ids: list[str]
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """Write time and absolute expiry (epoch ms, 0 = none) of each id's key; both 0 where it has none."""
        ...

    def view_rows(self, ids: list[str]) -> Iterator[tuple[list[str], list[ViewRows]]]:
        """Batches of (ids, each item view's rows of them)."""
        ...

    def log_position(self) -> tuple[bytes, ...] | None:
        """Return the change log's position now (taken before a scan), or None without a change log."""
        ...

    def written_since(self, position: tuple[bytes, ...]) -> bool:
        """Whether an item view may have written a row after ``position``."""
        ...

    def feed_position(self) -> FeedPosition | None:
        """Return the change feed's position now (subscribing to it), or None without a change feed."""
        ...

    def fed_since(self, since: FeedPosition) -> tuple[set[str], FeedPosition] | None:
        """Return the ids written in any item view after ``since`` and the position now.

        None when the feed cannot say (trimmed past ``since``, gone, or a write the freshness log
        shows is missing from it: a writer that does not feed it); the caller then scans.
        """
        ...


class StoreItemSource:
    """:class:`ItemSource` of the online store: keys, headers and rows read in batches."""

    def __init__(self, store: OnlineStore, side: SideViews, batch: int = 2000) -> None:
        self.store = store
        self.side = side
        self.batch = batch
        self._script = store.client.register_script(HEADER_SCRIPT)
        self._feed_script = store.client.register_script(FEED_SCRIPT)

    def ids(self, layout: ViewLayout) -> set[str]:
        """Every entity id with a key in ``layout``'s view (``SCAN``, keys only)."""
        prefix = key_prefix(layout.view, self.store.namespace)
        pattern = key_pattern(layout.view, self.store.namespace)
        cut = len(prefix.encode("utf-8"))
        return {
            key[cut:].decode("utf-8")
            for key in self.store.client.scan_iter(match=pattern, count=self.batch * 5)
        }

    def catalog(self) -> set[str]:
        """Return every entity id with a key in any of the side's views: one ``SCAN`` of the namespace.

        One pass over the keyspace for all views instead of one per view (``SCAN MATCH`` walks every
        key of the database whatever the pattern).
        """
        ns = glob_escape(self.store.namespace)
        prefixes = {key_prefix(lay.view, self.store.namespace).encode("utf-8") for lay in self.side.layouts}
        out: set[str] = set()
        for key in self.store.client.scan_iter(match=ns + ":\\{*", count=self.batch * 5):
            cut = key.find(b"}:") + 2
            if cut > 1 and key[:cut] in prefixes:
                out.add(key[cut:].decode("utf-8"))
        return out

    def headers(
        self, layout: ViewLayout, ids: list[str]
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """Write time and absolute expiry (epoch ms, 0 = none) of each id's key; both 0 where it has none."""
        out = np.zeros((len(ids), 2), dtype=np.int64)
        prefix = key_prefix(layout.view, self.store.namespace)
        for s in range(0, len(ids), self.batch):
            chunk = ids[s : s + self.batch]
            raw: list[bytes] = self._script(keys=[prefix + i for i in chunk])
            if all(len(r) == 16 for r in raw):
                out[s : s + len(chunk)] = np.frombuffer(b"".join(raw), dtype="<i8").reshape(-1, 2)
            else:
                for k, r in enumerate(raw):
                    if len(r) == 16:
                        out[s + k] = np.frombuffer(r, dtype="<i8")
        return out[:, 0].copy(), out[:, 1].copy()

    def log_position(self) -> tuple[bytes, ...]:
        """Return the newest entry id of each item view's freshness log (b"" for an empty one)."""
        pipe = self.store.client.pipeline(transaction=False)
        for layout in self.side.layouts:
            pipe.xrevrange(freshness_key(layout.view, self.store.namespace), count=1)
        return tuple(last[0][0] if last else b"" for last in pipe.execute())

    def written_since(self, position: tuple[bytes, ...], scan_limit: int = 256) -> bool:
        """Return whether an item view may have written a row after ``position`` (:meth:`log_position`).

        Reads each view's freshness-log entries after its position (at most ``scan_limit`` per
        view); entries that wrote no row (a tier's progress, a replay, a stale write) are not a
        change. ``scan_limit`` entries or more count as one (the log is capped: a log trimmed past
        the position has thousands after it), and so does a log that is gone (the view was deleted).
        """
        pipe = self.store.client.pipeline(transaction=False)
        for layout, last in zip(self.side.layouts, position, strict=True):
            key = freshness_key(layout.view, self.store.namespace)
            pipe.xrange(key, b"(" + last if last else b"-", b"+", count=scan_limit)
            pipe.exists(key)
        replies = pipe.execute(raise_on_error=False)
        for j, last in enumerate(position):
            entries, exists = replies[2 * j], replies[2 * j + 1]
            if isinstance(entries, Exception) or isinstance(exists, Exception):
                return True
            if last and not exists:
                return True
            if len(entries) >= scan_limit or any(int(fields.get(b"n", b"1")) > 0 for _, fields in entries):
                return True
        return False

    def feed_position(self) -> FeedPosition | None:
        """Create each item view's change feed when missing (an empty entry), then return the position."""
        ns = self.store.namespace
        for layout in self.side.layouts:
            key = changes_key(layout.view, ns)
            if not self.store.client.exists(key):
                self.store.client.xadd(key, {"k": b""}, maxlen=FEED_MAXLEN, approximate=True)
        return self._feed_now()[0]

    def _feed_now(self) -> tuple[FeedPosition, tuple[bytes, ...]]:
        ns = self.store.namespace
        fresh, feed, first = [], [], []
        for layout in self.side.layouts:
            keys = [freshness_key(layout.view, ns), changes_key(layout.view, ns)]
            f, c, o = self._feed_script(keys=keys)
            fresh.append(bytes(f))
            feed.append(bytes(c))
            first.append(bytes(o))
        return FeedPosition(tuple(fresh), tuple(feed)), tuple(first)

    def fed_since(
        self, since: FeedPosition, scan_limit: int = FEED_MAXLEN
    ) -> tuple[set[str], FeedPosition] | None:
        """Return the feeds' ids between ``since`` and now, checked against the logs (see the protocol)."""
        now, oldest = self._feed_now()
        ns = self.store.namespace
        ids: set[str] = set()
        for j, layout in enumerate(self.side.layouts):
            if not now.feed[j] or not since.feed[j] or oldest[j] > since.feed[j]:
                return None  # the feed is gone, or trimmed past where this refresher stopped
            if since.fresh[j] == now.fresh[j] and since.feed[j] == now.feed[j]:
                continue
            logged = self._entries(freshness_key(layout.view, ns), since.fresh[j], now.fresh[j], scan_limit)
            fed = self._entries(changes_key(layout.view, ns), since.feed[j], now.feed[j], scan_limit)
            if logged is None or fed is None:
                return None
            writes = sum(1 for fields in logged if int(fields.get(b"n", b"1")) > 0)
            try:
                named = [names for fields in fed if (names := feed_entry_ids(fields)) is not None]
            except KeyFormatError:
                return None  # an entry that does not decode: the caller scans instead
            if writes != len(named):  # a write the feed does not name: a writer that does not feed it
                return None
            for names in named:
                ids.update(names)
        return ids, now

    def _entries(self, key: str, after: bytes, upto: bytes, limit: int) -> list[dict[bytes, bytes]] | None:
        """Return the entries of stream ``key`` in (``after``, ``upto``]; None past ``limit`` of them."""
        got = self.store.client.xrange(key, b"(" + after if after else b"-", upto or b"+", count=limit + 1)
        return None if len(got) > limit else [fields for _, fields in got]

    def view_rows(self, ids: list[str]) -> Iterator[tuple[list[str], list[ViewRows]]]:
        """Batches of (ids, each item view's rows of them): one ``MGET`` per view and batch."""
        for s in range(0, len(ids), self.batch):
            chunk = ids[s : s + self.batch]
            rows = self.store.read_many([(layout, chunk) for layout in self.side.layouts])
            yield chunk, [ViewRows(r.values, r.found, r.event_time_ms) for r in rows]


class IndexRefresher:
    """Builds and refreshes an item index from the online store with a two-tower item tower."""

    def __init__(
        self,
        source: ItemSource,
        model: TwoTowerModel,
        index: ItemIndexLike,
        model_version: str,
        item_columns: npt.NDArray[np.intp] | None = None,
        mirror: ItemMirror | None = None,
    ) -> None:
        """Refresh ``index`` from ``source`` with ``model``'s item tower.

        ``item_columns``: the model's item inputs as columns of the registry's vector, or None;
        ``mirror``: also keep every item's rows in memory for the ranker (``serving/item_mirror.py``).
        """
        self.source = source
        self.model = model
        self.index = index
        self.model_version = model_version
        self.item_columns = item_columns
        self.mirror = mirror
        self.refreshes = 0
        self._indexed: dict[str, int] = {}
        """Item id -> the newest write time across the item views when it was last embedded."""
        self._position: tuple[bytes, ...] | None = None
        """Each item view's newest freshness-log entry when the last refresh began (None: never)."""
        self._feed: FeedPosition | None = None
        """The change feed's position when the last refresh began (None: never, or no feed)."""

    @property
    def version(self) -> str:
        """``<two-tower model version>.<refresh number>``: which model and which pass over the store."""
        return f"{self.model_version}.{self.refreshes}"

    def export(self) -> dict[str, npt.NDArray[np.generic]]:
        """Return the write time each indexed item was embedded at (``indexed.ids``, ``indexed.write_ms``).

        With :meth:`restore`, a restart re-embeds only what changed since. Not the change-log
        positions: the first refresh after a restore scans the whole catalog.
        """
        ids = np.asarray(list(self._indexed), dtype=np.str_)
        times = np.fromiter(self._indexed.values(), dtype=np.int64, count=len(self._indexed))
        return {"indexed.ids": ids, "indexed.write_ms": times}

    def restore(self, arrays: dict[str, npt.NDArray[np.generic]], refreshes: int) -> None:
        """Take back :meth:`export`'s arrays and the refresh count (versions go on from the snapshot's).

        The index and the mirror are restored alongside, first.

        Raises:
            ValueError: malformed arrays, or ids the index does not hold.
        """
        ids, times = arrays["indexed.ids"], arrays["indexed.write_ms"]
        if ids.ndim != 1 or ids.dtype.kind != "U" or times.shape != ids.shape or times.dtype != np.int64:
            msg = f"index snapshot: malformed write times (ids {ids.dtype}{ids.shape}, times {times.shape})"
            raise ValueError(msg)
        indexed = dict(zip(ids.tolist(), times.tolist(), strict=True))
        if (
            len(indexed) != len(ids)
            or len(indexed) != len(self.index)
            or not all(i in self.index for i in indexed)
        ):
            msg = f"index snapshot: {len(indexed)} write times for an index of {len(self.index)} items"
            raise ValueError(msg)
        self._indexed = indexed
        self.refreshes = max(0, int(refreshes))

    def log_position(self) -> tuple[bytes, ...] | None:
        """Return the source's change-log position (each item view's newest freshness-log entry), or None."""
        return self.source.log_position()

    def changed(self) -> bool:
        """Return whether an item view may have written a row since the last refresh began.

        True before the first refresh and for a source without a change log (every look scans).
        """
        if self._position is None:
            return True
        return self.source.written_since(self._position)

    def refresh(self) -> RefreshReport:
        """Run the four steps of the module docstring; the first call builds the whole index.

        With a mirror, an item is also re-read when any one view's write time differs from the
        mirror's (a view's row gone since is dropped from the mirror without a read), and the rows
        read go to the mirror as well; at the end the mirror is confirmed as of the moment the
        change-log position was taken.
        """
        started = time.perf_counter()
        began_ms = now_ms()
        feed = self.source.feed_position()  # before the scan, as the log's: what follows is fed next
        position = self.log_position()  # before the scan: a write after this is seen next time
        # Step 1
        present = sorted(self.source.catalog())
        catalog = set(present)
        gone = [i for i in self._indexed if i not in catalog]
        removed = self._forget(gone)
        added, updated, unchanged = self._update(present)
        self.refreshes += 1
        return self._settle(position, feed, began_ms, started, (added, updated, removed, unchanged))

    def refresh_fed(self) -> RefreshReport | None:
        """Refresh only the items the change feed names since the last refresh; None when it cannot say.

        No scan: each named item's headers are read (an item gone from every view is removed), the
        changed ones re-read and re-embedded, as :meth:`refresh` does for the whole catalog; the
        mirror is then confirmed as of this call's start. None (nothing done) before a first
        :meth:`refresh`, for a source without a feed, or when the feed cannot say what was written
        (:meth:`ItemSource.fed_since`): the caller runs :meth:`refresh`.
        """
        if self._feed is None:
            return None
        started = time.perf_counter()
        began_ms = now_ms()
        position = self.log_position()
        got = self.source.fed_since(self._feed)
        if got is None:
            return None
        named, feed = got
        ids = sorted(named)
        removed = added = updated = unchanged = 0
        if ids:
            written = [self.source.headers(layout, ids)[0] for layout in self.source.side.layouts]
            anywhere = np.logical_or.reduce([w > 0 for w in written])
            removed = self._forget([i for i, here in zip(ids, anywhere.tolist(), strict=True) if not here])
            added, updated, unchanged = self._update(
                [i for i, here in zip(ids, anywhere.tolist(), strict=True) if here]
            )
            self.refreshes += 1
        return self._settle(position, feed, began_ms, started, (added, updated, removed, unchanged))

    def _settle(
        self,
        position: tuple[bytes, ...] | None,
        feed: FeedPosition | None,
        began_ms: int,
        started: float,
        counts: tuple[int, int, int, int],
    ) -> RefreshReport:
        """End a refresh: keep the positions it started from, confirm the mirror as of its start, report.

        ``counts``: (added, updated, removed, unchanged).
        """
        self._position, self._feed = position, feed
        if self.mirror is not None:
            self.mirror.confirm(began_ms)
        added, updated, removed, unchanged = counts
        return RefreshReport(
            self.version, len(self.index), added, updated, removed, unchanged,
            round(time.perf_counter() - started, 3),
        )  # fmt: skip

    def _forget(self, gone: list[str]) -> int:
        """Remove ``gone`` (in no item view now) from the index and the mirror; return how many were."""
        removed = self.index.remove(gone)
        for item_id in gone:
            self._indexed.pop(item_id, None)
        if self.mirror is not None:
            self.mirror.remove(gone)
        return removed

    def _update(self, present: list[str]) -> tuple[int, int, int]:
        """Run steps 2-4 for ``present`` (each in some item view); return (added, updated, unchanged)."""
        layouts = self.source.side.layouts
        mirror = self.mirror
        # Step 2
        newest = np.zeros(len(present), dtype=np.int64)
        writes: list[npt.NDArray[np.int64]] = []
        expires: list[npt.NDArray[np.int64]] = []
        for layout in layouts:
            written, expiry = self.source.headers(layout, present)
            writes.append(written)
            expires.append(expiry)
            np.maximum(newest, written, out=newest)
        recorded = np.fromiter(
            (self._indexed.get(i, -1) for i in present), dtype=np.int64, count=len(present)
        )
        stale = newest != recorded
        if mirror is not None:
            stale |= mirror.sync(present, writes)  # rows of expired keys are dropped there, not re-read
        todo = np.flatnonzero(stale)
        # Step 3
        added = updated = 0
        todo_ids = [present[j] for j in todo.tolist()]
        write_ms = dict(zip(todo_ids, newest[todo].tolist(), strict=True))
        at = dict(zip(todo_ids, todo.tolist(), strict=True))
        for ids, rows in self.source.view_rows(todo_ids):
            matrix, found, _ = assemble(self.source.side, rows)
            keep = np.flatnonzero(found)  # deleted between steps 1 and 3: the next refresh removes it
            if not len(keep):
                continue
            items = matrix[keep] if self.item_columns is None else matrix[keep][:, self.item_columns]
            kept = [ids[k] for k in keep.tolist()]
            a, u = self.index.upsert(kept, self.model.embed_items(items))
            added, updated = added + a, updated + u
            if mirror is not None:
                where = np.fromiter((at[i] for i in kept), dtype=np.intp, count=len(kept))
                mirror.put(
                    kept,
                    [ViewRows(r.values[keep], r.found[keep], r.event_time_ms[keep]) for r in rows],
                    [w[where] for w in writes],
                    [e[where] for e in expires],
                )
            # Step 4
            self._indexed.update((i, write_ms[i]) for i in kept)
        return added, updated, len(present) - len(todo)
