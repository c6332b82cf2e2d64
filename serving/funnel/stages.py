"""The funnel of ``POST /v1/recommend``: retrieve -> seen filter -> rank -> re-rank -> rules.

Each stage is timed and reports the candidates it passes on; each has a fallback, flagged in the
answer (``stages[i].fallback`` and ``fallback_reason``) and counted in ``/metrics``:

========== ================================================= =========================================
stage      does                                              falls back to (reason)
========== ================================================= =========================================
retrieve   two-tower + ANN index over the whole catalog,     the most clicked items (``popularity``),
           ``retrieve_n`` + the user's seen count            else the editorial list (``editorial``):
                                                             ``no_retriever``, ``missing_user_features``,
                                                             ``retrieval_error``, ``store_error``
seen       drops items served to the user within             ``kept_all`` (``store_error``: the
           ``seen_window_s`` (:mod:`.recent`)                recent set could not be read)
rank       the ranking engine of ``/v1/rank`` (DCN through   the engine's own chain: ``linear``,
           its micro-batcher), keeps ``rank_keep``            ``popularity``, ``editorial``
rerank     attention over recent clicks on the top           the DCN's order (``no_reranker``,
           ``rerank_top`` (headwater.ranking.reranker)       ``no_model_scores``, ``reranker_error``)
rules      diversity by category, editorial pins             order kept, pins still placed
                                                             (``store_error``: no categories)
========== ================================================= =========================================

The recent-impressions and clicks memory, the catalog's categories and the popularity fallback
come from a :class:`~headwater.serving.funnel.recent.RecentItems`; the user's vector from the
online store (the registry's user views, the retriever's input).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
from prometheus_client import CollectorRegistry, Counter, Histogram

from headwater.ranking.features import BoundRegistry
from headwater.ranking.reranker import Reranker
from headwater.serving.engine import Ranked, RankingEngine, RankQuery
from headwater.serving.fetch import RequestFeatures, assemble
from headwater.serving.funnel.config import FunnelConfig
from headwater.serving.funnel.recent import Recent, RecentItems
from headwater.serving.funnel.rules import RulesOutcome, apply_rules
from headwater.serving.retrieval.retriever import Retriever
from headwater.serving.store import FeatureReader, ViewRows, now_ms
from headwater.serving.telemetry import LATENCY_BUCKETS, ROW_BUCKETS

log = logging.getLogger(__name__)
STAGES = ("retrieve", "seen", "rank", "rerank", "rules")
RULES_HEAD_PER_K = 3
"""The rules read categories for the first ``3 * k`` ranked items, more only if diversity relaxed its cap."""
_NO_RECENT = Recent(frozenset(), ())


class FunnelMetrics:
    """Per-stage latency and candidate histograms, fallbacks by stage and reason, end-to-end latency."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.stage_seconds = Histogram(
            "headwater_funnel_stage_seconds", "Duration of one /v1/recommend stage.", ["stage"],
            buckets=LATENCY_BUCKETS, registry=registry,
        )  # fmt: skip
        self.stage_candidates = Histogram(
            "headwater_funnel_stage_candidates", "Candidates a /v1/recommend stage passed on.", ["stage"],
            buckets=(0, *ROW_BUCKETS), registry=registry,
        )  # fmt: skip
        self.fallbacks = Counter(
            "headwater_funnel_fallbacks_total", "/v1/recommend stages that fell back, by reason.",
            ["stage", "reason"], registry=registry,
        )  # fmt: skip
        self.latency = Histogram(
            "headwater_recommend_latency_seconds", "End-to-end /v1/recommend latency in the service.",
            buckets=LATENCY_BUCKETS, registry=registry,
        )  # fmt: skip


@dataclass(frozen=True)
class RecommendQuery:
    """A validated recommendation request."""

    user_id: str
    k: int
    priority: str = "normal"
    deadline_ms: float | None = None


@dataclass
class StageReport:
    """One stage of one request: time, candidates passed on, fallback and its reason."""

    stage: str
    ms: float
    candidates: int
    fallback: str | None = None
    fallback_reason: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """JSON form."""
        return {"stage": self.stage, "ms": round(self.ms, 3), "candidates": self.candidates,
                "fallback": self.fallback, "fallback_reason": self.fallback_reason}  # fmt: skip


@dataclass(frozen=True)
class Recommended:
    """The final items (id, score or None for a pin the models never scored, category) and the stages."""

    items: list[tuple[str, float | None, str | None]]
    stages: list[StageReport]
    ranked: Ranked | None
    latency_ms: float
    reranker_version: str | None
    retrieval_version: str | None


@dataclass
class FunnelParts:
    """What ``create_app`` builds the funnel from; started and stopped with the app's lifespan."""

    recent: RecentItems
    retriever: Retriever | None = None
    reranker: Reranker | None = None
    runtime: Any = None
    """A :class:`~headwater.serving.retrieval.runtime.RetrievalRuntime` (its refresh thread), or None."""
    refresh_s: float = 30.0
    full_scan_s: float | None = None
    """A refresh at least this often, changed or not (None: at every look)."""
    feed_s: float | None = None
    """Read the item views' change feeds this often between looks (None: no feed reads)."""

    def retrieval_version(self) -> str | None:
        """Return the index version (``<model>.<refresh>``), or None without retrieval."""
        return str(self.runtime.version) if self.runtime is not None else None

    async def start(self) -> None:
        """Warm the re-ranker on the loop's thread; start the recent-items writer and the index refresh."""
        warm = getattr(self.reranker, "warm", None)
        if warm is not None:
            warm()
        start = getattr(self.recent, "start", None)
        if start is not None:
            start()
        if self.runtime is not None:
            self.runtime.start(self.refresh_s, self.full_scan_s, self.feed_s)

    async def stop(self) -> None:
        """Stop them (the writer writes what it holds first)."""
        if self.runtime is not None:
            await asyncio.to_thread(self.runtime.stop)
        stop = getattr(self.recent, "stop", None)
        if stop is not None:
            await asyncio.to_thread(stop)


class Funnel:
    """Runs the stages for one request at a time (many concurrently on the service's loop)."""

    def __init__(
        self,
        config: FunnelConfig,
        registry: BoundRegistry,
        reader: FeatureReader,
        recent: RecentItems,
        io: Executor,
        metrics: FunnelMetrics,
        retriever: Retriever | None = None,
        reranker: Reranker | None = None,
        editorial: Sequence[str] = (),
        retrieval_version: Callable[[], str | None] | None = None,
    ) -> None:
        self.config = config
        self.registry = registry
        self.reader = reader
        self.recent = recent
        self.io = io
        self.metrics = metrics
        self.retriever = retriever
        self.reranker = reranker
        self.editorial = tuple(editorial)
        self._retrieval_version = retrieval_version

    # The context, in one hop to an I/O thread: the user's rows of every user view (the retriever's
    # input, then handed to the engine so the rank stage does not read them again) and the user's
    # recent items. Each read's failure is returned, not raised: the stages fall back separately.
    def _context(self, user_id: str, at_ms: int) -> tuple[list[ViewRows] | Exception, Recent | Exception]:
        side = self.registry.user
        rows: list[ViewRows] | Exception
        recent: Recent | Exception
        try:
            rows = self.reader.read_many([(lay, [user_id]) for lay in side.layouts])
        except Exception as exc:
            rows = exc
        try:
            recent = self.recent.read(user_id, at_ms)
        except Exception as exc:
            recent = exc
        return rows, recent

    async def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.io, fn, *args)

    async def recommend(self, engine: RankingEngine, query: RecommendQuery) -> Recommended:
        """Run the funnel for ``query`` with ``engine`` (the /v1/rank engine: DCN, batcher, fallbacks).

        Never raises for a stage's failure (each falls back); ``QueueFullError`` from the engine is
        passed on (the caller answers 429), as for ``/v1/rank``. Each stage appends its report.
        """
        started = time.perf_counter()
        stages: list[StageReport] = []
        # 1. retrieve (with the context reads it needs)
        ids, user_rows, recent, seen_reason = await self._retrieve(query, stages)
        # 2. drop what the user was shown within the window
        t0 = time.perf_counter()
        fresh = [i for i in ids if i not in recent.seen][: self.config.retrieve_n]
        stages.append(self._stage("seen", t0, len(fresh), "kept_all" if seen_reason else None, seen_reason))
        # 3. rank with the engine (and read the click vectors for the re-ranker meanwhile)
        ranked, clicks = await self._rank(engine, query, fresh, recent, user_rows, started, stages)
        order = [i for i, _ in ranked.items] if ranked else []
        scores: dict[str, float] = dict(ranked.items) if ranked else {}
        # 4. re-rank the top with the sequence model
        order = self._rerank_top(query, ranked, fresh, order, scores, clicks, stages)
        # 5. business rules
        outcome, category = await self._rules(query, order, stages)

        latency = time.perf_counter() - started
        self.metrics.latency.observe(latency)
        items = [(i, scores.get(i), category.get(i)) for i in outcome.items]
        version = self._retrieval_version() if self._retrieval_version else None
        rerank_version = self.reranker.version if self.reranker is not None else None
        return Recommended(items, stages, ranked, round(latency * 1000.0, 3), rerank_version, version)

    async def _retrieve(
        self, query: RecommendQuery, stages: list[StageReport]
    ) -> tuple[list[str], list[ViewRows] | None, Recent, str | None]:
        """Stage 1: the user's context, then candidates (popularity, then editorial, when it fails).

        Returns the candidate ids, the user's rows (None when unread), the recent items and the seen
        stage's reason (``store_error`` when the recent items could not be read).
        """
        t0 = time.perf_counter()
        user_vec: npt.NDArray[np.float32] | None = None
        user_rows: list[ViewRows] | None = None
        reason: str | None = None
        seen_reason = None
        try:
            got_rows, got_recent = await self._call(self._context, query.user_id, now_ms())
        except Exception as exc:  # the I/O pool refused the read (too many in flight)
            got_rows = got_recent = exc
        if isinstance(got_rows, Exception):
            log.warning("user vector read for %r failed: %s", query.user_id, got_rows)
            reason = "store_error"
        else:
            user_rows = got_rows
            matrix, found, _ = assemble(self.registry.user, got_rows)
            user_vec = matrix[0] if bool(found[0]) else None
        if isinstance(got_recent, Exception):
            log.warning("recent items of %r could not be read: %s", query.user_id, got_recent)
            recent, seen_reason = _NO_RECENT, "store_error"
        else:
            recent = got_recent
        want = self.config.retrieve_n + len(recent.seen)
        ids: list[str] = []
        if reason is None:
            ids, reason = await self._retrieved(query.user_id, user_vec, want)
        fallback = None
        if reason is not None:
            fallback, ids = await self._fallback_candidates(want)
        stages.append(self._stage("retrieve", t0, len(ids), fallback, reason))
        return ids, user_rows, recent, seen_reason

    async def _retrieved(
        self, user_id: str, user_vec: npt.NDArray[np.float32] | None, want: int
    ) -> tuple[list[str], str | None]:
        """Return the retriever's ids for the user, or none and the reason it could not answer."""
        if self.retriever is None:
            return [], "no_retriever"
        if user_vec is None:
            return [], "missing_user_features"
        try:
            return (await self._call(self.retriever.retrieve, user_vec, want))[0], None
        except Exception:
            log.exception("retrieval for %r failed; popularity candidates instead", user_id)
            return [], "retrieval_error"

    async def _fallback_candidates(self, want: int) -> tuple[str, list[str]]:
        """Return the fallback that answered (popularity, else editorial) and its ids."""
        ids: list[str] = []
        try:
            ids = await self._call(self.recent.popular, want)
        except Exception as exc:
            log.warning("popular items could not be read: %s", exc)
        if not ids:
            return "editorial", list(self.editorial)
        return "popularity", ids

    async def _rank(
        self,
        engine: RankingEngine,
        query: RecommendQuery,
        fresh: list[str],
        recent: Recent,
        user_rows: list[ViewRows] | None,
        started: float,
        stages: list[StageReport],
    ) -> tuple[Ranked | None, RequestFeatures | None]:
        """Stage 3: rank ``fresh`` with the engine; the click vectors are read meanwhile."""
        cfg = self.config
        t0 = time.perf_counter()
        ranked: Ranked | None = None
        clicks: RequestFeatures | None = None
        if fresh:
            keep = min(len(fresh), max(cfg.rank_keep, query.k))
            left_ms = (query.deadline_ms or engine.config.default_deadline_ms) - (t0 - started) * 1000.0
            rank_query = RankQuery(query.user_id, fresh, keep, query.priority, max(left_ms, 1.0), user_rows)
            want_clicks = self.reranker is not None and cfg.rerank_top > 0 and bool(recent.clicks)
            click_ids = list(reversed(recent.clicks))  # oldest first, as in training
            if want_clicks:
                click_task = asyncio.ensure_future(
                    engine.fetcher.fetch(query.user_id, click_ids, max(left_ms, 1.0) / 1000.0, user_rows)
                )
            try:
                ranked = await engine.rank(rank_query)
            except BaseException:  # a full queue (429) or a cancelled request: no read left behind
                if want_clicks:
                    click_task.cancel()
                raise
            if want_clicks:
                try:
                    clicks = await click_task
                except Exception as exc:
                    log.warning("click vectors of %r could not be read: %s", query.user_id, exc)
        candidates = len(ranked.items) if ranked else 0
        stages.append(
            self._stage("rank", t0, candidates, ranked.fallback if ranked else "editorial",
                        ranked.fallback_reason if ranked else ("no_candidates" if not fresh else None))
        )  # fmt: skip
        return ranked, clicks

    def _rerank_top(
        self,
        query: RecommendQuery,
        ranked: Ranked | None,
        fresh: list[str],
        order: list[str],
        scores: dict[str, float],
        clicks: RequestFeatures | None,
        stages: list[StageReport],
    ) -> list[str]:
        """Stage 4: re-order the top of ``order`` (``scores`` updated in place); return the new order."""
        t0 = time.perf_counter()
        top = order[: self.config.rerank_top]
        why = None
        if self.config.rerank_top == 0:
            why = "off"
        elif self.reranker is None:
            why = "no_reranker"
        elif ranked is None or ranked.features is None or ranked.fallback is not None:
            why = "no_model_scores"
        elif top:
            try:
                # On the loop: a forward over 50 rows is ~0.2 ms, less than a hop to a thread (and a
                # thread's first torch call pays a one-off set-up of seconds: measured 6.4 s under load).
                new = self._rerank(ranked.features, fresh, top, scores, clicks)
                order = [top[j] for j in np.argsort(-new, kind="stable").tolist()] + order[len(top) :]
                scores.update(zip(top, new.tolist(), strict=True))
            except Exception:
                log.exception("the re-ranker failed for %r; keeping the DCN's order", query.user_id)
                why = "reranker_error"
        stages.append(self._stage("rerank", t0, len(top), "dcn_order" if why else None, why))
        return order

    async def _rules(
        self, query: RecommendQuery, order: list[str], stages: list[StageReport]
    ) -> tuple[RulesOutcome, dict[str, str | None]]:
        """Stage 5: the business rules over a head of the order; returns their outcome and categories.

        Diversity takes k items from the first few dozen; only when it had to relax the cap is the
        next part read (the answer is the same as over the whole order, for a fraction of the
        category reads).
        """
        t0 = time.perf_counter()
        why = None
        pins = self.config.pins
        category: dict[str, str | None] = {}
        head = RULES_HEAD_PER_K * query.k
        while True:
            part = order[:head]
            wanted = list(dict.fromkeys(i for i in (*part, *pins) if i not in category))
            try:
                cats = self.recent.cached_categories(wanted)  # on the loop: no I/O
                if cats is None:
                    cats = await self._call(self.recent.categories, wanted)
            except Exception as exc:
                log.warning("categories could not be read: %s", exc)
                cats, why = [None] * len(wanted), "store_error"
            category.update(zip(wanted, cats, strict=True))
            outcome = apply_rules(
                part, [category[i] for i in part], query.k, self.config.max_per_category, pins
            )
            short = outcome.relaxed > 0 or len(outcome.items) < query.k  # the cap met, or too few
            if not short or head >= len(order) or why:
                break
            head *= 4
        stages.append(self._stage("rules", t0, len(outcome.items), "no_diversity" if why else None, why))
        return outcome, category

    def _rerank(
        self,
        feats: RequestFeatures,
        candidates: Sequence[str],
        top: Sequence[str],
        scores: dict[str, float],
        clicks: RequestFeatures | None,
    ) -> npt.NDArray[np.float32]:
        assert self.reranker is not None  # checked by the caller
        row = {c: j for j, c in enumerate(candidates)}
        items = feats.items[[row[i] for i in top]]
        base = np.asarray([scores[i] for i in top], dtype=np.float32)
        seq = (
            clicks.items[clicks.items_found]
            if clicks is not None
            else np.zeros((0, items.shape[1]), np.float32)
        )
        out = self.reranker.score(items, base, seq)
        if not np.isfinite(out).all():
            msg = "the re-ranker produced non-finite scores"
            raise FloatingPointError(msg)
        return out

    def _stage(
        self, stage: str, t0: float, candidates: int, fallback: str | None, reason: str | None
    ) -> StageReport:
        seconds = time.perf_counter() - t0
        self.metrics.stage_seconds.labels(stage).observe(seconds)
        self.metrics.stage_candidates.labels(stage).observe(candidates)
        if fallback is not None:
            self.metrics.fallbacks.labels(stage, reason or "unknown").inc()
        return StageReport(stage, seconds * 1000.0, candidates, fallback, reason)
