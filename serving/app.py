"""The ranking service's HTTP API (FastAPI): ``/v1/rank``, ``/health``, ``/metrics``, ``/openapi.json``."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from headwater.serving.batcher import MicroBatcher, QueueFullError
from headwater.serving.config import ServingConfig
from headwater.serving.engine import Job, RankingEngine, RankQuery
from headwater.serving.feedback import FeedbackProducer, feedback_event, impression_events, new_request_id
from headwater.serving.fetch import FeatureFetcher, ItemVectorCache
from headwater.serving.model import gpu_memory_used_percent
from headwater.serving.registry import BoundRegistry
from headwater.serving.runtime import LoadedModels
from headwater.serving.schemas import (
    MAX_FEEDBACK_AGE_S,
    MAX_FEEDBACK_SKEW_S,
    ErrorResponse,
    FeedbackRequest,
    FeedbackResponse,
    FeedbackStats,
    HealthResponse,
    RankRequest,
    RankResponse,
    readable_errors,
)
from headwater.serving.store import FeatureReader, now_ms
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
    """ASGI middleware: a request whose Content-Length exceeds ``limit`` bytes gets 413."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(
        self, scope: Scope, receive: Callable[[], Awaitable[Any]], send: Callable[[Any], Awaitable[None]]
    ) -> None:
        """Refuse an oversized request before its body is read; pass the rest on."""
        if scope["type"] == "http":
            length = dict(scope.get("headers") or []).get(b"content-length")
            if length is not None and length.isdigit() and int(length) > self.limit:
                msg = f"the request body is {int(length)} bytes; the limit is {self.limit}"
                await JSONResponse({"detail": msg, "errors": []}, status_code=413)(scope, receive, send)
                return
        await self.app(scope, receive, send)


def create_app(
    config: ServingConfig,
    registry: BoundRegistry,
    reader: FeatureReader,
    loaded: LoadedModels,
    feedback: FeedbackProducer | None = None,
) -> FastAPI:
    """Build the app; the batcher, the engine and the feedback producer start with its lifespan."""
    telemetry = Telemetry()
    io = ThreadPoolExecutor(max_workers=config.io_threads, thread_name_prefix="headwater-io")
    cache = ItemVectorCache(config.item_cache_entries, config.item_cache_ttl_s, registry.item.dim)
    telemetry.watch_cache(lambda: cache.hits, lambda: cache.misses)
    if feedback is not None:
        telemetry.watch_feedback(feedback)
    binding = loaded.binding
    fetcher = FeatureFetcher(reader, registry, cache, io, (binding.user_columns, binding.item_columns))
    state: dict[str, RankingEngine] = {}

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        batcher: MicroBatcher[Job, npt.NDArray[np.float32]] | None = None
        if loaded.neural is not None:
            b = config.batcher
            batcher = MicroBatcher(
                loaded.neural.score_batch,
                max_delay_s=b.max_delay_ms / 1000.0,
                max_batch_rows=b.rows_for(loaded.device),
                max_queue_requests=b.max_queue_requests,
                retry_after_s=b.retry_after_s,
                on_batch=telemetry.observe_batch,
            )
            telemetry.watch_queues(batcher.depth)
            batcher.start()
        state["engine"] = app.state.engine = RankingEngine(
            config, registry, fetcher, reader, loaded.models(), batcher, telemetry, io
        )
        if feedback is not None:
            feedback.start()
        try:
            yield
        finally:
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

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        model = FeedbackRequest if request.url.path == "/v1/feedback" else RankRequest
        errors = readable_errors(exc.errors(), tuple(model.model_fields))
        telemetry.rejected.labels("invalid").inc()
        detail = "invalid request: " + "; ".join(f"{e['field']}: {e['message']}" for e in errors)
        return FastJSON({"detail": detail, "errors": errors}, status_code=422)

    @app.post(
        "/v1/rank",
        response_model=RankResponse,
        responses={422: {"model": ErrorResponse}, 429: {"model": ErrorResponse}},
    )
    async def rank(body: RankRequest) -> Response:
        """Rank the candidates for the user; degrades through the fallback chain, never a 5xx.

        The returned items go back to Kafka as impressions (unless ``log_impressions`` is false).
        """
        query = RankQuery(body.user_id, body.candidates, body.k, body.priority, body.deadline_ms)
        request_id = new_request_id()
        try:
            ranked = await state["engine"].rank(query)
        except QueueFullError as exc:
            telemetry.rejected.labels("queue_full").inc()
            return FastJSON(
                {"detail": str(exc), "errors": []},
                status_code=429,
                headers={"Retry-After": str(exc.retry_after_s)},
            )
        if feedback is not None and body.log_impressions:
            shown = [item for item, _ in ranked.items]
            feedback.offer(impression_events(request_id, body.user_id, shown, body.session_id, body.device))
        ages = ranked.ages
        return FastJSON(
            {
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
            }
        )

    @app.post(
        "/v1/feedback",
        response_model=FeedbackResponse,
        status_code=202,
        responses={422: {"model": ErrorResponse}},
    )
    async def post_feedback(body: FeedbackRequest) -> Response:
        """Produce a click, like, purchase or dwell to Kafka; never waits for Kafka, never a 5xx."""
        now = now_ms()
        at = body.event_time_ms if body.event_time_ms is not None else now
        problem = _feedback_time_problem(at, now)
        if problem is None:
            event_id = body.event_id or f"fb-{new_request_id()}"
            session = body.session_id or body.request_id or f"fb-{body.user_id}"
            try:
                event = feedback_event(
                    event_id, body.user_id, body.item_id, body.event_type, at, session, body.device,
                    position=body.position, category=body.category, price=body.price, dwell_ms=body.dwell_ms,
                )  # fmt: skip
            except ValueError as exc:
                problem = str(exc)
        if problem is not None:
            telemetry.rejected.labels("invalid").inc()
            return FastJSON({"detail": f"invalid feedback: {problem}", "errors": []}, status_code=422)
        queued = feedback.offer([event]) == 1 if feedback is not None else False
        return FastJSON({"event_id": event_id, "event_time_ms": at, "queued": queued}, status_code=202)

    @app.get("/health", response_model=HealthResponse)
    async def health() -> HealthResponse:
        """Model version, device, GPU memory in use and recent inference p99."""
        versions = loaded.models()
        return HealthResponse(
            status="ok" if versions.neural_version else "degraded",
            model_version=versions.neural_version,
            linear_version=versions.linear_version,
            registry_version=registry.registry_version,
            device=loaded.device,
            gpu_memory_used_percent=gpu_memory_used_percent(loaded.device),
            inference_latency_p99_ms=telemetry.inference_p99_ms(),
            feedback=_feedback_stats(feedback),
        )

    @app.get("/metrics", response_class=Response)
    async def metrics() -> Response:
        """Prometheus metrics."""
        # Off the event loop: the freshness collector reads Redis at scrape time.
        body = await asyncio.to_thread(generate_latest, telemetry.registry)
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    app.add_middleware(BodyLimit, limit=config.max_body_bytes)
    return app


def _feedback_time_problem(at_ms: int, now: int) -> str | None:
    """Return what is wrong with a feedback event time, or None (the tiers DLQ late events)."""
    if at_ms < now - MAX_FEEDBACK_AGE_S * 1000:
        return (
            f"event_time_ms: {at_ms} is {(now - at_ms) / 1000:.1f} s old; at most {MAX_FEEDBACK_AGE_S:g} s"
            " (omit it to use the time of the post)"
        )
    if at_ms > now + MAX_FEEDBACK_SKEW_S * 1000:
        return (
            f"event_time_ms: {at_ms} is {(at_ms - now) / 1000:.1f} s in the future; at most"
            f" {MAX_FEEDBACK_SKEW_S:g} s (check the client's clock)"
        )
    return None


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
