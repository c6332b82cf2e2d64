"""Limits at the REST edge that live below the ASGI app: connections, backlog, keep-alive, header reads.

:func:`uvicorn_options` turns the serving config's :class:`~headwater.serving.config.EdgeConfig`
into ``uvicorn.run`` keywords: ``limit_concurrency`` (past ``max_connections`` connections or
requests in flight uvicorn answers 503), ``backlog``, ``timeout_keep_alive``, and an HTTP protocol
class with a header deadline (:func:`header_deadline_protocol`). The body's own deadline is the
ASGI middleware's (:class:`headwater.serving.rest.BodyLimit`: 408), because only the app sees the
body arrive message by message.

uvicorn has no header read timeout: a client that opens a connection, or sends the first bytes of a
request line, and then nothing (or one byte a minute) holds that connection as long as it likes.
The protocol here closes such a connection ``header_timeout_s`` after it was accepted, or after the
first byte of a request on an idle keep-alive connection, unless the request's headers are complete
by then.
"""

from __future__ import annotations

import asyncio
from typing import Any

from headwater.serving.config import EdgeConfig

INTERNAL_ERROR = "internal error, request id {request_id}; retry"
"""What a client is told of a failure the service did not expect: no exception text, one id to quote."""


def internal_error(request_id: str) -> str:
    """Return the answer's message for an unexpected failure (the log has the detail under the same id)."""
    return INTERNAL_ERROR.format(request_id=request_id)


def header_deadline_protocol(timeout_s: float, base: type[asyncio.Protocol] | None = None) -> type[Any]:
    """Return uvicorn's HTTP protocol class (``base``, default ``auto``) with a ``timeout_s`` header deadline.

    The connection is closed when the headers of a request are not complete ``timeout_s`` after the
    connection was accepted, or after the first byte of the next request on a keep-alive connection
    (between requests uvicorn's own keep-alive timeout applies).
    """
    if base is None:
        from uvicorn.protocols.http.auto import AutoHTTPProtocol

        base = AutoHTTPProtocol

    class HeaderDeadline(base):  # type: ignore[valid-type,misc]
        """uvicorn's HTTP protocol, closing a connection whose request headers are late."""

        header_timeout_s = timeout_s
        _header_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._arm_header_deadline()

        def data_received(self, data: bytes) -> None:
            if self._header_timer is None and not self._in_request():
                self._arm_header_deadline()  # the first byte of the next request on a kept-alive connection
            super().data_received(data)
            if self._in_request():
                self._disarm_header_deadline()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm_header_deadline()
            super().connection_lost(exc)

        def _in_request(self) -> bool:
            """Whether a request's headers were read and its response is not complete yet."""
            cycle = getattr(self, "cycle", None)
            return cycle is not None and not cycle.response_complete

        def _arm_header_deadline(self) -> None:
            self._disarm_header_deadline()
            self._header_timer = self.loop.call_later(self.header_timeout_s, self._headers_late)

        def _disarm_header_deadline(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _headers_late(self) -> None:
            self._header_timer = None
            if not self._in_request() and not self.transport.is_closing():
                self.logger.info("closing a connection whose request headers took over %g s", timeout_s)
                self.transport.close()

    return HeaderDeadline


def uvicorn_options(edge: EdgeConfig) -> dict[str, Any]:
    """Return the ``uvicorn.run`` keywords of the edge limits (``http``: the header-deadline protocol)."""
    return {
        "limit_concurrency": edge.max_connections,
        "backlog": edge.backlog,
        "timeout_keep_alive": edge.keep_alive_s,
        "http": header_deadline_protocol(edge.header_timeout_s),
    }
