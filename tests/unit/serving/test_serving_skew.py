"""The prediction log (model inputs and scores of sampled answers), its landing, and the skew comparison."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from hypothesis import given
from hypothesis import strategies as st

from headwater.pipelines.offline.skew_land import PredictionLandingError, predictions_path, row_of
from headwater.ranking.skew_pit import Logged, compare, labels_table, load_scorers, parse_logged
from headwater.ranking.synthetic import make_world, small_registry, training_set, write_world
from headwater.ranking.train import TrainOptions, train_and_save
from headwater.ranking.trainset import TrainingSet
from headwater.serving.app import create_app
from headwater.serving.config import ServingConfig
from headwater.serving.runtime import load_models
from headwater.serving.skew import PredictionLog, PredictionLogConfig
from headwater.serving.store import InMemoryFeatureStore, now_ms

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


def served_as_pit(logged: list[Logged]) -> TrainingSet:
    """Point-in-time rows equal to what was served (labels_table order): a service without skew."""
    users, items, times, uids, iids = [], [], [], [], []
    for answer in logged:
        for j in np.flatnonzero(answer.found):
            users.append(answer.user)
            items.append(answer.item_features[j])
            times.append(answer.at_ms)
            uids.append(answer.user_id)
            iids.append(answer.items[j])
    n = len(users)
    return TrainingSet(REGISTRY.user.slots, REGISTRY.item.slots, "test", np.stack(users), np.stack(items),
                       np.zeros(n, np.float32), np.arange(n), np.asarray(times), np.asarray(uids),
                       np.asarray(iids))  # fmt: skip


def test_sampled_answers_are_logged_and_rescore_to_the_same_scores_without_skew(models: Path) -> None:
    users = [f"u{n:06d}" for n in range(12)]
    records, version = logged(models, users)
    assert [r["user_id"] for r in records] == users
    first = records[0]
    assert first["model_version"] == version
    assert first["fallback"] is None
    assert len(first["items"]) == len(first["scores"]) == len(first["item_features"]) == 5
    assert len(first["user"]) == REGISTRY.user.dim
    answers, notes = parse_logged([json.dumps(r) for r in records])
    assert notes == []
    labels = labels_table(answers)
    assert labels.num_rows == 60
    assert labels.column("event_time").to_pylist()[:5] == [first["at_ms"]] * 5
    assert labels.column("item_id").to_pylist()[:5] == first["items"]
    scorers, load_notes = load_scorers(models)
    assert load_notes == []
    result, notes = compare(answers, served_as_pit(answers), scorers)
    (row,) = result
    assert (row.model_version, row.kind, row.requests, row.scores, row.missing_items) == (
        version,
        "dcn",
        12,
        60,
        0,
    )
    assert row.max < 1e-5  # the same model on the same inputs: float noise only
    assert row.logged_max < 1e-5
    assert all(f.differ == 0 for f in row.features)
    assert not row.breached(0.003)
    assert notes == []


def test_a_feature_that_differs_is_named_first_with_its_share_and_mean(models: Path) -> None:
    records, _ = logged(models, [f"u{n:06d}" for n in range(8)])
    answers, _ = parse_logged([json.dumps(r) for r in records])
    pit = served_as_pit(answers)
    col = REGISTRY.item.slots.index("y")
    pit.item[:10, col] += 3.0  # the first two answers' items: y differs by 3 on 10 of 40 rows
    pit.user[:5, REGISTRY.user.slots.index("a")] += 0.5  # a differs on 1 of 8 answers
    scorers, _ = load_scorers(models)
    (row,), _ = compare(answers, pit, scorers)
    first, second = row.features[:2]
    assert (first.feature, first.compared, first.differ) == ("item.y", 40, 10)
    assert first.mean_abs_diff == pytest.approx(3.0 * 10 / 40, rel=1e-5)
    assert (second.feature, second.compared, second.differ) == ("user.a", 8, 1)
    assert all(f.differ == 0 for f in row.features[2:])
    assert row.max > 0.0
    assert row.logged_max < 1e-5  # the logged inputs rescore exactly: the skew is in the features


def test_a_changed_score_or_an_unknown_model_is_reported(models: Path) -> None:
    records, _ = logged(models, ["u000001", "u000002"])
    records[0]["scores"][2] += 0.01
    records[1] = {**records[1], "model_version": "not-a-model"}
    answers, _ = parse_logged([json.dumps(r) for r in records])
    scorers, _ = load_scorers(models)
    (row,), notes = compare(answers, served_as_pit(answers), scorers)
    assert row.requests == 1
    assert row.max == pytest.approx(0.01, abs=1e-5)
    assert row.logged_max == pytest.approx(0.01, abs=1e-5)
    assert row.breached(0.003)
    assert notes == [f"request {records[1]['request_id']}: model not-a-model is not in the models folder"]


def test_records_that_are_not_predictions_are_noted_not_rescored() -> None:
    answers, notes = parse_logged(["[1, 2]", "{not json", json.dumps({"model_version": None})])
    assert answers == []
    assert notes == [
        "landed record 0: not a prediction record (not a JSON object)",
        "landed record 1: not a prediction record (Expecting property name enclosed in double quotes:"
        " line 1 column 2 (char 1))",
    ]


def test_landed_rows_keep_the_record_and_its_kafka_position() -> None:
    record = {"v": 1, "request_id": "r1", "at_ms": 1767225600123, "user_id": "u1", "model_version": "m1",
              "fallback": None, "items": []}  # fmt: skip
    row = row_of(0, 41, json.dumps(record).encode())
    position = (row["kafka_partition"], row["kafka_offset"], row["request_id"], row["at_ms"])
    assert position == (0, 41, "r1", 1767225600123)
    fields = (row["user_id"], row["model_version"], row["fallback"], str(row["day"]))
    assert fields == ("u1", "m1", None, "2026-01-01")
    assert json.loads(row["record"]) == record
    assert predictions_path(Path("/lake"), "demo.predictions") == Path("/lake/predictions/demo.predictions")
    with pytest.raises(PredictionLandingError, match="a Kafka topic name"):
        predictions_path(Path("/lake"), "../etc")


@given(st.binary(max_size=200))
def test_any_bytes_land_as_one_row_and_only_json_objects_get_a_request_id(value: bytes) -> None:
    row = row_of(3, 7, value)
    assert (row["kafka_partition"], row["kafka_offset"]) == (3, 7)
    assert isinstance(row["record"], str)
    try:
        data = json.loads(value.decode("utf-8", errors="replace"))
    except ValueError:
        data = None
    if not isinstance(data, dict):
        assert row["request_id"] is None


def test_the_demo_line_gives_each_version_and_the_features_that_differ_most() -> None:
    from headwater.ranking.skew_pit import FeatureSkew, VersionSkew
    from headwater.serving.skew import summary_line

    same = [FeatureSkew("user.x", 10, 0, 0.0)]
    clean = VersionSkew("a" * 16, "dcn", 10, 50, 1e-8, 2e-8, 3e-8, 1e-8, 0, same)
    differ = [FeatureSkew("user.clicks", 4, 2, 3.0), FeatureSkew("item.p", 20, 1, 0.1)]
    skewed = VersionSkew("b" * 16, "linear", 4, 20, 0.001, 0.02, 0.05, 1e-8, 1, differ)
    assert summary_line([clean, skewed], 0.003, 14) == (
        "prediction skew over 14 logged answers vs 0.003: aaaaaaaaaaaa (dcn) 50 scores p99 2.00e-08"
        " max 3.00e-08 ok; bbbbbbbbbbbb (linear) 20 scores p99 2.00e-02 max 5.00e-02 BREACH; features"
        " differing most:"
        " user.clicks (50% of rows), item.p (5% of rows)"
    )


def test_exit_2_when_no_figures_so_that_1_stays_the_verdict(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from headwater.cli.experiment import report
    from headwater.cli.skew import skew_command

    missing = str(tmp_path / "no-state")
    skew = CliRunner().invoke(skew_command, ["--state-dir", missing, "--topic", "t"])
    assert skew.exit_code == 2
    assert f"no offline plan at {missing}/plans/offline.json" in skew.output
    experiment = CliRunner().invoke(report, ["--state-dir", missing, "--weights", "a=1,b=1"])
    assert experiment.exit_code == 2
    assert f"no offline plan at {missing}/plans/offline.json" in experiment.output
