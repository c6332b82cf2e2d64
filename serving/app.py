"""The ranking service's composition: :func:`create_app` wires the parts, the core and the REST adapter.

The parts (:meth:`~headwater.serving.core.ServiceParts.build`) make the protocol-neutral core
(:class:`~headwater.serving.core.RankingService`); the REST adapter (:mod:`headwater.serving.rest`)
serves it over HTTP, and ``app.state.service`` is where another protocol's adapter finds it
(:meth:`headwater.serving.grpc_server.GrpcEdge.for_app`).
"""

from __future__ import annotations

from collections.abc import Mapping

from fastapi import FastAPI

from headwater.ranking.features import BoundRegistry
from headwater.serving.config import ServingConfig
from headwater.serving.core import RankingService, ServiceParts
from headwater.serving.core import runtimes as runtimes  # the start-up line of `headwater serve`
from headwater.serving.feedback import FeedbackProducer
from headwater.serving.funnel.stages import FunnelParts
from headwater.serving.recording import Recorder
from headwater.serving.rest import rest_app
from headwater.serving.runtime import LoadedModels
from headwater.serving.skew import PredictionLog
from headwater.serving.store import FeatureReader


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
    ``funnel``: the retriever, re-ranker and recent-items memory of ``/v1/recommend`` (None: 404 there);
    ``fast_routes``: serve valid ``/v1/rank`` and ``/v1/recommend`` requests through
    :class:`~headwater.serving.rest.FastRoutes` (False: every request through FastAPI, the same answers).
    """
    parts = ServiceParts.build(
        config, registry, reader, loaded, feedback, max_reads_in_flight, arm_loaded, recorder, predictions,
        funnel,
    )  # fmt: skip
    service = RankingService(parts)
    app = rest_app(service, config.max_body_bytes, fast_routes, config.edge.body_timeout_s)
    # What tests, the CLI and benchmarks read (the engine itself: app.state.engine, set at start).
    app.state.telemetry = parts.telemetry
    app.state.cache = parts.cache
    app.state.reads = parts.io
    app.state.admission = parts.admission
    app.state.business = parts.business
    app.state.servers = service.servers
    """Objects with ``async start()`` / ``async stop()`` run with the app's lifespan (the gRPC server)."""
    return app
