"""Fixtures of the freshness tests: a Redis DB with a unique namespace, applied plans of features/."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from headwater.pipelines.store import OnlineStore
from headwater.registry.plans import build_plans, plan_path
from headwater.registry.validate import check_repo

ROOT = Path(__file__).resolve().parents[4]
DB = 12


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    c = redis.Redis.from_url(redis_url.rsplit("/", 1)[0] + f"/{DB}")
    yield c
    c.close()


@pytest.fixture
def namespace(client: redis.Redis) -> Iterator[str]:
    ns = f"hwfresh-{uuid.uuid4().hex[:8]}"
    yield ns
    keys = list(client.scan_iter(match=f"{ns}:*", count=1000))
    if keys:
        client.delete(*keys)


@pytest.fixture
def store(client: redis.Redis, namespace: str) -> OnlineStore:
    return OnlineStore(client, namespace=namespace)


@pytest.fixture(scope="session")
def state_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Plans of the example repo, as `headwater apply features/` writes them (without Feast)."""
    state = tmp_path_factory.mktemp("hw-state")
    for tier, plan in build_plans(check_repo(ROOT / "features"), "sha256:" + "0" * 64).items():
        path = plan_path(state, tier)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(plan.model_dump_json())
    return state
