"""The fallback chain and the HTTP contract, with the in-memory store and fake scorers."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from headwater.ranking.model import LinearRanker
from headwater.serving.app import create_app
from headwater.serving.config import BatcherConfig, ServingConfig
from headwater.serving.engine import top_k
from headwater.serving.runtime import LoadedModels
from headwater.serving.store import InMemoryFeatureStore

from .four_items import ITEMS, REGISTRY, four_item_store

U, ITEM_VIEW, P = REGISTRY.user.layouts[0], *REGISTRY.item.layouts
CONFIG = ServingConfig(editorial_items=("i3", "i9"), item_cache_ttl_s=0.0)


class FakeNeural:
    """Scores = first item feature; ``mode`` = ok | raise | nan | slow."""

    def __init__(self, mode: str = "ok") -> None:
        self.mode = mode
        self.batches: list[int] = []

    def score_batch(self, jobs: Sequence[tuple[Any, Any]]) -> list[Any]:
        self.batches.append(len(jobs))
        if self.mode == "raise":
            raise RuntimeError("CUDA error: device-side assert")
        if self.mode == "slow":
            time.sleep(0.3)
        scale = np.nan if self.mode == "nan" else 1.0
        return [np.nan_to_num(items[:, 0]).astype(np.float32) * scale for _, items in jobs]


def linear(broken: bool = False) -> LinearRanker:
    z = np.zeros(2, np.float32)
    return LinearRanker(
        {
            "user_mean": z,
            "user_scale": np.ones(2, np.float32),
            "item_mean": np.zeros(3, np.float32),
            "item_scale": np.ones(3, np.float32),
            "w_user": z,
            "w_item": np.array([0.0, np.nan if broken else 1.0, 0.0], np.float32),
            "w_cross": np.zeros((2, 3), np.float32),
            "bias": np.zeros(1, np.float32),
        }
    )


def store() -> InMemoryFeatureStore:
    # x: neural order i2 > i0 > i1 > i3;  y: linear order i1 > i3 > i0 > i2
    return four_item_store()


def client(
    st: InMemoryFeatureStore, neural: Any = None, lin: Any = None, config: ServingConfig = CONFIG
) -> TestClient:
    arts = type("A", (), {"version": "abc123abc123"})()
    lin_art = type("A", (), {"version": "linlinlinlin"})()
    loaded = LoadedModels(neural, arts if neural else None, lin, lin_art if lin else None, "cpu")
    return TestClient(create_app(config, REGISTRY, st, loaded))


def rank(c: TestClient, **body: Any) -> dict[str, Any]:
    payload = {"user_id": "u1", "candidates": ITEMS, "k": 3, **body}
    response = c.post("/v1/rank", json=payload)
    assert response.status_code == 200, response.text
    return dict(response.json())


def ids(answer: dict[str, Any]) -> list[str]:
    return [x["item_id"] for x in answer["items"]]


def test_neural_answers_with_version_and_ages() -> None:
    with client(store(), FakeNeural(), linear()) as c:
        out = rank(c)
    assert ids(out) == ["i2", "i0", "i1"]
    assert [x["score"] for x in out["items"]] == [5.0, 3.0, 1.0]
    assert out["fallback"] is None
    assert out["model_version"] == "abc123abc123"
    assert out["feature_ages_s"]["user"] == pytest.approx(3.0, abs=0.5)
    assert out["feature_ages_s"]["items_max"] == pytest.approx(1.0, abs=0.5)


@pytest.mark.parametrize("mode", ["raise", "nan"])
def test_model_error_falls_back_to_linear(mode: str) -> None:
    with client(store(), FakeNeural(mode), linear()) as c:
        out = rank(c)
    assert (out["fallback"], out["fallback_reason"], out["model_version"]) == (
        "linear",
        "model_error",
        "linlinlinlin",
    )
    assert ids(out) == ["i1", "i3", "i0"]


def test_deadline_falls_back_to_linear() -> None:
    with client(store(), FakeNeural("slow"), linear()) as c:
        out = rank(c, deadline_ms=50)
    assert (out["fallback"], out["fallback_reason"]) == ("linear", "deadline")


def test_broken_linear_falls_back_to_popularity() -> None:
    with client(store(), FakeNeural("raise"), linear(broken=True)) as c:
        out = rank(c)
    assert (out["fallback"], out["fallback_reason"]) == ("popularity", "model_error")
    assert ids(out) == ["i1", "i2", "i0"]
    assert out["model_version"] is None


def test_no_model_uses_popularity() -> None:
    with client(store()) as c:
        out = rank(c)
    assert (out["fallback"], out["fallback_reason"]) == ("popularity", "no_model")


def test_missing_user_skips_the_models() -> None:
    with client(store(), FakeNeural(), linear()) as c:
        out = rank(c, user_id="stranger")
    assert (out["fallback"], out["fallback_reason"]) == ("popularity", "missing_user_features")
    assert out["feature_ages_s"]["user"] is None


def test_missing_items_rank_last() -> None:
    with client(store(), FakeNeural(), linear()) as c:
        out = rank(c, candidates=["zz", "i1", "i0"], k=3)
    assert ids(out) == ["i0", "i1", "zz"]


def test_store_down_gives_editorial() -> None:
    st = store()
    st.fail = "Connection refused"
    with client(st, FakeNeural(), linear()) as c:
        out = rank(c, candidates=["i0", "i9", "i1", "i3"], k=3)
    assert (out["fallback"], out["fallback_reason"]) == ("editorial", "store_error")
    assert ids(out) == ["i3", "i9", "i0"]
    assert out["feature_ages_s"] == {"user": None, "items_p50": None, "items_max": None}


def test_requests_are_merged_and_health_reports() -> None:
    neural = FakeNeural()
    with client(store(), neural, linear()) as c:
        rank(c)
        health = c.get("/health").json()
        metrics = c.get("/metrics").text
    assert health["model_version"] == "abc123abc123"
    assert health["device"] == "cpu"
    assert health["gpu_memory_used_percent"] is None
    assert health["inference_latency_p99_ms"] >= 0.0
    assert "headwater_batch_rows_bucket" in metrics
    assert 'headwater_queue_depth{priority="high"} 0.0' in metrics


def test_full_queue_answers_429() -> None:
    config = CONFIG.model_copy(update={"batcher": BatcherConfig(max_queue_requests=1, retry_after_s=2)})
    job = (np.zeros(2, np.float32), np.zeros((1, 2), np.float32))

    async def fill(app: Any) -> None:
        batcher = app.state.engine.batcher
        loop = asyncio.get_running_loop()
        batcher.submit(job, 1, "low", loop.time() + 10)  # taken by the worker, which sleeps
        await asyncio.sleep(0.05)
        batcher.submit(job, 1, "low", loop.time() + 10)  # waits: the 'low' queue is now full

    with client(store(), FakeNeural("slow"), linear(), config) as c:
        assert c.portal is not None
        c.portal.call(fill, c.app)
        response = c.post("/v1/rank", json={"user_id": "u1", "candidates": ITEMS, "k": 1, "priority": "low"})
        high = c.post("/v1/rank", json={"user_id": "u1", "candidates": ITEMS, "k": 1, "priority": "high"})
        metrics = c.get("/metrics").text
    assert response.status_code == 429
    assert response.headers["Retry-After"] == "2"
    assert "'low' queue holds its limit of 1" in response.json()["detail"]
    assert high.status_code == 200
    assert 'headwater_rejected_total{reason="queue_full"} 1.0' in metrics


@pytest.mark.parametrize(
    ("body", "field", "message"),
    [
        ({"candidates": ITEMS, "k": 1}, "user_id", "is required"),
        ({"user_id": "u1", "candidates": [], "k": 1}, "candidates", "must hold at least 1 entries; got 0"),
        (
            {"user_id": "u1", "candidates": [f"i{i}" for i in range(2001)], "k": 1},
            "candidates",
            "must hold at most 2000 entries; got 2001",
        ),
        (
            {"user_id": "u1", "candidates": ITEMS, "k": 5},
            "k",
            "must be between 1 and the number of candidates (4); got 5",
        ),
        ({"user_id": "u1", "candidates": ITEMS, "k": 0}, "k", "must be greater than or equal to 1; got 0"),
        (
            {"user_id": "u1", "candidates": ITEMS, "k": 1, "priority": "urgent"},
            "priority",
            "must be 'high', 'normal' or 'low'; got 'urgent'",
        ),
        (
            {"user_id": "u1", "candidates": ["a", "a"], "k": 1},
            "candidates",
            "item ids must be unique; 'a' appears more than once",
        ),
        (
            {"user_id": "u1", "candidates": ITEMS, "k": 1, "deadline_ms": -1},
            "deadline_ms",
            "must be greater than 0; got -1",
        ),
        ({"user_id": "u1", "candidates": [1, 2], "k": 1}, "candidates[0]", "must be a valid string; got 1"),
    ],
)
def test_invalid_requests_get_one_readable_message_per_field(
    body: dict[str, Any], field: str, message: str
) -> None:
    with client(store(), FakeNeural(), linear()) as c:
        response = c.post("/v1/rank", json=body)
    assert response.status_code == 422
    errors = response.json()["errors"]
    assert {"field": field, "message": message} in errors
    assert response.json()["detail"].startswith("invalid request: ")


def test_body_that_is_not_json_is_422() -> None:
    with client(store(), FakeNeural(), linear()) as c:
        response = c.post("/v1/rank", content=b"{nope", headers={"content-type": "application/json"})
    assert response.status_code == 422
    assert "not valid JSON" in response.json()["detail"]


def test_openapi_documents_rank() -> None:
    with client(store(), FakeNeural(), linear()) as c:
        spec = c.get("/openapi.json").json()
    assert "/v1/rank" in spec["paths"]
    assert "/health" in spec["paths"]
    assert spec["components"]["schemas"]["RankRequest"]["properties"]["candidates"]["maxItems"] == 2000


def test_top_k_breaks_ties_by_candidate_order() -> None:
    assert top_k(np.array([1.0, 3.0, 3.0, 2.0]), 3).tolist() == [1, 2, 3]
    assert top_k(np.array([1.0]), 1).tolist() == [0]
