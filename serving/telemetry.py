"""Prometheus metrics of the ranking service, in a registry of its own (one per app)."""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Callable, Mapping, Sequence

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from headwater.serving.batcher import PRIORITIES, BatchStats
from headwater.serving.feedback import FeedbackProducer
from headwater.serving.item_mirror import ItemMirror

LATENCY_BUCKETS = (
    0.001,
    0.002,
    0.003,
    0.005,
    0.0075,
    0.01,
    0.015,
    0.02,
    0.03,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
)
ROW_BUCKETS = (1, 10, 50, 100, 250, 500, 1000, 2000, 4000, 8192, 16384)
REQUEST_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64)


class Telemetry:
    """Latency, batch-size, fallback and queue metrics, plus a rolling inference p99."""

    def __init__(self, window: int = 4096) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.rank_latency = Histogram(
            "headwater_rank_latency_seconds",
            "End-to-end /v1/rank latency by fallback used ('none' = model).",
            ["fallback"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.inference_latency = Histogram(
            "headwater_inference_latency_seconds",
            "Duration of one batched model forward.",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.queue_wait = Histogram(
            "headwater_queue_wait_seconds",
            "Time a request waited in the batcher queue.",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.batch_rows = Histogram(
            "headwater_batch_rows", "Candidate rows per model forward.", buckets=ROW_BUCKETS, registry=r
        )
        self.batch_requests = Histogram(
            "headwater_batch_requests",
            "Requests merged into one model forward.",
            buckets=REQUEST_BUCKETS,
            registry=r,
        )
        self.fallbacks = Counter(
            "headwater_fallbacks_total",
            "Answers that fell back, by fallback kind and reason.",
            ["kind", "reason"],
            registry=r,
        )
        self.rejected = Counter(
            "headwater_rejected_total",
            "Requests refused, by reason (queue_full, invalid).",
            ["reason"],
            registry=r,
        )
        self.queue_depth = Gauge(
            "headwater_queue_depth", "Requests waiting in the batcher, by priority.", ["priority"], registry=r
        )
        self.item_cache = Gauge(
            "headwater_item_cache_lookups",
            "Item-vector cache look-ups since start, by result.",
            ["result"],
            registry=r,
        )
        self.item_mirror = Gauge(
            "headwater_item_mirror_candidates",
            "Candidates whose item rows came from the in-memory mirror or were read from Redis, since start.",
            ["source"],
            registry=r,
        )
        self.item_mirror_age = Gauge(
            "headwater_item_mirror_age_seconds",
            "Seconds since the item mirror and the store were last confirmed to agree (-1: never).",
            registry=r,
        )
        self.feedback_events = Gauge(
            "headwater_feedback_events",
            "Events sent back to Kafka since start (impressions and feedback), by result.",
            ["result"],
            registry=r,
        )
        self.other_version_rows = Gauge(
            "headwater_feature_rows_other_version",
            "Feature rows read since start that a tier wrote under another version of the view than the"
            " applied one (its job not yet restarted on the applied plan), by view.",
            ["view"],
            registry=r,
        )
        self.model_view_changed = Gauge(
            "headwater_model_view_version_changed",
            "1 for each view whose applied version differs from the one the model was trained on.",
            ["view"],
            registry=r,
        )
        self.model_answers = Counter(
            "headwater_model_answers_total",
            "Answers scored by a model, by model version and version_drift ('true': the model was trained"
            " on another version of a view it reads than the applied one). The seed's feature version"
            " drift is the 'true' share, under 0.1%.",
            ["model_version", "version_drift"],
            registry=r,
        )
        self._drifted: dict[str, bool] = {}
        self._inference_s: deque[float] = deque(maxlen=window)

    def watch_feedback(self, producer: FeedbackProducer) -> None:
        """Report the feedback producer's counters (sent, dropped, failed, invalid, buffered)."""
        counters = producer.counters
        self.feedback_events.labels("sent").set_function(lambda: float(counters.sent))
        self.feedback_events.labels("dropped").set_function(lambda: float(counters.dropped))
        self.feedback_events.labels("failed").set_function(lambda: float(counters.failed))
        self.feedback_events.labels("invalid").set_function(lambda: float(counters.invalid))
        self.feedback_events.labels("buffered").set_function(lambda: float(producer.buffered))

    def watch_queues(self, depth: Callable[[str], int]) -> None:
        """Report queue depths by calling ``depth(priority)`` at scrape time."""
        for priority in PRIORITIES:
            self.queue_depth.labels(priority).set_function(functools.partial(_as_float, depth, priority))

    def watch_cache(self, hits: Callable[[], int], misses: Callable[[], int]) -> None:
        """Report item-cache hits and misses at scrape time."""
        self.item_cache.labels("hit").set_function(lambda: float(hits()))
        self.item_cache.labels("miss").set_function(lambda: float(misses()))

    def watch_mirror(self, mirror: ItemMirror) -> None:
        """Report the item mirror's use and age at scrape time."""
        self.item_mirror.labels("memory").set_function(lambda: float(mirror.served))
        self.item_mirror.labels("store").set_function(lambda: float(mirror.read))
        self.item_mirror_age.set_function(lambda: min(mirror.age_s(), 1e12) if mirror.confirmed_ms else -1.0)

    def watch_versions(
        self, rows: Callable[[], Mapping[str, int]], views: Sequence[str], changed: Sequence[str]
    ) -> None:
        """Report per view the rows of another version read, and whether the model is out of date.

        ``rows()`` is called at scrape time; ``changed`` lists the views whose applied version differs
        from the one the model was trained on.
        """
        for view in views:
            self.other_version_rows.labels(view).set_function(functools.partial(_count_of, rows, view))
            self.model_view_changed.labels(view).set(1.0 if view in changed else 0.0)

    def watch_drift(self, changed: Mapping[str, Sequence[str]]) -> None:
        """Know, per model version the service loaded, the views it reads at another version.

        ``changed``: model version -> the views whose applied version differs from the one that model
        was trained on (its binding's ``changed_views``; empty: no drift).
        """
        self._drifted = {version: bool(views) for version, views in changed.items()}

    def answered(self, model_version: str | None) -> None:
        """Count one answer a model scored (``None``: a fallback without a model, not counted)."""
        if model_version is None:
            return
        drifted = self._drifted.get(model_version)
        if drifted is None:  # a version the service did not load cannot be judged; not expected
            return
        self.model_answers.labels(model_version, "true" if drifted else "false").inc()

    def observe_batch(self, stats: BatchStats) -> None:
        """Record one model forward."""
        self.inference_latency.observe(stats.seconds)
        self.batch_rows.observe(stats.rows)
        self.batch_requests.observe(stats.requests)
        self.queue_wait.observe(stats.queue_wait_s)
        self._inference_s.append(stats.seconds)

    def inference_p99_ms(self) -> float | None:
        """p99 of the recent model forwards in milliseconds (None before the first)."""
        if not self._inference_s:
            return None
        return round(float(np.percentile(np.fromiter(self._inference_s, dtype=np.float64), 99)) * 1000.0, 3)


def _count_of(rows: Callable[[], Mapping[str, int]], view: str) -> float:
    return float(rows().get(view, 0))


def _as_float(depth: Callable[[str], int], priority: str) -> float:
    return float(depth(priority))
