"""The ranking service against real Redis: ranking, each fallback step, 422/429, Redis restart."""

from __future__ import annotations

import asyncio
import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import redis
import torch

from headwater.pipelines.store.testing import OwnRedis
from headwater.ranking.features import BoundRegistry, registry_from_repo
from headwater.ranking.synthetic import World, make_world, training_set, write_world
from headwater.ranking.train import TrainOptions, train_and_save
from headwater.serving.app import create_app
from headwater.serving.config import BatcherConfig, ServingConfig
from headwater.serving.runtime import LoadedModels, load_models
from headwater.serving.store import OnlineStoreReader, now_ms

CONFIG = ServingConfig()
REGISTRY: BoundRegistry = registry_from_repo(
    Path(__file__).resolve().parents[3] / "features", CONFIG.popularity
)


def write_demo(reader: OnlineStoreReader, _config: ServingConfig, rows: World) -> int:
    return write_world(reader, REGISTRY, rows, now_ms())


def create(config: ServingConfig, reader: Any, loaded: LoadedModels) -> Any:
    return create_app(config, REGISTRY, reader, loaded)


def load(model_dir: Path) -> LoadedModels:
    return load_models(model_dir, REGISTRY, "cpu")


@pytest.fixture(scope="module")
def rows() -> World:
    return make_world(REGISTRY, users=400, items=600, seed=3)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory, rows: World) -> Path:
    out = tmp_path_factory.mktemp("models")
    ts = training_set(REGISTRY, rows, slates=1_500, seed=3)
    train_and_save(ts, out, TrainOptions(epochs=1, linear_iterations=20, device="cpu"))
    return out


def _drop(url: str, namespace: str) -> None:
    client = redis.Redis.from_url(url)
    keys = list(client.scan_iter(match=f"{namespace}:*", count=1000))
    if keys:
        client.delete(*keys)
    client.close()


@pytest.fixture
def seeded(redis_url: str, rows: World) -> Iterator[OnlineStoreReader]:
    namespace = f"hwtest-serve-{uuid.uuid4().hex[:8]}"
    reader = OnlineStoreReader.from_url(redis_url, namespace=namespace)
    write_demo(reader, CONFIG, rows)
    yield reader
    reader.close()
    _drop(redis_url, namespace)


def _rank(app: Any, bodies: list[dict[str, Any]]) -> list[httpx.Response]:
    async def main() -> list[httpx.Response]:
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
                return list(await asyncio.gather(*[client.post("/v1/rank", json=b) for b in bodies]))

    return asyncio.run(main())


def _body(rows: World, n: int = 300, k: int = 10, **extra: Any) -> dict[str, Any]:
    return {"user_id": rows.user_ids[0], "candidates": rows.item_ids[:n], "k": k, **extra}


def test_rank_returns_sorted_top_k_with_version_and_ages(
    model_dir: Path, rows: World, seeded: OnlineStoreReader
) -> None:
    loaded = load(model_dir)
    [response] = _rank(create(CONFIG, seeded, loaded), [_body(rows)])
    out = response.json()
    assert response.status_code == 200
    assert out["fallback"] is None
    assert out["model_version"] == loaded.models().neural_version
    scores = [x["score"] for x in out["items"]]
    assert len(scores) == 10
    assert scores == sorted(scores, reverse=True)
    assert {x["item_id"] for x in out["items"]} <= set(rows.item_ids[:300])
    ages = out["feature_ages_s"]
    assert 0.0 <= ages["user"] < 120.0
    assert 0.0 <= ages["items_p50"] <= ages["items_max"] < 120.0
    # the same scores as the model run directly on the stored vectors
    assert loaded.neural is not None
    direct = loaded.neural.score_batch([(rows.users[0], rows.items[:300])])[0]
    best = np.argsort(-direct, kind="stable")[:10]
    assert [x["item_id"] for x in out["items"]] == [rows.item_ids[i] for i in best]
    np.testing.assert_allclose(scores, direct[best], rtol=1e-5)


def _break_neural(loaded: LoadedModels) -> None:
    assert loaded.neural is not None
    with torch.no_grad():
        for p in loaded.neural.model.parameters():
            p.fill_(float("nan"))
    loaded.neural.compile()  # an ONNX Runtime session holds its own copy of the weights


def test_broken_model_falls_back_to_linear_then_popularity(
    model_dir: Path, rows: World, seeded: OnlineStoreReader
) -> None:
    loaded = load(model_dir)
    _break_neural(loaded)
    [first] = _rank(create(CONFIG, seeded, loaded), [_body(rows)])
    assert (first.json()["fallback"], first.json()["fallback_reason"]) == ("linear", "model_error")
    assert first.json()["model_version"] == loaded.models().linear_version
    assert loaded.linear is not None
    loaded.linear.w_item[:] = np.nan
    [second] = _rank(create(CONFIG, seeded, loaded), [_body(rows)])
    out = second.json()
    assert (second.status_code, out["fallback"], out["fallback_reason"]) == (200, "popularity", "model_error")
    column = (
        REGISTRY.item.offsets[REGISTRY.item.layouts.index(REGISTRY.popularity)] + REGISTRY.popularity_slot
    )
    popularity = dict(zip(rows.item_ids, rows.items[:, column].tolist(), strict=True))
    expected = sorted(rows.item_ids[:300], key=lambda i: -popularity[i])[:10]
    assert [x["score"] for x in out["items"]] == [popularity[i] for i in expected]


def test_store_down_answers_editorial(model_dir: Path, rows: World) -> None:
    config = CONFIG.model_copy(update={"editorial_items": (rows.item_ids[5], rows.item_ids[2])})
    reader = OnlineStoreReader.from_url(f"redis://127.0.0.1:{_free_port()}/0", timeout_s=0.2)
    [response] = _rank(create(config, reader, load(model_dir)), [_body(rows, k=3)])
    out = response.json()
    assert (response.status_code, out["fallback"], out["fallback_reason"]) == (
        200,
        "editorial",
        "store_error",
    )
    assert [x["item_id"] for x in out["items"]] == [rows.item_ids[5], rows.item_ids[2], rows.item_ids[0]]


def test_invalid_request_is_422(model_dir: Path, rows: World, seeded: OnlineStoreReader) -> None:
    [response] = _rank(create(CONFIG, seeded, load(model_dir)), [_body(rows, n=3, k=4)])
    assert response.status_code == 422
    assert response.json()["errors"] == [
        {"field": "k", "message": "must be between 1 and the number of candidates (3); got 4"}
    ]


def test_full_queue_is_429_with_retry_after(model_dir: Path, rows: World, seeded: OnlineStoreReader) -> None:
    loaded = load(model_dir)
    assert loaded.neural is not None
    fast = loaded.neural.score_batch

    def slow(jobs: Any) -> Any:
        time.sleep(0.2)
        return fast(jobs)

    loaded.neural.score_batch = slow  # type: ignore[method-assign]
    config = CONFIG.model_copy(
        update={
            "batcher": BatcherConfig(max_queue_requests=2, max_batch_rows=300),
            "default_deadline_ms": 5000.0,
        }
    )
    responses = _rank(create(config, seeded, loaded), [_body(rows) for _ in range(12)])
    codes = sorted(r.status_code for r in responses)
    assert set(codes) == {200, 429}
    refused = next(r for r in responses if r.status_code == 429)
    assert refused.headers["Retry-After"] == "1"
    assert all(r.json()["fallback"] is None for r in responses if r.status_code == 200)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_redis_stopped_and_restarted_mid_test(model_dir: Path, rows: World, own_redis: OwnRedis) -> None:
    url = own_redis.url
    config = CONFIG.model_copy(update={"item_cache_ttl_s": 0.0})
    reader = OnlineStoreReader.from_url(url, timeout_s=0.3)
    write_demo(reader, config, rows)
    app = create(config, reader, load(model_dir))
    seen: list[tuple[int, str | None]] = []

    async def main() -> None:
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:

                async def ask() -> None:
                    r = await client.post("/v1/rank", json=_body(rows, n=200))
                    seen.append((r.status_code, r.json().get("fallback")))

                for _ in range(3):
                    await ask()
                own_redis.stop()
                for _ in range(5):
                    await ask()
                own_redis.start()
                await asyncio.to_thread(write_demo, reader, config, rows)
                for _ in range(3):
                    await ask()

    try:
        asyncio.run(main())
    finally:
        reader.close()
    assert [code for code, _ in seen] == [200] * 11
    assert [fb for _, fb in seen[:3]] == [None] * 3
    assert [fb for _, fb in seen[3:8]] == ["editorial"] * 5
    assert [fb for _, fb in seen[8:]] == [None] * 3
