"""Experiments in the service without Kafka: assignment, per-arm scoring, arm on events, business metrics."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError

from headwater.pipelines.events.codec import DecodedEvent, EventCodec
from headwater.ranking.artifact import Binding
from headwater.ranking.model import LinearRanker
from headwater.ranking.synthetic import small_registry
from headwater.serving.app import create_app
from headwater.serving.config import ServingConfig, ServingConfigError, load_config
from headwater.serving.experiments import ArmConfig, Assigner, ExperimentConfig, unit_hash
from headwater.serving.feedback import FeedbackProducer
from headwater.serving.runtime import LoadedModels
from headwater.serving.store import InMemoryFeatureStore

REGISTRY = small_registry({"u": ["a", "b"]}, {"i": ["x", "y"], "p": ["clicks"]}, "p.clicks")
U, ITEM_VIEW, P = REGISTRY.user.layouts[0], *REGISTRY.item.layouts
ITEMS = ["i0", "i1", "i2", "i3"]
USERS = [f"u{n}" for n in range(40)]


class FakeNeural:
    """Scores = item feature ``column`` (x: i2 > i0 > i1 > i3; y: i1 > i3 > i0 > i2)."""

    def __init__(self, column: int = 0) -> None:
        self.column = column

    def score_batch(self, jobs: Sequence[tuple[Any, Any]]) -> list[Any]:
        return [np.asarray(items[:, self.column], np.float32) for _, items in jobs]


def linear() -> LinearRanker:
    z = np.zeros(2, np.float32)
    return LinearRanker(
        {
            "user_mean": z,
            "user_scale": np.ones(2, np.float32),
            "item_mean": np.zeros(3, np.float32),
            "item_scale": np.ones(3, np.float32),
            "w_user": z,
            "w_item": np.array([0.0, 1.0, 0.0], np.float32),
            "w_cross": np.zeros((2, 3), np.float32),
            "bias": np.zeros(1, np.float32),
        }
    )


def loaded(neural: Any, version: str) -> LoadedModels:
    art = type("A", (), {"version": version})()
    lin_art = type("A", (), {"version": "lin-" + version})()
    return LoadedModels(neural, art, linear(), lin_art, "cpu")


def store() -> InMemoryFeatureStore:
    s = InMemoryFeatureStore()
    now = int(time.time() * 1000)
    s.write(U, USERS, np.tile(np.array([[1.0, 2.0]], np.float32), (len(USERS), 1)), now - 3000)
    s.write(ITEM_VIEW, ITEMS, np.array([[3, 1], [1, 4], [5, 0], [0, 2]], np.float32), now - 1000)
    s.write(P, ITEMS, np.array([[10], [30], [20], [0]], np.float32), now)
    return s


EXPERIMENT = ExperimentConfig(
    name="ranker-v2",
    arms=(
        ArmConfig(name="control", weight=2),
        ArmConfig(name="treatment", weight=1, model=Path("unused-in-unit-tests")),
        ArmConfig(name="linear", weight=1, start_at="linear"),
    ),
)


# --- assignment ------------------------------------------------------------------------------------


def test_unit_hash_is_the_first_eight_bytes_of_sha256_of_salt_nul_user() -> None:
    digest = hashlib.sha256(b"ranker-v2\x00u42").digest()
    assert unit_hash("ranker-v2", "u42") == int.from_bytes(digest[:8], "big") / 2**64
    assert 0.0 <= unit_hash("", "") < 1.0


def test_assignment_is_stable_and_follows_the_weights() -> None:
    a, again = Assigner(EXPERIMENT), Assigner(EXPERIMENT)
    users = [f"user-{n}" for n in range(60_000)]
    arms = [a.arm(u) for u in users]
    assert arms == [again.arm(u) for u in users]  # stable across instances (restarts, replicas)
    n = len(users)
    for name, share in EXPERIMENT.shares().items():
        count = arms.count(name)
        sigma = (n * share * (1 - share)) ** 0.5
        assert abs(count - n * share) < 5 * sigma, (name, count, n * share)


def test_the_salt_reshuffles_users() -> None:
    other = Assigner(EXPERIMENT.model_copy(update={"salt": "another"}))
    base = Assigner(EXPERIMENT)
    users = [f"user-{n}" for n in range(2_000)]
    moved = sum(base.arm(u) != other.arm(u) for u in users)
    # independent assignments agree with probability sum(share^2) = 0.375
    assert 0.55 < moved / len(users) < 0.70


def test_experiment_config_errors_name_the_field(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="repeated: a"):
        ExperimentConfig(name="e", arms=(ArmConfig(name="a", weight=1), ArmConfig(name="a", weight=1)))
    path = tmp_path / "serving.yaml"
    path.write_text(
        "experiment:\n  name: e\n  arms:\n    - {name: a, weight: 0}\n    - {name: b, weight: 1}\n"
    )
    with pytest.raises(ServingConfigError, match=r"serving.yaml: line 4: experiment.arms.0.weight"):
        load_config(path)
    path.write_text("experiment:\n  name: e\n  arms:\n    - {name: a, weight: 1}\n")
    with pytest.raises(ServingConfigError, match=r"experiment\.arms"):
        load_config(path)


def test_only_one_experiment_runs_at_a_time_and_the_error_names_the_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "serving.yaml"
    arms = "  arms:\n    - {name: a, weight: 1}\n    - {name: b, weight: 1}\n"
    path.write_text(f"popularity: p.clicks\nexperiments:\n- name: e1\n{arms}- name: e2\n{arms}")
    with pytest.raises(ServingConfigError, match=r"serving.yaml, line 2: one experiment runs at a time"):
        load_config(path)
    path.write_text(f"experiment:\n- name: e1\n{arms}")
    with pytest.raises(ServingConfigError, match=r"serving.yaml, line 1: one experiment runs at a time"):
        load_config(path)


# --- the service ----------------------------------------------------------------------------------


class FakeSink:
    def __init__(self) -> None:
        self.values: list[tuple[bytes, list[tuple[str, bytes]]]] = []

    def send(self, topic: str, *, value: bytes, key: bytes, headers: list[tuple[str, bytes]]) -> Any:
        self.values.append((value, headers))
        return type("F", (), {"add_callback": lambda s, f: s, "add_errback": lambda s, f: s})()

    def send_many(
        self, topic: str, *, values: Any, key: Any, headers: Any, on_sent: Any, on_failed: Any
    ) -> int:
        self.values.extend((value, headers) for value in values)
        return len(values)

    def poll(self) -> None:
        return None

    def flush(self, timeout: float | None = None) -> None:
        return None

    def close(self, timeout: float | None = None) -> None:
        return None


def client(sink: FakeSink | None = None) -> TestClient:
    config = ServingConfig(item_cache_ttl_s=0.0, experiment=EXPERIMENT, default_deadline_ms=5000.0)
    producer = FeedbackProducer("events-test", lambda: sink) if sink is not None else None
    arms = {"treatment": loaded(FakeNeural(column=1), "v2v2v2v2")}
    app = create_app(config, REGISTRY, store(), loaded(FakeNeural(), "v1v1v1v1"), producer, arm_loaded=arms)
    return TestClient(app)


def ids(answer: dict[str, Any]) -> list[str]:
    return [x["item_id"] for x in answer["items"]]


def test_each_arm_scores_with_its_model_or_funnel_setting() -> None:
    assigner = Assigner(EXPERIMENT)
    with client() as c:
        for user in USERS:
            out = c.post("/v1/rank", json={"user_id": user, "candidates": ITEMS, "k": 3}).json()
            arm = assigner.arm(user)
            assert out["arm"] == f"ranker-v2/{arm}"
            if arm == "control":
                assert (ids(out), out["model_version"], out["fallback"]) == (
                    ["i2", "i0", "i1"],
                    "v1v1v1v1",
                    None,
                )
            elif arm == "treatment":
                assert (ids(out), out["model_version"], out["fallback"]) == (
                    ["i1", "i3", "i0"],
                    "v2v2v2v2",
                    None,
                )
            else:
                assert (out["model_version"], out["fallback"], out["fallback_reason"]) == (
                    "lin-v1v1v1v1",
                    "linear",
                    "experiment",
                )
    assert {assigner.arm(u) for u in USERS} == {"control", "treatment", "linear"}


def test_the_arm_travels_with_impressions_and_feedback() -> None:
    sink = FakeSink()
    user = USERS[0]
    label = Assigner(EXPERIMENT).label(user)
    with client(sink) as c:
        out = c.post("/v1/rank", json={"user_id": user, "candidates": ITEMS, "k": 2}).json()
        posted = c.post(
            "/v1/feedback",
            json={
                "user_id": user,
                "item_id": ids(out)[0],
                "event_type": "click",
                "request_id": out["request_id"],
            },
        )
        assert posted.status_code == 202, posted.text
        deadline = time.monotonic() + 5
        while len(sink.values) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
    codec = EventCodec()
    events = []
    for value, headers in sink.values:
        decoded = codec.decode(value, headers)
        assert isinstance(decoded, DecodedEvent)
        events.append(decoded.event)
    assert [(e["event_type"], e["arm"]) for e in events] == [
        ("impression", label),
        ("impression", label),
        ("click", label),
    ]


def metric(text: str, name: str, **labels: str) -> float:
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no {name}{{{want}}} in /metrics")


def test_business_metrics_count_impressions_and_clicks_per_version_arm_and_fallback() -> None:
    assigner = Assigner(EXPERIMENT)
    control = next(u for u in USERS if assigner.arm(u) == "control")
    lin = next(u for u in USERS if assigner.arm(u) == "linear")
    with client() as c:
        first = c.post("/v1/rank", json={"user_id": control, "candidates": ITEMS, "k": 3}).json()
        c.post("/v1/rank", json={"user_id": control, "candidates": ITEMS, "k": 2})
        c.post("/v1/rank", json={"user_id": lin, "candidates": ITEMS, "k": 4})
        c.post("/v1/rank", json={"user_id": lin, "candidates": ITEMS, "k": 4, "log_impressions": False})
        click = {"user_id": control, "item_id": "i2", "event_type": "click"}
        c.post("/v1/feedback", json={**click, "request_id": first["request_id"]})
        c.post("/v1/feedback", json={**click, "session_id": "not-remembered"})
        c.post("/v1/feedback", json={**click, "event_type": "like", "request_id": first["request_id"]})
        text = c.get("/metrics").text
    arm_c, arm_l = "ranker-v2/control", "ranker-v2/linear"
    assert (
        metric(text, "headwater_impressions_total", model_version="v1v1v1v1", arm=arm_c, fallback="none") == 5
    )
    assert (
        metric(
            text, "headwater_impressions_total", model_version="lin-v1v1v1v1", arm=arm_l, fallback="linear"
        )
        == 4
    )
    assert metric(text, "headwater_clicks_total", model_version="v1v1v1v1", arm=arm_c, fallback="none") == 1
    assert metric(text, "headwater_clicks_total", model_version="unknown", arm=arm_c, fallback="unknown") == 1


def test_without_an_experiment_answers_carry_no_arm() -> None:
    config = ServingConfig(item_cache_ttl_s=0.0, default_deadline_ms=5000.0)
    app = create_app(config, REGISTRY, store(), loaded(FakeNeural(), "v1v1v1v1"))
    with TestClient(app) as c:
        out = c.post("/v1/rank", json={"user_id": USERS[0], "candidates": ITEMS, "k": 3}).json()
        text = c.get("/metrics").text
    assert out["arm"] is None
    assert (
        metric(text, "headwater_impressions_total", model_version="v1v1v1v1", arm="none", fallback="none")
        == 3
    )


def test_model_answers_count_version_drift_per_model_version() -> None:
    # The treatment arm's model was trained on another version of the item view than the applied one:
    # every answer it scores drifts; the control's and the linear arm's do not.
    config = ServingConfig(item_cache_ttl_s=0.0, experiment=EXPERIMENT, default_deadline_ms=5000.0)
    drifted = loaded(FakeNeural(column=1), "v2v2v2v2")
    drifted = LoadedModels(drifted.neural, drifted.neural_artifact, drifted.linear, drifted.linear_artifact,
                           "cpu", Binding(None, None, changed_views=(ITEM_VIEW.view,)))  # fmt: skip
    app = create_app(
        config, REGISTRY, store(), loaded(FakeNeural(), "v1v1v1v1"), arm_loaded={"treatment": drifted}
    )
    assigner = Assigner(EXPERIMENT)
    arm_users = {
        arm: [u for u in USERS if assigner.arm(u) == arm] for arm in ("control", "treatment", "linear")
    }
    with TestClient(app) as c:
        for arm, users in arm_users.items():
            for user in users:
                answer = c.post("/v1/rank", json={"user_id": user, "candidates": ITEMS, "k": 2}).json()
                assert answer["arm"] == f"ranker-v2/{arm}"
        text = c.get("/metrics").text
    name = "headwater_model_answers_total"
    assert metric(text, name, model_version="v2v2v2v2", version_drift="true") == len(arm_users["treatment"])
    assert metric(text, name, model_version="v1v1v1v1", version_drift="false") == len(arm_users["control"])
    assert metric(text, name, model_version="lin-v1v1v1v1", version_drift="false") == len(arm_users["linear"])
    assert f'{name}{{model_version="v2v2v2v2",version_drift="false"}}' not in text
