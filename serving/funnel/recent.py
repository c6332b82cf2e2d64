"""What the funnel remembers per user in Redis (recent impressions, clicks) and the catalog's side data.

Why a set the service keeps, not a registry view: the seen-filter needs the item ids a user was
shown in the last minutes, at once (the next request may come a second later). The realtime tier
aggregates events into numbers per window (counts, shares, top-k); it holds no set of ids, and an
impression reaches it through Kafka and Flink seconds later. The service that sends the
impressions knows them first, so it writes them here on the impressions path, bounded and
expiring, and Kafka still gets every impression for the tiers.

Keys (namespace of the online store, ``<ns>:funnel:...``):

- ``seen:<user>``: sorted set item -> time served (ms); members older than ``seen_window_s`` are
  removed on each write, at most ``seen_max`` newest kept, the key expires with the window.
- ``clicks:<user>``: sorted set item -> click time (ms), the newest ``clicks_max`` kept (the
  re-ranker's sequence), expiring after ``clicks_ttl_s``.
- ``popular``: sorted set item -> clicks received through ``/v1/feedback``; the ``popular_max``
  most clicked kept. The retrieval stage's fallback (the service's own popularity signal).
- ``category``: hash item -> category (catalog metadata, written by whoever loads the catalog:
  :meth:`RedisRecentItems.put_categories`); the diversity rule reads it.

Reads run in the caller's thread (the service's I/O pool). Writes never block a request: they go
into a bounded queue that one thread drains into one pipelined round trip per batch; when the
queue is full the write is dropped and counted (``dropped``).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any, Protocol

from headwater.pipelines.store.transport import Transport
from headwater.serving.funnel.config import FunnelConfig

log = logging.getLogger(__name__)
_STOP = object()
_MISSING = object()
CATEGORIES_CACHED_MAX = 500_000
"""Item categories kept in process at most; past it the copy starts again (bounded memory at 1M items)."""


@dataclass(frozen=True)
class Recent:
    """One user's recent impressions (ids) and clicks (newest first)."""

    seen: frozenset[str]
    clicks: tuple[str, ...]


class RecentItems(Protocol):
    """The funnel's per-user memory and catalog side data (Redis, or in memory for tests)."""

    def read(self, user_id: str, now_ms: int) -> Recent:
        """Return the items served to ``user_id`` within the window and their recent clicks (blocking)."""
        ...

    def popular(self, n: int) -> list[str]:
        """Return the ``n`` most clicked items, most first (blocking)."""
        ...

    def categories(self, ids: Sequence[str]) -> list[str | None]:
        """Return each item's category, None where the catalog has none (blocking)."""
        ...

    def cached_categories(self, ids: Sequence[str]) -> list[str | None] | None:
        """Return each item's category from an in-process copy (no I/O), or None: call :meth:`categories`."""
        ...

    def served(self, user_id: str, items: Sequence[str], at_ms: int) -> None:
        """Remember that ``items`` were shown to ``user_id`` (never blocks)."""
        ...

    def clicked(self, user_id: str, item_id: str, at_ms: int) -> None:
        """Remember a click of ``user_id`` on ``item_id`` (never blocks)."""
        ...


@dataclass
class WriteCounters:
    """Writes by outcome since start."""

    written: int = 0
    dropped: int = 0
    """Refused because the queue was full (Redis slow or down)."""
    failed: int = 0
    """Taken from the queue but Redis refused the batch (logged)."""


@dataclass
class RedisRecentItems:
    """:class:`RecentItems` in Redis: reads in the caller's thread, writes from one sender thread."""

    client: Any
    """A redis-py client (``OnlineStore.client``)."""
    namespace: str
    config: FunnelConfig = field(default_factory=FunnelConfig)
    counters: WriteCounters = field(default_factory=WriteCounters)

    def __post_init__(self) -> None:
        self._transport = Transport(self.client)
        self._queue: queue.Queue[object] = queue.Queue(maxsize=self.config.write_buffer)
        self._thread: threading.Thread | None = None
        self._prefix = f"{self.namespace}:funnel:"
        self._cats: dict[str, str | None] = {}
        self._cats_until = 0.0

    def key(self, kind: str, user_id: str | None = None) -> str:
        """Return the Redis key of ``kind`` (``seen``, ``clicks``: per user; ``popular``, ``category``)."""
        return self._prefix + kind + ("" if user_id is None else ":" + user_id)

    # Reads ----------------------------------------------------------------------------------------

    def read(self, user_id: str, now_ms: int) -> Recent:
        """One round trip: the seen items within the window and the newest clicks."""
        since = now_ms - int(self.config.seen_window_s * 1000)
        # The store's transport (hiredis, one send), not a redis-py pipeline: a third of the CPU.
        seen, clicks = self._transport.execute(
            [("ZRANGEBYSCORE", self.key("seen", user_id), since, "+inf"),
             ("ZREVRANGE", self.key("clicks", user_id), 0, self.config.clicks_max - 1)],
            f"reading the recent items of user {user_id!r}",
        )  # fmt: skip
        for reply in (seen, clicks):
            if isinstance(reply, Exception):  # an error reply (a key of another type...)
                raise reply
        return Recent(frozenset(map(_text, seen)), tuple(map(_text, clicks)))

    def popular(self, n: int) -> list[str]:
        """Return the ``n`` most clicked items, most first."""
        return [_text(x) for x in self.client.zrevrange(self.key("popular"), 0, n - 1)]

    def categories(self, ids: Sequence[str]) -> list[str | None]:
        """Each item's category: from the in-process copy, else the catalog hash (one ``HMGET``)."""
        if not ids:
            return []
        if not self._cats or time.monotonic() > self._cats_until or len(self._cats) > CATEGORIES_CACHED_MAX:
            self._cats = {}  # a new period: a new copy
            self._cats_until = time.monotonic() + self.config.categories_cache_s
        got: list[object] = list(map(self._cats.get, ids, repeat(_MISSING)))
        missing = [i for i, c in zip(ids, got, strict=True) if c is _MISSING]
        if missing:  # only the items the copy lacks (at 1M items most requests hold some it has)
            read = [None if c is None else _text(c) for c in self.client.hmget(self.key("category"), missing)]
            if self.config.categories_cache_s > 0:
                self._cats.update(zip(missing, read, strict=True))
            fill = iter(read)
            got = [next(fill) if c is _MISSING else c for c in got]
        return got  # type: ignore[return-value]

    def cached_categories(self, ids: Sequence[str]) -> list[str | None] | None:
        """Each item's category from the in-process copy (no I/O), or None when one is not there.

        The copy is dropped ``categories_cache_s`` after it was started, so a category changed in
        Redis is seen within that time.
        """
        if not self._cats or time.monotonic() > self._cats_until:
            self._cats = {}
            return None
        got = list(map(self._cats.get, ids, repeat(_MISSING)))
        return None if any(c is _MISSING for c in got) else got  # type: ignore[return-value]

    def put_categories(self, categories: Mapping[str, str], chunk: int = 10_000) -> int:
        """Write item -> category into the catalog hash (blocking; loaders, tests); return the count."""
        items = list(categories.items())
        for start in range(0, len(items), chunk):
            self.client.hset(self.key("category"), mapping=dict(items[start : start + chunk]))
        return len(items)

    # Writes ---------------------------------------------------------------------------------------

    def served(self, user_id: str, items: Sequence[str], at_ms: int) -> None:
        """Queue the impressions of one answer (dropped and counted when the queue is full)."""
        if items:
            self._offer(("seen", user_id, tuple(items), at_ms))

    def clicked(self, user_id: str, item_id: str, at_ms: int) -> None:
        """Queue one click (the user's sequence and the popularity set)."""
        self._offer(("click", user_id, item_id, at_ms))

    def _offer(self, op: tuple[Any, ...]) -> None:
        try:
            self._queue.put_nowait(op)
        except queue.Full:
            self.counters.dropped += 1

    def start(self) -> None:
        """Start the sender thread (idempotent)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="headwater-funnel-recent", daemon=True)
            self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Write what is queued, then stop the sender thread."""
        if self._thread is not None:
            self._queue.put(_STOP)
            self._thread.join(timeout_s)
            self._thread = None

    def flush_now(self) -> int:
        """Write what is queued from the calling thread (tests and the bench); returns ops written."""
        ops = self._drain(block=False)
        if ops:
            self._write(ops)
        return len(ops)

    def _drain(self, block: bool) -> list[tuple[Any, ...]]:
        ops: list[Any] = []
        try:
            ops.append(self._queue.get(timeout=0.5) if block else self._queue.get_nowait())
            while len(ops) < 1000:
                ops.append(self._queue.get_nowait())
        except queue.Empty:
            pass
        return ops

    def _run(self) -> None:
        while True:
            ops = self._drain(block=True)
            stop = any(op is _STOP for op in ops)
            ops = [op for op in ops if op is not _STOP]
            if ops:
                self._write(ops)
            if stop:
                rest = [op for op in self._drain(block=False) if op is not _STOP]
                if rest:
                    self._write(rest)
                return

    def _write(self, ops: list[tuple[Any, ...]]) -> None:
        cfg = self.config
        window_ms = int(cfg.seen_window_s * 1000)
        pipe = self.client.pipeline(transaction=False)
        for kind, user_id, what, at_ms in ops:
            if kind == "seen":
                key = self.key("seen", user_id)
                pipe.zadd(key, dict.fromkeys(what, at_ms))
                pipe.zremrangebyscore(key, "-inf", at_ms - window_ms - 1)
                pipe.zremrangebyrank(key, 0, -cfg.seen_max - 1)  # keep the newest seen_max
                pipe.pexpire(key, window_ms)
            else:
                key = self.key("clicks", user_id)
                pipe.zadd(key, {what: at_ms})
                pipe.zremrangebyrank(key, 0, -cfg.clicks_max - 1)
                pipe.pexpire(key, int(cfg.clicks_ttl_s * 1000))
                pipe.zincrby(self.key("popular"), 1.0, what)
        if any(op[0] == "click" for op in ops):
            pipe.zremrangebyrank(self.key("popular"), 0, -cfg.popular_max - 1)
        try:
            pipe.execute()
            self.counters.written += len(ops)
        except Exception as exc:  # Redis down or refusing: the funnel still answers, without the memory
            self.counters.failed += len(ops)
            log.warning("recent-items write of %d ops failed (%s: %s)", len(ops), type(exc).__name__, exc)


class MemoryRecentItems:
    """:class:`RecentItems` in process memory (unit tests, benchmarks without Redis); writes are immediate."""

    def __init__(
        self, config: FunnelConfig | None = None, categories: Mapping[str, str] | None = None
    ) -> None:
        self.config = config or FunnelConfig()
        self.seen: dict[str, dict[str, int]] = {}
        self.clicks: dict[str, dict[str, int]] = {}
        self.clicks_total: dict[str, int] = {}
        self.category: dict[str, str] = dict(categories or {})

    def read(self, user_id: str, now_ms: int) -> Recent:
        """Return the seen items within the window and the newest clicks."""
        since = now_ms - int(self.config.seen_window_s * 1000)
        seen = frozenset(i for i, t in self.seen.get(user_id, {}).items() if t >= since)
        clicks = sorted(self.clicks.get(user_id, {}).items(), key=lambda kv: -kv[1])
        return Recent(seen, tuple(i for i, _ in clicks[: self.config.clicks_max]))

    def popular(self, n: int) -> list[str]:
        """Return the ``n`` most clicked items."""
        return [i for i, _ in sorted(self.clicks_total.items(), key=lambda kv: (-kv[1], kv[0]))[:n]]

    def categories(self, ids: Sequence[str]) -> list[str | None]:
        """Each item's category."""
        return [self.category.get(i) for i in ids]

    def cached_categories(self, ids: Sequence[str]) -> list[str | None] | None:
        """None: the funnel calls :meth:`categories` (off the loop, as it does a store)."""
        return None

    def served(self, user_id: str, items: Sequence[str], at_ms: int) -> None:
        """Remember the impressions."""
        self.seen.setdefault(user_id, {}).update(dict.fromkeys(items, at_ms))

    def clicked(self, user_id: str, item_id: str, at_ms: int) -> None:
        """Remember the click."""
        self.clicks.setdefault(user_id, {})[item_id] = at_ms
        self.clicks_total[item_id] = self.clicks_total.get(item_id, 0) + 1


def _text(value: bytes | str) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else value
