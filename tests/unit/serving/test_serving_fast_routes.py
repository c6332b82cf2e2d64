"""The lean routes (``FastRoutes``) answer exactly as FastAPI's routes do, valid request or not.

Two apps over the same store and models, one with ``fast_routes`` (the default) and one without;
every request goes to both and the answers must be equal: status, headers that matter, and the body
less the per-request fields (request id, latency). Hand-picked bodies cover the 4xx shapes (bad
JSON, wrong types, extra and missing fields, a non-JSON content type, an empty body, the user-class
header); hypothesis adds arbitrary JSON values for every field.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from headwater.ranking.model import LinearRanker
from headwater.serving.app import create_app
from headwater.serving.config import ServingConfig
from headwater.serving.runtime import LoadedModels

from .four_items import ITEMS, REGISTRY, four_item_store

CONFIG = ServingConfig(editorial_items=("i3",), item_cache_ttl_s=0.0, max_body_bytes=8 * 1024)
PER_REQUEST = ("request_id", "latency_ms", "feature_ages_s")  # differ between any two calls


def _linear() -> LinearRanker:
    f32 = np.float32
    return LinearRanker(
        {
            "user_mean": np.zeros(2, f32), "user_scale": np.ones(2, f32), "item_mean": np.zeros(3, f32),
            "item_scale": np.ones(3, f32), "w_user": np.zeros(2, f32), "w_item": np.array([0, 1, 0], f32),
            "w_cross": np.zeros((2, 3), f32), "bias": np.zeros(1, f32),
        }
    )  # fmt: skip


@pytest.fixture(scope="module")
def clients() -> Iterator[tuple[TestClient, TestClient]]:
    store = four_item_store()
    art = type("A", (), {"version": "linlinlinlin"})()
    loaded = LoadedModels(None, None, _linear(), art, "cpu")
    fast = TestClient(create_app(CONFIG, REGISTRY, store, loaded, fast_routes=True))
    slow = TestClient(create_app(CONFIG, REGISTRY, store, loaded, fast_routes=False))
    with fast, slow:
        yield fast, slow


def _answer(client: TestClient, path: str, content: bytes, headers: dict[str, str]) -> tuple[Any, ...]:
    response = client.post(path, content=content, headers=headers)
    try:
        body = response.json()
    except ValueError:
        body = response.text
    if isinstance(body, dict):
        body = {k: v for k, v in body.items() if k not in PER_REQUEST}
    kept = {k: response.headers.get(k) for k in ("content-type", "retry-after")}
    return response.status_code, kept, body


def _same(clients: tuple[TestClient, TestClient], path: str, content: bytes, **headers: str) -> int:
    headers = {"content-type": "application/json", **headers}
    fast, slow = (_answer(c, path, content, headers) for c in clients)
    assert fast == slow
    assert fast[0] < 500, fast
    return int(fast[0])


RANK = {"user_id": "u1", "candidates": ITEMS, "k": 2, "log_impressions": False}
RECOMMEND = {"user_id": "u1", "k": 2, "log_impressions": False}

CASES: list[tuple[str, bytes, dict[str, str], int]] = [
    ("/v1/rank", json.dumps(RANK).encode(), {}, 200),
    ("/v1/rank", json.dumps({**RANK, "user_class": "batch"}).encode(), {"x-user-class": "interactive"}, 200),
    ("/v1/rank", json.dumps({**RANK, "k": 0}).encode(), {}, 422),
    ("/v1/rank", json.dumps({**RANK, "candidates": "i0"}).encode(), {}, 422),
    ("/v1/rank", json.dumps({**RANK, "extra": 1}).encode(), {}, 422),
    ("/v1/rank", json.dumps({"candidates": ITEMS}).encode(), {}, 422),
    ("/v1/rank", b'{"user_id": "u1", "candidates": [', {}, 422),
    ("/v1/rank", b"", {}, 422),
    ("/v1/rank", b"[]", {}, 422),
    ("/v1/rank", json.dumps(RANK).encode(), {"content-type": "text/plain"}, 415),  # a browser's CSRF POST
    ("/v1/rank", json.dumps(RANK).encode(), {"content-type": "application/vnd.api+json; charset=utf-8"}, 200),
    (
        "/v1/rank",
        json.dumps(RANK).encode("utf-16"),
        {},
        200,
    ),  # json.loads reads UTF-16; the lean path hands over
    ("/v1/rank", b'{"user_id": "u1", "candidates": ["i0"], "k": NaN}', {}, 422),
    ("/v1/rank", json.dumps({**RANK, "candidates": [f"i{n}" for n in range(2001)]}).encode(), {}, 413),
    ("/v1/recommend", json.dumps(RECOMMEND).encode(), {}, 404),  # no funnel in this app
    ("/v1/recommend", json.dumps({**RECOMMEND, "k": "many"}).encode(), {}, 422),
    ("/v1/recommend", b"not json", {}, 422),
]


@pytest.mark.parametrize(("path", "content", "headers", "status"), CASES)
def test_both_routes_answer_alike(
    clients: tuple[TestClient, TestClient], path: str, content: bytes, headers: dict[str, str], status: int
) -> None:
    assert _same(clients, path, content, **headers) == status


JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    field=st.sampled_from(["user_id", "candidates", "k", "priority", "deadline_ms", "log_impressions", "x"]),
    value=JSON,
    path=st.sampled_from(["/v1/rank", "/v1/recommend"]),
)
def test_any_json_value_in_any_field_gets_the_same_answer(
    clients: tuple[TestClient, TestClient], field: str, value: Any, path: str
) -> None:
    body = {**(RANK if path == "/v1/rank" else RECOMMEND), field: value}
    _same(clients, path, json.dumps(body).encode())
