"""Freshness entries as ``write.lua`` records them, and reading them back from Redis.

Every call of the online store's write script appends one entry to the view's capped stream
``<namespace>:fresh:{<view>}`` (see ``headwater/pipelines/store/write.lua`` for the fields). This
module decodes those entries; :mod:`headwater.pipelines.freshness.stats` turns them into figures.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from headwater.pipelines.store.layout import DEFAULT_NAMESPACE, freshness_key
from headwater.pipelines.store.transport import StoreError, StoreUnavailableError, describe

_READ_COUNT = 5000
ANCHOR_ENTRIES = 100
T = TypeVar("T")


class SampleFormatError(StoreError):
    """A freshness entry in Redis does not have the fields ``write.lua`` writes."""


@dataclass(frozen=True, slots=True)
class Entry:
    """One write call of one view: when it wrote, how many rows, and their event times.

    Attributes:
        write_ms: write time of the call (the writer's clock, as stored in the values).
        rows: rows written (new values); ``considered`` rows were in the call.
        progress_ms: greatest window boundary of the call's rows: the tier published up to it.
        samples: (event time B, rows) pairs summarising the written rows' event times.
        version: the view version of the values written ("" for entries written before it was logged).
    """

    write_ms: int
    rows: int
    considered: int
    progress_ms: int
    samples: tuple[tuple[int, int], ...]
    version: str = ""


def parse_entry(fields: Mapping[bytes, bytes], where: str = "freshness entry") -> Entry:
    """Decode the fields of one stream entry (bytes keys and values, as redis-py returns them)."""
    try:
        samples = tuple(
            (int(b), int(count))
            for b, count in (part.split(b":") for part in fields[b"s"].split(b",") if part)
        )
        version = fields.get(b"v", b"").decode("ascii")
        return Entry(
            int(fields[b"w"]), int(fields[b"n"]), int(fields[b"r"]), int(fields[b"hi"]), samples, version
        )
    except (KeyError, ValueError, TypeError, AttributeError) as exc:
        msg = (
            f"{where}: expected the fields w, n, r, lo, hi, s (and v) written by write.lua"
            f" (s as 'B:count,...');"
            f" got {dict(fields)!r} ({exc}). Was the stream written by another tool?"
        )
        raise SampleFormatError(msg) from exc


def read_entries(
    client: Any, view: str, namespace: str = DEFAULT_NAMESPACE, after_id: bytes | str = "-"
) -> tuple[list[Entry], bytes | None]:
    """Read the freshness entries of ``view`` after stream id ``after_id`` (default: all kept).

    Returns:
        The entries in stream order, and the id of the last one (None when there were none), to
        pass as ``after_id`` next time (the Prometheus collector reads incrementally).
    """
    key = freshness_key(view, namespace)
    start: bytes | str = after_id if after_id == "-" else b"(" + _as_bytes(after_id)
    entries: list[Entry] = []
    last: bytes | None = None
    while True:
        chunk: list[tuple[bytes, Mapping[bytes, bytes]]] = _call(client, key, _xrange(client, key, start))
        for entry_id, fields in chunk:
            entries.append(parse_entry(fields, f"{key} entry {entry_id.decode('ascii', 'replace')}"))
            last = entry_id
        if len(chunk) < _READ_COUNT or last is None:
            return entries, last
        start = b"(" + last


def read_since(
    client: Any, view: str, start_ms: int, namespace: str = DEFAULT_NAMESPACE, margin_ms: int = 60_000
) -> list[Entry]:
    """Read what a report over a window starting at ``start_ms`` needs, not the whole log.

    The entries logged since ``start_ms - margin_ms`` (stream ids are Redis time; the margin covers
    writers whose clock runs ahead), preceded by one anchor entry carrying the greatest progress of
    the :data:`ANCHOR_ENTRIES` entries logged before: the boundary published up to when the window
    opened (tiers publish boundaries in increasing order, so the latest entries hold the maximum).
    """
    key = freshness_key(view, namespace)
    first = max(start_ms - margin_ms, 0)
    before = _call(client, key, lambda: client.xrevrange(key, f"({first}-0", "-", ANCHOR_ENTRIES))
    entries: list[Entry] = []
    if before:
        old = [parse_entry(fields, f"{key} entry {eid.decode('ascii', 'replace')}") for eid, fields in before]
        entries.append(Entry(max(e.write_ms for e in old), 0, 0, max(e.progress_ms for e in old), ()))
    after, _ = read_entries(client, view, namespace, f"{first - 1}-{2**63 - 1}" if first else "-")
    return entries + after


def _xrange(client: Any, key: str, start: bytes | str) -> Callable[[], Any]:
    return lambda: client.xrange(key, start, "+", _READ_COUNT)


def _call(client: Any, key: str, fn: Callable[[], T]) -> T:
    """Run one read of ``key``, translating redis-py errors to the store's errors."""
    try:
        return fn()
    except (OSError, RedisConnectionError, RedisTimeoutError) as exc:
        reason = str(exc).rstrip(".")
        msg = f"online store at {describe(client)}: reading {key} failed: {reason}. Is Redis running?"
        raise StoreUnavailableError(msg) from exc
    except ResponseError as exc:
        msg = f"online store at {describe(client)}: reading {key} failed: {exc} (expected a stream)"
        raise StoreError(msg) from exc


def _as_bytes(value: bytes | str) -> bytes:
    return value if isinstance(value, bytes) else value.encode("ascii")
