"""What serving needs from the online store, an adapter to the real one, and an in-memory fake.

The service reads through :class:`FeatureReader` only, so the fallback logic can be tested with
:class:`InMemoryFeatureStore` and run against Redis with :class:`OnlineStoreReader`. Store
failures of any kind reach serving as one exception, :class:`FeatureReadError`, translated at
this boundary.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

from headwater.pipelines.store import OnlineStore, StoreError, ViewLayout


class FeatureReadError(RuntimeError):
    """The online store could not answer a read (down, timed out, or an error reply)."""


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


def now_ms() -> int:
    """Wall-clock epoch milliseconds (UTC)."""
    return time.time_ns() // 1_000_000


class OnlineStoreReader:
    """:class:`FeatureReader` over the Redis online store (``headwater.pipelines.store``)."""

    def __init__(self, store: OnlineStore) -> None:
        self._store = store

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
        """Read all views in one round trip; store errors become :class:`FeatureReadError`."""
        try:
            results = self._store.read_many(list(requests))
        except StoreError as exc:
            raise FeatureReadError(str(exc)) from exc
        return [ViewRows(r.values, r.found, r.event_time_ms) for r in results]

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
