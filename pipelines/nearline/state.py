r"""One partition's nearline state: a rocksdict store on disk, mirrored in memory, with its changelog.

Keys (bytes: a kind byte, then the parts of :func:`headwater.pipelines.keycodec.pack_parts`, each
``<length>:<bytes>``, so an entity id of any bytes is data, never a separator) and values (JSON,
written with orjson):

- ``p <view> <entity> <pane start>``: a pane record (:mod:`headwater.pipelines.windows.panes`);
- ``d <bucket> <first offset>``: event ids first seen in that batch and bucket, ``{id: offset}``
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

**Keys written before the length-prefixed format** (``p\\x1f<view>\\x1f<entity>\\x1f<pane>`` and
``d\\x1f<bucket>\\x1f<offset>``, in a local store or on the compacted changelog) are still read: a
view name holds no ``\\x1f`` (registry names are ``[A-Za-z0-9_.-]``) and the last part is the pane
start, so the entity is everything between, ``\\x1f`` included (the key that stopped the tier, issue
33). :meth:`PartitionStore.load` lists each such record in :attr:`Loaded.migration` (a tombstone for
the old key, the record under its new key); the restore commits that once, on the changelog too
(``backfill.py``). A key that decodes in neither format is counted (:attr:`PartitionStore.skipped`),
logged and skipped: it never stops a restore.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import orjson
from rocksdict import Checkpoint, Options, Rdict, WriteBatch

from headwater.pipelines.keycodec import KeyFormatError, pack_parts, to_int, to_text, unpack_parts

LEGACY_SEP = b"\x1f"
"""The separator of the keys written before the length-prefixed format (read, then migrated)."""
META_KEY = b"m"
OUTBOX_KEY = b"o"
CHANGELOG_POS_KEY = b"c"
DEDUP_BUCKET_MS = 60_000
log = logging.getLogger("headwater.nearline")


def pane_key(view: str, entity: str, pane: int) -> bytes:
    """Return the store key of one pane record (:func:`decode_pane_key` reads it back)."""
    return b"p" + pack_parts((view, entity, pane))


def dedup_key(bucket: int, first_offset: int) -> bytes:
    """Return the store key of one batch's new event ids in one bucket (:func:`decode_dedup_key`)."""
    return b"d" + pack_parts((bucket, first_offset))


def is_legacy(key: bytes) -> bool:
    r"""Return whether ``key`` is a pane or dedup key of the ``\x1f``-separated format."""
    return key[1:2] == LEGACY_SEP


def decode_pane_key(key: bytes) -> tuple[str, str, int]:
    """Return (view, entity, pane start) of a pane key, in either format.

    Raises:
        KeyFormatError: ``key`` is not a pane key.
    """
    if key[:1] != b"p":
        msg = f"store key {key[:60]!r} is not a pane key (kind {key[:1]!r})"
        raise KeyFormatError(msg)
    if is_legacy(key):
        view, sep, rest = key[2:].partition(LEGACY_SEP)
        entity, sep2, pane = rest.rpartition(LEGACY_SEP)
        if not sep or not sep2:
            msg = f"store key {key[:60]!r}: a pane key of the old format needs 4 parts"
            raise KeyFormatError(msg)
        return to_text(view), to_text(entity), to_int(pane)
    view, entity, pane = unpack_parts(key[1:], 3)
    return to_text(view), to_text(entity), to_int(pane)


def decode_dedup_key(key: bytes) -> tuple[int, int]:
    """Return (bucket, first offset) of a dedup key, in either format.

    Raises:
        KeyFormatError: ``key`` is not a dedup key.
    """
    if key[:1] != b"d":
        msg = f"store key {key[:60]!r} is not a dedup key (kind {key[:1]!r})"
        raise KeyFormatError(msg)
    parts = key[2:].split(LEGACY_SEP) if is_legacy(key) else unpack_parts(key[1:])
    if len(parts) != 2:
        msg = f"store key {key[:60]!r}: a dedup key has 2 parts; got {len(parts)}"
        raise KeyFormatError(msg)
    return to_int(parts[0]), to_int(parts[1])


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
    migration: dict[bytes, bytes | None] = field(default_factory=dict)
    """Store changes that rewrite the records found under old-format keys (module docstring)."""
    skipped: int = 0
    """Records whose key (or value) did not decode: left out, counted and logged."""


class PartitionStore:
    """The rocksdict store of one partition (``<root>/p<N>/db``) and its checkpoint (``.../checkpoint``)."""

    def __init__(self, root: Path, partition: int) -> None:
        self.dir = root / f"p{partition}"
        self.db_path = self.dir / "db"
        self.checkpoint_path = self.dir / "checkpoint"
        self.restored_from = "empty"
        self.migration: dict[bytes, bytes | None] = {}
        """What the last :meth:`load` found to migrate, until the restore commits it (``backfill.py``)."""
        self.skipped = 0
        """Records the last :meth:`load` could not decode (left out of the state)."""
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
        """Read the whole store into plain structures (one scan).

        Old-format keys are read and listed in :attr:`Loaded.migration` (also kept in
        :attr:`migration` until the restore commits it); a record that does not decode is skipped,
        counted in :attr:`Loaded.skipped` and logged.
        """
        out = Loaded()
        first_bad: tuple[bytes, str] | None = None
        for raw_key, raw_value in self.db.items():
            key, value = cast(bytes, raw_key), cast(bytes, raw_value)
            kind = key[:1]
            try:
                if kind == b"p":
                    view, entity, pane = decode_pane_key(key)
                    out.panes.setdefault(view, []).append((entity, pane, loads(value)))
                    new = pane_key(view, entity, pane)
                elif kind == b"d":
                    bucket, first_offset = decode_dedup_key(key)
                    new = dedup_key(bucket, first_offset)
                    out.dedup.setdefault(bucket, {})[new] = loads(value)
                elif key == OUTBOX_KEY:
                    out.outbox = loads(value)
                    continue
                elif key == META_KEY:
                    out.meta = loads(value)
                    continue
                else:
                    continue
            except (KeyFormatError, orjson.JSONDecodeError) as exc:
                out.skipped += 1
                first_bad = first_bad or (key, str(exc))
                continue
            if new != key:
                out.migration[key] = None
                out.migration[new] = value
        if first_bad is not None:
            log.warning(
                "nearline store %s: %d records do not decode and are left out of the state (first: key "
                "%r: %s)",
                self.db_path,
                out.skipped,
                first_bad[0][:80],
                first_bad[1],
            )
        if out.migration:
            log.info(
                "nearline store %s: %d records under keys of the old \\x1f-separated format; they are "
                "rewritten under length-prefixed keys when the restore commits",
                self.db_path,
                len(out.migration) // 2,
            )
        self.migration = dict(out.migration)
        self.skipped = out.skipped
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
                try:
                    name = "panes:" + decode_pane_key(key)[0]
                except KeyFormatError:
                    name = "other"
            elif kind == b"d":
                name = "dedup"
            else:
                name = "other"
            out[name] = out.get(name, 0) + size
        return out

    def close(self) -> None:
        """Close the store (releases the RocksDB lock for the next owner)."""
        self.db.close()
