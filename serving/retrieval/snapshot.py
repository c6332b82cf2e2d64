"""The retrieval index on disk, so that a restart does not rebuild it from the online store.

A build reads every item's rows from Redis, embeds them with the item tower and adds them to the
HNSW graph: 135-160 s for 1M items on this machine. A snapshot keeps what the build made: the graph
(usearch's own file), the id map, the write time each item was embedded at, and the item mirror's
rows. At start, a snapshot made *the same way* (:func:`snapshot_key`: the same two-tower model and
item inputs, the same item views at the same versions and layouts, the same store namespace and
index settings) is loaded, and the first refresh, which scans the catalog's write times as every
refresh does, re-reads and re-embeds only the items written since it was saved (and drops those
gone): the snapshot is never trusted for what the store says now, only for what did not change.
A snapshot made another way, or one that fails a check (a file missing, a checksum, arrays that do
not fit), is left aside with the reason logged, and the index is built from the store as before.

Files, in ``<state dir>/index-snapshot`` by default (:data:`SNAPSHOT_FOLDER`):

- ``graph-<token>.usearch``: the HNSW graph and vectors;
- ``state-<token>.npz``: the id maps, write times and mirror rows (numpy arrays, no pickles);
- ``meta.json``: the key, counts, the index version, when it was saved, and the SHA-256 of the two
  files. A save writes new files, then replaces ``meta.json`` in one rename, then deletes the old
  files: a crash leaves the previous snapshot or the new one, never a mix.

Saved by :class:`~headwater.serving.retrieval.runtime.RetrievalRuntime` on its refresh thread (the
index's only writer) at most every ``index_snapshot_s`` while it changes, and at stop.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import secrets
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from headwater.ranking.features import SideViews
from headwater.registry.errors import HeadwaterError
from headwater.serving.retrieval.index import ItemIndex
from headwater.serving.retrieval.refresh import IndexRefresher
from headwater.serving.store import now_ms

log = logging.getLogger(__name__)
SNAPSHOT_FOLDER = "index-snapshot"
"""The folder under the state directory that ``headwater serve`` keeps its snapshot in."""
FORMAT = 1
META = "meta.json"
MAX_META_BYTES = 1 << 20
LEFTOVER_AGE_S = 3600.0
"""Files of a save that did not finish (a crash) are deleted by the next save once this old."""


class SnapshotError(HeadwaterError):
    """A snapshot that cannot be used; the message says why (the index is then built from the store)."""


class NoSnapshot(SnapshotError):
    """The folder holds no snapshot yet (a first start): not a problem, nothing to warn about."""


@dataclass(frozen=True)
class SnapshotInfo:
    """One saved or loaded snapshot."""

    folder: Path
    version: str
    """The index version it holds (``<two-tower model version>.<refresh number>``)."""
    items: int
    saved_at_ms: int
    seconds: float
    """How long the save or the load took."""
    bytes: int


def snapshot_key(
    model_version: str,
    item_columns: npt.NDArray[np.intp] | None,
    side: SideViews,
    namespace: str,
    index: ItemIndex,
    mirror: bool,
) -> dict[str, Any]:
    """Return what a snapshot was made with; one made otherwise is not loaded.

    The views' versions and schema hashes cover a change of what a view computes or of its layout;
    ``mirror`` whether the item rows are kept (a snapshot without them would make every item stale).
    """
    return {
        "format": FORMAT,
        "two_tower": model_version,
        "item_columns": None if item_columns is None else [int(c) for c in item_columns],
        "item_views": [[lay.view, lay.version, lay.schema_hash, lay.dim] for lay in side.layouts],
        "namespace": namespace,
        "index": index.settings(),
        "mirror": mirror,
    }


def save_snapshot(
    folder: Path, key: dict[str, Any], index: ItemIndex, refresher: IndexRefresher
) -> SnapshotInfo:
    """Write the index, the refresher's write times and the mirror to ``folder`` (module docstring).

    Call it from the index's only writer (the refresh thread, or once it stopped): searches may run
    meanwhile, a refresh may not. Raises OSError when the folder cannot be written.
    """
    started = time.perf_counter()
    folder.mkdir(parents=True, exist_ok=True)
    token = f"{now_ms()}-{os.getpid()}-{secrets.token_hex(4)}"
    graph, state = folder / f"graph-{token}.usearch", folder / f"state-{token}.npz"
    try:
        arrays = {f"index.{k}": v for k, v in index.export(graph).items()}
        arrays.update(refresher.export())
        if refresher.mirror is not None:
            arrays.update({f"mirror.{k}": v for k, v in refresher.mirror.export().items()})
        with state.open("wb") as out:
            np.savez(out, **arrays)  # no object arrays: loaded back with allow_pickle=False
        files = {p.name: _sha256(p) for p in (graph, state)}
        saved_at = now_ms()
        meta = {"key": key, "version": refresher.version, "refreshes": refresher.refreshes,
                "items": len(index), "saved_at_ms": saved_at, "files": files}  # fmt: skip
        previous = _previous_files(folder)
        partial = folder / f"{META}.{token}"
        partial.write_text(json.dumps(meta, indent=1), encoding="utf-8")
        os.replace(partial, folder / META)
    except BaseException:
        for leftover in (graph, state, folder / f"{META}.{token}"):
            leftover.unlink(missing_ok=True)
        raise
    # The previous snapshot's files, and those a crashed save left an hour ago or more (not another
    # process's save in progress).
    stale = time.time() - LEFTOVER_AGE_S
    for old in folder.iterdir():
        if old.name in files or old.name == META or not old.name.startswith(("graph-", "state-", META)):
            continue
        with contextlib.suppress(OSError):
            if old.name in previous or old.stat().st_mtime < stale:
                old.unlink()
    size = graph.stat().st_size + state.stat().st_size
    seconds = round(time.perf_counter() - started, 3)
    return SnapshotInfo(folder, refresher.version, len(index), saved_at, seconds, size)


def load_snapshot(
    folder: Path, key: dict[str, Any], index: ItemIndex, refresher: IndexRefresher
) -> SnapshotInfo:
    """Restore the empty ``index``, ``refresher`` and its mirror from ``folder``'s snapshot.

    Raises:
        SnapshotError: no snapshot, one made another way, or one that fails a check; the message
            names the folder and the reason. The objects may then be half-filled: make new ones.
    """
    started = time.perf_counter()
    meta = _read_meta(folder)
    if meta.get("key") != key:
        raise SnapshotError(
            f"{folder}: made {_difference(meta.get('key'), key)}; the index is built from the store"
        )
    files = meta.get("files")
    if not isinstance(files, dict) or len(files) != 2:
        raise SnapshotError(f"{folder}/{META}: no list of files; the index is built from the store")
    names = sorted(files)
    graph_name = next((n for n in names if n.startswith("graph-") and "/" not in n), None)
    state_name = next((n for n in names if n.startswith("state-") and "/" not in n), None)
    if graph_name is None or state_name is None:
        raise SnapshotError(
            f"{folder}/{META}: names no graph and state file; the index is built from the store"
        )
    graph, state = folder / graph_name, folder / state_name
    try:
        for path in (graph, state):
            if _sha256(path) != files[path.name]:
                raise SnapshotError(f"{path}: its checksum differs from {META}'s (a damaged file); "
                                    "the index is built from the store")  # fmt: skip
        with np.load(state, allow_pickle=False) as npz:
            arrays = {name: npz[name] for name in npz.files}
        index.restore(graph, {k[6:]: v for k, v in arrays.items() if k.startswith("index.")})
        if refresher.mirror is not None:
            refresher.mirror.restore({k[7:]: v for k, v in arrays.items() if k.startswith("mirror.")})
        refreshes = meta.get("refreshes")
        if not isinstance(refreshes, int):
            raise SnapshotError(f"{folder}/{META}: no refresh count; the index is built from the store")
        refresher.restore(arrays, refreshes)
    except SnapshotError:
        raise
    except (OSError, ValueError, KeyError, RuntimeError, EOFError, zipfile.BadZipFile) as exc:
        # ValueError covers ItemIndexError and numpy's refusals; RuntimeError is usearch's
        msg = f"{folder}: cannot be loaded ({type(exc).__name__}: {exc}); the index is built from the store"
        raise SnapshotError(msg) from exc
    size = graph.stat().st_size + state.stat().st_size
    saved = meta.get("saved_at_ms")
    saved_at = int(saved) if isinstance(saved, int) else 0
    return SnapshotInfo(
        folder, refresher.version, len(index), saved_at, round(time.perf_counter() - started, 3), size
    )


def _read_meta(folder: Path) -> dict[str, Any]:
    path = folder / META
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_META_BYTES + 1)
    except FileNotFoundError:
        raise NoSnapshot(f"{folder}: no snapshot yet; the index is built from the store") from None
    except OSError as exc:
        raise SnapshotError(f"{path}: cannot be read ({exc}); the index is built from the store") from exc
    if len(raw) > MAX_META_BYTES:
        raise SnapshotError(f"{path}: larger than {MAX_META_BYTES} bytes; the index is built from the store")
    try:
        meta = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise SnapshotError(f"{path}: not JSON ({exc}); the index is built from the store") from exc
    if not isinstance(meta, dict):
        raise SnapshotError(f"{path}: not a JSON object; the index is built from the store")
    return meta


def _previous_files(folder: Path) -> set[str]:
    """Return the files the snapshot in ``folder`` names now (none when there is none, or unreadable)."""
    try:
        files = _read_meta(folder).get("files")
    except SnapshotError:
        return set()
    return {str(name) for name in files} if isinstance(files, dict) else set()


def _difference(found: object, want: dict[str, Any]) -> str:
    """Say what made a snapshot differ, for the log line."""
    if not isinstance(found, dict):
        return "without a key"
    for name, value in want.items():
        if found.get(name) != value:
            return f"with another {name.replace('_', ' ')} ({_short(found.get(name))}, now {_short(value)})"
    return "with other settings"


def _short(value: object, limit: int = 120) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


__all__ = [
    "SNAPSHOT_FOLDER",
    "NoSnapshot",
    "SnapshotError",
    "SnapshotInfo",
    "load_snapshot",
    "save_snapshot",
    "snapshot_key",
]
