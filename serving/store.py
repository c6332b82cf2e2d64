"""What serving needs from the online store, an adapter to the real one, and an in-memory fake.

The service reads through :class:`FeatureReader` only, so the fallback logic can be tested with
:class:`InMemoryFeatureStore` and run against Redis with :class:`OnlineStoreReader`. Store
failures of any kind reach serving as one exception, :class:`FeatureReadError`, translated at
this boundary.

Reads run on a :class:`ReadPool`: threads with a bound on the reads in flight (running or queued).
A thread cannot be interrupted, so a read whose caller gave up on its deadline runs until the
store answers or the client's socket timeout; the bound keeps those from piling up behind a slow
store: past it a read fails at once (the request falls back) instead of queueing without end. A
queued read whose caller gave up is cancelled before it starts.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, ParamSpec, Protocol, TypeVar

import numpy as np
import numpy.typing as npt

from headwater.pipelines.store import OnlineStore, StoreError, ViewLayout
from headwater.registry.errors import HeadwaterError


class FeatureReadError(HeadwaterError, RuntimeError):
    """The online store could not answer a read (down, timed out, or an error reply)."""


P = ParamSpec("P")
T = TypeVar("T")


def default_reads_in_flight(threads: int) -> int:
    """Return how many reads a pool of ``threads`` takes before refusing: 16 per thread, at least 64.

    A healthy store answers a read in about a millisecond, so a burst of requests (the batcher
    queues 128) waits briefly and is served; a hung one fills the bound within a deadline, and
    from then on requests fall back at once instead of each waiting out its deadline in a queue.
    """
    return max(64, 16 * threads)


class ReadPool(Executor):
    """A thread pool that refuses work past ``max_in_flight`` reads running or queued.

    ``submit`` raises :class:`FeatureReadError` when the bound is reached, so a caller falls back
    at once; ``refused`` counts those. A read counts until its thread returns, timed out or not.
    """

    def __init__(self, threads: int, max_in_flight: int | None = None, name: str = "headwater-io") -> None:
        """``max_in_flight`` defaults to :func:`default_reads_in_flight` of ``threads``."""
        self.threads = threads
        self.max_in_flight = max_in_flight if max_in_flight is not None else default_reads_in_flight(threads)
        self._name = name
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._in_flight = 0
        self.refused = 0

    @property
    def in_flight(self) -> int:
        """Reads submitted and not finished (running, queued, or timed out and still running)."""
        return self._in_flight

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        """Queue ``fn``; raise :class:`FeatureReadError` when ``max_in_flight`` reads are in flight."""
        with self._lock:
            if self._in_flight >= self.max_in_flight:
                self.refused += 1
                msg = (
                    f"{self._in_flight} online-store reads are already in flight on {self.threads} threads"
                    " (the store is slow or down); not queueing another"
                )
                raise FeatureReadError(msg)
            self._in_flight += 1
            if self._pool is None:  # first use, or used again after shutdown (an app's second lifespan)
                self._pool = ThreadPoolExecutor(max_workers=self.threads, thread_name_prefix=self._name)
            pool = self._pool
        try:
            future = pool.submit(fn, *args, **kwargs)
        except BaseException:
            self._finished(None)
            raise
        future.add_done_callback(self._finished)
        return future

    def _finished(self, _future: Future[Any] | None) -> None:
        with self._lock:
            self._in_flight -= 1

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Stop the threads (as ``Executor.shutdown``); a later submit starts new ones."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=wait, cancel_futures=cancel_futures)


@dataclass(frozen=True)
class ViewRows:
    """Rows of one view, in the order of the requested ids.

    Attributes:
        values: (n, d) float32, NaN where not found.
        found: (n,) bool.
        event_time_ms: (n,) int64 event time of each row, 0 where not found.
    """

    values: npt.NDArray[np.float32]
    found: npt.NDArray[np.bool_]
    event_time_ms: npt.NDArray[np.int64]


class FeatureReader(Protocol):
    """Batched reads of several views in one round trip."""

    def read_many(self, requests: Sequence[tuple[ViewLayout, Sequence[str]]]) -> list[ViewRows]:
        """Read each (view, ids) pair; raise :class:`FeatureReadError` when the store fails."""
        ...

    def other_version_rows(self) -> Mapping[str, int]:
        """Per view, rows read since start that were written under another version of the view."""
        ...


def now_ms() -> int:
    """Wall-clock epoch milliseconds (UTC)."""
    return time.time_ns() // 1_000_000


class OnlineStoreReader:
    """:class:`FeatureReader` over the Redis online store (``headwater.pipelines.store``)."""

    def __init__(self, store: OnlineStore) -> None:
        self._store = store
        self._other_version: collections.Counter[str] = collections.Counter()
        self._lock = threading.Lock()

    @property
    def store(self) -> OnlineStore:
        """The online store read from (its client and namespace also feed the freshness metrics)."""
        return self._store

    @classmethod
    def from_url(cls, url: str, namespace: str | None = None, timeout_s: float = 1.0) -> OnlineStoreReader:
        """Connect to ``url``; reads give up after ``timeout_s`` so a hung Redis cannot stall serving."""
        kwargs: dict[str, object] = {"socket_timeout": timeout_s, "socket_connect_timeout": timeout_s}
        if namespace is not None:
            kwargs["namespace"] = namespace
        return cls(OnlineStore.from_url(url, **kwargs))  # type: ignore[arg-type]

    def read_many(self, requests: Sequence[tuple[ViewLayout, Sequence[str]]]) -> list[ViewRows]:
        """Read all views in one round trip; any store failure becomes :class:`FeatureReadError`."""
        try:
            results = self._store.read_many(list(requests))
        except StoreError as exc:
            raise FeatureReadError(str(exc)) from exc
        except Exception as exc:
            # Whatever the client or the decoding raises (a reply that is not what the store
            # writes, a bug): the request falls back instead of failing.
            msg = f"online store read failed: {type(exc).__name__}: {exc}"
            raise FeatureReadError(msg) from exc
        for result in results:
            other = result.other_version_rows()
            if other:
                with self._lock:
                    self._other_version[result.layout.view] += other
        return [ViewRows(r.values, r.found, r.event_time_ms) for r in results]

    def other_version_rows(self) -> Mapping[str, int]:
        """Per view, rows read since start that were written under another version of the view."""
        with self._lock:
            return dict(self._other_version)

    def write(
        self, spec: ViewLayout, ids: Sequence[str], values: npt.NDArray[np.float32], event_ms: int
    ) -> None:
        """Write one batch of vectors with one event time (tests and benchmarks)."""
        times = np.full(len(ids), event_ms, dtype=np.int64)
        self._store.write_batch(spec, list(ids), values, times)

    def close(self) -> None:
        """Close the store's connections."""
        self._store.close()


class InMemoryFeatureStore:
    """A dict-backed :class:`FeatureReader` for tests and examples; ``fail`` makes reads raise."""

    def __init__(self) -> None:
        self._rows: dict[tuple[str, str], tuple[npt.NDArray[np.float32], int]] = {}
        self._lock = threading.Lock()
        self.fail: str | None = None
        self.reads = 0

    def write(
        self, spec: ViewLayout, ids: Sequence[str], values: npt.NDArray[np.float32], event_ms: int
    ) -> None:
        """Store one vector per id; a row with an older event time than the stored one is ignored."""
        matrix = np.asarray(values, dtype=np.float32).reshape(len(ids), spec.dim)
        with self._lock:
            for entity_id, row in zip(ids, matrix, strict=True):
                old = self._rows.get((spec.view, entity_id))
                if old is None or old[1] <= event_ms:
                    self._rows[(spec.view, entity_id)] = (row.copy(), event_ms)

    def other_version_rows(self) -> Mapping[str, int]:
        """Rows here carry no version: none is ever of another one."""
        return {}

    def read_many(self, requests: Sequence[tuple[ViewLayout, Sequence[str]]]) -> list[ViewRows]:
        """Read each view; raise :class:`FeatureReadError` while ``fail`` is set."""
        if self.fail is not None:
            raise FeatureReadError(self.fail)
        out: list[ViewRows] = []
        with self._lock:
            self.reads += 1
            for spec, ids in requests:
                values = np.full((len(ids), spec.dim), np.nan, dtype=np.float32)
                found = np.zeros(len(ids), dtype=bool)
                times = np.zeros(len(ids), dtype=np.int64)
                for i, entity_id in enumerate(ids):
                    hit = self._rows.get((spec.view, entity_id))
                    if hit is not None:
                        values[i], times[i], found[i] = hit[0], hit[1], True
                out.append(ViewRows(values, found, times))
        return out
