r"""One partition's nearline state: a rocksdict store on disk, mirrored in memory, with its changelog.

Keys (bytes, ``\\x1f``-separated) and values (JSON, written with orjson):

- ``p|<view>|<entity>|<pane start>``: a pane record (:mod:`headwater.pipelines.windows.panes`);
- ``d|<bucket>|<first offset>``: event ids first seen in that batch and bucket, ``{id: offset}``
  (deduplication; buckets are minutes of event time, dropped once older than the lateness horizon);
- ``o``: the outbox, ``{view: {"live": bool, "entities": [...]}}``: values to (re)publish at the
  view's boundary (live: also every entity with a pane before it);
- ``m``: meta, ``{"offset": next source offset, "max_t": max event time, "t_pub": {view: B},
  "versions": {view: version}, "forward": [join keys], "short": {view: B}}``: the version of each
  view its panes were built from (a restore keeps a view's state only when its version is the
  plan's, see ``versions.py``), the join keys its events were forwarded by (stage A), and the views
  whose backfill found less history than their windows (full from boundary B on);
- ``c`` (local only, never on the changelog): the changelog offset this store reflects.

Every key but ``c`` is mirrored on the compacted changelog topic, partition = source partition,
so another process (or this one after the folder was deleted) rebuilds the store by replaying
it; a surviving local store or RocksDB checkpoint only replays the changelog after its ``c``.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import orjson
from rocksdict import Checkpoint, Options, Rdict, WriteBatch

SEP = "\x1f"
META_KEY = b"m"
OUTBOX_KEY = b"o"
CHANGELOG_POS_KEY = b"c"
DEDUP_BUCKET_MS = 60_000


def pane_key(view: str, entity: str, pane: int) -> bytes:
    """Return the store key of one pane record."""
    return f"p{SEP}{view}{SEP}{entity}{SEP}{pane}".encode()


def dedup_key(bucket: int, first_offset: int) -> bytes:
    """Return the store key of one batch's new event ids in one bucket."""
    return f"d{SEP}{bucket}{SEP}{first_offset}".encode()


def dumps(value: Any) -> bytes:
    """Encode a JSON value compactly (orjson: floats round-trip exactly, about 10x faster than json)."""
    return orjson.dumps(value)


def loads(raw: bytes) -> Any:
    """Decode a value written by :func:`dumps`."""
    return orjson.loads(raw)


@dataclass
class Loaded:
    """What :meth:`PartitionStore.load` found: raw pane records, dedup ids, outbox and meta."""

    panes: dict[str, list[tuple[str, int, Any]]] = field(default_factory=dict)
    """view -> [(entity, pane start, record JSON)]."""
    dedup: dict[int, dict[bytes, dict[str, int]]] = field(default_factory=dict)
    """bucket -> {store key: {event id: offset}}."""
    outbox: dict[str, Any] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)


class PartitionStore:
    """The rocksdict store of one partition (``<root>/p<N>/db``) and its checkpoint (``.../checkpoint``)."""

    def __init__(self, root: Path, partition: int) -> None:
        self.dir = root / f"p{partition}"
        self.db_path = self.dir / "db"
        self.checkpoint_path = self.dir / "checkpoint"
        self.restored_from = "empty"
        self.dir.mkdir(parents=True, exist_ok=True)
        if not self.db_path.exists() and (self.checkpoint_path / "CURRENT").exists():
            shutil.copytree(self.checkpoint_path, self.db_path)
            self.restored_from = "checkpoint"
        elif self.db_path.exists():
            self.restored_from = "local"
        self.db = Rdict(str(self.db_path), options=Options(raw_mode=True))

    def changelog_position(self) -> int:
        """Return the changelog offset this store reflects (-1: none)."""
        raw = self.db.get(CHANGELOG_POS_KEY)
        return int(raw) if raw is not None else -1

    def wipe(self) -> None:
        """Delete everything (the changelog lost records this store would need)."""
        self.db.close()
        Rdict.destroy(str(self.db_path))
        shutil.rmtree(self.checkpoint_path, ignore_errors=True)
        self.db = Rdict(str(self.db_path), options=Options(raw_mode=True))
        self.restored_from = "empty"

    def apply_changelog(self, records: list[tuple[bytes, bytes | None]], last_offset: int) -> None:
        """Apply changelog records (None = deleted) in one write batch, then remember ``last_offset``."""
        wb = WriteBatch(raw_mode=True)
        for key, value in records:
            if value is None:
                wb.delete(key)
            else:
                wb.put(key, value)
        wb.put(CHANGELOG_POS_KEY, str(last_offset).encode())
        self.db.write(wb)

    def commit(self, changes: dict[bytes, bytes | None], changelog_pos: int) -> None:
        """Write one batch of changes and the changelog position atomically (one RocksDB write batch)."""
        wb = WriteBatch(raw_mode=True)
        for key, value in changes.items():
            if value is None:
                wb.delete(key)
            else:
                wb.put(key, value)
        wb.put(CHANGELOG_POS_KEY, str(changelog_pos).encode())
        self.db.write(wb)

    def items(self) -> Iterator[tuple[bytes, bytes]]:
        """Return every (key, value) of the store."""
        yield from self.db.items()

    def load(self) -> Loaded:
        """Read the whole store into plain structures (one scan)."""
        out = Loaded()
        for raw_key, value in self.db.items():
            key = cast(bytes, raw_key)
            kind = key[:1]
            if kind == b"p":
                _, view, entity, pane = key.decode().split(SEP)
                out.panes.setdefault(view, []).append((entity, int(pane), loads(value)))
            elif kind == b"d":
                bucket = int(key.decode().split(SEP)[1])
                out.dedup.setdefault(bucket, {})[key] = loads(value)
            elif key == OUTBOX_KEY:
                out.outbox = loads(value)
            elif key == META_KEY:
                out.meta = loads(value)
        return out

    def checkpoint(self) -> None:
        """Write a RocksDB checkpoint (hard links) to ``checkpoint/``, replacing the previous one."""
        tmp = self.dir / "checkpoint.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        Checkpoint(self.db).create_checkpoint(str(tmp))
        old = self.dir / "checkpoint.old"
        shutil.rmtree(old, ignore_errors=True)
        if self.checkpoint_path.exists():
            self.checkpoint_path.rename(old)
        tmp.rename(self.checkpoint_path)
        shutil.rmtree(old, ignore_errors=True)

    def size_bytes(self) -> int:
        """Return the bytes on disk of the store folder (db and checkpoint)."""
        return sum(p.stat().st_size for p in self.dir.rglob("*") if p.is_file())

    def live_bytes(self) -> dict[str, int]:
        """Return the bytes of the live keys and values (one scan), by kind.

        ``panes:<view>``: per view, its pane records; ``dedup``: event ids; ``other``: meta, outbox,
        changelog position.

        What the state holds, unlike :meth:`size_bytes` (files on disk: write-ahead log, memtables
        not yet flushed, SST files not yet compacted, the checkpoint's hard links), which moves by
        megabytes with RocksDB's timing whatever the data.
        """
        out: dict[str, int] = {}
        for raw_key, value in self.db.items():
            key = cast(bytes, raw_key)
            size = len(key) + len(cast(bytes, value))
            kind = key[:1]
            if kind == b"p":
                name = "panes:" + key.split(SEP.encode(), 2)[1].decode()
            elif kind == b"d":
                name = "dedup"
            else:
                name = "other"
            out[name] = out.get(name, 0) + size
        return out

    def close(self) -> None:
        """Close the store (releases the RocksDB lock for the next owner)."""
        self.db.close()
