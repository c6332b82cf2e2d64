"""Prediction skew, first part: the service logs what it scored; ``headwater skew`` rescores it offline.

The service (``predictions.enabled``) samples requests answered by a model and sends one JSON
record per request to a Kafka topic (default ``predictions``), never waiting for Kafka (a bounded
buffer; a full one drops and counts)::

    {"v": 2, "request_id": "...", "at_ms": 1767225600123, "user_id": "u1", "model_version": "9f0b...",
     "fallback": null, "user_event_ms": {"user_session_realtime": 1767225600000, ...},
     "views": {"user_session_realtime": {"side": "user", "version": "3c1d...", "event_ms": 1767225600000},
               "item_trending_realtime": {"side": "item", "version": "77aa..."}, ...},
     "item_views": ["item_trending_realtime", ...], "item_event_ms": [[1767225595000, ...], ...],
     "on_demand": {"at_ms": 1767225600124, "features": ["affinity", ...]},
     "user": [...model inputs...], "items": ["i7", ...], "item_features": [[...], ...],
     "found": [true, ...], "scores": [0.83, ...]}

``user`` and ``item_features`` are the model's inputs in its column order (NaN as null), for
the returned top k; the on-demand features are among the item inputs, computed at
``on_demand.at_ms`` from the user's and the item's stored values. Each value comes with its own
event time: ``views[v].event_ms`` for a user view (absent: the user has no row there, the empty
window was served), ``item_event_ms[i][j]`` for top item ``i`` in ``item_views[j]`` (0: no row);
``views[v].version`` is the version of the view the service read. Version 1 records (no ``views``)
stay readable: the report rescores them at the request's time only.

``headwater skew`` (below; the work is in :mod:`headwater.pipelines.offline.skew_land` and
:mod:`headwater.ranking.skew_pit`) lands the topic in a Delta table under the lake,
exactly once, then rescores every logged answer with the model version the service used, from the
features the point-in-time training-set path gives at the request's time; it reports per model
version the distribution of ``|online - offline|`` (p50, p99, max), exits 1 when the largest is over
``--threshold`` (default 0.003), and names the features whose served values differ most from the
point-in-time ones. The logged inputs are rescored too: a difference there is scoring skew alone.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import queue
import random
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    from headwater.ranking.features import BoundRegistry
    from headwater.ranking.skew_pit import VersionSkew
    from headwater.serving.fetch import RequestFeatures

logger = logging.getLogger(__name__)
PREDICTION_VERSION = 2
DEFAULT_TOPIC = "predictions"
_STOP = object()


PREDICTIONS_RETENTION_MS = str(7 * 24 * 3600 * 1000)
"""A week of logged predictions: what `headwater skew` can compare."""


class PredictionLogConfig(BaseModel):
    """Which answers are logged with their model inputs and scores, and where."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = False
    topic: str = DEFAULT_TOPIC
    sample_rate: float = Field(default=0.01, ge=0.0, le=1.0)
    max_buffer: int = Field(default=10_000, ge=1)


def _floats(values: npt.NDArray[np.float32]) -> list[float | None]:
    return [None if not math.isfinite(v) else float(v) for v in values.tolist()]


def served_views(registry: BoundRegistry, features: RequestFeatures, rows: Sequence[int]) -> dict[str, Any]:
    """Return the record's per-value fields: each view's version and event times, the on-demand inputs.

    ``rows``: the candidates' rows of the returned top k, in answer order.
    """
    views: dict[str, dict[str, Any]] = {}
    for lay in registry.user.layouts:
        entry: dict[str, Any] = {"side": "user", "version": lay.version}
        if lay.view in features.user_event_ms:
            entry["event_ms"] = int(features.user_event_ms[lay.view])
        views[lay.view] = entry
    for lay in registry.item.layouts:
        views[lay.view] = {"side": "item", "version": lay.version}
    out: dict[str, Any] = {"views": views, "item_views": [lay.view for lay in registry.item.layouts]}
    if features.items_view_ms is not None:
        out["item_event_ms"] = features.items_view_ms[list(rows)].tolist()
    if registry.on_demand is not None:
        out["on_demand"] = {"at_ms": int(features.at_ms), "features": list(registry.on_demand.names)}
    return out


def prediction_record(
    request_id: str,
    at_ms: int,
    user_id: str,
    answer: Mapping[str, Any],
    candidates: Sequence[str],
    user: npt.NDArray[np.float32],
    items: npt.NDArray[np.float32],
    found: npt.NDArray[np.bool_],
    user_event_ms: Mapping[str, int],
    registry: BoundRegistry | None = None,
    features: RequestFeatures | None = None,
) -> dict[str, Any]:
    """Return the log record of one answer: the top k's model inputs and scores.

    With ``registry`` and ``features`` (the vectors the model scored), the record holds each value's
    view version and event time and the on-demand inputs (:func:`served_views`).
    """
    index = {c: i for i, c in enumerate(candidates)}
    ranked = [(x["item_id"], x["score"]) for x in answer["items"]]
    rows = [index[item] for item, _ in ranked]
    served = {} if registry is None or features is None else served_views(registry, features, rows)
    return {
        "v": PREDICTION_VERSION,
        "request_id": request_id,
        "at_ms": at_ms,
        "user_id": user_id,
        "model_version": answer.get("model_version"),
        "fallback": answer.get("fallback"),
        "user_event_ms": dict(user_event_ms),
        **served,
        "user": _floats(user),
        "items": [item for item, _ in ranked],
        "item_features": [_floats(items[r]) for r in rows],
        "found": [bool(found[r]) for r in rows],
        "scores": [float(s) for _, s in ranked],
    }


class PredictionLog:
    """Samples answers into a bounded buffer; a thread sends them to Kafka as JSON."""

    def __init__(
        self, config: PredictionLogConfig, connect: Callable[[], Any], seed: int | None = None
    ) -> None:
        """Send to ``config.topic`` through the producer ``connect()`` returns (kafka-python's)."""
        self.config = config
        self._connect = connect
        self._rng = random.Random(seed)
        self._buffer: queue.Queue[object] = queue.Queue(maxsize=config.max_buffer)
        self._thread: threading.Thread | None = None
        self.sent = self.dropped = self.failed = 0

    def sampled(self) -> bool:
        """Return whether the next answer is logged."""
        rate = self.config.sample_rate
        return rate >= 1.0 or (rate > 0.0 and self._rng.random() < rate)

    def offer(self, record: dict[str, Any]) -> None:
        """Buffer one record; never blocks (a full buffer drops it)."""
        try:
            self._buffer.put_nowait(record)
        except queue.Full:
            self.dropped += 1

    async def start(self) -> None:
        """Start the sender thread (the app's lifespan calls it)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="headwater-predictions", daemon=True)
            self._thread.start()

    async def stop(self) -> None:
        """Send what is buffered (5 s at most) and stop."""
        if self._thread is not None:
            self._buffer.put(_STOP)
            self._thread.join(5.0)
            self._thread = None

    def _run(self) -> None:
        from kafka.errors import KafkaError

        producer = None
        while True:
            item = self._buffer.get()
            if item is _STOP:
                break
            try:
                producer = producer or self._connect()
                key = str(item["user_id"]).encode()  # type: ignore[index]
                producer.send(self.config.topic, value=json.dumps(item).encode(), key=key)
                self.sent += 1
            except (KafkaError, OSError) as exc:
                self.failed += 1
                logger.warning("prediction log: not sent (%s)", exc)
        if producer is not None:
            with contextlib.suppress(KafkaError, OSError):
                producer.flush(timeout=2.0)
                producer.close(timeout=2.0)


def kafka_connect(bootstrap: str, topic: str | None = None) -> Callable[[], Any]:
    """Return a factory of a Kafka producer (prediction log, recording); it creates ``topic`` if missing.

    The factory runs on the log's own thread at the first record, so a broker that is down
    costs the service nothing (the record is counted as failed and the next one tries again).
    """

    def connect() -> Any:
        from headwater.pipelines import kafka as kafka_clients

        if topic is not None:  # the brokers do not auto-create topics (infra/config)
            from headwater.pipelines.settings import Settings
            from headwater.pipelines.topics import ensure_topics

            settings = dataclasses.replace(Settings.from_env(), kafka_bootstrap=bootstrap)
            ensure_topics(settings, {topic: {"retention.ms": PREDICTIONS_RETENTION_MS}}, partitions=1)
        return kafka_clients.producer(bootstrap, client_id="headwater-serving-predictions", acks=1,
                                      linger_ms=20, compression_type="zstd", max_block_ms=1000)  # fmt: skip

    return connect


# --- offline: land, rescore from the point-in-time path, compare -------------------------------------


def summary_line(result: Sequence[VersionSkew], threshold: float, answers: int) -> str:
    """Return one line over every model version: |online - offline| p99, max, verdict; worst features.

    The features named are the three that differ on the largest share of rows in any version.
    """
    versions = "; ".join(
        f"{r.model_version[:12]} ({r.kind}) {r.scores} scores p99 {r.p99:.2e} max {r.max:.2e}"
        f" {'BREACH' if r.breached(threshold) else 'ok'}"
        for r in result
    )
    worst: dict[str, float] = {}
    for r in result:
        for f in r.features:
            if f.differ:
                worst[f.feature] = max(worst.get(f.feature, 0.0), f.share)
    named = sorted(worst.items(), key=lambda kv: (-kv[1], kv[0]))[:3]
    features = ", ".join(f"{name} ({share:.0%} of rows)" for name, share in named) or "none"
    return (
        f"prediction skew over {answers} logged answers vs {threshold:g}: {versions};"
        f" features differing most: {features}"
    )
