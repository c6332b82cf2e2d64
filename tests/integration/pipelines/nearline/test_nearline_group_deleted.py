"""Deleting the nearline consumer group does not stop online writes (issue 33, item 3).

The Redis write fence of each task once took the group's generation as its epoch. A deleted group
(or one whose metadata expired) restarts its generations at 1, below the epoch the fence still held,
so every online write of the next worker was refused for the fence's 7 days. The claim now takes one
step above whatever holds the fence.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from kafka import KafkaAdminClient

from headwater.pipelines.nearline.plan import changelog_topic
from headwater.pipelines.settings import Settings
from headwater.pipelines.store import OnlineStore, ViewLayout
from headwater.pipelines.store.store import FencedError, fence_key

_spec = importlib.util.spec_from_file_location("nl_harness", Path(__file__).with_name("harness.py"))
assert _spec is not None
assert _spec.loader is not None
h = importlib.util.module_from_spec(_spec)
sys.modules["nl_harness"] = h
_spec.loader.exec_module(h)


@pytest.fixture
def env(settings: Settings, kafka_bootstrap: str, redis_url: str, tmp_path: Path) -> Iterator[h.Env]:
    e = h.Env(settings=settings, tmp=tmp_path, partitions=1)
    e.create()
    yield e
    e.cleanup()


def _fence(env: h.Env) -> int:
    client = redis.Redis.from_url(env.settings.redis_url)
    try:
        owner = f"{changelog_topic(env.group, 'events')}.p0"
        raw = client.get(fence_key("nl_activity", owner, env.namespace))
    finally:
        client.close()
    return int(raw) if raw is not None else 0


def test_a_claim_goes_above_the_holder_whatever_the_generation(redis_url: str) -> None:
    store = OnlineStore.from_url(redis_url, namespace="tfence")
    layout = ViewLayout(view="v_fence", entity="user", features=("a",), ttl_s=60, version="v1")
    try:
        assert store.claim_fence(layout, "owner.p0", 5) == 5  # first claim: the generation
        assert store.claim_fence(layout, "owner.p0", 1) == 6  # generations restarted: still above
        assert store.claim_fence(layout, "owner.p0", 9) == 9
        store.write_batch(layout, ["u1"], [[1.0]], 60_000, fence=("owner.p0", 9))
        with pytest.raises(FencedError):  # the previous holder (epoch 6) is refused
            store.write_batch(layout, ["u1"], [[2.0]], 120_000, fence=("owner.p0", 6))
    finally:
        for key in store.client.scan_iter(match="tfence:*"):
            store.client.unlink(key)
        store.close()


def test_online_writes_go_on_after_the_consumer_group_is_deleted(env: h.Env) -> None:
    last = h.produce(env.settings, 3_000, seed=61)
    assert env.start().wait(timeout=90) == 0
    last = h.produce(env.settings, 1_000, seed=62, start_ms=last + 1)
    assert env.start().wait(timeout=90) == 0  # a second generation of the group: the fence is above 1
    before = _fence(env)
    assert before >= 2
    assert h.compare_online(env, h.expected(env.settings)) > 50

    admin = KafkaAdminClient(bootstrap_servers=env.settings.kafka_bootstrap)
    try:
        assert admin.delete_groups([env.group]) == {env.group: "OK"}
    finally:
        admin.close()

    h.produce(env.settings, 1_500, seed=63, start_ms=last + 1)
    assert env.start().wait(timeout=90) == 0
    assert _fence(env) == before + 1  # generation 1 again, and the claim still went above the holder
    assert h.compare_online(env, h.expected(env.settings)) > 50
    logs = "".join(p.read_text(errors="replace") for p in env.tmp.glob("worker-*.log"))
    assert "fenced" not in logs
