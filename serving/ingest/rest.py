"""The push API's REST adapter: ``POST /v1/sources/{source}/events``, a Feast-compatible ``POST /push``.

Routes:

- ``POST /v1/sources/{source}/events``: a JSON array (``application/json``), JSON Lines
  (``application/x-ndjson``) or Avro binary (``application/avro`` with ``X-Schema-Fp``,
  :mod:`~headwater.serving.ingest.bodies`). Answers one result per event:
  200 all accepted, 422 some rejected (each with field and reason; the accepted ones were written),
  503 some not acknowledged by the broker (retry the batch: event ids make it count once);
  a request refused whole: 400 not a batch, 401/403 the auth hook, 404 no such source,
  413 too large, 415 the type, 429 with ``Retry-After`` the producer's buffer is full.
- ``POST /push``: a Feast push payload (``push_source_name``, ``df``), same answers.
- ``GET /v1/sources``, ``GET /v1/sources/{source}``: the sources, each with its current schema's
  fingerprint and fields (what an Avro client needs); ``GET /health``: the counts.

The body is read up to ``max_body_bytes`` (413 beyond), then parsing, checking and the wait for the
acknowledgements run in a worker thread, so a large batch never stalls the event loop. Every
refusal is an :class:`~headwater.serving.ingest.core.IngestRefused` carrying its status: one handler
(:func:`refused`) turns it into JSON. An exception nothing expected is a 503 naming a request id
(the trace is in the log under it), never a bare 500.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from headwater.serving.ingest.bodies import FINGERPRINT_HEADER, feast_rows, json_value, read_rows
from headwater.serving.ingest.core import BatchTooLarge, IngestAnswer, IngestRefused, IngestService

logger = logging.getLogger(__name__)
DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024


class FastJSON(JSONResponse):
    """JSON rendered with orjson."""

    def render(self, content: Any) -> bytes:
        """Serialise ``content``."""
        return orjson.dumps(content)


def refused(exc: IngestRefused) -> Response:
    """Answer a request refused whole in JSON: its status, ``detail``, and ``Retry-After`` when set."""
    headers = (
        {"Retry-After": f"{max(1, round(exc.retry_after_s))}"} if exc.retry_after_s is not None else None
    )
    return FastJSON({"detail": str(exc), "errors": []}, status_code=exc.status, headers=headers)


def answered(answer: IngestAnswer) -> Response:
    """Answer a batch in JSON, with its status (``Retry-After`` on a 503)."""
    headers = {"Retry-After": "1"} if answer.status == 503 else None
    return FastJSON(answer.as_dict(), status_code=answer.status, headers=headers)


class IngestRoutes:
    """The handlers over one :class:`IngestService` (methods, not closures: they hold no other state)."""

    def __init__(self, service: IngestService, max_body_bytes: int, feast_sources: Mapping[str, str]) -> None:
        self.service = service
        self.max_body_bytes = max_body_bytes
        self.feast_sources = dict(feast_sources)

    async def _body(self, request: Request) -> bytes:
        """Read the body up to the limit.

        Raises:
            BatchTooLarge: over ``max_body_bytes``.
        """
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self.max_body_bytes:
            raise BatchTooLarge(self._too_large())
        chunks: list[bytes] = []
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > self.max_body_bytes:
                raise BatchTooLarge(self._too_large())
            chunks.append(chunk)
        return b"".join(chunks)

    def _too_large(self) -> str:
        return f"the body is over {self.max_body_bytes:,} bytes; split the batch"

    async def post_events(self, request: Request) -> Response:
        """``POST /v1/sources/{source}/events``: check, send and answer one batch."""
        name = request.path_params["source"]
        try:
            headers = dict(request.headers)
            self.service.check_access(headers)
            source = self.service.source(name)
            body = await self._body(request)
            content_type = request.headers.get("content-type")
            fingerprint = request.headers.get(FINGERPRINT_HEADER)
            answer = await run_in_threadpool(
                self._accept, source.name, body, content_type, fingerprint, headers
            )
        except IngestRefused as exc:
            return refused(exc)
        except Exception:
            return self._internal(request)
        return answered(answer)

    def _accept(
        self,
        name: str,
        body: bytes,
        content_type: str | None,
        fingerprint: str | None,
        headers: dict[str, str],
    ) -> IngestAnswer:
        rows = read_rows(body, content_type, self.service.codec(name), fingerprint)
        return self.service.accept(name, rows, headers)

    async def push(self, request: Request) -> Response:
        """``POST /push``: a Feast push payload for a push source mapped to a headwater source."""
        try:
            headers = dict(request.headers)
            self.service.check_access(headers)
            body = await self._body(request)
            answer = await run_in_threadpool(self._accept_feast, body, headers)
        except IngestRefused as exc:
            return refused(exc)
        except Exception:
            return self._internal(request)
        return answered(answer)

    def _accept_feast(self, body: bytes, headers: dict[str, str]) -> IngestAnswer:
        name, rows = feast_rows(json_value(body), self.feast_sources)
        return self.service.accept(name, rows, headers)

    async def list_sources(self, request: Request) -> Response:
        """``GET /v1/sources``: every source's description (for a caller the auth hook lets push)."""
        try:
            self.service.check_access(dict(request.headers))
        except IngestRefused as exc:
            return refused(exc)
        return FastJSON({"sources": [self.service.describe(n) for n in sorted(self.service.sources)]})

    async def get_source(self, request: Request) -> Response:
        """``GET /v1/sources/{source}``: one source's topic, key, event id, fingerprint and fields."""
        try:
            self.service.check_access(dict(request.headers))
            return FastJSON(self.service.describe(request.path_params["source"]))
        except IngestRefused as exc:
            return refused(exc)

    async def health(self, request: Request) -> Response:
        """``GET /health``: ok, the sources and the counts since start."""
        return FastJSON(
            {"status": "ok", "sources": sorted(self.service.sources), **self.service.stats.as_dict()}
        )

    def _internal(self, request: Request) -> Response:
        request_id = uuid.uuid4().hex[:16]
        logger.exception(
            "unhandled error serving %s %s (request id %s)", request.method, request.url.path, request_id
        )
        detail = f"internal error, request id {request_id}: retry; report it if it persists"
        return FastJSON({"detail": detail, "errors": []}, status_code=503, headers={"Retry-After": "1"})


@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    """Close the service (deliver what is queued) when the server stops."""
    yield
    app.state.service.close()


def ingest_app(
    service: IngestService,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    feast_sources: Mapping[str, str] | None = None,
) -> FastAPI:
    """Return the FastAPI app of the push API over ``service``; closing the app closes the service.

    ``feast_sources`` maps a Feast push source's name to a headwater source (default: the same name).
    """
    app = FastAPI(
        lifespan=_lifespan,
        title="headwater push API",
        version="1",
        summary="Push any source's events: checked against its schema and rules, keyed, acknowledged.",
        default_response_class=FastJSON,
    )
    app.state.service = service
    routes = IngestRoutes(service, max_body_bytes, feast_sources or {})
    app.add_api_route("/v1/sources/{source}/events", routes.post_events, methods=["POST"])
    app.add_api_route("/push", routes.push, methods=["POST"])
    app.add_api_route("/v1/sources", routes.list_sources, methods=["GET"])
    app.add_api_route("/v1/sources/{source}", routes.get_source, methods=["GET"])
    app.add_api_route("/health", routes.health, methods=["GET"])
    return app
