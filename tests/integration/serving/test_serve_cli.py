"""`headwater serve` as a user starts it: a registry-bound model, real Redis and Kafka, freshness metrics."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition
from kafka.admin import NewTopic

from headwater.pipelines.events.codec import DecodedEvent, EventCodec
from headwater.ranking.features import load_registry
from headwater.ranking.synthetic import make_world, training_set, write_world
from headwater.ranking.trainset import write_parquet
from headwater.serving.config import DEFAULT_POPULARITY
from headwater.serving.store import OnlineStoreReader, now_ms

ROOT = Path(__file__).resolve().parents[3]
HEADWATER = str(Path(sys.executable).with_name("headwater"))


_spec = importlib.util.spec_from_file_location("edge_service", Path(__file__).with_name("edge_service.py"))
assert _spec is not None
assert _spec.loader is not None
edge = sys.modules.setdefault("edge_service", importlib.util.module_from_spec(_spec))
_spec.loader.exec_module(edge)


def _call(url: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            raw = answer.read()
            status = answer.status
    except urllib.error.HTTPError as exc:
        raw, status = exc.read(), exc.code
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode()


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, redis_url: str, kafka_bootstrap: str) -> Iterator[Any]:
    """Apply features/, train a small model on a synthetic set of its shape, start `headwater serve`."""
    tmp = tmp_path_factory.mktemp("serve-cli")
    state = tmp / "state"
    cmd = [HEADWATER, "apply", str(ROOT / "features"), "--state-dir", str(state), "--no-feast"]
    subprocess.run(cmd, check=True, cwd=ROOT, capture_output=True)
    registry = load_registry(state, DEFAULT_POPULARITY)
    world = make_world(registry, users=50, items=50, seed=5)
    write_parquet(training_set(registry, world, slates=400, seed=5), tmp / "train.parquet")
    train = [HEADWATER, "model", "train", "--training-set", str(tmp / "train.parquet"),
             "--out", str(tmp / "models"), "--epochs", "1"]  # fmt: skip
    subprocess.run(train, check=True, cwd=ROOT, capture_output=True)

    namespace = f"t{uuid.uuid4().hex[:8]}"
    reader = OnlineStoreReader.from_url(redis_url, namespace=namespace)
    write_world(reader, registry, world, now_ms())
    topic = f"test.serve.{uuid.uuid4().hex[:8]}"
    admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    admin.create_topics([NewTopic(topic, 1, 1)])
    # Under load a cold DCN call can miss the default deadline and fall back; the test checks the DCN.
    # JSON is YAML; the test's feedback is a trusted caller's (for items not served to the user)
    config = {"default_deadline_ms": 5000.0, "feedback": {"trust": {"allow_unsolicited": True}}}
    (tmp / "serving.yaml").write_text(json.dumps(config))
    args = ["--model", str(tmp / "models"), "--state-dir", str(state), "--namespace", namespace,
            "--feedback-topic", topic, "--device", "cpu", "--config", str(tmp / "serving.yaml")]  # fmt: skip
    try:
        with edge.serve_process(tmp, *args, timeout_s=90) as service:
            yield {"url": service.url, "world": world, "topic": topic, "log": service.log}
    finally:
        admin.delete_topics([topic])
        admin.close()
        edge.drop_namespace(redis_url, namespace)
        reader.close()


def test_serve_ranks_with_the_neural_model_bound_to_the_registry(served: Any) -> None:
    world = served["world"]
    status, health = _call(f"{served['url']}/health")
    assert status == 200, health
    # The start-up line names the runtimes as /health does (no two-tower model or re-ranker here).
    line = next(x for x in served["log"].read_text().splitlines() if x.startswith("serving on"))
    assert f" ranker_runtime={health['ranker_runtime']} " in line, line
    assert (health["retrieval_index"], health["reranker_runtime"]) == (None, None)
    assert line.endswith(" retrieval_runtime=none retrieval_index=none reranker_runtime=none"), line
    status, answer = _call(
        f"{served['url']}/v1/rank", {"user_id": world.user_ids[0], "candidates": world.item_ids[:40], "k": 5}
    )
    assert status == 200, answer
    assert answer["fallback"] in (None, "none"), answer
    assert len(answer["items"]) == 5
    assert {item["item_id"] for item in answer["items"]} <= set(world.item_ids[:40])
    scores = [item["score"] for item in answer["items"]]
    assert scores == sorted(scores, reverse=True)


def test_feedback_reaches_kafka_and_a_bad_request_is_a_422(served: Any, kafka_bootstrap: str) -> None:
    world = served["world"]
    body = {"user_id": world.user_ids[1], "item_id": world.item_ids[2], "event_type": "click"}
    status, answer = _call(f"{served['url']}/v1/feedback", body)
    assert status == 202, answer
    status, bad = _call(f"{served['url']}/v1/feedback", {**body, "event_type": "dwell"})
    assert status == 422
    assert "dwell_ms" in json.dumps(bad)

    consumer = KafkaConsumer(bootstrap_servers=kafka_bootstrap, group_id=None, enable_auto_commit=False)
    part = TopicPartition(served["topic"], 0)
    consumer.assign([part])
    consumer.seek_to_beginning(part)
    codec, clicks = EventCodec(), []
    deadline = time.monotonic() + 20
    while not clicks and time.monotonic() < deadline:
        for records in consumer.poll(timeout_ms=500).values():
            for rec in records:
                decoded = codec.decode(rec.value, rec.headers)
                if isinstance(decoded, DecodedEvent) and decoded.event["event_type"] == "click":
                    clicks.append(decoded.event)
    consumer.close()
    assert [(c["user_id"], c["item_id"], c["event_id"]) for c in clicks] == [
        (world.user_ids[1], world.item_ids[2], answer["event_id"])
    ]


def test_metrics_carry_the_freshness_of_every_written_view(served: Any) -> None:
    status, text = _call(f"{served['url']}/metrics")
    assert status == 200
    assert isinstance(text, str)
    fresh = [line for line in text.splitlines() if line.startswith("headwater_freshness") and "view=" in line]
    views = {line.split('view="', 1)[1].split('"', 1)[0] for line in fresh}
    # write_world wrote every view of every tier; each one now reports its freshness.
    assert {"user_session_realtime", "user_engagement_nearline", "item_popularity_offline"} <= views
