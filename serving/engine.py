"""One ranking request end to end, with the fallback chain neural -> linear -> popularity -> editorial.

Each step says what it needs; the first step whose needs are met and that succeeds answers:

1. ``neural`` (fallback null): the user's vector, item vectors for enough candidates, a loaded
   DCN model, and an answer from the micro-batcher before the deadline (less a reserve kept
   for the fallbacks).
2. ``linear``: the same vectors and the logistic-regression model (numpy, microseconds).
3. ``popularity``: the candidates' popularity slot (config ``popularity``, an item view's slot).
4. ``editorial``: always; the configured editorial items first, then the candidates as given.

What sends a request down the chain is reported as ``fallback_reason``: ``no_model``,
``missing_user_features``, ``missing_item_features``, ``store_error``, ``deadline``,
``model_error``, ``no_popularity``. A full batcher queue is not a fallback: the caller gets
:class:`QueueFullError` (429), before any store read when the queue is already full.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from headwater.ranking.features import BoundRegistry
from headwater.ranking.model import LinearRanker
from headwater.serving.batcher import DeadlineExceededError, MicroBatcher, QueueFullError
from headwater.serving.config import ServingConfig
from headwater.serving.fetch import FeatureAges, FeatureFetcher, RequestFeatures
from headwater.serving.store import FeatureReader, FeatureReadError, ViewRows, now_ms
from headwater.serving.telemetry import Telemetry

logger = logging.getLogger(__name__)
Job = tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]
NO_AGES = FeatureAges(None, None, None)


@dataclass(frozen=True)
class RankQuery:
    """A validated ranking request."""

    user_id: str
    candidates: Sequence[str]
    k: int
    priority: str = "normal"
    deadline_ms: float | None = None
    user_rows: Sequence[ViewRows] | None = None
    """The user's rows of every user view when the caller already read them (the funnel): not read again."""


@dataclass(frozen=True)
class Ranked:
    """The answer: top-k items with scores, who scored them and how old the features were."""

    items: list[tuple[str, float]]
    model_version: str | None
    fallback: str | None
    fallback_reason: str | None
    ages: FeatureAges
    latency_ms: float
    user_event_ms: dict[str, int]
    """Event time (window boundary, ms) of each user view read for this answer."""
    features: RequestFeatures | None = None
    """The model inputs when a model answered (what the prediction log records); else None."""


@dataclass(frozen=True)
class Models:
    """What can score: the DCN (through the batcher) and the linear fallback, each optional."""

    neural_version: str | None = None
    linear: LinearRanker | None = None
    linear_version: str | None = None
    absent_reason: str = "no_model"
    """The ``fallback_reason`` when the DCN is absent (``experiment``: an arm starts below it)."""


def top_k(scores: npt.NDArray[np.floating[Any]], k: int) -> npt.NDArray[np.intp]:
    """Indexes of the ``k`` highest scores, best first; ties keep the candidates' order."""
    k = min(k, len(scores))
    part: npt.NDArray[np.intp] = (
        np.argpartition(-scores, k - 1)[:k] if k < len(scores) else np.arange(len(scores))
    )
    best: npt.NDArray[np.intp] = part[np.lexsort((part, -scores[part]))]
    return best


def _missing_last(scores: npt.NDArray[np.float32], found: npt.NDArray[np.bool_]) -> npt.NDArray[np.float32]:
    """Candidates without item features rank after every candidate with them (score below the lowest)."""
    if found.all() or not found.any():
        return scores
    out = scores.copy()
    out[~found] = float(scores[found].min()) - 1.0
    return out


class RankingEngine:
    """Runs the fallback chain for one request at a time (many concurrently on one loop)."""

    def __init__(
        self,
        config: ServingConfig,
        registry: BoundRegistry,
        fetcher: FeatureFetcher,
        reader: FeatureReader,
        models: Models,
        batcher: MicroBatcher[Job, npt.NDArray[np.float32]] | None,
        telemetry: Telemetry,
        io: Executor,
    ) -> None:
        self.config = config
        self.registry = registry
        self.fetcher = fetcher
        self.reader = reader
        self.models = models
        self.batcher = batcher
        self.telemetry = telemetry
        self._io = io
        self._reserve_s = config.fallback_reserve_ms / 1000.0

    async def rank(self, query: RankQuery) -> Ranked:
        """Rank ``query.candidates``; raises :class:`QueueFullError` only, never a scoring error."""
        loop = asyncio.get_running_loop()
        started = time.perf_counter()
        deadline = loop.time() + (query.deadline_ms or self.config.default_deadline_ms) / 1000.0
        batcher = self.batcher
        if batcher is not None and self.models.neural_version and batcher.is_full(query.priority):
            raise QueueFullError(query.priority, batcher.max_queue_requests, batcher.retry_after_s)
        feats, reason = await self._features(query, deadline)
        answer = None
        if feats is not None and reason is None:
            answer, reason = await self._models(query, feats, deadline)
        if answer is None:
            answer, why = await self._popularity(query, deadline, feats)
            reason = reason or why
        if answer is None:
            answer = self._editorial(query)
        items, version, fallback, ages = answer
        latency = time.perf_counter() - started
        self.telemetry.rank_latency.labels(fallback or "none").observe(latency)
        if fallback is not None:
            self.telemetry.fallbacks.labels(fallback, reason or "unknown").inc()
        return Ranked(
            items,
            version,
            fallback,
            reason if fallback else None,
            ages,
            round(latency * 1000.0, 3),
            feats.user_event_ms if feats is not None else {},
            feats if version is not None else None,
        )

    async def _features(self, query: RankQuery, deadline: float) -> tuple[RequestFeatures | None, str | None]:
        budget = deadline - asyncio.get_running_loop().time() - self._reserve_s
        try:
            feats = await self.fetcher.fetch(query.user_id, query.candidates, budget, query.user_rows)
        except FeatureReadError as exc:
            logger.warning("feature read for user %r failed, falling back: %s", query.user_id, exc)
            return None, "store_error"
        if feats.user is None:
            return feats, "missing_user_features"
        if feats.missing_item_fraction > self.config.max_missing_item_fraction:
            return feats, "missing_item_features"
        return feats, None

    async def _models(
        self, query: RankQuery, feats: RequestFeatures, deadline: float
    ) -> tuple[tuple[list[tuple[str, float]], str | None, str | None, FeatureAges] | None, str]:
        user = feats.user
        if user is None:
            return None, "missing_user_features"
        reason = self.models.absent_reason
        if self.batcher is not None and self.models.neural_version:
            loop = asyncio.get_running_loop()
            until = deadline - self._reserve_s
            future = self.batcher.submit((user, feats.items), len(query.candidates), query.priority, until)
            try:
                scores = await asyncio.wait_for(future, max(until - loop.time(), 0.0))
                if len(scores) != len(query.candidates) or not np.isfinite(scores).all():
                    msg = (
                        f"the neural model returned {len(scores)} scores, not all finite,"
                        f" for {len(query.candidates)} candidates"
                    )
                    raise FloatingPointError(msg)
                scores = _missing_last(scores, feats.items_found)
                return self._answer(query, scores, self.models.neural_version, None, feats.ages()), ""
            except (TimeoutError, DeadlineExceededError):
                reason = "deadline"
            except Exception:
                logger.exception("the neural model failed for user %r; falling back", query.user_id)
                reason = "model_error"
        linear = self.models.linear
        if linear is not None:
            try:
                scores = _missing_last(linear.score(user, feats.items), feats.items_found)
                if not np.isfinite(scores).all():
                    msg = "the linear model produced non-finite scores"
                    raise FloatingPointError(msg)
                return self._answer(query, scores, self.models.linear_version, "linear", feats.ages()), reason
            except (ValueError, FloatingPointError) as exc:
                logger.warning("the linear model failed for user %r: %s", query.user_id, exc)
                reason = reason if reason != self.models.absent_reason else "model_error"
        return None, reason

    async def _popularity(
        self, query: RankQuery, deadline: float, feats: RequestFeatures | None
    ) -> tuple[tuple[list[tuple[str, float]], str | None, str | None, FeatureAges] | None, str]:
        loop = asyncio.get_running_loop()
        spec, slot = self.registry.popularity, self.registry.popularity_slot
        budget = max(deadline - loop.time(), self._reserve_s)
        try:
            rows = (
                await asyncio.wait_for(
                    loop.run_in_executor(self._io, self.reader.read_many, [(spec, list(query.candidates))]),
                    budget,
                )
            )[0]
        except (FeatureReadError, TimeoutError) as exc:
            logger.warning("popularity read failed, using the editorial list: %s", exc)
            return None, "store_error"
        if not rows.found.any():
            return None, "no_popularity"
        scores = np.where(rows.found, np.nan_to_num(rows.values[:, slot], nan=0.0), -1.0)
        now = now_ms()
        ages = np.maximum(0.0, (now - rows.event_time_ms[rows.found]) / 1000.0)
        user_age = feats.ages(now).user if feats is not None else None
        item_ages = FeatureAges(user_age, float(np.median(ages)), float(ages.max()))
        return self._answer(query, scores, None, "popularity", item_ages), ""

    def _editorial(
        self, query: RankQuery
    ) -> tuple[list[tuple[str, float]], str | None, str | None, FeatureAges]:
        wanted = set(query.candidates)
        first = [i for i in self.config.editorial_items if i in wanted]
        chosen = set(first)
        ordered = first + [c for c in query.candidates if c not in chosen]
        items = [(item, round(1.0 / (1 + rank), 6)) for rank, item in enumerate(ordered[: query.k])]
        return items, None, "editorial", NO_AGES

    @staticmethod
    def _answer(
        query: RankQuery,
        scores: npt.NDArray[np.floating[Any]],
        version: str | None,
        fallback: str | None,
        ages: FeatureAges,
    ) -> tuple[list[tuple[str, float]], str | None, str | None, FeatureAges]:
        best = top_k(np.asarray(scores, dtype=np.float64), query.k)
        items = [(query.candidates[i], float(scores[i])) for i in best.tolist()]
        return items, version, fallback, ages


__all__ = ["Models", "QueueFullError", "RankQuery", "Ranked", "RankingEngine", "top_k"]
