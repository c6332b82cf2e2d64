"""The ranking service's REST adapter (FastAPI): ``/v1/rank``, ``/v1/recommend``, ``/v1/feedback`` and more.

The routes: ``POST /v1/rank``, ``/v1/recommend``, ``/v1/feedback``; ``GET /health``, ``/metrics``,
``/openapi.json``.

:class:`RestRoutes` validates (FastAPI, or :class:`FastRoutes` for the hot routes' common case),
calls the :class:`~headwater.serving.core.RankingService` and serialises its answer with orjson;
:func:`refused` maps the core's refusals to HTTP in one place (429 with ``Retry-After``, 404, 422).
:func:`rest_app` builds the FastAPI app over a service, with the middlewares (:class:`BodyLimit`,
:class:`FastRoutes`, :class:`LastResort`) and the service's lifespan.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, MutableMapping
from contextlib import asynccontextmanager
from typing import Annotated, Any

import orjson
from fastapi import FastAPI, Header, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from headwater.serving.admission import CLASS_HEADER, Throttled
from headwater.serving.auth import Authenticator, AuthError, Forbidden, Identity
from headwater.serving.batcher import QueueFullError
from headwater.serving.config import AuthConfig, Role
from headwater.serving.core import FunnelOff, RankingService
from headwater.serving.edge import internal_error
from headwater.serving.feedback import FeedbackRefused, new_request_id
from headwater.serving.impressions import REQUEST_ID_HEADER, InvalidRequestId, checked_request_id
from headwater.serving.schemas import (
    ErrorResponse,
    FeedbackRequest,
    FeedbackResponse,
    HealthResponse,
    RankRequest,
    RankResponse,
    RecommendRequest,
    RecommendResponse,
    known_fields,
    readable_errors,
)

logger = logging.getLogger(__name__)
Scope = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]], Awaitable[None]]


class FastJSON(JSONResponse):
    """JSON response rendered with orjson (numpy-free, fast for 2,000 items)."""

    def render(self, content: Any) -> bytes:
        """Serialise ``content``."""
        return orjson.dumps(content)


class BodyLimit:
    """ASGI middleware: a request body over ``limit`` bytes gets 413, one slower than ``timeout_s`` 408.

    A ``Content-Length`` over the limit is refused before the body is read; any other body
    (chunked, or a length header that lies) is read here up to the limit and then replayed to the
    app, so the app never holds more than ``limit`` bytes of one request. The whole body must arrive
    within ``timeout_s`` of the headers: a client trickling it is answered 408 and its connection
    closed, so it holds a connection and ``limit`` bytes for ``timeout_s`` at most.
    """

    def __init__(self, app: ASGIApp, limit: int, timeout_s: float = 10.0) -> None:
        self.app = app
        self.limit = limit
        self.timeout_s = timeout_s

    async def __call__(
        self, scope: Scope, receive: Callable[[], Awaitable[Any]], send: Callable[[Any], Awaitable[None]]
    ) -> None:
        """Refuse an oversized request; pass the rest on with its body read."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.limit:
            msg = f"the request body is {int(length)} bytes; the limit is {self.limit}"
            await self._refuse(msg, scope, receive, send)
            return
        chunks: list[bytes] = []
        size = 0
        deadline = asyncio.get_running_loop().time() + self.timeout_s
        while True:
            try:
                async with asyncio.timeout_at(deadline):
                    message = await receive()
            except TimeoutError:
                await self._too_slow(size, scope, receive, send)
                return
            if message["type"] != "http.request":  # the client went away: let the app see it
                await self.app(scope, _replay([message], receive), send)
                return
            body = message.get("body", b"")
            size += len(body)
            if size > self.limit:
                msg = (
                    f"the request body is over the limit of {self.limit} bytes ({size} read before refusing)"
                )
                await self._refuse(msg, scope, receive, send)
                return
            chunks.append(body)
            if not message.get("more_body", False):
                break
        whole = {"type": "http.request", "body": b"".join(chunks), "more_body": False}
        await self.app(scope, _replay([whole], receive), send)

    @staticmethod
    async def _refuse(
        msg: str,
        scope: Scope,
        receive: Callable[[], Awaitable[Any]],
        send: Callable[[Any], Awaitable[None]],
    ) -> None:
        await JSONResponse({"detail": msg, "errors": []}, status_code=413)(scope, receive, send)

    async def _too_slow(
        self,
        size: int,
        scope: Scope,
        receive: Callable[[], Awaitable[Any]],
        send: Callable[[Any], Awaitable[None]],
    ) -> None:
        msg = (
            f"the request body did not arrive within {self.timeout_s:g} s ({size} bytes read);"
            " send the whole body at once"
        )
        # Connection: close, so the server drops the connection rather than read the rest of the body.
        response = JSONResponse(
            {"detail": msg, "errors": []}, status_code=408, headers={"Connection": "close"}
        )
        await response(scope, receive, send)


IDENTITY = "headwater.identity"
"""The scope key where :class:`Guard` leaves the caller's :class:`~headwater.serving.auth.Identity`."""
ROUTE_ROLES: dict[str, Role] = {"/v1/rank": "rank", "/v1/recommend": "rank", "/v1/feedback": "feedback"}
"""The role each write route needs; ``/metrics`` needs ``admin`` unless ``auth.metrics: open``."""


class Guard:
    """ASGI middleware: the caller of a protected route must be allowed (401, 403); writes must be JSON (415).

    Runs before the body is read. ``/health`` and the OpenAPI document stay open. A write route's
    body must say ``Content-Type: application/json`` (or ``+json``): a browser page can POST
    ``text/plain`` to any address without a preflight, and without this check FastAPI would parse it.
    """

    def __init__(self, app: ASGIApp, auth: Authenticator, roles: Mapping[str, Role]) -> None:
        self.app = app
        self.auth = auth
        self.roles = dict(roles)

    async def __call__(
        self, scope: Scope, receive: Callable[[], Awaitable[Any]], send: Callable[[Any], Awaitable[None]]
    ) -> None:
        """Refuse a caller without the route's role, or a write that is not JSON; pass the rest on."""
        role = self.roles.get(scope["path"]) if scope["type"] == "http" else None
        if role is None:
            await self.app(scope, receive, send)
            return
        headers: dict[str, str] = {}
        for name, value in scope["headers"]:
            headers.setdefault(name.decode("latin-1"), value.decode("latin-1"))  # the first of repeats
        try:
            identity = self.auth.authenticate(headers, role)
        except AuthError as exc:
            forbidden = isinstance(exc, Forbidden)
            extra = {} if forbidden else {"WWW-Authenticate": "Bearer"}
            response = FastJSON({"detail": str(exc), "errors": []}, status_code=403 if forbidden else 401,
                                headers=extra)  # fmt: skip
            await response(scope, receive, send)
            return
        if scope["method"] == "POST" and not _is_json(headers.get("content-type", "").encode("latin-1")):
            got = headers.get("content-type", "none")[:100]
            msg = f"the body must be JSON with Content-Type: application/json; got {got!r}"
            await FastJSON({"detail": msg, "errors": []}, status_code=415)(scope, receive, send)
            return
        scope[IDENTITY] = identity
        await self.app(scope, receive, send)


def identity_of(scope: Scope) -> Identity | None:
    """Return the identity :class:`Guard` found for this request (None: the route is not guarded)."""
    found = scope.get(IDENTITY)
    return found if isinstance(found, Identity) else None


Handler = Callable[[Any, str | None, str | None, Identity | None], Awaitable[Response]]
"""A hot route's handler: the validated body, the user-class and request-id headers, the caller."""


class FastRoutes:
    """ASGI middleware: ``POST /v1/rank`` and ``/v1/recommend`` with a valid JSON body, served directly.

    The hot routes' common case skips FastAPI's request machinery (routing, the body read through
    ``Request``, ``json.loads`` then validation of the dict, dependency solving, the exception and
    exit-stack middlewares): the raw body is validated in one step by pydantic's JSON parser
    (``Model.model_validate_json``) and the route's own handler answers. Anything else, a body that
    does not validate, a content type that is not JSON, goes to the FastAPI app unchanged (the body
    replayed), so every 4xx and the OpenAPI schema stay exactly FastAPI's.
    """

    def __init__(self, app: ASGIApp, routes: Mapping[str, tuple[type[BaseModel], Handler]]) -> None:
        self.app = app
        self.routes = dict(routes)

    async def __call__(
        self, scope: Scope, receive: Callable[[], Awaitable[Any]], send: Callable[[Any], Awaitable[None]]
    ) -> None:
        """Serve a valid hot-route request; pass every other request on."""
        route = (
            self.routes.get(scope["path"]) if scope["type"] == "http" and scope["method"] == "POST" else None
        )
        if route is None:
            await self.app(scope, receive, send)
            return
        user_class = request_id = None
        for name, value in scope["headers"]:
            if name == b"content-type" and not _is_json(value):
                await self.app(scope, receive, send)
                return
            if name == _CLASS_HEADER and user_class is None:
                user_class = value.decode("latin-1")
            elif name == _ID_HEADER and request_id is None:
                request_id = value.decode("latin-1")
        chunks: list[bytes] = []
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away: FastAPI's path sees it
                await self.app(scope, _replay([message], receive), send)
                return
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        raw = b"".join(chunks)
        model, handler = route
        try:
            body = model.model_validate_json(raw)
        except ValidationError:  # FastAPI's path words the 422 (or 400) as it always has
            whole = {"type": "http.request", "body": raw, "more_body": False}
            await self.app(scope, _replay([whole], receive), send)
            return
        response = await handler(body, user_class, request_id, identity_of(scope))
        await response(scope, receive, send)


_CLASS_HEADER = CLASS_HEADER.encode("latin-1")
_ID_HEADER = REQUEST_ID_HEADER.lower().encode("latin-1")


def _is_json(content_type: bytes) -> bool:
    """Whether FastAPI would read a body of this content type as JSON (``application/json`` or ``+json``)."""
    kind = content_type.split(b";", 1)[0].strip().lower()
    main, _, sub = kind.partition(b"/")
    return main == b"application" and (sub == b"json" or sub.endswith(b"+json"))


def _replay(messages: list[Any], receive: Callable[[], Awaitable[Any]]) -> Callable[[], Awaitable[Any]]:
    """Return a ``receive`` that gives ``messages`` first, then what the server sends (a disconnect)."""
    pending = list(messages)

    async def replayed() -> Any:
        if pending:
            return pending.pop(0)
        return await receive()

    return replayed


class LastResort:
    """ASGI middleware: an exception no handler caught becomes a 503 naming a request id, not a bare 500.

    The routes are written never to raise (a ranking degrades to the editorial list); this is the
    net under a bug, so a client sees a retryable status and ``internal error, request id X``, and
    the log has the trace under the same id. No exception text reaches the client: it can hold
    paths, addresses or data of other requests.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(
        self, scope: Scope, receive: Callable[[], Awaitable[Any]], send: Callable[[Any], Awaitable[None]]
    ) -> None:
        """Run the app; answer 503 if it raises before it started its response."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracked(message: Any) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except Exception:
            request_id = _request_id_of(scope)
            logger.exception(
                "unhandled error serving %s %s (request id %s)",
                scope.get("method"),
                scope.get("path"),
                request_id,
            )
            if started:
                raise
            detail = internal_error(request_id)
            response = JSONResponse(
                {"detail": detail, "errors": []}, status_code=503, headers={"Retry-After": "1"}
            )
            await response(scope, receive, send)


def _request_id_of(scope: Scope) -> str:
    """Return the caller's valid ``X-Request-Id``, else a fresh id (the one the log and the answer name)."""
    for name, value in scope.get("headers") or ():
        if name == _ID_HEADER:
            try:
                return checked_request_id(value.decode("latin-1")) or new_request_id()
            except InvalidRequestId:
                break
    return new_request_id()


_AUTH_REFUSED: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorResponse, "description": "No credential, or an invalid or expired one"},
    403: {"model": ErrorResponse, "description": "The credential lacks the role this route needs"},
}
REFUSED: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorResponse, "description": "The body cannot be read (not UTF-8, not JSON)"},
    408: {"model": ErrorResponse, "description": "The body did not arrive within the configured time"},
    413: {"model": ErrorResponse, "description": "The body is over the configured limit"},
    422: {"model": ErrorResponse, "description": "The request is not valid; one entry per field"},
    **_AUTH_REFUSED,
    415: {"model": ErrorResponse, "description": "The body is not sent as Content-Type: application/json"},
}
"""The refusals documented on every POST route."""

_RANK_REFUSED: dict[int | str, dict[str, Any]] = {
    **REFUSED,
    429: {
        "model": ErrorResponse,
        "description": "The user class is over its quota, or the scoring queue is full; retry after"
        " Retry-After seconds",
    },
}
_RECOMMEND_REFUSED: dict[int | str, dict[str, Any]] = {
    **REFUSED,
    429: {"model": ErrorResponse, "description": "Over quota or the scoring queue is full; retry"},
    404: {"model": ErrorResponse, "description": "The service runs without the funnel"},
}
_FEEDBACK_REFUSED: dict[int | str, dict[str, Any]] = {
    **REFUSED,
    409: {"model": ErrorResponse, "description": "The item was not served to the user, or is unknown"},
}
_FORMS: dict[str, type[BaseModel]] = {"/v1/feedback": FeedbackRequest, "/v1/recommend": RecommendRequest}
"""The body model of each POST path whose 422 names its fields (any other path: ``RankRequest``'s)."""


def refused(exc: Throttled | QueueFullError | FunnelOff | FeedbackRefused) -> Response:
    """Return the HTTP answer of a refusal the core raised (:data:`headwater.serving.core.REFUSALS`).

    429 with ``Retry-After``: the user's class is over its quota, or the batcher's queue is full;
    404: recommend on a service without the funnel; a feedback post that cannot be accepted: its
    ``status`` (422 invalid, 409 an item not served, not in the catalog, or not checkable now).
    """
    if isinstance(exc, Throttled):
        detail = {"detail": str(exc), "errors": [], "user_class": exc.user_class}
        return FastJSON(
            {**detail, "retry_after_s": round(exc.retry_after_s, 3)},
            status_code=429,
            headers={"Retry-After": exc.retry_after_header},
        )
    if isinstance(exc, QueueFullError):
        return FastJSON(
            {"detail": str(exc), "errors": []},
            status_code=429,
            headers={"Retry-After": str(exc.retry_after_s)},
        )
    if isinstance(exc, FunnelOff):
        return FastJSON({"detail": str(exc), "errors": []}, status_code=404)
    errors = [{"field": exc.field, "message": exc.message}]
    return FastJSON({"detail": f"invalid feedback: {exc}", "errors": errors}, status_code=exc.status)


_CLASS_HELP = (
    "Honoured only from a trusted gateway's credential (or with auth: none); else the credential's class."
)
_ID_HELP = (
    "Your id of this logical request (1-64 of A-Z a-z 0-9 . _ -), the same on every retry: the answer's"
    " request_id, and its impressions are logged once however often it is retried."
)


class RestRoutes:
    """The routes' handlers over one service: validated bodies in, the core's answers out as JSON."""

    def __init__(self, service: RankingService) -> None:
        self.service = service

    async def rank(
        self,
        body: RankRequest,
        request: Request,
        user_class: Annotated[str | None, Header(alias=CLASS_HEADER, description=_CLASS_HELP)] = None,
        request_id: Annotated[str | None, Header(alias=REQUEST_ID_HEADER, description=_ID_HELP)] = None,
    ) -> Response:
        """Rank the candidates for the user; degrades through the fallback chain, never a 5xx.

        The returned items go back to Kafka as impressions (unless ``log_impressions`` is false).
        """
        return await self.rank_as(body, user_class, request_id, identity_of(request.scope))

    async def rank_as(
        self, body: RankRequest, user_class: str | None, request_id: str | None, identity: Identity | None
    ) -> Response:
        """:meth:`rank` for a caller already authenticated (the hot route's handler)."""
        try:
            given = checked_request_id(request_id)
            return FastJSON(await self.service.rank(body, user_class, given, identity))
        except InvalidRequestId as exc:
            return self._bad_id(exc)
        except (Throttled, QueueFullError) as exc:
            return refused(exc)

    async def recommend(
        self,
        body: RecommendRequest,
        request: Request,
        user_class: Annotated[str | None, Header(alias=CLASS_HEADER, description=_CLASS_HELP)] = None,
        request_id: Annotated[str | None, Header(alias=REQUEST_ID_HEADER, description=_ID_HELP)] = None,
    ) -> Response:
        """Recommend k items from the whole catalog: retrieve, drop seen, rank, re-rank, business rules.

        Each stage's time, candidates and fallback are in ``stages``; the answer goes back to Kafka
        as impressions and into the user's seen set (unless ``log_impressions`` is false).
        """
        return await self.recommend_as(body, user_class, request_id, identity_of(request.scope))

    async def recommend_as(
        self,
        body: RecommendRequest,
        user_class: str | None,
        request_id: str | None,
        identity: Identity | None,
    ) -> Response:
        """:meth:`recommend` for a caller already authenticated (the hot route's handler)."""
        try:
            given = checked_request_id(request_id)
            return FastJSON(await self.service.recommend(body, user_class, given, identity))
        except InvalidRequestId as exc:
            return self._bad_id(exc)
        except (Throttled, QueueFullError, FunnelOff) as exc:
            return refused(exc)

    def _bad_id(self, exc: InvalidRequestId) -> Response:
        self.service.count_invalid()
        errors = [{"field": REQUEST_ID_HEADER, "message": str(exc)}]
        return FastJSON({"detail": f"invalid request: {exc}", "errors": errors}, status_code=422)

    async def post_feedback(
        self,
        body: FeedbackRequest,
        request: Request,
        idempotency_key: Annotated[
            str | None, Header(alias="Idempotency-Key", description="Same as the idempotency_key field.")
        ] = None,
    ) -> Response:
        """Produce a click, like, purchase or dwell to Kafka; never waits for Kafka, never a 5xx.

        A retry with the same idempotency key produces the same event (``headwater.serving.feedback``).
        """
        try:
            answer = await self.service.feedback(body, idempotency_key, identity=identity_of(request.scope))
            return FastJSON(answer, status_code=202)
        except (FeedbackRefused, Throttled) as exc:
            return refused(exc)

    async def health(self) -> HealthResponse:
        """Model version, device, GPU memory in use and recent inference p99."""
        return await self.service.health()

    async def metrics(self) -> Response:
        """Prometheus metrics."""
        try:
            body = await self.service.metrics()
        except Exception:  # a collector's bug must not take the endpoint down with a 500
            request_id = new_request_id()
            logger.exception("collecting metrics failed (request id %s)", request_id)
            detail = f"metrics are unavailable: {internal_error(request_id)}"
            return FastJSON({"detail": detail, "errors": []}, status_code=503, headers={"Retry-After": "5"})
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    async def http_error(self, request: Request, exc: StarletteHTTPException) -> Response:
        """FastAPI's own refusals (a body that is not UTF-8 JSON: 400) in the service's error shape."""
        self.service.count_invalid()
        detail = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
        return FastJSON({"detail": detail, "errors": []}, status_code=exc.status_code, headers=exc.headers)

    async def invalid(self, request: Request, exc: RequestValidationError) -> Response:
        """Refuse a body that does not validate: 422 with one readable entry per field."""
        model = _FORMS.get(request.url.path, RankRequest)
        errors = readable_errors(exc.errors(), known_fields(model))
        self.service.count_invalid()
        detail = "invalid request: " + "; ".join(f"{e['field']}: {e['message']}" for e in errors)
        return FastJSON({"detail": detail, "errors": errors}, status_code=422)


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    """Run ``app.state.service`` (its engine, batcher, feedback producer and servers) with the app."""
    service: RankingService = app.state.service
    await service.start()
    app.state.engine = service.engine
    try:
        yield
    finally:
        await service.stop()


def rest_app(
    service: RankingService, max_body_bytes: int, fast_routes: bool = True, body_timeout_s: float = 10.0
) -> FastAPI:
    """Return the FastAPI app over ``service``; ``app.state.service`` is it (another adapter reads it there).

    ``max_body_bytes`` and ``body_timeout_s``: a body over the size gets 413, one slower than the
    time 408 (:class:`BodyLimit`).

    ``fast_routes``: serve valid ``/v1/rank`` and ``/v1/recommend`` requests through :class:`FastRoutes`
    (False: every request through FastAPI, the same answers).
    """
    app = FastAPI(
        title="headwater ranking service",
        version="1",
        summary="Top-k ranking of candidate items from online-store features, with fallbacks.",
        lifespan=lifespan,
        default_response_class=FastJSON,
    )
    app.state.service = service
    routes = RestRoutes(service)
    app.exception_handler(StarletteHTTPException)(routes.http_error)
    app.exception_handler(RequestValidationError)(routes.invalid)
    app.add_api_route(
        "/v1/rank", routes.rank, methods=["POST"], response_model=RankResponse, responses=_RANK_REFUSED
    )
    app.add_api_route(
        "/v1/recommend", routes.recommend, methods=["POST"], response_model=RecommendResponse,
        responses=_RECOMMEND_REFUSED,
    )  # fmt: skip
    app.add_api_route(
        "/v1/feedback", routes.post_feedback, methods=["POST"], response_model=FeedbackResponse,
        status_code=202, responses=_FEEDBACK_REFUSED,
    )  # fmt: skip
    app.add_api_route("/health", routes.health, methods=["GET"], response_model=HealthResponse)
    app.add_api_route(
        "/metrics", routes.metrics, methods=["GET"], response_class=Response, responses=_AUTH_REFUSED
    )
    if fast_routes:  # added first = innermost: behind the body limit and the last-resort 503
        hot: dict[str, tuple[type[BaseModel], Handler]] = {
            "/v1/rank": (RankRequest, routes.rank_as),
            "/v1/recommend": (RecommendRequest, routes.recommend_as),
        }
        app.add_middleware(FastRoutes, routes=hot)
    app.add_middleware(BodyLimit, limit=max_body_bytes, timeout_s=body_timeout_s)
    roles = dict(ROUTE_ROLES)
    auth = service.parts.config.auth
    if not (isinstance(auth, AuthConfig) and auth.metrics == "open"):
        roles["/metrics"] = "admin"
    app.add_middleware(Guard, auth=service.parts.auth, roles=roles)  # before the body is read
    app.add_middleware(LastResort)  # added last = outermost: also covers BodyLimit
    return app
