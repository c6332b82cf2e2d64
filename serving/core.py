"""The ranking service's protocol-neutral core: rank, recommend, feedback and health as async methods.

:class:`RankingService` holds what a request needs (the engine and the experiment's arms, admission,
the funnel, the feedback producer, the recorder, the prediction log, the business metrics; built by
:meth:`ServiceParts.build`) and answers typed requests (:mod:`headwater.serving.schemas`) with typed
answers. It knows no protocol: the REST adapter (:mod:`headwater.serving.rest`) and the gRPC adapter
(:mod:`headwater.serving.grpc_server`) validate, call it and serialise, and each maps the refusals
the core raises (:data:`REFUSALS`) to its protocol's status in one place. Its :meth:`start` and
:meth:`stop` are the service's lifespan: the batcher, the engine, the feedback producer and
:attr:`RankingService.servers` (the arms, the recorder, the funnel, another protocol's server).

The answers are TypedDicts (:class:`~headwater.serving.schemas.RankAnswer` and the others): plain
dicts at run time, written by orjson as they are, so the hot path validates nothing twice.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

import numpy as np
import numpy.typing as npt
from prometheus_client import generate_latest

from headwater.ranking.features import BoundRegistry
from headwater.ranking.model import gpu_memory_used_percent
from headwater.registry.errors import HeadwaterError
from headwater.serving.admission import Admission, Admitted, Throttled
from headwater.serving.auth import Authenticator, Identity
from headwater.serving.batcher import MicroBatcher, QueueFullError
from headwater.serving.business import BusinessMetrics
from headwater.serving.config import ServingConfig
from headwater.serving.engine import NO_AGES, Job, Models, Ranked, RankingEngine, RankQuery
from headwater.serving.experiments import ArmEngines, with_arm
from headwater.serving.feedback import (
    FeedbackProducer,
    FeedbackRefused,
    IdempotencyKeys,
    check_feedback,
    impressions,
    new_request_id,
)
from headwater.serving.fetch import FeatureFetcher, ItemVectorCache
from headwater.serving.funnel.stages import Funnel, FunnelMetrics, FunnelParts, RecommendQuery
from headwater.serving.impressions import ImpressionLedger
from headwater.serving.item_mirror import ItemMirror
from headwater.serving.recording import Recorder
from headwater.serving.runtime import LoadedModels
from headwater.serving.schemas import (
    FeedbackAnswer,
    FeedbackRequest,
    FeedbackStats,
    HealthResponse,
    IndexSnapshotStats,
    ItemMirrorStats,
    RankAnswer,
    RankRequest,
    RecommendAnswer,
    RecommendRequest,
    RequestOptions,
    StageAnswer,
)
from headwater.serving.served import FeedbackGate, ItemCatalog, ServedLedger, catalog_prefix, found_items
from headwater.serving.skew import PredictionLog, prediction_record
from headwater.serving.store import FeatureReader, ReadPool, now_ms
from headwater.serving.telemetry import Telemetry

logger = logging.getLogger(__name__)
Batcher = MicroBatcher[Job, npt.NDArray[np.float32]]


class FunnelOff(HeadwaterError, RuntimeError):
    """``recommend`` was called on a service built without a funnel."""


class NotStarted(HeadwaterError, RuntimeError):
    """A request reached the service before :meth:`RankingService.start` (or after its stop)."""


REFUSALS = (Throttled, QueueFullError, FunnelOff, FeedbackRefused)
"""What the core raises to refuse a request; each adapter maps them to its protocol's status."""


class Server(Protocol):
    """Something run with the service's lifespan: the arms, the recorder, the funnel, a gRPC server."""

    async def start(self) -> None:
        """Start it (the service's engine exists by then)."""
        ...

    async def stop(self) -> None:
        """Stop it (before the engine)."""
        ...


class Engines:
    """Builds ranking engines and their micro-batchers over one store, item cache and read pool."""

    def __init__(
        self,
        config: ServingConfig,
        registry: BoundRegistry,
        reader: FeatureReader,
        cache: ItemVectorCache,
        io: ReadPool,
        telemetry: Telemetry,
        mirror: ItemMirror | None,
    ) -> None:
        self.config, self.registry, self.reader = config, registry, reader
        self.cache, self.io, self.telemetry, self.mirror = cache, io, telemetry, mirror

    def fetcher(self, models: LoadedModels) -> FeatureFetcher:
        """Return a feature fetcher with ``models``' column binding."""
        b = models.binding
        columns = (b.user_columns, b.item_columns)
        return FeatureFetcher(self.reader, self.registry, self.cache, self.io, columns, self.mirror)

    def batcher(self, models: LoadedModels) -> Batcher | None:
        """Return a started micro-batcher of ``models``' neural scorer (None without one)."""
        if models.neural is None:
            return None
        b = self.config.batcher
        batcher = MicroBatcher(
            models.neural.score_batch,
            max_delay_s=b.max_delay_ms / 1000.0,
            max_batch_rows=b.rows_for(models.device),
            max_queue_requests=b.max_queue_requests,
            retry_after_s=b.retry_after_s,
            on_batch=self.telemetry.observe_batch,
        )
        batcher.start()
        return batcher

    def engine(self, fetcher: FeatureFetcher, scorers: Models, batcher: Batcher | None) -> RankingEngine:
        """Return an engine over ``fetcher`` scoring with ``scorers`` (through ``batcher``)."""
        c, r = self.config, self.registry
        return RankingEngine(c, r, fetcher, self.reader, scorers, batcher, self.telemetry, self.io)

    def arm(self, models: LoadedModels, scorers: Models) -> tuple[RankingEngine, Batcher | None]:
        """Return an experiment arm's engine (its model's column binding and batcher, the shared store)."""
        batcher = self.batcher(models) if scorers.neural_version else None
        return self.engine(self.fetcher(models), scorers, batcher), batcher


def model_drift(loaded: Sequence[LoadedModels]) -> dict[str, tuple[str, ...]]:
    """Per model version of ``loaded`` (the main models and each arm's), the views it reads drifted."""
    out: dict[str, tuple[str, ...]] = {}
    for models in loaded:
        for artifact in (models.neural_artifact, models.linear_artifact):
            if artifact is not None:
                out[artifact.version] = tuple(models.binding.changed_views)
    return out


@dataclass(frozen=True)
class ServiceParts:
    """What :class:`RankingService` is made of (:meth:`build` makes them from the service's inputs)."""

    config: ServingConfig
    registry: BoundRegistry
    loaded: LoadedModels
    telemetry: Telemetry
    io: ReadPool
    cache: ItemVectorCache
    engines: Engines
    fetcher: FeatureFetcher
    arms: ArmEngines
    admission: Admission
    keys: IdempotencyKeys
    business: BusinessMetrics
    feedback: FeedbackProducer | None = None
    recorder: Recorder | None = None
    predictions: PredictionLog | None = None
    funnel: FunnelParts | None = None
    recommender: Funnel | None = None
    mirror: ItemMirror | None = None
    auth: Authenticator = field(default_factory=lambda: Authenticator(None))
    """Who may call what (serving/auth.py); each adapter asks it before calling the service."""

    @classmethod
    def build(
        cls,
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
    ) -> ServiceParts:
        """Make the parts (the arguments are :func:`~headwater.serving.app.create_app`'s)."""
        telemetry = Telemetry()
        io = ReadPool(config.io_threads, max_reads_in_flight)
        cache = ItemVectorCache(config.item_cache_entries, config.item_cache_ttl_s, registry.item.dim)
        telemetry.watch_cache(lambda: cache.hits, lambda: cache.misses)
        if feedback is not None:
            telemetry.watch_feedback(feedback)
        changed = loaded.binding.changed_views
        telemetry.watch_versions(reader.other_version_rows, list(registry.view_versions), changed)
        telemetry.watch_drift(model_drift([loaded, *(arm_loaded or {}).values()]))
        # The index refresher's copy of the item views' rows, when the funnel keeps one (item_mirror.py).
        mirror = getattr(funnel.runtime, "mirror", None) if funnel is not None else None
        if mirror is not None:
            telemetry.watch_mirror(mirror)
        engines = Engines(config, registry, reader, cache, io, telemetry, mirror)
        admission = Admission(config.admission, telemetry.registry)
        business = BusinessMetrics(telemetry.registry)
        recommender = None
        if funnel is not None:
            recommender = Funnel(
                config.funnel, registry, reader, funnel.recent, io, FunnelMetrics(telemetry.registry),
                funnel.retriever, funnel.reranker, config.editorial_items, funnel.retrieval_version,
            )  # fmt: skip
        arms = ArmEngines(config.experiment, loaded, arm_loaded or {}, engines.arm)
        if recorder is not None:
            recorder.register_metrics(telemetry.registry)
        return cls(
            config, registry, loaded, telemetry, io, cache, engines, engines.fetcher(loaded), arms, admission,
            IdempotencyKeys(), business, feedback, recorder, predictions, funnel, recommender, mirror,
            Authenticator(config.auth, telemetry.registry),
        )  # fmt: skip


class RankingService:
    """The service: rank, recommend, feedback, health and metrics, for any protocol's adapter.

    ``rank`` and ``recommend`` raise :class:`Throttled` (the class is over its quota) or
    :class:`QueueFullError` (the scoring queue is full); ``recommend`` also :class:`FunnelOff`,
    ``feedback`` :class:`FeedbackRefused`. Anything else they raise is a bug.
    """

    def __init__(self, parts: ServiceParts) -> None:
        self.parts = parts
        self.telemetry = parts.telemetry
        self._engine: RankingEngine | None = None
        self._batcher: Batcher | None = None
        edge = parts.config.edge
        self.ledger = ImpressionLedger(edge.request_id_ttl_s, edge.request_id_entries)
        """The callers' request ids answered lately: a retry of one logs its impressions once."""
        trust = parts.config.feedback.trust  # feedback only for items served to the user, in the catalog
        catalog = ItemCatalog(parts.engines.reader, parts.registry.item.layouts, parts.io, parts.mirror)
        self.gate = FeedbackGate(ServedLedger.of(trust), catalog, trust.allow_unsolicited)
        """What each user was served lately, and the checks a feedback post passes (serving/served.py)."""
        self.servers: list[Server] = [parts.arms]  # the experiment's engines: before any other server
        """Run with :meth:`start` and :meth:`stop`, in this order (an adapter adds its server here)."""
        for extra in (parts.recorder, parts.predictions, parts.funnel):  # the funnel: its refresh thread
            if extra is not None:
                self.servers.append(extra)

    @property
    def engine(self) -> RankingEngine:
        """The service's ranking engine (the neural model's, shared by the arms without their own)."""
        if self._engine is None:
            msg = "the ranking service is not started: run its start() (the app's lifespan) first"
            raise NotStarted(msg)
        return self._engine

    async def start(self) -> None:
        """Start the batcher, the engine, the feedback producer, then :attr:`servers` in order."""
        p = self.parts
        self._batcher = p.engines.batcher(p.loaded)
        if self._batcher is not None:
            self.telemetry.watch_queues(self._batcher.depth)
        self._engine = p.engines.engine(p.fetcher, p.loaded.models(), self._batcher)
        if p.feedback is not None:
            p.feedback.start()
        for server in self.servers:
            await server.start()

    async def stop(self) -> None:
        """Stop :attr:`servers` in reverse order, then the batcher, the feedback producer, the reads."""
        p = self.parts
        for server in reversed(self.servers):
            await server.stop()
        if self._batcher is not None:
            await self._batcher.stop()
        if p.feedback is not None:
            await asyncio.to_thread(p.feedback.stop)
        p.io.shutdown(wait=False, cancel_futures=True)

    def count_invalid(self) -> None:
        """Count a request an adapter refused as invalid (its validation, not the core's)."""
        self.telemetry.rejected.labels("invalid").inc()

    def _admit(
        self, body: RequestOptions | None, header_class: str | None, identity: Identity | None
    ) -> Admitted:
        asked = body.priority if body is not None and "priority" in body.model_fields_set else None
        try:
            claimed = body.user_class if body is not None else None
            return self.parts.admission.admit(header_class, claimed, asked, identity)
        except Throttled:
            self.telemetry.rejected.labels("throttled").inc()
            raise

    async def rank(
        self,
        body: RankRequest,
        header_class: str | None = None,
        request_id: str | None = None,
        identity: Identity | None = None,
    ) -> RankAnswer:
        """Rank the candidates: admission, the engine (degrading to the editorial list), the impressions.

        ``header_class``: the protocol's user-class header; ``identity``: the caller's credential
        (the adapter authenticated it), whose class is the request's unless it is a gateway's (then
        the header's) or None (``auth: none``: the header's, else the body's);
        ``request_id``: the caller's id of this logical request (checked by the adapter), the same on
        its retries, whose impressions are logged once (:attr:`ledger`); None: a fresh id.
        """
        p = self.parts
        admitted = self._admit(body, header_class, identity)
        query = RankQuery(body.user_id, body.candidates, body.k, admitted.priority, body.deadline_ms)
        given, request_id = request_id is not None, request_id or new_request_id()
        # Recorded: a sample of what users see (log_impressions); replays and benchmarks send false.
        arrived_ms = now_ms()  # the record's at_ms
        recording = p.recorder is not None and body.log_impressions and p.recorder.sampled()
        routed = p.arms.route(body.user_id, self.engine)
        async with p.admission.slot(admitted):
            ranked = await self._ranked(routed.engine, query)
        answer = rank_answer(ranked, request_id, routed.arm)
        if body.log_impressions:
            known = found_items(body.candidates, ranked.features)  # in an item view: no read at feedback
            self.gate.served(body.user_id, request_id, [item for item, _ in ranked.items], known)
        if body.log_impressions and (not given or self.ledger.first(body.user_id, request_id)):
            self._shown(body, ranked, answer, routed.arm, arrived_ms)
        if recording and p.recorder is not None:
            sent = body.model_dump(mode="json", exclude_unset=True)
            p.recorder.offer(arrived_ms, sent, 200, ranked.latency_ms, answer)
        self._log_prediction(body, ranked, answer, arrived_ms, routed.engine)
        self.telemetry.answered(answer.get("model_version"))
        return answer

    async def _ranked(self, engine: RankingEngine, query: RankQuery) -> Ranked:
        try:
            return await engine.rank(query)
        except QueueFullError:
            self.telemetry.rejected.labels("queue_full").inc()
            raise
        except Exception:
            # The engine catches what each step can raise; this is a bug's net: the request still
            # gets the last step of the chain, the editorial list, and the log has the trace.
            logger.exception("ranking for user %r failed; answering from the editorial list", query.user_id)
            self.telemetry.fallbacks.labels("editorial", "internal_error").inc()
            return _editorial(self.parts.config, query)

    def _shown(
        self, body: RankRequest, ranked: Ranked, answer: RankAnswer, arm: str | None, arrived_ms: int
    ) -> None:
        """Send a rank answer's items back: impressions to Kafka, the seen set, the business metrics."""
        p = self.parts
        shown = [item for item, _ in ranked.items]
        request_id = answer["request_id"]
        logged = catalog_prefix(shown, body.candidates, ranked.features)  # no impression creates an item
        if p.feedback is not None and logged:
            p.feedback.offer(  # one unit per answer: built, validated and encoded by the sender thread
                impressions(request_id, body.user_id, logged, body.session_id, body.device, arm=arm)
            )
        if p.funnel is not None:  # the seen filter of /v1/recommend
            p.funnel.recent.served(body.user_id, shown, arrived_ms)
        p.business.served(request_id, body.session_id, len(ranked.items), answer, arm)

    def _log_prediction(
        self, body: RankRequest, ranked: Ranked, answer: RankAnswer, arrived_ms: int, engine: RankingEngine
    ) -> None:
        log, used = self.parts.predictions, ranked.features
        if log is None or used is None or used.user is None or not log.sampled():
            return
        log.offer(  # with each value's view, version and event time: the value skew's input
            prediction_record(answer["request_id"], arrived_ms, body.user_id, answer, body.candidates,
                              used.user, used.items, used.items_found, used.user_event_ms,
                              engine.registry, used)
        )  # fmt: skip

    async def recommend(
        self,
        body: RecommendRequest,
        header_class: str | None = None,
        request_id: str | None = None,
        identity: Identity | None = None,
    ) -> RecommendAnswer:
        """Recommend k items from the whole catalog: admission, the funnel, the impressions and seen set.

        ``header_class``, ``request_id`` and ``identity`` as :meth:`rank`'s: a retry's impressions are
        logged once.
        """
        p = self.parts
        if p.recommender is None or p.funnel is None:
            msg = "this service runs without the funnel (/v1/recommend); start it with `headwater serve`"
            raise FunnelOff(msg)
        admitted = self._admit(body, header_class, identity)
        given, request_id = request_id is not None, request_id or new_request_id()
        arrived_ms = now_ms()
        query = RecommendQuery(body.user_id, body.k, admitted.priority, body.deadline_ms)
        async with p.admission.slot(admitted):
            try:
                got = await p.recommender.recommend(self.engine, query)
            except QueueFullError:
                self.telemetry.rejected.labels("queue_full").inc()
                raise
        shown = [item for item, _, _ in got.items]
        if body.log_impressions:
            self.gate.served(body.user_id, request_id, shown)
        if body.log_impressions and shown and (not given or self.ledger.first(body.user_id, request_id)):
            p.funnel.recent.served(body.user_id, shown, arrived_ms)
            if p.feedback is not None:
                p.feedback.offer(impressions(request_id, body.user_id, shown, body.session_id, body.device))
        model_version = got.ranked.model_version if got.ranked is not None else None
        self.telemetry.answered(model_version)
        return {
            "items": [{"item_id": i, "score": s, "category": c} for i, s, c in got.items],
            "stages": [cast(StageAnswer, stage.as_dict()) for stage in got.stages],
            "fallback": any(stage.fallback is not None for stage in got.stages),
            "model_version": model_version,
            "reranker_version": got.reranker_version,
            "retrieval_version": got.retrieval_version,
            "latency_ms": got.latency_ms,
            "request_id": request_id,
        }

    async def feedback(
        self,
        body: FeedbackRequest,
        idempotency_key: str | None = None,
        unsolicited_allowed: bool = False,
        identity: Identity | None = None,
    ) -> FeedbackAnswer:
        """Produce a click, like, purchase or dwell to Kafka; never waits for Kafka.

        ``idempotency_key``: the protocol's key (a header), the same as the body's field. A retry with
        the same key produces the same event (``headwater.serving.feedback``). Raises
        :class:`FeedbackRefused` for a post that cannot be accepted, :class:`FeedbackUntrusted` (409)
        for an item not served to the user (unless ``unsolicited_allowed`` or ``identity`` has the
        ``unsolicited`` role: the caller may post events for items it was not served) or not in the
        catalog (:attr:`gate`);
        :class:`Throttled` when ``identity`` (the caller's credential) or, with admission on, its
        class is over its quota.
        """
        p = self.parts
        self._admit(None, None, identity)  # the credential's quota (and its class's): Throttled, 429
        try:
            checked = check_feedback(body, idempotency_key, p.keys, now_ms())
            allowed = unsolicited_allowed or (identity is not None and "unsolicited" in identity.roles)
            await self.gate.check(body.user_id, body.item_id, body.request_id, allowed)
            got = checked.accept()
        except FeedbackRefused:
            self.count_invalid()
            raise
        arm = p.arms.arm_of(body.user_id)
        queued = False
        if p.feedback is not None and got.send:
            queued = p.feedback.offer(with_arm([got.event], arm)) == 1
        if body.event_type == "click" and not got.replayed:
            p.business.clicked(body.request_id, body.session_id, arm)
            if p.funnel is not None:  # the re-ranker's sequence and the popularity fallback
                p.funnel.recent.clicked(body.user_id, body.item_id, got.event["event_time"])
        event = got.event
        return {"event_id": event["event_id"], "event_time_ms": event["event_time"], "queued": queued,
                "replayed": got.replayed}  # fmt: skip

    async def health(self) -> HealthResponse:
        """Model version, device, GPU memory in use, recent inference p99, the funnel's runtimes."""
        p = self.parts
        loaded, funnel = p.loaded, p.funnel
        versions = loaded.models()
        retriever = funnel.retriever if funnel is not None else None
        return HealthResponse(
            status="ok" if versions.neural_version else "degraded",
            model_version=versions.neural_version,
            linear_version=versions.linear_version,
            registry_version=p.registry.registry_version,
            view_versions_changed=list(loaded.binding.changed_views),
            device=loaded.device,
            ranker_runtime_failures=int(getattr(loaded.neural, "onnx_failures", 0)),
            gpu_memory_used_percent=gpu_memory_used_percent(loaded.device),
            inference_latency_p99_ms=self.telemetry.inference_p99_ms(),
            feedback=_feedback_stats(p.feedback),
            retrieval_runtime_failures=int(getattr(retriever, "onnx_failures", 0)),
            item_mirror=_mirror_stats(p.mirror, p.registry),
            index_snapshot=_snapshot_stats(funnel.runtime if funnel is not None else None),
            **runtimes(loaded, funnel),
        )

    async def metrics(self) -> bytes:
        """Return the Prometheus text of the service's metrics (collected off the event loop)."""
        # Off the event loop: the freshness collector reads Redis at scrape time.
        return await asyncio.to_thread(generate_latest, self.telemetry.registry)


def rank_answer(ranked: Ranked, request_id: str, arm: str | None) -> RankAnswer:
    """Return the answer of one ranking."""
    ages = ranked.ages
    return {
        "items": [{"item_id": i, "score": s} for i, s in ranked.items],
        "model_version": ranked.model_version,
        "fallback": ranked.fallback,
        "fallback_reason": ranked.fallback_reason,
        "feature_ages_s": {"user": ages.user, "items_p50": ages.items_p50, "items_max": ages.items_max},
        "latency_ms": ranked.latency_ms,
        "request_id": request_id,
        "user_feature_event_ms": ranked.user_event_ms,
        "arm": arm,
    }


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


def _editorial(config: ServingConfig, query: RankQuery) -> Ranked:
    """Return the editorial answer (the chain's last step) for a request whose ranking raised."""
    wanted = set(query.candidates)
    first = [i for i in config.editorial_items if i in wanted]
    chosen = set(first)
    ordered = first + [c for c in query.candidates if c not in chosen]
    items = [(item, round(1.0 / (1 + rank), 6)) for rank, item in enumerate(ordered[: query.k])]
    return Ranked(items, None, "editorial", "internal_error", NO_AGES, 0.0, {})


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
