"""The ranking service's HTTP API (FastAPI): ``/v1/rank``, ``/health``, ``/metrics``, ``/openapi.json``."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, MutableMapping
from contextlib import asynccontextmanager
from typing import Annotated, Any

import numpy as np
import numpy.typing as npt
import orjson
from fastapi import FastAPI, Header, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from headwater.ranking.features import BoundRegistry
from headwater.ranking.model import gpu_memory_used_percent
from headwater.serving.admission import CLASS_HEADER, Admission, Throttled
from headwater.serving.batcher import MicroBatcher, QueueFullError
from headwater.serving.business import BusinessMetrics
from headwater.serving.config import ServingConfig
from headwater.serving.engine import NO_AGES, Job, Models, Ranked, RankingEngine, RankQuery
from headwater.serving.experiments import ArmEngines, with_arm
from headwater.serving.feedback import (
    FeedbackProducer,
    FeedbackRefused,
    IdempotencyKeys,
    impressions,
    new_request_id,
    receive_feedback,
)
from headwater.serving.fetch import FeatureFetcher, ItemVectorCache
from headwater.serving.funnel.stages import Funnel, FunnelMetrics, FunnelParts, RecommendQuery
from headwater.serving.item_mirror import ItemMirror
from headwater.serving.recording import Recorder
from headwater.serving.runtime import LoadedModels
from headwater.serving.schemas import (
    ErrorResponse,
    FeedbackRequest,
    FeedbackResponse,
    FeedbackStats,
    HealthResponse,
    IndexSnapshotStats,
    ItemMirrorStats,
    RankRequest,
    RankResponse,
    RecommendRequest,
    RecommendResponse,
    known_fields,
    readable_errors,
)
from headwater.serving.skew import PredictionLog, prediction_record
from headwater.serving.store import FeatureReader, ReadPool, now_ms
from headwater.serving.telemetry import Telemetry

logger = logging.getLogger(__name__)
Scope = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]], Awaitable[None]]


class FastJSON(JSONResponse):
    """JSON response rendered with orjson (numpy-free, fast for 2,000 items)."""

    def render(self, content: Any) -> bytes:
        """Serialise ``content``."""
        return orjson.dumps(content)


class BodyLimit:
    """ASGI middleware: a request body over ``limit`` bytes gets 413, however it is framed.

    A ``Content-Length`` over the limit is refused before the body is read; any other body
    (chunked, or a length header that lies) is read here up to the limit and then replayed to the
    app, so the app never holds more than ``limit`` bytes of one request.
    """

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

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
        while True:
            message = await receive()
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


Handler = Callable[[Any, str | None], Awaitable[Response]]
"""A hot route's handler: the validated body and the user-class header, to the response."""


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
        user_class = None
        for name, value in scope["headers"]:
            if name == b"content-type" and not _is_json(value):
                await self.app(scope, receive, send)
                return
            if name == _CLASS_HEADER and user_class is None:
                user_class = value.decode("latin-1")
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
        response = await handler(body, user_class)
        await response(scope, receive, send)


_CLASS_HEADER = CLASS_HEADER.encode("latin-1")


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
    """ASGI middleware: an exception no handler caught becomes a 503 with its type, not a bare 500.

    The routes are written never to raise (a ranking degrades to the editorial list); this is the
    net under a bug, so a client sees a retryable status and a message, and the log has the trace.
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
        except Exception as exc:
            logger.exception("unhandled error serving %s %s", scope.get("method"), scope.get("path"))
            if started:
                raise
            detail = f"the service failed to answer ({type(exc).__name__}); retry"
            response = JSONResponse(
                {"detail": detail, "errors": []}, status_code=503, headers={"Retry-After": "1"}
            )
            await response(scope, receive, send)


def _too_many(exc: Throttled | QueueFullError) -> Response:
    """429 with ``Retry-After``: the user's class is over its quota, or the batcher's queue is full."""
    if isinstance(exc, Throttled):
        detail = {"detail": str(exc), "errors": [], "user_class": exc.user_class}
        return FastJSON(
            {**detail, "retry_after_s": round(exc.retry_after_s, 3)},
            status_code=429,
            headers={"Retry-After": exc.retry_after_header},
        )
    return FastJSON(
        {"detail": str(exc), "errors": []}, status_code=429, headers={"Retry-After": str(exc.retry_after_s)}
    )


def runtimes(loaded: LoadedModels, funnel: FunnelParts | None) -> dict[str, str | None]:
    """Return what runs the DCN, the user tower, the re-ranker (``onnxruntime``/``torch``), the index search.

    The start-up line of ``headwater serve`` and ``/health`` both show these, from here.
    """
    retriever = funnel.retriever if funnel is not None else None
    runtime = funnel.runtime if funnel is not None else None
    return {
        "ranker_runtime": getattr(loaded.neural, "runtime", None),
        "retrieval_runtime": getattr(retriever, "runtime", None),
        "retrieval_index": runtime.index.library if runtime is not None else None,
        "reranker_runtime": getattr(funnel.reranker if funnel is not None else None, "runtime", None),
    }


def create_app(
    config: ServingConfig,
    registry: BoundRegistry,
    reader: FeatureReader,
    loaded: LoadedModels,
    feedback: FeedbackProducer | None = None,
    max_reads_in_flight: int | None = None,
    arm_loaded: Mapping[str, LoadedModels] | None = None,
    recorder: Recorder | None = None,
    predictions: PredictionLog | None = None,
    funnel: FunnelParts | None = None,
    fast_routes: bool = True,
) -> FastAPI:
    """Build the app; the batcher, the engine and the feedback producer start with its lifespan.

    ``max_reads_in_flight`` bounds the store reads running or queued on the ``io_threads``
    (default :func:`~headwater.serving.store.default_reads_in_flight`); past it a request falls back.
    ``arm_loaded``: the models of the experiment's arms that name one (``config.experiment``);
    ``recorder``: where a sample of the requests is recorded, with their answers;
    ``predictions``: where a sample of the answers goes with their model inputs (``headwater skew``);
    ``funnel``: the retriever, re-ranker and recent-items memory of ``/v1/recommend`` (None: 503 there);
    ``fast_routes``: serve valid ``/v1/rank`` and ``/v1/recommend`` requests through :class:`FastRoutes`
    (False: every request through FastAPI, the same answers; the tests compare both).
    """
    telemetry = Telemetry()
    io = ReadPool(config.io_threads, max_reads_in_flight)
    cache = ItemVectorCache(config.item_cache_entries, config.item_cache_ttl_s, registry.item.dim)
    telemetry.watch_cache(lambda: cache.hits, lambda: cache.misses)
    if feedback is not None:
        telemetry.watch_feedback(feedback)
    binding = loaded.binding
    telemetry.watch_versions(reader.other_version_rows, list(registry.view_versions), binding.changed_views)
    # The index refresher's copy of the item views' rows, when the funnel keeps one (serving/item_mirror.py).
    mirror = getattr(funnel.runtime, "mirror", None) if funnel is not None else None
    retriever = funnel.retriever if funnel is not None else None
    columns = (binding.user_columns, binding.item_columns)
    fetcher = FeatureFetcher(reader, registry, cache, io, columns, mirror)
    if mirror is not None:
        telemetry.watch_mirror(mirror)
    state: dict[str, RankingEngine] = {}
    admission = Admission(config.admission, telemetry.registry)
    keys = IdempotencyKeys()
    business = BusinessMetrics(telemetry.registry)
    recommender = None
    if funnel is not None:
        recommender = Funnel(
            config.funnel, registry, reader, funnel.recent, io, FunnelMetrics(telemetry.registry),
            funnel.retriever, funnel.reranker, config.editorial_items, funnel.retrieval_version,
        )  # fmt: skip

    def new_batcher(models: LoadedModels) -> MicroBatcher[Job, npt.NDArray[np.float32]] | None:
        if models.neural is None:
            return None
        b = config.batcher
        batcher = MicroBatcher(
            models.neural.score_batch,
            max_delay_s=b.max_delay_ms / 1000.0,
            max_batch_rows=b.rows_for(models.device),
            max_queue_requests=b.max_queue_requests,
            retry_after_s=b.retry_after_s,
            on_batch=telemetry.observe_batch,
        )
        batcher.start()
        return batcher

    def arm_engine(
        models: LoadedModels, scorers: Models
    ) -> tuple[RankingEngine, MicroBatcher[Job, npt.NDArray[np.float32]] | None]:
        # An experiment arm's engine: its own model's column binding and batcher, the shared store.
        b = models.binding
        arm_fetcher = FeatureFetcher(reader, registry, cache, io, (b.user_columns, b.item_columns), mirror)
        batcher = new_batcher(models) if scorers.neural_version else None
        return RankingEngine(config, registry, arm_fetcher, reader, scorers, batcher, telemetry, io), batcher

    arms = ArmEngines(config.experiment, loaded, arm_loaded or {}, arm_engine)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        batcher = new_batcher(loaded)
        if batcher is not None:
            telemetry.watch_queues(batcher.depth)
        state["engine"] = app.state.engine = RankingEngine(
            config, registry, fetcher, reader, loaded.models(), batcher, telemetry, io
        )
        if feedback is not None:
            feedback.start()
        # Other protocols' servers (gRPC) in this process: started on the engine, stopped before it.
        for server in app.state.servers:
            await server.start()
        try:
            yield
        finally:
            for server in reversed(app.state.servers):
                await server.stop()
            if batcher is not None:
                await batcher.stop()
            if feedback is not None:
                await asyncio.to_thread(feedback.stop)
            io.shutdown(wait=False, cancel_futures=True)

    app = FastAPI(
        title="headwater ranking service",
        version="1",
        summary="Top-k ranking of candidate items from online-store features, with fallbacks.",
        lifespan=lifespan,
        default_response_class=FastJSON,
    )
    app.state.telemetry = telemetry
    app.state.cache = cache
    app.state.reads = io
    app.state.admission = admission
    app.state.servers = []
    """Objects with ``async start()`` / ``async stop()`` run with the app's lifespan (the gRPC server)."""
    app.state.servers.append(arms)  # the experiment's engines: before any other protocol's server
    if recorder is not None:
        app.state.servers.append(recorder)
        recorder.register_metrics(telemetry.registry)
    if predictions is not None:
        app.state.servers.append(predictions)
    if funnel is not None:
        app.state.servers.append(funnel)  # the recent-items writer and the index refresh thread
    app.state.business = business

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
        # FastAPI's own refusals (a body that is not UTF-8 JSON: 400) in the service's error shape.
        telemetry.rejected.labels("invalid").inc()
        detail = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
        return FastJSON({"detail": detail, "errors": []}, status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        path = request.url.path
        forms: dict[str, type[FeedbackRequest | RecommendRequest]] = {
            "/v1/feedback": FeedbackRequest, "/v1/recommend": RecommendRequest,
        }  # fmt: skip
        model = forms.get(path, RankRequest)
        errors = readable_errors(exc.errors(), known_fields(model))
        telemetry.rejected.labels("invalid").inc()
        detail = "invalid request: " + "; ".join(f"{e['field']}: {e['message']}" for e in errors)
        return FastJSON({"detail": detail, "errors": errors}, status_code=422)

    @app.post(
        "/v1/rank",
        response_model=RankResponse,
        responses={
            **REFUSED,
            429: {
                "model": ErrorResponse,
                "description": "The user class is over its quota, or the scoring queue is full; retry after"
                " Retry-After seconds",
            },
        },
    )
    async def rank(
        body: RankRequest,
        user_class: Annotated[
            str | None,
            Header(alias=CLASS_HEADER, description="The caller's user class (wins over the body's)."),
        ] = None,
    ) -> Response:
        """Rank the candidates for the user; degrades through the fallback chain, never a 5xx.

        The returned items go back to Kafka as impressions (unless ``log_impressions`` is false).
        """
        try:
            return FastJSON(await answer_rank(body, user_class))
        except (Throttled, QueueFullError) as exc:
            return _too_many(exc)

    async def answer_rank(body: RankRequest, header_class: str | None = None) -> dict[str, Any]:
        """One rank call of any protocol (REST, gRPC): admission, the engine, the impressions; the answer.

        Raises :class:`Throttled` (the class is over its quota) or :class:`QueueFullError`.
        """
        asked = body.priority if "priority" in body.model_fields_set else None
        try:
            admitted = admission.admit(header_class, body.user_class, asked)
        except Throttled:
            telemetry.rejected.labels("throttled").inc()
            raise
        query = RankQuery(body.user_id, body.candidates, body.k, admitted.priority, body.deadline_ms)
        request_id = new_request_id()
        # Recorded: a sample of what users see (log_impressions); replays and benchmarks send false.
        arrived_ms = now_ms()  # the record's at_ms
        recording = recorder is not None and body.log_impressions and recorder.sampled()
        routed = arms.route(body.user_id, state["engine"])
        engine = routed.engine
        async with admission.slot(admitted):
            try:
                ranked = await engine.rank(query)
            except QueueFullError:
                telemetry.rejected.labels("queue_full").inc()
                raise
            except Exception:
                # The engine catches what each step can raise; this is a bug's net: the request still
                # gets the last step of the chain, the editorial list, and the log has the trace.
                logger.exception(
                    "ranking for user %r failed; answering from the editorial list", body.user_id
                )
                ranked = _editorial(config, query)
                telemetry.fallbacks.labels("editorial", "internal_error").inc()
        if feedback is not None and body.log_impressions:
            shown = [item for item, _ in ranked.items]
            feedback.offer(  # one unit per answer: built, validated and encoded by the sender thread
                impressions(request_id, body.user_id, shown, body.session_id, body.device, arm=routed.arm)
            )
        if funnel is not None and body.log_impressions:  # the seen filter of /v1/recommend
            funnel.recent.served(body.user_id, [item for item, _ in ranked.items], arrived_ms)
        ages = ranked.ages
        answer = {
            "items": [{"item_id": i, "score": s} for i, s in ranked.items],
            "model_version": ranked.model_version,
            "fallback": ranked.fallback,
            "fallback_reason": ranked.fallback_reason,
            "feature_ages_s": {
                "user": ages.user,
                "items_p50": ages.items_p50,
                "items_max": ages.items_max,
            },
            "latency_ms": ranked.latency_ms,
            "request_id": request_id,
            "user_feature_event_ms": ranked.user_event_ms,
            "arm": routed.arm,
        }
        if body.log_impressions:
            business.served(request_id, body.session_id, len(ranked.items), answer, routed.arm)
        if recording and recorder is not None:
            sent = body.model_dump(mode="json", exclude_unset=True)
            recorder.offer(arrived_ms, sent, 200, ranked.latency_ms, answer)
        used = ranked.features
        if predictions is not None and used is not None and used.user is not None and predictions.sampled():
            predictions.offer(
                prediction_record(request_id, arrived_ms, body.user_id, answer, body.candidates, used.user,
                                  used.items, used.items_found, used.user_event_ms)
            )  # fmt: skip
        return answer

    app.state.rank = answer_rank

    @app.post(
        "/v1/recommend",
        response_model=RecommendResponse,
        responses={
            **REFUSED,
            429: {"model": ErrorResponse, "description": "Over quota or the scoring queue is full; retry"},
            404: {"model": ErrorResponse, "description": "The service runs without the funnel"},
        },
    )
    async def recommend(
        body: RecommendRequest,
        user_class: Annotated[
            str | None,
            Header(alias=CLASS_HEADER, description="The caller's user class (wins over the body's)."),
        ] = None,
    ) -> Response:
        """Recommend k items from the whole catalog: retrieve, drop seen, rank, re-rank, business rules.

        Each stage's time, candidates and fallback are in ``stages``; the answer goes back to Kafka
        as impressions and into the user's seen set (unless ``log_impressions`` is false).
        """
        try:
            return FastJSON(await answer_recommend(body, user_class))
        except (Throttled, QueueFullError) as exc:
            return _too_many(exc)
        except FunnelOff as exc:
            return FastJSON({"detail": str(exc), "errors": []}, status_code=404)

    async def answer_recommend(body: RecommendRequest, header_class: str | None = None) -> dict[str, Any]:
        """One recommend call of any protocol: admission, the funnel, the impressions; the answer.

        Raises :class:`Throttled`, :class:`QueueFullError` or :class:`FunnelOff`.
        """
        if recommender is None or funnel is None:
            msg = "this service runs without the funnel (/v1/recommend); start it with `headwater serve`"
            raise FunnelOff(msg)
        asked = body.priority if "priority" in body.model_fields_set else None
        try:
            admitted = admission.admit(header_class, body.user_class, asked)
        except Throttled:
            telemetry.rejected.labels("throttled").inc()
            raise
        request_id = new_request_id()
        arrived_ms = now_ms()
        query = RecommendQuery(body.user_id, body.k, admitted.priority, body.deadline_ms)
        async with admission.slot(admitted):
            try:
                got = await recommender.recommend(state["engine"], query)
            except QueueFullError:
                telemetry.rejected.labels("queue_full").inc()
                raise
        shown = [item for item, _, _ in got.items]
        if body.log_impressions and shown:
            funnel.recent.served(body.user_id, shown, arrived_ms)
            if feedback is not None:
                feedback.offer(impressions(request_id, body.user_id, shown, body.session_id, body.device))
        return {
            "items": [{"item_id": i, "score": s, "category": c} for i, s, c in got.items],
            "stages": [stage.as_dict() for stage in got.stages],
            "fallback": any(stage.fallback is not None for stage in got.stages),
            "model_version": got.ranked.model_version if got.ranked is not None else None,
            "reranker_version": got.reranker_version,
            "retrieval_version": got.retrieval_version,
            "latency_ms": got.latency_ms,
            "request_id": request_id,
        }

    app.state.recommend = answer_recommend

    @app.post(
        "/v1/feedback",
        response_model=FeedbackResponse,
        status_code=202,
        responses=REFUSED,
    )
    async def post_feedback(
        body: FeedbackRequest,
        idempotency_key: Annotated[
            str | None, Header(alias="Idempotency-Key", description="Same as the idempotency_key field.")
        ] = None,
    ) -> Response:
        """Produce a click, like, purchase or dwell to Kafka; never waits for Kafka, never a 5xx.

        A retry with the same idempotency key produces the same event (``headwater.serving.feedback``).
        """
        try:
            got = receive_feedback(body, idempotency_key, keys, now_ms())
        except FeedbackRefused as exc:
            telemetry.rejected.labels("invalid").inc()
            errors = [{"field": exc.field, "message": exc.message}]
            return FastJSON({"detail": f"invalid feedback: {exc}", "errors": errors}, status_code=422)
        arm = arms.arm_of(body.user_id)
        queued = False
        if feedback is not None and got.send:
            queued = feedback.offer(with_arm([got.event], arm)) == 1
        if body.event_type == "click" and not got.replayed:
            business.clicked(body.request_id, body.session_id, arm)
            if funnel is not None:  # the re-ranker's sequence and the popularity fallback
                funnel.recent.clicked(body.user_id, body.item_id, got.event["event_time"])
        event = got.event
        answer = {"event_id": event["event_id"], "event_time_ms": event["event_time"], "queued": queued,
                  "replayed": got.replayed}  # fmt: skip
        return FastJSON(answer, status_code=202)

    @app.get("/health", response_model=HealthResponse)
    async def health() -> HealthResponse:
        """Model version, device, GPU memory in use and recent inference p99."""
        versions = loaded.models()
        return HealthResponse(
            status="ok" if versions.neural_version else "degraded",
            model_version=versions.neural_version,
            linear_version=versions.linear_version,
            registry_version=registry.registry_version,
            view_versions_changed=list(loaded.binding.changed_views),
            device=loaded.device,
            ranker_runtime_failures=int(getattr(loaded.neural, "onnx_failures", 0)),
            gpu_memory_used_percent=gpu_memory_used_percent(loaded.device),
            inference_latency_p99_ms=telemetry.inference_p99_ms(),
            feedback=_feedback_stats(feedback),
            retrieval_runtime_failures=int(getattr(retriever, "onnx_failures", 0)),
            item_mirror=_mirror_stats(mirror, registry),
            index_snapshot=_snapshot_stats(funnel.runtime if funnel is not None else None),
            **runtimes(loaded, funnel),
        )

    @app.get("/metrics", response_class=Response)
    async def metrics() -> Response:
        """Prometheus metrics."""
        # Off the event loop: the freshness collector reads Redis at scrape time.
        try:
            body = await asyncio.to_thread(generate_latest, telemetry.registry)
        except Exception as exc:  # a collector's bug must not take the endpoint down with a 500
            logger.exception("collecting metrics failed")
            detail = f"metrics are unavailable: {type(exc).__name__}: {exc}"
            return FastJSON({"detail": detail, "errors": []}, status_code=503, headers={"Retry-After": "5"})
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    if fast_routes:  # added first = innermost: behind the body limit and the last-resort 503
        app.add_middleware(
            FastRoutes,
            routes={"/v1/rank": (RankRequest, rank), "/v1/recommend": (RecommendRequest, recommend)},
        )
    app.add_middleware(BodyLimit, limit=config.max_body_bytes)
    app.add_middleware(LastResort)  # added last = outermost: also covers BodyLimit
    return app


def _mirror_stats(mirror: ItemMirror | None, registry: BoundRegistry) -> ItemMirrorStats | None:
    if mirror is None:
        return None
    age = mirror.age_s()
    served = mirror.views_served()
    return ItemMirrorStats(
        items=len(mirror),
        version=mirror.version,
        age_s=None if age == float("inf") else round(age, 3),
        views_from_memory=[lay.view for lay, yes in zip(registry.item.layouts, served, strict=True) if yes],
        candidates_from_memory=mirror.served,
        candidates_from_store=mirror.read,
    )


def _snapshot_stats(runtime: Any) -> IndexSnapshotStats | None:
    """Return the retrieval runtime's snapshot plan as /health shows it (None: no runtime or no snapshot)."""
    plan = getattr(runtime, "snapshot", None)
    if plan is None:
        return None
    loaded, saved = plan.restored, plan.saved
    return IndexSnapshotStats(
        folder=str(plan.folder),
        loaded_version=loaded.version if loaded else None,
        loaded_items=loaded.items if loaded else None,
        load_s=loaded.seconds if loaded else None,
        saved_version=saved.version if saved else None,
        saved_at_ms=saved.saved_at_ms if saved else None,
        save_s=saved.seconds if saved else None,
        save_bytes=saved.bytes if saved else None,
        save_failures=plan.failures,
    )


class FunnelOff(RuntimeError):
    """``/v1/recommend`` was called on an app built without a funnel."""


def _editorial(config: ServingConfig, query: RankQuery) -> Ranked:
    """Return the editorial answer (the chain's last step) for a request whose ranking raised."""
    wanted = set(query.candidates)
    first = [i for i in config.editorial_items if i in wanted]
    chosen = set(first)
    ordered = first + [c for c in query.candidates if c not in chosen]
    items = [(item, round(1.0 / (1 + rank), 6)) for rank, item in enumerate(ordered[: query.k])]
    return Ranked(items, None, "editorial", "internal_error", NO_AGES, 0.0, {})


REFUSED: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorResponse, "description": "The body cannot be read (not UTF-8, not JSON)"},
    413: {"model": ErrorResponse, "description": "The body is over the configured limit"},
    422: {"model": ErrorResponse, "description": "The request is not valid; one entry per field"},
}
"""The refusals documented on every POST route."""


def _feedback_stats(feedback: FeedbackProducer | None) -> FeedbackStats | None:
    if feedback is None:
        return None
    c = feedback.counters
    return FeedbackStats(
        connected=feedback.connected,
        sent=c.sent,
        dropped=c.dropped,
        failed=c.failed,
        buffered=feedback.buffered,
    )
