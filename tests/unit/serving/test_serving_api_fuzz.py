"""Fuzz the HTTP API from its own OpenAPI schema (schemathesis, in-process): zero 5xx.

Every operation of ``/openapi.json`` gets valid and invalid requests (schemathesis' positive and
negative modes); each answer must be below 500 and, for a documented status, match its schema.
The service runs with an in-memory store holding some users and items, a linear model and a
neural stand-in, so requests go down every step of the fallback chain. A second app whose store
fails every read shows the same: a broken store is a fallback, not an error.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error, response_schema_conformance, status_code_conformance

from headwater.ranking.model import LinearRanker
from headwater.ranking.synthetic import small_registry
from headwater.serving.app import create_app
from headwater.serving.config import ServingConfig
from headwater.serving.runtime import LoadedModels
from headwater.serving.store import InMemoryFeatureStore

REGISTRY = small_registry({"u": ["a", "b"]}, {"i": ["x", "y"], "p": ["clicks"]}, "p.clicks")
U, ITEM_VIEW, P = REGISTRY.user.layouts[0], *REGISTRY.item.layouts
CONFIG = ServingConfig(editorial_items=("i3",), item_cache_ttl_s=1.0, max_body_bytes=64 * 1024)
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))


class Neural:
    """Scores = the first item feature (NaN for a user whose first feature is negative)."""

    def score_batch(self, jobs: Sequence[tuple[Any, Any]]) -> list[Any]:
        return [
            np.nan_to_num(items[:, 0]).astype(np.float32) * (np.nan if user[0] < 0 else 1.0)
            for user, items in jobs
        ]


def linear() -> LinearRanker:
    return LinearRanker(
        {
            "user_mean": np.zeros(2, np.float32),
            "user_scale": np.ones(2, np.float32),
            "item_mean": np.zeros(3, np.float32),
            "item_scale": np.ones(3, np.float32),
            "w_user": np.zeros(2, np.float32),
            "w_item": np.array([0.0, 1.0, 0.0], np.float32),
            "w_cross": np.zeros((2, 3), np.float32),
            "bias": np.zeros(1, np.float32),
        }
    )


def store() -> InMemoryFeatureStore:
    s = InMemoryFeatureStore()
    now = int(time.time() * 1000)
    users = [f"u{i}" for i in range(5)] + ["", "0", "string"]
    s.write(U, users, np.arange(2 * len(users), dtype=np.float32).reshape(-1, 2) - 3, now - 2000)
    items = [f"i{i}" for i in range(10)] + ["string"]
    s.write(ITEM_VIEW, items, np.arange(2 * len(items), dtype=np.float32).reshape(-1, 2), now - 1000)
    s.write(P, items, np.arange(len(items), dtype=np.float32).reshape(-1, 1), now)
    return s


def models() -> LoadedModels:
    version = type("A", (), {"version": "abc123abc123"})()
    return LoadedModels(Neural(), version, linear(), version, "cpu")  # type: ignore[arg-type]


APP = create_app(CONFIG, REGISTRY, store(), models())
schema = schemathesis.openapi.from_asgi("/openapi.json", APP)

FAILING = InMemoryFeatureStore()
FAILING.fail = "the store is down"
DOWN_APP = create_app(CONFIG, REGISTRY, FAILING, models())
down_schema = schemathesis.openapi.from_asgi("/openapi.json", DOWN_APP)

CHECKS = [not_a_server_error, status_code_conformance, response_schema_conformance]


@schema.parametrize()
@FUZZ
def test_api_never_answers_5xx(case: schemathesis.Case) -> None:
    case.call_and_validate(checks=CHECKS)


@down_schema.parametrize()
@FUZZ
def test_api_with_a_failing_store_never_answers_5xx(case: schemathesis.Case) -> None:
    case.call_and_validate(checks=CHECKS)
