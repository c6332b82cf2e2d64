"""Item-embedding indexes: an HNSW index (usearch) for serving and an exact one for checks.

Both map item ids (str) to unit-norm embeddings and answer ``search(query, n, exclude)`` with
the ``n`` items of highest inner product, best first, leaving out ``exclude``. Both take
incremental changes: :meth:`upsert` replaces the vectors of ids already present and adds the
others, :meth:`remove` deletes ids. ``bench/bench_ann.py`` chose usearch (the figures and the
reasons are in its JSON and the issue-15 report): it removes and re-adds keys in place (faiss's
HNSW cannot remove; IVF must be retrained as vectors drift), and it installs as a wheel (hnswlib
compiles from source).

Each index keeps its id <-> key map in Python (usearch keys are integers); keys of removed ids
are reused. A lock keeps the graph and the id map in step: a search never sees half of an upsert.
A second lock serialises the writers, so a snapshot (:meth:`ItemIndex.export`) holds only that one
and searches go on while the graph is written (a save of 1M items takes 0.5-7 s).

Changes are not split into smaller atomic chunks to shorten a search's wait: usearch hands the GIL
back once per added item, so while the event loop runs Python each add waits up to one switch
interval (0.11 -> 1.25 ms an item at the service's 1 ms); at 2,000 item writes a second, chunks of
64 ids read 72.9 QPS at 4 connections against 115.6 for whole batches (1M items,
``bench_recommend.py --item-writes 2000``, ``bench/results/bench_recommend_1000000_s10_writes*.json``).
"""

from __future__ import annotations

import threading
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Protocol, cast

import numpy as np
import numpy.typing as npt

from headwater.registry.errors import HeadwaterError
from headwater.serving.slots import ids_from_arrays, ids_to_arrays

DEFAULT_CONNECTIVITY = 16
DEFAULT_EXPANSION_ADD = 128
DEFAULT_EXPANSION_SEARCH = 256
"""ef at query time. On the two-tower model's own item embeddings (100k items) recall@100 is 0.911,
0.961, 0.986 and 0.995 at ef 100, 160, 256 and 400; on synthetic clusters ef 160 already gives 0.995
(100k, dim 32), 0.990 (dim 64) and 0.991 (1M, dim 32), 256 gives 0.997 at 1M. 256 keeps a margin
over 0.95 on the harder real embeddings (bench/results/bench_ann.json).

The funnel asks ``retrieve_n`` + seen ids (about 500), and ef is at least what is asked, so serving
searches at ef ~500 whatever this default: there recall@100 is 0.998 and the search CPU follows the
ids asked (100k items, ``bench/bench_retrieval_ef.py``: ~0.4 ms for 100 at ef 256, ~0.65 ms for
300, ~0.9-1.1 ms for 500). Connectivity 12 or 8 instead of 16 saves nothing measurable there (within
the run-to-run noise) and loses recall at small ef; 300 candidates instead of 500 costs 2.6% of the
answers' planted signal (``bench_recommend.py --variants current,retrieve300 --quality-users 300``)."""


class ItemIndexError(HeadwaterError, ValueError):
    """Vectors of the wrong shape, or ids and vectors of different lengths."""


class ItemIndexLike(Protocol):
    """What a retriever needs from an index."""

    dim: int

    @property
    def library(self) -> str:
        """What searches: the library and its version, no spaces (the start-up line and /health name it)."""
        ...

    def __len__(self) -> int: ...

    def __contains__(self, item_id: object) -> bool: ...

    def upsert(self, ids: Sequence[str], vectors: npt.NDArray[np.float32]) -> tuple[int, int]:
        """Add or replace; returns (added, updated)."""
        ...

    def remove(self, ids: Collection[str]) -> int:
        """Delete the ids present; returns how many were."""
        ...

    def search(
        self, query: npt.NDArray[np.float32], n: int, exclude: Collection[str] = ()
    ) -> tuple[list[str], npt.NDArray[np.float32]]:
        """Return the ``n`` best ids and their inner products, best first, none of ``exclude``."""
        ...


def _check(ids: Sequence[str], vectors: npt.NDArray[np.float32], dim: int) -> npt.NDArray[np.float32]:
    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    if vectors.ndim != 2 or vectors.shape[1] != dim or len(vectors) != len(ids):
        msg = f"item index: expected {len(ids)} vectors of dim {dim} (one per id); got shape {vectors.shape}"
        raise ItemIndexError(msg)
    if len(set(ids)) != len(ids):
        msg = "item index: an upsert names an id twice; pass each id once"
        raise ItemIndexError(msg)
    return vectors


class ExactIndex:
    """Brute-force inner-product search over a dense matrix: the ground truth of recall checks."""

    def __init__(self, dim: int) -> None:
        self.dim = dim
        self._row: dict[str, int] = {}
        self._ids: list[str] = []
        self._vectors = np.empty((0, dim), dtype=np.float32)
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._row)

    @property
    def library(self) -> str:
        """Exact search with numpy (no approximate library): ``exact-numpy-<version>``."""
        return f"exact-numpy-{np.__version__}"

    def __contains__(self, item_id: object) -> bool:
        return item_id in self._row

    def upsert(self, ids: Sequence[str], vectors: npt.NDArray[np.float32]) -> tuple[int, int]:
        """Add or replace rows; returns (added, updated)."""
        vectors = _check(ids, vectors, self.dim)
        with self._lock:
            rows = np.fromiter((self._row.get(i, -1) for i in ids), dtype=np.intp, count=len(ids))
            old = rows >= 0
            self._vectors[rows[old]] = vectors[old]
            new = np.flatnonzero(~old)
            start = len(self._ids)
            for j, i in enumerate(new.tolist()):
                self._row[ids[i]] = start + j
                self._ids.append(ids[i])
            self._vectors = np.concatenate([self._vectors, vectors[new]])
            return len(new), int(old.sum())

    def remove(self, ids: Collection[str]) -> int:
        """Delete ids (the last row moves into each freed row); returns how many were present."""
        removed = 0
        with self._lock:
            for item_id in ids:
                row = self._row.pop(item_id, None)
                if row is None:
                    continue
                last = len(self._ids) - 1
                if row != last:
                    self._vectors[row] = self._vectors[last]
                    self._ids[row] = self._ids[last]
                    self._row[self._ids[row]] = row
                self._ids.pop()
                self._vectors = self._vectors[:last]
                removed += 1
        return removed

    def search(
        self, query: npt.NDArray[np.float32], n: int, exclude: Collection[str] = ()
    ) -> tuple[list[str], npt.NDArray[np.float32]]:
        """Exact top ``n`` by inner product; ties broken by id for a stable order."""
        with self._lock:
            scores = self._vectors @ np.asarray(query, dtype=np.float32)
            if exclude:
                drop = [self._row[e] for e in exclude if e in self._row]
                scores[drop] = -np.inf
            ids = np.asarray(self._ids)
        keep = np.flatnonzero(np.isfinite(scores))
        order = keep[np.lexsort((ids[keep], -scores[keep]))][:n]
        return ids[order].tolist(), scores[order].astype(np.float32)


class ItemIndex:
    """An HNSW index (usearch, inner product, float32 storage) over item embeddings, keyed by item id."""

    def __init__(
        self,
        dim: int,
        connectivity: int = DEFAULT_CONNECTIVITY,
        expansion_add: int = DEFAULT_EXPANSION_ADD,
        expansion_search: int = DEFAULT_EXPANSION_SEARCH,
        threads: int = 0,
    ) -> None:
        """``threads`` for batch adds (0 = every core); a search runs on the caller's thread."""
        from usearch.index import Index

        self.dim = dim
        self.connectivity = connectivity
        self.expansion_add = expansion_add
        self.expansion_search = expansion_search
        self.threads = threads
        self._index = Index(
            ndim=dim,
            metric="ip",
            dtype="f32",
            connectivity=connectivity,
            expansion_add=expansion_add,
            expansion_search=expansion_search,
        )
        self._key: dict[str, int] = {}
        self._ids: list[str | None] = []
        self._free: list[int] = []
        self._lock = threading.Lock()
        """Held by a search and by a change: the graph and the id map agree."""
        self._write = threading.Lock()
        """Held by a writer (a change, a snapshot's export): one at a time; searches only wait for changes."""

    def __len__(self) -> int:
        return len(self._key)

    def __contains__(self, item_id: object) -> bool:
        return item_id in self._key

    @property
    def library(self) -> str:
        """``usearch-<version>`` (no spaces: the start-up line is ``key=value`` pairs)."""
        import usearch

        return f"usearch-{usearch.__version__}"

    def settings(self) -> dict[str, int | str]:
        """Return what the graph is built with (a snapshot made with others is not loaded)."""
        return {"dim": self.dim, "metric": "ip", "dtype": "f32", "connectivity": self.connectivity,
                "expansion_add": self.expansion_add}  # fmt: skip

    @property
    def memory_bytes(self) -> int:
        """Bytes usearch holds for the graph and vectors."""
        return int(self._index.memory_usage)

    def upsert(self, ids: Sequence[str], vectors: npt.NDArray[np.float32]) -> tuple[int, int]:
        """Add new ids, replace the vectors of present ones (remove + add); returns (added, updated)."""
        vectors = _check(ids, vectors, self.dim)
        if not len(ids):
            return 0, 0
        with self._write, self._lock:  # whole: the module docstring says why not in chunks
            present = [self._key[i] for i in ids if i in self._key]
            if present:
                self._index.remove(np.asarray(present, dtype=np.uint64))
            keys = np.empty(len(ids), dtype=np.uint64)
            for j, item_id in enumerate(ids):
                key = self._key.get(item_id)
                if key is None:
                    key = self._free.pop() if self._free else len(self._ids)
                    if key == len(self._ids):
                        self._ids.append(item_id)
                    else:
                        self._ids[key] = item_id
                    self._key[item_id] = key
                keys[j] = key
            self._index.add(keys, vectors, threads=self.threads)
        return len(ids) - len(present), len(present)

    def remove(self, ids: Collection[str]) -> int:
        """Delete the ids present; returns how many were."""
        with self._write, self._lock:
            keys = [self._key.pop(i) for i in ids if i in self._key]
            if keys:
                self._index.remove(np.asarray(keys, dtype=np.uint64))
                for key in keys:
                    self._ids[key] = None
                self._free.extend(keys)
        return len(keys)

    def export(self, graph: Path) -> dict[str, npt.NDArray[np.generic]]:
        """Write the HNSW graph to ``graph``; return the id map as arrays (``ids``, ``held``).

        Holds the writers' lock, not the searches': nothing changes while the graph and the map are
        written (they are of the same moment), and searches go on. :meth:`restore` reads both back.
        """
        with self._write:
            self._index.save(str(graph))
            return ids_to_arrays(self._ids)

    def restore(self, graph: Path, arrays: dict[str, npt.NDArray[np.generic]]) -> None:
        """Load what :meth:`export` wrote into this empty index (same dim and connectivity).

        Raises:
            ItemIndexError: the graph and the id map disagree (other keys, another dim, an id twice).
        """
        try:
            restored = ids_from_arrays(arrays, "item index")
        except ValueError as exc:
            raise ItemIndexError(str(exc)) from exc
        with self._write, self._lock:
            if len(self._key):
                msg = "item index: restore into an empty index only"
                raise ItemIndexError(msg)
            self._index.load(str(graph))
            keys = np.asarray([k for k, n in enumerate(restored) if n is not None], dtype=np.uint64)
            graph_size, graph_dim = len(self._index), int(self._index.ndim)
            if graph_dim != self.dim or graph_size != len(keys) or not np.all(self._index.contains(keys)):
                self._index.reset()  # type: ignore[no-untyped-call]
                msg = (
                    f"item index snapshot: the graph ({graph_size} vectors of dim {graph_dim})"
                    f" does not match its id map ({len(keys)} ids, dim {self.dim})"
                )
                raise ItemIndexError(msg)
            self._ids = restored
            self._key = {n: k for k, n in enumerate(self._ids) if n is not None}
            self._free = [k for k, n in enumerate(self._ids) if n is None]
            if len(self._key) != len(keys):
                self._index.reset()  # type: ignore[no-untyped-call]
                self._ids, self._key, self._free = [], {}, []
                msg = "item index snapshot: an id is mapped to two keys"
                raise ItemIndexError(msg)

    def search(
        self, query: npt.NDArray[np.float32], n: int, exclude: Collection[str] = ()
    ) -> tuple[list[str], npt.NDArray[np.float32]]:
        """Approximate top ``n`` by inner product, none of ``exclude`` (fetched beyond ``n``, dropped)."""
        q = np.ascontiguousarray(query, dtype=np.float32).reshape(-1)
        if q.shape[0] != self.dim:
            msg = f"item index: the query must have dim {self.dim}; got {q.shape[0]}"
            raise ItemIndexError(msg)
        with self._lock:
            skip = sum(1 for e in exclude if e in self._key) if exclude else 0
            want = min(n + skip, len(self._key))
            if want <= 0:
                return [], np.empty(0, dtype=np.float32)
            # ef must cover the results wanted; usearch's stub marks the (settable) property read-only
            self._index.expansion_search = max(self.expansion_search, want)  # type: ignore[misc]
            found = self._index.search(q, want, threads=1)
            keys, dist = np.asarray(found.keys), np.asarray(found.distances)
            names = list(map(self._ids.__getitem__, keys.tolist()))  # C-level: ~750 ids a funnel request
        scores = (1.0 - dist).astype(np.float32)  # usearch's "ip" distance is 1 - <q, x>
        if not exclude and None not in names:  # the usual case: usearch returns live keys only
            return cast("list[str]", names[:n]), scores[:n]
        keep = [j for j, name in enumerate(names) if name is not None and name not in exclude][:n]
        return [cast(str, names[j]) for j in keep], scores[keep]


def recall_at_k(
    approx: ItemIndexLike, exact: ItemIndexLike, queries: npt.NDArray[np.float32], k: int = 100
) -> float:
    """Mean share of the exact top ``k`` that the approximate index returns, over ``queries``."""
    hits = total = 0
    for q in queries:
        truth, _ = exact.search(q, k)
        got, _ = approx.search(q, k)
        hits += len(set(truth) & set(got))
        total += len(truth)
    return hits / total if total else float("nan")
