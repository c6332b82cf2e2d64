"""Prediction skew end to end: a real `headwater serve` logs its answers to Kafka, `headwater skew`
lands them in Delta and rescores them from the point-in-time training-set path (Spark), Redis the store.

Two days of events land in bronze; a user and an item view (offline tier) are computed per day and
materialized to Redis, as the offline tier does; a model trained on the views' slots serves. The
point-in-time path at a request's time reads the values as of today's boundary, which is what was
materialized: no skew, exit 0. Then one user's ``clicks_1d`` is overwritten in Redis (a tier writing
a wrong value) and that user ranks again: exit 1, and ``user.clicks_1d`` is the feature named first.
(A run across midnight UTC would see a new day boundary that nothing materialized: not supported.)
"""

from __future__ import annotations

import importlib.util
import json
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner
from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition

from headwater.cli.skew import skew_command
from headwater.pipelines.offline.bronze import append_events
from headwater.pipelines.offline.job import read_bronze, run_view
from headwater.pipelines.offline.lake import bronze_path, day_start_ms, days
from headwater.pipelines.offline.materialize import materialize
from headwater.pipelines.offline.testing import HOUR_MS, behaviour, event, feature, view, write_plan
from headwater.pipelines.store import OnlineStore
from headwater.ranking.features import load_registry
from headwater.ranking.synthetic import make_world, training_set
from headwater.ranking.train import TrainOptions, train_and_save

ROOT = Path(__file__).resolve().parents[3]
HEADWATER = str(Path(sys.executable).with_name("headwater"))
USERS = [f"u{n}" for n in range(8)]
ITEMS = [f"i{n}" for n in range(10)]
CATEGORIES = ("music", "books", "art")
POPULARITY = "sk_item.item_clicks_1d"
USER_VIEW = view("sk_user", "user", "user_id", [
    feature("clicks_1d", "count", "1d", filter_="event_type = 'click'", dtype="int64"),
    feature("impressions_2d", "count", "2d", filter_="event_type = 'impression'", dtype="int64"),
    feature("top_cat_2d", "top_k", "2d", field="category", k=2),
])  # fmt: skip
ITEM_VIEW = view("sk_item", "item", "item_id", [
    feature("item_clicks_1d", "count", "1d", filter_="event_type = 'click'", dtype="int64"),
    feature("price_max_2d", "max", "2d", field="price"),
])  # fmt: skip


def history(today: datetime) -> list[dict[str, Any]]:
    """Impressions and clicks of every user on the two days before ``today``."""
    rng = np.random.default_rng(3)
    out: list[dict[str, Any]] = []
    n = 0
    for back in (2, 1):
        start = day_start_ms((today - timedelta(days=back)).date())
        for u, user in enumerate(USERS):
            for s in range(6):
                item = int(rng.integers(0, len(ITEMS)))
                fields = {"item_id": ITEMS[item], "category": CATEGORIES[item % 3], "price": float(3 + item)}
                t = start + (u + 1) * HOUR_MS + s * 60_000
                n += 1
                out.append(event(n, user, "impression", t, **fields))
                if rng.random() < 0.4:
                    n += 1
                    out.append(event(n, user, "click", t + 500, **fields))
    return out


_spec = importlib.util.spec_from_file_location("edge_service", Path(__file__).with_name("edge_service.py"))
assert _spec is not None
assert _spec.loader is not None
edge = sys.modules.setdefault("edge_service", importlib.util.module_from_spec(_spec))
_spec.loader.exec_module(edge)


def _rank(url: str, user: str) -> dict[str, Any]:
    body = {"user_id": user, "candidates": ITEMS, "k": 5, "log_impressions": False}
    request = urllib.request.Request(
        f"{url}/v1/rank", data=json.dumps(body).encode(), headers={"content-type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as answer:
        data: dict[str, Any] = json.loads(answer.read())
    return data


def _wait_for_records(bootstrap: str, topic: str, count: int) -> None:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            parts = consumer.partitions_for_topic(topic) or set()
            if parts:
                ends = consumer.end_offsets([TopicPartition(topic, p) for p in parts])
                if sum(ends.values()) >= count:
                    return
            time.sleep(0.2)
        pytest.fail(f"the service did not log {count} predictions to {topic} within 60 s")
    finally:
        consumer.close()


@pytest.fixture(scope="module")
def served(
    tmp_path_factory: pytest.TempPathFactory, spark: Any, redis_url: str, kafka_bootstrap: str
) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("skew")
    today = datetime.now(UTC)
    state, lake = tmp / "state", tmp / "lake"
    write_plan(state, "offline", [USER_VIEW, ITEM_VIEW])
    write_plan(state, "realtime", [])
    write_plan(state, "nearline", [])
    append_events(spark, behaviour(), history(today), bronze_path(lake, "events"))
    bronze = read_bronze(spark, lake, behaviour())
    first, last = (today - timedelta(days=2)).date(), (today - timedelta(days=1)).date()
    for v in (USER_VIEW, ITEM_VIEW):
        run_view(spark, bronze, v, behaviour(), lake, days(first, last), zorder=False)
    namespace = f"tskew{uuid.uuid4().hex[:8]}"
    store = OnlineStore.from_url(redis_url, namespace=namespace)
    materialize(spark, store, [USER_VIEW, ITEM_VIEW], lake)  # values as of today 00:00 UTC
    registry = load_registry(state, POPULARITY)
    world = make_world(registry, users=50, items=40, seed=5, empty_share=0.0)
    train_and_save(training_set(registry, world, slates=200, seed=5), tmp / "models",
                   TrainOptions(epochs=1, device="cpu"))  # fmt: skip
    topic = f"test.skew.{uuid.uuid4().hex[:8]}"
    config = {
        "popularity": POPULARITY,
        "feedback": {"enabled": False},
        "predictions": {"enabled": True, "topic": topic, "sample_rate": 1.0},
        "default_deadline_ms": 5000.0,  # under load the DCN must answer: a fallback logs no model input
    }
    (tmp / "serving.yaml").write_text(json.dumps(config))  # JSON is YAML
    serve = ["--model", str(tmp / "models"), "--state-dir", str(state), "--namespace", namespace,
             "--device", "cpu", "--config", str(tmp / "serving.yaml")]  # fmt: skip
    args = ["--topic", topic, "--models", str(tmp / "models"), "--state-dir", str(state), "--lake",
            str(lake), "--redis-url", redis_url, "--namespace", namespace, "--bootstrap", kafka_bootstrap,
            "--format", "json"]  # fmt: skip
    try:
        with edge.serve_process(tmp, *serve) as service:
            yield {"url": service.url, "topic": topic, "store": store, "registry": registry, "args": args}
    finally:
        admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap)
        admin.delete_topics([topic])
        admin.close()
        edge.drop_namespace(redis_url, namespace)
        store.close()


def test_no_skew_then_a_feature_changed_in_the_store_is_named_first(
    served: Any, kafka_bootstrap: str
) -> None:
    url, topic = served["url"], served["topic"]
    answers = [_rank(url, user) for user in USERS]
    assert all(a["model_version"] is not None and a["fallback"] is None for a in answers), answers
    _wait_for_records(kafka_bootstrap, topic, len(USERS))
    runner = CliRunner()
    clean = runner.invoke(skew_command, served["args"])
    assert clean.exit_code == 0, clean.output
    report = json.loads(clean.output)
    assert (report["landed"], report["rows"], report["answers"]) == (len(USERS), len(USERS), len(USERS))
    (version,) = report["versions"]
    assert version["model_version"] == answers[0]["model_version"]
    assert (version["requests"], version["scores"], version["missing_items"]) == (
        len(USERS),
        5 * len(USERS),
        0,
    )
    assert version["max"] < 1e-4  # the served features are the point-in-time ones: float noise only
    assert version["logged_max"] < 1e-4
    assert all(f["differ"] == 0 for f in version["features"])
    assert report["notes"] == []

    # A tier writes another value for u0's clicks_1d (a newer event time wins); u0 ranks again.
    layout = next(lay for lay in served["registry"].user.layouts if lay.view == "sk_user")
    store = served["store"]
    stored = store.read_batch(layout, ["u0"])
    values = stored.values.copy()
    column = list(layout.features).index("clicks_1d")
    values[0, column] += 500.0
    store.write_batch(layout, ["u0"], values, stored.event_time_ms + 1)
    for _ in range(3):
        assert _rank(url, "u0")["fallback"] is None
    _wait_for_records(kafka_bootstrap, topic, len(USERS) + 3)
    skewed = runner.invoke(skew_command, served["args"])
    assert skewed.exit_code == 1, skewed.output
    report = json.loads(skewed.output)
    assert (report["landed"], report["rows"], report["answers"]) == (3, len(USERS) + 3, len(USERS) + 3)
    (version,) = report["versions"]
    assert version["breached"] is True
    assert version["max"] > 0.003
    assert version["logged_max"] < 1e-4  # the model scored what it was given: the skew is the feature
    top = version["features"][0]
    assert (top["feature"], top["compared"], top["differ"]) == ("user.clicks_1d", len(USERS) + 3, 3)
    assert top["mean_abs_diff"] == pytest.approx(500.0 * 3 / (len(USERS) + 3), rel=1e-5)
    assert all(f["differ"] == 0 for f in version["features"][1:])
