"""A writing tier refuses a Redis that evicts values at a memory limit, unless declared (issue 33)."""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from headwater.pipelines.store.connect import EvictingStoreError, check_eviction_policy


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[redis.Redis[bytes]]:
    """A redis-server of this test's own (a policy changed on the shared one would leak into others)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    server = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--dir", str(tmp_path)],
        stdout=subprocess.DEVNULL,
    )
    client = redis.Redis(port=port)
    try:
        for _ in range(100):
            try:
                client.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.05)
        yield client
    finally:
        client.close()
        server.terminate()
        server.wait(timeout=10)


def test_noeviction_is_accepted(private_redis: redis.Redis[bytes]) -> None:
    private_redis.config_set("maxmemory", "64mb")
    assert check_eviction_policy(private_redis) == "noeviction"


@pytest.mark.parametrize("policy", ["allkeys-lru", "volatile-ttl", "allkeys-random"])
def test_an_evicting_policy_with_a_limit_is_refused_with_the_fix(
    private_redis: redis.Redis[bytes], policy: str
) -> None:
    private_redis.config_set("maxmemory", "64mb")
    private_redis.config_set("maxmemory-policy", policy)
    with pytest.raises(EvictingStoreError) as refused:
        check_eviction_policy(private_redis, tier="the nearline tier")
    message = str(refused.value)
    assert message.startswith(
        f"the nearline tier: the online store evicts values at its memory limit (maxmemory-policy {policy})"
    )
    assert "--maxmemory-policy noeviction" in message
    assert "`redis: {eviction: allow}` in headwater.yaml" in message
    assert refused.value.exit_code == 1


def test_a_declared_eviction_is_accepted(private_redis: redis.Redis[bytes]) -> None:
    private_redis.config_set("maxmemory", "64mb")
    private_redis.config_set("maxmemory-policy", "allkeys-lru")
    assert check_eviction_policy(private_redis, allowed="allow") == "allkeys-lru"


def test_an_evicting_policy_without_a_memory_limit_never_evicts(private_redis: redis.Redis[bytes]) -> None:
    private_redis.config_set("maxmemory", "0")
    private_redis.config_set("maxmemory-policy", "allkeys-lru")
    assert check_eviction_policy(private_redis) == "allkeys-lru"


def test_the_offline_tiers_writing_store_refuses_an_evicting_redis(
    private_redis: redis.Redis[bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    from headwater.cli.offline import online_store

    private_redis.config_set("maxmemory", "64mb")
    private_redis.config_set("maxmemory-policy", "allkeys-lfu")
    url = f"redis://127.0.0.1:{private_redis.connection_pool.connection_kwargs['port']}/0"
    with pytest.raises(EvictingStoreError, match=r"the offline tier: .*allkeys-lfu"):
        online_store(url, writes=True)
    online_store(url).close()  # a reader (skew, consistency) is not refused
