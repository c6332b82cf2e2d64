"""The prediction log (model inputs and scores of sampled answers) and its offline rescoring."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from headwater.serving.app import create_app
from headwater.serving.config import ServingConfig
from headwater.serving.runtime import load_models
from headwater.serving.skew import PredictionLog, PredictionLogConfig, rescore
from headwater.serving.store import InMemoryFeatureStore, now_ms
from headwater.serving.synthetic import make_world, small_registry, training_set, write_world
from headwater.serving.train import TrainOptions, train_and_save

REGISTRY = small_registry({"u": ["a", "b", "c"]}, {"i": ["x", "y"], "p": ["clicks"]}, "p.clicks")


class FakeProducer:
    def __init__(self) -> None:
        self.sent: list[tuple[str, dict[str, Any]]] = []

    def send(self, topic: str, *, value: bytes, key: bytes) -> None:
        self.sent.append((topic, json.loads(value)))

    def flush(self, timeout: float | None = None) -> None:
        return None

    def close(self, timeout: float | None = None) -> None:
        return None


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    world = make_world(REGISTRY, users=40, items=40, seed=3, empty_share=0.0)
    out = tmp_path_factory.mktemp("models")
    train_and_save(
        training_set(REGISTRY, world, slates=40, seed=3), out, TrainOptions(epochs=1, device="cpu")
    )
    return out


def logged(models: Path, users: list[str]) -> tuple[list[dict[str, Any]], str | None]:
    world = make_world(REGISTRY, users=40, items=40, seed=3, empty_share=0.0)
    store = InMemoryFeatureStore()
    write_world(store, REGISTRY, world, now_ms())
    producer = FakeProducer()
    log = PredictionLog(PredictionLogConfig(enabled=True, sample_rate=1.0, topic="preds"), lambda: producer)
    loaded = load_models(models, REGISTRY, "cpu")
    config = ServingConfig(default_deadline_ms=5000.0)
    with TestClient(create_app(config, REGISTRY, store, loaded, predictions=log)) as c:
        for user in users:
            body = {"user_id": user, "candidates": world.item_ids[:20], "k": 5}
            assert c.post("/v1/rank", json=body).status_code == 200
        deadline = time.monotonic() + 5
        while len(producer.sent) < len(users) and time.monotonic() < deadline:
            time.sleep(0.01)
    assert {t for t, _ in producer.sent} == {"preds"}
    return [r for _, r in producer.sent], loaded.models().neural_version


def test_sampled_answers_are_logged_with_inputs_and_rescore_to_the_same_scores(models: Path) -> None:
    users = [f"u{n:06d}" for n in range(12)]
    records, version = logged(models, users)
    assert [r["user_id"] for r in records] == users
    first = records[0]
    assert first["model_version"] == version
    assert first["fallback"] is None
    assert len(first["items"]) == len(first["scores"]) == len(first["item_features"]) == 5
    assert len(first["user"]) == REGISTRY.user.dim
    skew, notes = rescore(records, models)
    (row,) = skew
    assert (row.model_version, row.kind, row.requests, row.scores) == (version, "dcn", 12, 60)
    assert row.max < 1e-5  # the same model on the same inputs: float noise only
    assert notes == []


def test_a_changed_score_or_an_unknown_model_is_reported(models: Path) -> None:
    records, _ = logged(models, ["u000001", "u000002"])
    records[0]["scores"][2] += 0.01
    records[1] = {**records[1], "model_version": "not-a-model"}
    (row,), notes = rescore(records, models)
    assert row.requests == 1
    assert row.max == pytest.approx(0.01, abs=1e-5)
    assert notes == [f"request {records[1]['request_id']}: model not-a-model is not in {models}"]
