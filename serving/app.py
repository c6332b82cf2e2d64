"""The ranking service's HTTP API (FastAPI): ``/v1/rank``, ``/health``, ``/metrics``, ``/openapi.json``."""

from __future__ import annotations

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
from headwater.serving.fetch import FeatureFetcher, ItemVectorCache
from headwater.serving.model import gpu_memory_used_percent
from headwater.serving.runtime import LoadedModels
from headwater.serving.schemas import (
    ErrorResponse,
    HealthResponse,
    RankRequest,
    RankResponse,
    readable_errors,
)
from headwater.serving.store import FeatureReader
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


def create_app(config: ServingConfig, reader: FeatureReader, loaded: LoadedModels) -> FastAPI:
    """Build the app; the batcher and the engine start with the app's lifespan."""
    telemetry = Telemetry()
    io = ThreadPoolExecutor(max_workers=config.io_threads, thread_name_prefix="headwater-io")
    cache = ItemVectorCache(
        config.item_cache_entries, config.item_cache_ttl_s, len(config.item_view.features)
    )
    telemetry.watch_cache(lambda: cache.hits, lambda: cache.misses)
    fetcher = FeatureFetcher(reader, config.user_view, config.item_view, cache, io)
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
            config, fetcher, reader, loaded.models(), batcher, telemetry, io
        )
        try:
            yield
        finally:
            if batcher is not None:
                await batcher.stop()
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
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = readable_errors(exc.errors())
        telemetry.rejected.labels("invalid").inc()
        detail = "invalid request: " + "; ".join(f"{e['field']}: {e['message']}" for e in errors)
        return FastJSON({"detail": detail, "errors": errors}, status_code=422)

    @app.post(
        "/v1/rank",
        response_model=RankResponse,
        responses={422: {"model": ErrorResponse}, 429: {"model": ErrorResponse}},
    )
    async def rank(body: RankRequest) -> Response:
        """Rank the candidates for the user; degrades through the fallback chain, never a 5xx."""
        query = RankQuery(body.user_id, body.candidates, body.k, body.priority, body.deadline_ms)
        try:
            ranked = await state["engine"].rank(query)
        except QueueFullError as exc:
            telemetry.rejected.labels("queue_full").inc()
            return FastJSON(
                {"detail": str(exc), "errors": []},
                status_code=429,
                headers={"Retry-After": str(exc.retry_after_s)},
            )
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
            }
        )

    @app.get("/health", response_model=HealthResponse)
    async def health() -> HealthResponse:
        """Model version, device, GPU memory in use and recent inference p99."""
        versions = loaded.models()
        return HealthResponse(
            status="ok" if versions.neural_version else "degraded",
            model_version=versions.neural_version,
            linear_version=versions.linear_version,
            registry_version=config.item_view.version,
            device=loaded.device,
            gpu_memory_used_percent=gpu_memory_used_percent(loaded.device),
            inference_latency_p99_ms=telemetry.inference_p99_ms(),
        )

    @app.get("/metrics", response_class=Response)
    async def metrics() -> Response:
        """Prometheus metrics."""
        return Response(generate_latest(telemetry.registry), media_type=CONTENT_TYPE_LATEST)

    app.add_middleware(BodyLimit, limit=config.max_body_bytes)
    return app
