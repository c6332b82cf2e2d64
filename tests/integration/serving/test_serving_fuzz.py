"""Fuzz the ranking service from its OpenAPI schema against real Redis: zero 5xx.

The service is the one ``headwater serve`` builds: the example registry, a model trained on a
synthetic world, the Redis online store seeded with that world (plus a few values that are not
what the store writes). schemathesis sends valid and invalid requests to every operation; each
answer must be below 500 and match its documented schema. Then the same with the Redis server
stopped under the service: every ranking is a fallback, never an error.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error, response_schema_conformance, status_code_conformance

from headwater.pipelines.store.testing import OwnRedis
from headwater.ranking.features import BoundRegistry, registry_from_repo
from headwater.ranking.synthetic import World, make_world, training_set, write_world
from headwater.ranking.train import TrainOptions, train_and_save
from headwater.serving.app import create_app
from headwater.serving.config import ServingConfig
from headwater.serving.funnel.build import build_funnel
from headwater.serving.retrieval import TowerOptions, save_towers, train_two_tower
from headwater.serving.runtime import load_models
from headwater.serving.store import OnlineStoreReader, now_ms

CONFIG = ServingConfig(item_cache_ttl_s=0.0, default_deadline_ms=500.0)
REGISTRY: BoundRegistry = registry_from_repo(
    Path(__file__).resolve().parents[3] / "features", CONFIG.popularity
)
FUZZ = settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
CHECKS = [not_a_server_error, status_code_conformance, response_schema_conformance]


@pytest.fixture(scope="module")
def world() -> World:
    return make_world(REGISTRY, users=50, items=80, seed=5)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory, world: World) -> Path:
    out = tmp_path_factory.mktemp("fuzz-models")
    ts = training_set(REGISTRY, world, slates=400, seed=5)
    train_and_save(ts, out, TrainOptions(epochs=1, linear_iterations=10, device="cpu"))
    save_towers(out, train_two_tower(ts, TowerOptions(epochs=1, threads=1)), ts)  # /v1/recommend's retrieval
    return out


def _seed(reader: OnlineStoreReader, world: World) -> None:
    write_world(reader, REGISTRY, world, now_ms())
    # Values that are not what the store writes, under ids the fuzzer is likely to send.
    client = reader.store.client
    for layout in (*REGISTRY.user.layouts, *REGISTRY.item.layouts):
        for entity, junk in (("string", b"\x00garbage"), ("0", b""), ("a", b"\xff" * 3)):
            client.set(reader.store.keys(layout, [entity])[0], junk)


@pytest.fixture(scope="module")
def live_schema(redis_url: str, world: World, model_dir: Path) -> Iterator[Any]:
    namespace = f"hwtest-fuzz-{uuid.uuid4().hex[:8]}"
    reader = OnlineStoreReader.from_url(redis_url, namespace=namespace, timeout_s=0.5)
    _seed(reader, world)
    loaded = load_models(model_dir, REGISTRY, "cpu")
    funnel = build_funnel(CONFIG.funnel, REGISTRY, reader.store, model_dir, loaded)
    assert funnel.retriever is not None
    app = create_app(CONFIG, REGISTRY, reader, loaded, funnel=funnel)
    yield schemathesis.openapi.from_asgi("/openapi.json", app)
    client = redis.Redis.from_url(redis_url)
    keys = list(client.scan_iter(match=f"{namespace}:*", count=1000))
    if keys:
        client.delete(*keys)
    client.close()
    reader.close()


@pytest.fixture(scope="module")
def stopped_redis_schema(
    tmp_path_factory: pytest.TempPathFactory, world: World, model_dir: Path
) -> Iterator[Any]:
    own = OwnRedis(tmp_path_factory.mktemp("own-redis"))
    own.start()
    reader = OnlineStoreReader.from_url(own.url, timeout_s=0.2)
    _seed(reader, world)
    own.stop()  # the service starts and serves with its store gone
    loaded = load_models(model_dir, REGISTRY, "cpu")
    funnel = build_funnel(CONFIG.funnel, REGISTRY, reader.store, model_dir, loaded)  # no index: store down
    app = create_app(CONFIG, REGISTRY, reader, loaded, funnel=funnel)
    yield schemathesis.openapi.from_asgi("/openapi.json", app)
    reader.close()


OPERATIONS = [
    ("POST", "/v1/rank"), ("POST", "/v1/recommend"), ("POST", "/v1/feedback"), ("GET", "/health"),
    ("GET", "/metrics"),
]  # fmt: skip


def fuzz(schema: Any, method: str, path: str) -> list[Any]:
    """Send valid and invalid requests for one operation; return the bodies of the 2xx answers.

    The schema comes from a fixture (the app needs Redis and a model), so the cases are drawn
    from schemathesis' strategies inside the test rather than by ``schema.parametrize``.
    """
    operation = schema[path][method]
    cases = st.one_of(
        operation.as_strategy(GenerationMode.POSITIVE), operation.as_strategy(GenerationMode.NEGATIVE)
    )
    served: list[Any] = []

    @FUZZ
    @given(case=cases)
    def run(case: schemathesis.Case) -> None:
        response = case.call_and_validate(checks=CHECKS)
        if response.status_code < 300:
            served.append(response.json() if path != "/metrics" else response.text)

    run()
    if path == "/v1/rank":
        # The schema cannot say that k is at most the number of candidates, so most generated
        # bodies are refused (422); one known-valid request is always among the served ones.
        valid = operation.Case(body={"user_id": "u0", "candidates": ["i000001", "i000002"], "k": 2})
        response = valid.call_and_validate(checks=CHECKS)
        if response.status_code < 300:
            served.append(response.json())
    if path == "/v1/feedback":
        # Feedback is accepted only for an item served to the user (a random one is 409): rank for
        # the user, then click the answer's top item with its request id.
        rank = schema["/v1/rank"]["POST"].Case(body={"user_id": "u0", "candidates": ["i000001"], "k": 1})
        ranked = rank.call_and_validate(checks=CHECKS)
        if ranked.status_code < 300:
            answer = ranked.json()
            click = {"user_id": "u0", "item_id": answer["items"][0]["item_id"], "event_type": "click",
                     "request_id": answer["request_id"]}  # fmt: skip
            response = operation.Case(body=click).call_and_validate(checks=CHECKS)
            if response.status_code < 300:
                served.append(response.json())
    return served


@pytest.mark.parametrize(("method", "path"), OPERATIONS)
def test_api_over_real_redis_never_answers_5xx(live_schema: Any, method: str, path: str) -> None:
    served = fuzz(live_schema, method, path)
    assert served, f"no request to {method} {path} was served: the fuzzer only sent invalid ones"


@pytest.mark.parametrize(("method", "path"), OPERATIONS)
def test_api_with_redis_stopped_never_answers_5xx(stopped_redis_schema: Any, method: str, path: str) -> None:
    served = fuzz(stopped_redis_schema, method, path)
    if path == "/v1/rank":
        assert served
        assert {answer["fallback"] for answer in served} == {"editorial"}
    if path == "/v1/recommend":
        assert served
        assert {answer["stages"][0]["fallback"] for answer in served} == {"editorial"}  # no store, no index


@st.composite
def rank_bodies(draw: st.DrawFn, world: World) -> dict[str, Any]:
    """Ranking requests over the seeded ids, the junk-valued ids and unknown ones."""
    ids = st.one_of(
        st.sampled_from(world.item_ids),
        st.sampled_from(["string", "0", "a"]),
        st.text(min_size=1, max_size=8),
    )
    candidates = draw(st.lists(ids, min_size=1, max_size=60, unique=True))
    user = draw(
        st.one_of(
            st.sampled_from(world.user_ids),
            st.sampled_from(["string", "0", "a"]),
            st.text(min_size=1, max_size=8),
        )
    )
    body: dict[str, Any] = {
        "user_id": user,
        "candidates": candidates,
        "k": draw(st.integers(1, len(candidates))),
    }
    if draw(st.booleans()):
        body["deadline_ms"] = draw(st.floats(0.001, 2000.0))
    body["priority"] = draw(st.sampled_from(["high", "normal", "low"]))
    body["log_impressions"] = False
    return body


def test_rank_over_seeded_and_junk_ids_never_answers_5xx(live_schema: Any, world: World) -> None:
    app = live_schema.app
    answers: list[tuple[int, str | None]] = []
    with TestClient(app) as client:

        @FUZZ
        @given(body=rank_bodies(world))
        def run(body: dict[str, Any]) -> None:
            response = client.post("/v1/rank", json=body)
            assert response.status_code == 200, response.text
            answer = response.json()
            assert len(answer["items"]) == body["k"]
            assert {i["item_id"] for i in answer["items"]} <= set(body["candidates"])
            answers.append((response.status_code, answer["fallback"]))

        run()
    # Requests reached the model as well as the fallbacks (a seeded user with seeded items).
    assert None in {fallback for _, fallback in answers}


@st.composite
def recommend_bodies(draw: st.DrawFn, world: World) -> dict[str, Any]:
    """Recommendation requests for seeded, junk-valued and unknown users, any k and deadline."""
    user = draw(
        st.one_of(
            st.sampled_from(world.user_ids),
            st.sampled_from(["string", "0", "a"]),
            st.text(min_size=1, max_size=8),
        )
    )
    body: dict[str, Any] = {"user_id": user, "k": draw(st.integers(1, 200))}
    if draw(st.booleans()):
        body["deadline_ms"] = draw(st.floats(0.001, 2000.0))
    body["priority"] = draw(st.sampled_from(["high", "normal", "low"]))
    body["log_impressions"] = draw(st.booleans())
    return body


def test_recommend_over_seeded_and_junk_users_never_answers_5xx(live_schema: Any, world: World) -> None:
    app = live_schema.app
    retrieved: list[str | None] = []
    with TestClient(app) as client:

        @FUZZ
        @given(body=recommend_bodies(world))
        def run(body: dict[str, Any]) -> None:
            response = client.post("/v1/recommend", json=body)
            assert response.status_code == 200, response.text
            answer = response.json()
            items = [i["item_id"] for i in answer["items"]]
            assert len(items) <= body["k"]
            assert len(set(items)) == len(items)
            assert [s["stage"] for s in answer["stages"]] == ["retrieve", "seen", "rank", "rerank", "rules"]
            retrieved.append(answer["stages"][0]["fallback"])

        run()
    # Seeded users went through retrieval; junk and unknown ones fell back.
    assert None in retrieved
