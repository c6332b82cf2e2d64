"""The service's own prediction-log records, monitored: named by the model's slots like its training set."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from fastapi.testclient import TestClient

from headwater.ranking.monitor import baseline_columns, model_slots, monitor, served_from_logged
from headwater.ranking.skew_pit import parse_logged
from headwater.ranking.synthetic import make_world, small_registry, training_set, write_world
from headwater.ranking.train import TrainOptions, train_and_save
from headwater.ranking.trainset import write_parquet
from headwater.serving.app import create_app
from headwater.serving.config import ServingConfig
from headwater.serving.runtime import load_models
from headwater.serving.skew import PredictionLog, PredictionLogConfig
from headwater.serving.store import InMemoryFeatureStore, now_ms

REGISTRY = small_registry({"u": ["a", "b", "c"]}, {"i": ["x", "y"], "p": ["clicks"]}, "p.clicks")


class _Producer:
    def __init__(self) -> None:
        self.sent: list[bytes] = []

    def send(self, topic: str, *, value: bytes, key: bytes) -> None:
        self.sent.append(value)

    def flush(self, timeout: float | None = None) -> None:
        return None

    def close(self, timeout: float | None = None) -> None:
        return None


def test_logged_answers_are_monitored_against_their_training_set(tmp_path: Path) -> None:
    world = make_world(REGISTRY, users=30, items=30, seed=5, empty_share=0.0)
    ts = training_set(REGISTRY, world, slates=30, seed=5)
    write_parquet(ts, tmp_path / "training.parquet")
    train_and_save(ts, tmp_path / "models", TrainOptions(epochs=1, device="cpu"))
    store = InMemoryFeatureStore()
    write_world(store, REGISTRY, world, now_ms())
    producer = _Producer()
    log = PredictionLog(PredictionLogConfig(enabled=True, sample_rate=1.0, topic="p"), lambda: producer)
    loaded = load_models(tmp_path / "models", REGISTRY, "cpu")
    users = world.user_ids[:10]
    with TestClient(
        create_app(ServingConfig(default_deadline_ms=5000.0), REGISTRY, store, loaded, predictions=log)
    ) as c:
        for user in users:
            body = {"user_id": user, "candidates": world.item_ids[:20], "k": 5}
            assert c.post("/v1/rank", json=body).status_code == 200
        deadline = time.monotonic() + 5  # the log sends from its own thread; bounded wait, no timed assertion
        while len(producer.sent) < len(users) and time.monotonic() < deadline:
            time.sleep(0.01)
    records = [json.loads(v) for v in producer.sent]
    answers, notes = parse_logged([json.dumps(r) for r in records])
    assert (len(answers), notes) == (len(users), [])
    slots, slot_notes = model_slots(tmp_path / "models")
    assert slot_notes == []
    served, served_notes = served_from_logged(answers, slots)
    assert served_notes == []
    baseline = baseline_columns(pq.read_table(tmp_path / "training.parquet"), "training.parquet")
    report = monitor(served, baseline, {})
    # Every value the model was served is a column of its training set, under the same name.
    assert {c.column for c in report.columns} == set(baseline)
    by_column = {c.column: c for c in report.columns}
    first = REGISTRY.user.slots[0]
    expected_user = [r["user"][0] for r in records]
    assert by_column[f"user.{first}"].served.count == len(users)
    assert by_column[f"user.{first}"].served.mean == pytest.approx(float(np.mean(expected_user)), rel=1e-6)
    item_values = sum(sum(r["found"]) for r in records)
    assert by_column[f"item.{REGISTRY.item.slots[0]}"].served.count == item_values
    for c in report.columns:
        assert c.vs_training is not None
        assert math.isfinite(c.vs_training.psi)
    assert report.breaches == []
    assert "no drift against it" in report.notes[-1]  # one day served: nothing the day before
