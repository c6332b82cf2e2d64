"""Send batches of commands to Redis with as little client overhead as possible.

For a plain ``redis.Redis`` client the commands are packed by hiredis and written straight to
one pooled connection: each chunk of a write is on the wire while the next is being packed, and
the replies are read afterwards (a pipeline without buffering every command first). Any other
client (``redis.RedisCluster``) goes through its own command routing, which keeps the same
semantics because all keys of one command share a hash slot.

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

_hiredis_pack: Callable[[Any], bytes] | None
try:
    from hiredis import pack_command as _hiredis_pack
except ImportError:  # pragma: no cover - hiredis is a dependency, kept optional for safety
    _hiredis_pack = None

T = TypeVar("T")
Command = tuple[str | bytes | int, ...]
_MAX_IN_FLIGHT = 64


class StoreError(RuntimeError):
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
        self.address = describe(client)

    def execute(self, commands: Sequence[Command], what: str) -> list[Any]:
        """Run ``commands`` in order in one round trip; replies in order, error replies as exceptions."""
        run: Callable[[Sequence[Command]], list[Any]] = self._fast if self.fast else self._generic
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
        pack = _hiredis_pack
        if pack is None:  # pragma: no cover - self.fast is False without hiredis
            return self._generic(commands)
        pool = self.client.connection_pool
        conn = pool.get_connection()
        replies: list[Any] = []
        try:
            pending = 0
            for cmd in commands:
                conn.send_packed_command([pack(cmd)], check_health=False)
                pending += 1
                if pending >= _MAX_IN_FLIGHT:
                    replies.extend(_read(conn, pending))
                    pending = 0
            replies.extend(_read(conn, pending))
        except BaseException:
            conn.disconnect()
            raise
        finally:
            pool.release(conn)
        return replies

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


def _read(conn: Any, count: int) -> list[Any]:
    out: list[Any] = []
    for _ in range(count):
        try:
            out.append(conn.read_response())
        except ResponseError as exc:
            out.append(exc)
    return out
