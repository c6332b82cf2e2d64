"""Send batches of commands to Redis with as little client overhead as possible.

For a plain ``redis.Redis`` client the commands are packed by hiredis and written straight to
one pooled connection: each chunk of a write is on the wire while the next is being packed, and
the replies are read afterwards (a pipeline without buffering every command first).

A ``redis.RedisCluster`` client gets the same fast path per node: all keys of one command share
a hash slot (one view, one dictionary), so each command goes to the primary of its first key's
slot, every node's commands are sent before any reply is read (the nodes work at once), and a
reply that says the slot moved (``MOVED``/``ASK``: a failover or a resharding) refreshes the
slot map and re-runs that command through redis-py's own routing. redis-py's cluster pipeline
would hash every key of a 500-key ``MGET`` in Python to check what the hash tag already says.

Errors are translated here: a connection or timeout error becomes :class:`StoreUnavailableError`
(after one retry on a fresh connection), a server error reply becomes :class:`StoreError`, and so
does any other client error (a reply that breaks the protocol, a server that is not Redis): no
redis-py exception leaves this module.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from headwater.registry.errors import HeadwaterError

_hiredis_pack: Callable[[Any], bytes] | None
try:
    from hiredis import pack_command as _hiredis_pack
except ImportError:  # pragma: no cover - hiredis is a dependency, kept optional for safety
    _hiredis_pack = None

T = TypeVar("T")
Command = tuple[str | bytes | int, ...]
_MAX_IN_FLIGHT = 64
_JOIN_MAX_BYTES = 64 * 1024
"""Packed commands are sent together up to this many bytes (see :func:`_send`)."""
_KEYED = frozenset({"MGET", "GET", "SET", "DEL", "UNLINK", "XADD", "XRANGE", "XREVRANGE", "HGET", "HMGET",
                    "HSET", "PEXPIREAT", "PTTL", "EXISTS", "TYPE", "XLEN"})  # fmt: skip
"""Commands whose first argument is their key (the store's own commands; others go through redis-py)."""


class StoreError(HeadwaterError, RuntimeError):
    """The online store answered with an error."""


class StoreUnavailableError(StoreError):
    """The online store cannot be reached (connection refused, reset or timed out)."""


def describe(client: Any) -> str:
    """Return a short address of ``client`` for error messages (host:port/db when known)."""
    kwargs = getattr(getattr(client, "connection_pool", None), "connection_kwargs", None)
    if isinstance(kwargs, dict):
        return f"redis://{kwargs.get('host', '?')}:{kwargs.get('port', '?')}/{kwargs.get('db', 0)}"
    return type(client).__name__


class Transport:
    """Executes commands for the store on one redis-py client."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.fast = type(client) is redis.Redis and _hiredis_pack is not None
        self.cluster = isinstance(client, redis.RedisCluster) and _hiredis_pack is not None
        self.address = describe(client)

    def execute(self, commands: Sequence[Command], what: str) -> list[Any]:
        """Run ``commands`` in order in one round trip; replies in order, error replies as exceptions."""
        run: Callable[[Sequence[Command]], list[Any]] = self._generic
        if self.fast:
            run = self._fast
        elif self.cluster:
            run = self._cluster
        return self._with_retry(lambda: run(commands), what)

    def _with_retry(self, call: Callable[[], T], what: str) -> T:
        for attempt in (1, 2):
            try:
                return call()
            except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
                if attempt == 2:
                    msg = (
                        f"online store at {self.address} is unavailable while {what}: {exc}."
                        " Check that Redis is running (make services-up) and HEADWATER_REDIS_URL."
                    )
                    raise StoreUnavailableError(msg) from exc
            except RedisError as exc:
                # A protocol error (InvalidResponse), a client-side data error...: the connection
                # was dropped by _fast, and retrying a reply that breaks the protocol would not help.
                msg = (
                    f"online store at {self.address} failed while {what}: {type(exc).__name__}: {exc}."
                    " Check that HEADWATER_REDIS_URL points at a Redis server."
                )
                raise StoreError(msg) from exc
        msg = "unreachable"
        raise AssertionError(msg)  # pragma: no cover

    def _fast(self, commands: Sequence[Command]) -> list[Any]:
        return _pipelined(self.client.connection_pool, commands)

    def _cluster(self, commands: Sequence[Command]) -> list[Any]:
        by_node: dict[str, tuple[Any, list[int]]] = {}
        for i, cmd in enumerate(commands):
            key = _first_key(cmd)
            if key is None:  # a command without a key (SCRIPT LOAD...): redis-py routes it
                return self._generic(commands)
            node = self.client.get_node_from_key(key)
            by_node.setdefault(node.name, (node, []))[1].append(i)
        replies: list[Any] = [None] * len(commands)
        sent: list[tuple[Any, Any, list[int]]] = []
        try:
            for node, indexes in by_node.values():
                pool = node.redis_connection.connection_pool
                conn = pool.get_connection()
                sent.append((pool, conn, indexes))
                _send(conn, [commands[i] for i in indexes])
            for _pool, conn, indexes in sent:
                for i, reply in zip(indexes, _read(conn, len(indexes)), strict=True):
                    replies[i] = reply
        except BaseException as exc:
            for _pool, conn, _ in sent:
                conn.disconnect()
            if isinstance(exc, RedisConnectionError | RedisTimeoutError | OSError):
                # a node is gone (killed, failing over): ask the others for the slot map, so the
                # next attempt goes to the replica that takes over
                self._refresh_slots()
            raise
        finally:
            for pool, conn, _ in sent:
                pool.release(conn)
        moved = [i for i, r in enumerate(replies) if _redirected(r)]
        if moved:  # a failover or a resharding: learn the new slot map, let redis-py route these
            self._refresh_slots()
            for i, reply in zip(moved, self._generic([commands[i] for i in moved]), strict=True):
                replies[i] = reply
        return replies

    def _refresh_slots(self) -> None:
        try:
            self.client.nodes_manager.initialize()
        except RedisError:  # no node answers yet: the next attempt says unavailable
            return

    def _generic(self, commands: Sequence[Command]) -> list[Any]:
        if len(commands) == 1:
            try:
                return [self.client.execute_command(*commands[0])]
            except ResponseError as exc:
                return [exc]
        pipe = self.client.pipeline(transaction=False)
        for cmd in commands:
            pipe.execute_command(*cmd)
        return list(pipe.execute(raise_on_error=False))


def _pipelined(pool: Any, commands: Sequence[Command]) -> list[Any]:
    """Send ``commands`` on one pooled connection, reading replies every ``_MAX_IN_FLIGHT`` commands."""
    conn = pool.get_connection()
    replies: list[Any] = []
    try:
        for start in range(0, len(commands), _MAX_IN_FLIGHT):
            chunk = commands[start : start + _MAX_IN_FLIGHT]
            _send(conn, chunk)
            replies.extend(_read(conn, len(chunk)))
    except BaseException:
        conn.disconnect()
        raise
    finally:
        pool.release(conn)
    return replies


def _send(conn: Any, commands: Sequence[Command]) -> None:
    pack = _hiredis_pack
    if pack is None:  # pragma: no cover - the fast paths are off without hiredis
        msg = "hiredis is required for the pipelined paths"
        raise RuntimeError(msg)
    # Small commands (a request's reads: one MGET per view) go out together in one send, not one
    # syscall each; a large one (a write's chunk) is sent as soon as it is packed.
    held: list[bytes] = []
    size = 0
    for cmd in commands:
        packed = pack(cmd)
        if held and size + len(packed) > _JOIN_MAX_BYTES:
            conn.send_packed_command([b"".join(held)], check_health=False)
            held, size = [], 0
        held.append(packed)
        size += len(packed)
    if held:
        conn.send_packed_command([b"".join(held)], check_health=False)


def _first_key(cmd: Command) -> str | bytes | None:
    """Return the key that decides a command's slot (all keys of a store command share its hash tag)."""
    name = str(cmd[0]).upper() if not isinstance(cmd[0], bytes) else cmd[0].decode().upper()
    if name in ("EVALSHA", "EVAL"):
        if len(cmd) > 3 and int(cmd[2]) > 0:
            key = cmd[3]
            return key if isinstance(key, str | bytes) else None
        return None
    if name in _KEYED and len(cmd) > 1:
        key = cmd[1]
        return key if isinstance(key, str | bytes) else None
    return None


def _redirected(reply: Any) -> bool:
    return isinstance(reply, ResponseError) and str(reply).startswith(("MOVED ", "ASK "))


def _read(conn: Any, count: int) -> list[Any]:
    out: list[Any] = []
    for _ in range(count):
        try:
            out.append(conn.read_response())
        except ResponseError as exc:
            out.append(exc)
    return out
