"""Prediction skew, first part: the service logs what it scored; ``headwater skew`` rescores it offline.

The service (``predictions.enabled``) samples requests answered by a model and sends one JSON
record per request to a Kafka topic (default ``predictions``), never waiting for Kafka (a bounded
buffer; a full one drops and counts)::

    {"v": 1, "request_id": "...", "at_ms": 1767225600123, "user_id": "u1", "model_version": "9f0b...",
     "fallback": null, "user_event_ms": {"user_session_realtime": 1767225600000, ...},
     "user": [...model inputs...], "items": ["i7", ...], "item_features": [[...], ...],
     "found": [true, ...], "scores": [0.83, ...]}

``user`` and ``item_features`` are the model's inputs in its column order (NaN as null), for
the returned top k.

``headwater skew`` (below; the work is in :mod:`headwater.pipelines.offline.skew_land` and
:mod:`headwater.pipelines.offline.skew_pit`) lands the topic in a Delta table under the lake,
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
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from pydantic import BaseModel, ConfigDict, Field

from headwater.pipelines.offline.cli import LAKE, MASTER, NAMESPACE, REDIS, STATE

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    from headwater.pipelines.offline.skew_pit import VersionSkew

logger = logging.getLogger(__name__)
PREDICTION_VERSION = 1
DEFAULT_TOPIC = "predictions"
DEFAULT_THRESHOLD = 0.003
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
) -> dict[str, Any]:
    """Return the log record of one answer: the top k's model inputs and scores."""
    index = {c: i for i, c in enumerate(candidates)}
    ranked = [(x["item_id"], x["score"]) for x in answer["items"]]
    rows = [index[item] for item, _ in ranked]
    return {
        "v": PREDICTION_VERSION,
        "request_id": request_id,
        "at_ms": at_ms,
        "user_id": user_id,
        "model_version": answer.get("model_version"),
        "fallback": answer.get("fallback"),
        "user_event_ms": dict(user_event_ms),
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
        from kafka import KafkaProducer

        if topic is not None:  # the brokers do not auto-create topics (infra/config)
            from headwater.pipelines.settings import Settings
            from headwater.pipelines.topics import ensure_topics

            settings = dataclasses.replace(Settings.from_env(), kafka_bootstrap=bootstrap)
            ensure_topics(settings, {topic: {"retention.ms": PREDICTIONS_RETENTION_MS}}, partitions=1)
        return KafkaProducer(bootstrap_servers=bootstrap, client_id="headwater-serving-predictions", acks=1,
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


@click.command("skew")
@click.option("--topic", default=DEFAULT_TOPIC, show_default=True, help="The service's prediction log topic.")
@click.option(
    "--models", "models_dir", type=click.Path(exists=True, file_okay=False, path_type=Path), default=None,
    help="Folder of the model artifacts [default: models/ in the state folder].",
)  # fmt: skip
@click.option(
    "--threshold", type=click.FloatRange(min=0.0), default=DEFAULT_THRESHOLD, show_default=True,
    help="Exit 1 when a model version's largest |online - offline| is above this.",
)  # fmt: skip
@click.option("--since", "since_min", type=click.FloatRange(min=0.0), default=None,
              help="Only the answers logged in the last N minutes (default: all landed).")  # fmt: skip
@click.option("--top", type=click.IntRange(1, 100), default=5, show_default=True, help="Features named.")
@click.option("--bootstrap", default=None, help="Kafka (default: HEADWATER_* settings).")
@click.option(
    "--format", "fmt", type=click.Choice(["text", "json", "line"]), default="text", show_default=True,
    help="line: one line for every model version together (the demo prints it).",
)  # fmt: skip
@LAKE
@STATE
@MASTER
@REDIS
@NAMESPACE
def skew_command(
    topic: str, models_dir: Path | None, threshold: float, since_min: float | None, top: int,
    bootstrap: str | None, fmt: str, lake: Path | None, state_dir: Path | None, master: str | None,
    redis_url: str | None, namespace: str | None,
) -> None:  # fmt: skip
    """Land the prediction log, rescore it from the point-in-time features, exit 1 above --threshold.

    Steps: the topic's new records are appended to the Delta table <lake>/predictions/<topic>
    (exactly once); each logged (request, item) becomes a label row at the request's time, joined
    to every user and item view by the training-set path (`headwater training-set`); the model
    version the service used rescores those features. Reports per model version the p50, p99 and
    largest |online - offline| score and the features whose served values differ most from the
    point-in-time ones. Exit 1: a version is over --threshold; exit 2: no figures (an error).
    """
    from headwater.pipelines.offline.cli import _plan, _store, _tier_views
    from headwater.pipelines.offline.experiment_report import NotComputed
    from headwater.pipelines.offline.job import BronzeTables, OfflineJobError
    from headwater.pipelines.offline.lake import lake_root
    from headwater.pipelines.offline.landing_state import LandingError
    from headwater.pipelines.offline.session import offline_session
    from headwater.pipelines.offline.skew_land import (
        PredictionLandingError,
        land_predictions,
        predictions_path,
        read_landed,
    )
    from headwater.pipelines.offline.skew_pit import (
        SkewError,
        compare,
        labels_table,
        load_scorers,
        parse_logged,
        point_in_time,
    )
    from headwater.pipelines.settings import Settings
    from headwater.pipelines.windows import RedisDictionary
    from headwater.registry.config import state_dir as resolved_state

    models = models_dir or resolved_state(state_dir) / "models"
    try:
        plan = _plan(state_dir, "offline")
    except click.ClickException as exc:
        raise NotComputed(exc.message) from exc
    views = [v for tier in ("realtime", "nearline", "offline") for v in _tier_views(state_dir, tier)]
    root = lake_root(lake)
    scorers, notes = load_scorers(models)
    if not scorers:
        raise NotComputed(f"no model artifact (*.pt) loads from {models}; pass --models DIR")
    store = _store(redis_url, namespace)
    spark = offline_session("headwater-skew", master)
    try:
        landed = land_predictions(spark, bootstrap or Settings.from_env().kafka_bootstrap, topic, root)
        since_ms = None if since_min is None else int(time.time() * 1000 - since_min * 60_000)
        frame = read_landed(spark, predictions_path(root, topic), since_ms)
        texts = [r["record"] for r in frame.select("record", "kafka_partition", "kafka_offset")
                 .orderBy("kafka_partition", "kafka_offset").collect()]  # fmt: skip
        logged, parse_notes = parse_logged(texts)
        notes += parse_notes
        if not logged:
            raise NotComputed(
                f"no logged answer of a model in {landed.path} ({landed.total} rows landed); serve with"
                " `predictions: {enabled: true}` and rank some requests"
            )
        ids = RedisDictionary(store.client, store.namespace).ids
        with tempfile.TemporaryDirectory(prefix="hw-skew-") as tmp:
            bronze = BronzeTables(spark, root, plan.sources)
            out = Path(tmp) / "pit.parquet"
            pit = point_in_time(
                spark, labels_table(logged), views, root, plan.registry_hash, ids, bronze, out, plan.on_demand
            )
        result, compare_notes = compare(logged, pit, scorers, top)
        notes += compare_notes
    except (PredictionLandingError, LandingError, SkewError, OfflineJobError) as exc:
        raise NotComputed(str(exc)) from exc
    finally:
        store.close()
    if fmt == "json":
        data = {
            "topic": topic,
            "table": str(landed.path),
            "landed": landed.landed,
            "rows": landed.total,
            "answers": len(logged),
            "threshold": threshold,
            "versions": [r.as_dict(threshold) for r in result],
            "notes": notes[:20],
        }
        click.echo(json.dumps(data, indent=2))
    elif fmt == "line":
        click.echo(summary_line(result, threshold, len(logged)))
    else:
        click.echo(
            f"prediction log {topic}: {landed.landed} new record(s) landed in {landed.path}"
            f" ({landed.total} in all); {len(logged)} answer(s) rescored from the point-in-time features"
        )
        for r in result:
            click.echo(r.line(threshold))
        for note in notes[:5]:
            click.echo(f"note: {note}")
    if not result:
        raise NotComputed(f"no logged answer of a model in {models} on topic {topic!r}")
    if any(r.breached(threshold) for r in result):
        raise SystemExit(1)
