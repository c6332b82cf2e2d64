"""The online store API shared by every tier and by serving: batched writes and reads of packed vectors.

Usage::

    layout = ViewLayout(view="user_profile", entity="user", features=("f1", "f2"), ttl_s=86400,
                        version="abc123")
    store = OnlineStore.from_url("redis://127.0.0.1:6379/0")
    store.write_batch(layout, ["u1", "u2"], values, event_time_ms)     # values: (n, d) float32
    res = store.read_batch(layout, ["u1", "u2", "u3"])                 # one MGET, one round trip
    res.values, res.found, res.ages_s()

Writes are idempotent and checked inside Redis by ``write.lua``: a value never replaces one
with a newer event time, and replaying the same value is a no-op (see the script's header).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from importlib import resources
from typing import Any

import numpy as np
import numpy.typing as npt
from redis.exceptions import NoScriptError

from headwater.pipelines.store import codec
from headwater.pipelines.store.connect import redis_client
from headwater.pipelines.store.layout import (
    DEFAULT_NAMESPACE,
    FRESHNESS_MAXLEN,
    LayoutError,
    ViewLayout,
    changes_key,
    check_namespace,
    freshness_key,
    key_pattern,
    key_prefix,
)
from headwater.pipelines.store.transport import Command, StoreError, Transport

WRITE_SCRIPT = resources.files("headwater.pipelines.store").joinpath("write.lua").read_text("utf-8")
WRITE_SCRIPT_SHA = hashlib.sha1(WRITE_SCRIPT.encode("utf-8")).hexdigest()
STATUS_STALE, STATUS_WRITTEN, STATUS_UNCHANGED = 0, 1, 2
DEFAULT_CHUNK_ROWS = 256


class StoreInputError(StoreError, ValueError):
    """Arguments given to the store do not match the view layout."""


class FencedError(StoreError):
    """A fenced write was refused: a newer owner holds the fence (``write.lua``, ARGV[4])."""


# Claims a write fence (OnlineStore.claim_fence): one step above whatever holds it, for the same 7
# days as write.lua's fenced writes keep it.
CLAIM_FENCE_LUA = """
local held = tonumber(redis.call('GET', KEYS[1]) or '0') or 0
local epoch = math.max(held + 1, tonumber(ARGV[1]))
redis.call('SET', KEYS[1], epoch, 'PX', 604800000)
return epoch
"""


def fence_key(view: str, owner: str, namespace: str = DEFAULT_NAMESPACE) -> str:
    """Return the key of ``owner``'s write fence in ``view``: ``<namespace>:fence:{<view>}:<owner>``."""
    return f"{namespace}:fence:{{{view}}}:{owner}"


def epoch_ms() -> int:
    """Wall-clock time in epoch milliseconds (UTC)."""
    return time.time_ns() // 1_000_000


@dataclass(frozen=True)
class WriteResult:
    """Outcome of a batched write: per-row status and counts.

    ``status[i]`` is 1 when row i was written, 0 when it was stale (a newer event time is stored)
    and 2 when it was unchanged (the same event time and value are stored already).
    """

    status: npt.NDArray[np.int8]

    @property
    def written(self) -> int:
        """Rows written."""
        return int(np.count_nonzero(self.status == STATUS_WRITTEN))

    @property
    def stale(self) -> int:
        """Rows rejected because a newer event time is stored."""
        return int(np.count_nonzero(self.status == STATUS_STALE))

    @property
    def unchanged(self) -> int:
        """Rows that repeat the stored event time and value (replays): nothing changed."""
        return int(np.count_nonzero(self.status == STATUS_UNCHANGED))


@dataclass(frozen=True)
class ReadResult:
    """Rows of one view read in one round trip, in the order of the requested entity ids.

    ``values`` (n, d) float32 is NaN where not found; ``event_time_ms`` and ``write_time_ms``
    are 0 there. ``mismatch`` flags keys that exist but hold a value of another layout (other
    feature order or count, another format): they count as not found.
    """

    layout: ViewLayout
    values: npt.NDArray[np.float32]
    found: npt.NDArray[np.bool_]
    event_time_ms: npt.NDArray[np.int64]
    write_time_ms: npt.NDArray[np.int64]
    mismatch: npt.NDArray[np.bool_]
    _version_raw: npt.NDArray[np.bytes_] = field(repr=False)

    @cached_property
    def versions(self) -> list[str | None]:
        """Version id each row was written with (None where not found)."""
        return codec.decode_versions(self._version_raw, self.found)

    def other_version_rows(self) -> int:
        """Count found rows written under another version of the view than ``layout.version``.

        Such values were computed from another definition (a tier not yet restarted on the applied plan).
        """
        # One version per found row, in row order (not one per requested key).
        return int(np.count_nonzero(self._version_raw != self.layout.version.encode("ascii")))

    def ages_s(self, now_ms: int | None = None) -> npt.NDArray[np.float64]:
        """Age of each row's event time at ``now_ms`` (default: now), in seconds; NaN where not found."""
        now = epoch_ms() if now_ms is None else now_ms
        ages = (now - self.event_time_ms).astype(np.float64) / 1000.0
        ages[~self.found] = np.nan
        return ages


class OnlineStore:
    """Batched, idempotent reads and writes of packed feature vectors in Redis.

    ``client`` is a ``redis.Redis`` (fast path: hiredis-packed commands on one connection) or a
    ``redis.RedisCluster`` (each command routed to the slot of its view). Do not set
    ``decode_responses`` on the client: values are binary.
    """

    def __init__(self, client: Any, namespace: str = DEFAULT_NAMESPACE, chunk_rows: int = DEFAULT_CHUNK_ROWS):
        if chunk_rows < 1:
            msg = f"OnlineStore: chunk_rows must be >= 1; got {chunk_rows}"
            raise StoreInputError(msg)
        try:
            self.namespace = check_namespace(namespace)
        except LayoutError as exc:
            raise StoreInputError(str(exc)) from exc
        self.client = client
        self.chunk_rows = chunk_rows
        self._transport = Transport(client)

    @classmethod
    def from_url(cls, url: str, namespace: str = DEFAULT_NAMESPACE, **client_kwargs: Any) -> OnlineStore:
        """Connect to ``url``: ``redis://host:port/db`` or ``redis-cluster://host:port`` (any node).

        ``client_kwargs`` go to the redis-py client (:func:`.connect.redis_client`).
        """
        client_kwargs.setdefault("socket_timeout", 5.0)
        client_kwargs.setdefault("socket_connect_timeout", 2.0)
        return cls(redis_client(url, **client_kwargs), namespace=namespace)

    def close(self) -> None:
        """Close the client's connections."""
        self.client.close()

    def keys(self, layout: ViewLayout, entity_ids: Sequence[str]) -> list[bytes]:
        """Return the Redis keys of ``entity_ids`` in ``layout``'s view.

        The prefix, then the id's UTF-8 bytes (``surrogatepass``: any ``str`` has a key, the same as
        its UTF-8 for valid Unicode); the id is data whatever it holds (``layout.py``).
        """
        prefix = key_prefix(layout.view, self.namespace).encode("utf-8")
        try:
            return [prefix + e.encode("utf-8", "surrogatepass") for e in entity_ids]
        except (TypeError, AttributeError) as exc:
            bad = next(e for e in entity_ids if not isinstance(e, str))
            msg = f"view {layout.view!r}: entity ids must be str; got {bad!r} ({type(bad).__name__})"
            raise StoreInputError(msg) from exc

    def read_batch(self, layout: ViewLayout, entity_ids: Sequence[str]) -> ReadResult:
        """Read the vectors of ``entity_ids`` in one round trip (one ``MGET``)."""
        return self.read_many([(layout, entity_ids)])[0]

    def read_many(self, requests: Sequence[tuple[ViewLayout, Sequence[str]]]) -> list[ReadResult]:
        """Read several views (e.g. one user and 500 items) in one round trip: one ``MGET`` per view."""
        commands: list[Command] = []
        for layout, ids in requests:
            commands.append(("MGET", *self.keys(layout, ids)) if len(ids) else ("ECHO", b""))
        names = ", ".join(layout.view for layout, _ in requests)
        replies = self._transport.execute(commands, f"reading views {names}")
        results: list[ReadResult] = []
        for (layout, ids), reply in zip(requests, replies, strict=True):
            if isinstance(reply, Exception):
                msg = (
                    f"online store at {self._transport.address}: reading view {layout.view!r} failed: {reply}"
                )
                raise StoreError(msg)
            raw = reply if len(ids) else []
            u = codec.unpack(raw, layout.dim, layout.schema_hash)
            results.append(
                ReadResult(
                    layout, u.values, u.found, u.event_time_ms, u.write_time_ms, u.mismatch, u.version_raw
                )
            )
        return results

    def write_batch(
        self,
        layout: ViewLayout,
        entity_ids: Sequence[str],
        values: npt.ArrayLike,
        event_time_ms: npt.ArrayLike,
        write_time_ms: int | None = None,
        fence: tuple[str, int] | None = None,
    ) -> WriteResult:
        """Write one vector per entity, keeping for each key the value with the newest event time.

        Args:
            layout: the view's layout; ``values`` columns follow ``layout.features``.
            entity_ids: n entity ids (str).
            values: (n, d) array, converted to float32; NaN is stored as is (a missing feature).
            event_time_ms: n event times in epoch ms, or one for all rows.
            write_time_ms: the write time stamped in the values (default: now). The TTL always counts
                from now (this process's clock), whatever ``write_time_ms`` says.
            fence: (owner, epoch): refuse the whole write when ``owner``'s fence in this view holds
                a greater epoch (see :meth:`claim_fence`).

        Returns:
            Per-row status: written, stale (a newer event time is stored) or unchanged (replay).

        Raises:
            FencedError: ``fence`` was given and a newer epoch holds it; nothing was written.
        """
        n = len(entity_ids)
        vals = _as_matrix(layout, values, n)
        times = _as_times(layout, event_time_ms, n)
        keys = self.keys(layout, entity_ids)
        now = epoch_ms()
        wt = now if write_time_ms is None else int(write_time_ms)
        expire_at = now + layout.ttl_ms if layout.ttl_ms else 0
        blob = codec.pack(vals, times, wt, expire_at, layout.schema_hash, layout.version).tobytes()
        size = codec.record_size(layout.dim)
        step = self.chunk_rows
        commands: list[Command] = []
        for s in range(0, n, step):
            chunk = keys[s : s + step]
            payload = blob[s * size : (s + step) * size]
            if fence is None:
                commands.append(("EVALSHA", WRITE_SCRIPT_SHA, len(chunk), *chunk, expire_at, size, payload))
            else:
                fkey = fence_key(layout.view, fence[0], self.namespace)
                commands.append(
                    (
                        "EVALSHA",
                        WRITE_SCRIPT_SHA,
                        len(chunk) + 1,
                        *chunk,
                        fkey,
                        expire_at,
                        size,
                        payload,
                        fence[1],
                    )
                )
        replies = self._run_script(commands, layout)
        status = np.concatenate([np.frombuffer(r, dtype=np.int8) for r in replies]) - ord("0")
        return WriteResult(status.astype(np.int8) if n else np.zeros(0, dtype=np.int8))

    def claim_fence(self, layout: ViewLayout, owner: str, epoch: int) -> int:
        """Take ``owner``'s write fence in ``layout``'s view; return the epoch to write with from now on.

        The fence becomes ``max(held + 1, epoch)``: above every earlier holder's, whatever ``epoch``
        proposes, so the previous owner's writes (a lower epoch) are refused from now on. The
        proposal (the nearline group's generation) only keeps the numbers familiar: a consumer group
        deleted, or whose metadata expired, restarts its generations at 1, and a fence that took the
        generation as it came then refused every online write of the new owner for its 7 days.
        """
        fkey = fence_key(layout.view, owner, self.namespace)
        return int(self.client.eval(CLAIM_FENCE_LUA, 1, fkey, int(epoch)))

    def _run_script(self, commands: list[Command], layout: ViewLayout) -> list[bytes]:
        """Run the write chunks, loading the script once if Redis does not know it (NOSCRIPT)."""
        what = f"writing view {layout.view!r}"
        replies = self._transport.execute(commands, what)
        missing = [i for i, r in enumerate(replies) if isinstance(r, NoScriptError)]
        if missing:
            self._transport.execute([("SCRIPT", "LOAD", WRITE_SCRIPT)], "loading the write script")
            for i, reply in zip(
                missing, self._transport.execute([commands[i] for i in missing], what), strict=True
            ):
                replies[i] = reply
        for reply in replies:
            if isinstance(reply, Exception):
                msg = f"online store at {self._transport.address}: {what} failed: {reply}"
                raise (FencedError if str(reply).startswith("HWFENCED") else StoreError)(msg)
        return [bytes(reply) for reply in replies]

    def publish_progress(
        self, layout: ViewLayout, boundary_ms: int, write_time_ms: int | None = None
    ) -> None:
        """Record that ``layout``'s tier has published every value up to window boundary ``boundary_ms``.

        ``write.lua`` records progress with every write; a tier calls this when it passed a boundary
        without changing any row (no write), so the view's read-time age stays true. One ``XADD`` of a
        freshness entry with no rows (format: ``write.lua``'s header).
        """
        wt = epoch_ms() if write_time_ms is None else int(write_time_ms)
        entry: Command = ("w", wt, "n", 0, "r", 0, "lo", 0, "hi", int(boundary_ms), "s", "")
        command: Command = (
            "XADD",
            freshness_key(layout.view, self.namespace),
            "MAXLEN",
            "~",
            FRESHNESS_MAXLEN,
        )
        replies = self._transport.execute(
            [(*command, "*", *entry)], f"publishing progress of {layout.view!r}"
        )
        if isinstance(replies[0], Exception):
            msg = f"online store at {self._transport.address}: publishing progress failed: {replies[0]}"
            raise StoreError(msg)

    def delete_view(self, view: str, batch: int = 1000) -> int:
        """Delete every key of ``view`` (SCAN + UNLINK), its freshness log and its change feed.

        Returns the value keys deleted (the log and the feed are not counted).
        """
        pattern = key_pattern(view, self.namespace)  # every glob character of the prefix escaped
        deleted = 0
        pending: list[bytes] = []
        for key in self.client.scan_iter(match=pattern, count=batch):
            pending.append(key)
            if len(pending) >= batch:
                deleted += int(self.client.unlink(*pending))
                pending = []
        if pending:
            deleted += int(self.client.unlink(*pending))
        self.client.unlink(freshness_key(view, self.namespace), changes_key(view, self.namespace))
        return deleted


def _as_matrix(layout: ViewLayout, values: npt.ArrayLike, n: int) -> npt.NDArray[np.float32]:
    try:
        vals = np.asarray(values, dtype=np.float32)
    except (TypeError, ValueError) as exc:
        msg = f"view {layout.view!r}: values must be numeric, convertible to float32: {exc}"
        raise StoreInputError(msg) from exc
    if vals.shape != (n, layout.dim):
        msg = (
            f"view {layout.view!r}: values must have shape (n entities, n features) = ({n}, {layout.dim})"
            f" for features {list(layout.features)}; got shape {vals.shape}"
        )
        raise StoreInputError(msg)
    return vals


def _as_times(layout: ViewLayout, event_time_ms: npt.ArrayLike, n: int) -> npt.NDArray[np.int64]:
    times = np.asarray(event_time_ms)
    if times.dtype.kind not in "iu":
        msg = f"view {layout.view!r}: event_time_ms must be integers (epoch ms); got dtype {times.dtype}"
        raise StoreInputError(msg)
    if times.ndim == 0:
        return np.full(n, int(times), dtype=np.int64)
    if times.shape != (n,):
        msg = (
            f"view {layout.view!r}: event_time_ms must hold one time per entity ({n});"
            f" got shape {times.shape}"
        )
        raise StoreInputError(msg)
    return times.astype(np.int64, copy=False)
