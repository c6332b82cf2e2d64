"""The funnel's per-user memory in real Redis: bounded, windowed, expiring; writes never raise."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import redis

from headwater.pipelines.store.testing import OwnRedis
from headwater.pipelines.store.transport import StoreUnavailableError
from headwater.serving.funnel.config import FunnelConfig
from headwater.serving.funnel.recent import RedisRecentItems

T0 = 1_767_225_600_000


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    c = redis.Redis.from_url(redis_url)
    yield c
    c.close()


@pytest.fixture
def namespace(client: redis.Redis) -> Iterator[str]:
    name = f"hwtest-recent-{uuid.uuid4().hex[:8]}"
    yield name
    keys = list(client.scan_iter(match=f"{name}:*", count=1000))
    if keys:
        client.delete(*keys)


def test_seen_is_bounded_windowed_and_expiring(client: redis.Redis, namespace: str) -> None:
    cfg = FunnelConfig(seen_max=3, seen_window_s=10.0, clicks_max=2, popular_max=2)
    recent = RedisRecentItems(client, namespace, cfg)
    for j, item in enumerate("abcde"):
        recent.served("u1", [item], T0 + j)
    assert recent.flush_now() == 5
    assert recent.read("u1", T0 + 5).seen == frozenset("cde")  # the newest 3 kept
    assert 0 < client.pttl(recent.key("seen", "u1")) <= 10_000
    recent.served("u1", ["x"], T0 + 20_000)  # the others are now older than the window
    recent.flush_now()
    assert recent.read("u1", T0 + 20_000).seen == frozenset("x")
    assert client.zcard(recent.key("seen", "u1")) == 1


def test_clicks_keep_the_newest_and_feed_popularity(client: redis.Redis, namespace: str) -> None:
    recent = RedisRecentItems(client, namespace, FunnelConfig(clicks_max=2, popular_max=2))
    for j, item in enumerate(["p", "q", "p", "r", "p", "q"]):
        recent.clicked("u2", item, T0 + j)
    recent.flush_now()
    assert recent.read("u2", T0 + 10).clicks == ("q", "p")  # newest first, at most 2
    assert recent.popular(5) == ["p", "q"]  # 3 and 2 clicks; r (1) trimmed away
    assert recent.put_categories({"p": "shoes", "q": "books"}) == 2
    assert recent.categories(["q", "zz", "p"]) == ["books", None, "shoes"]


def test_categories_are_kept_in_process_for_the_configured_time(
    client: redis.Redis, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = [1000.0]
    monkeypatch.setattr("headwater.serving.funnel.recent.time.monotonic", lambda: now[0])
    recent = RedisRecentItems(client, namespace, FunnelConfig(categories_cache_s=60.0))
    recent.put_categories({"p": "shoes", "q": "books"})
    assert recent.cached_categories(["p"]) is None  # nothing read yet
    assert recent.categories(["p", "q", "zz"]) == ["shoes", "books", None]
    recent.put_categories({"p": "hats"})
    assert recent.cached_categories(["zz", "p"]) == [None, "shoes"]  # the copy, no read
    assert recent.cached_categories(["p", "other"]) is None  # one not read yet
    assert recent.categories(["p", "other"]) == ["shoes", None]  # only "other" is read: p is the copy's
    assert recent.categories(["q", "p"]) == ["books", "shoes"]
    now[0] += 61.0  # the period is over: the change in Redis is seen
    assert recent.cached_categories(["p"]) is None
    assert recent.categories(["p"]) == ["hats"]
    off = RedisRecentItems(client, namespace, FunnelConfig(categories_cache_s=0.0))
    assert off.categories(["p"]) == ["hats"]
    assert off.cached_categories(["p"]) is None


def test_writes_to_a_stopped_redis_are_counted_not_raised(own_redis: OwnRedis) -> None:
    c = redis.Redis.from_url(own_redis.url, socket_timeout=0.5, socket_connect_timeout=0.5)
    recent = RedisRecentItems(c, "hw", FunnelConfig(write_buffer=2))
    own_redis.stop()
    recent.served("u", ["a"], T0)
    recent.clicked("u", "a", T0)
    recent.served("u", ["b"], T0)  # the queue holds 2: this one is dropped
    assert recent.counters.dropped == 1
    recent.flush_now()
    assert recent.counters.failed == 2
    assert recent.counters.written == 0
    with pytest.raises(StoreUnavailableError):
        recent.read("u", T0)  # reads raise (the store's transport); the funnel falls back
    c.close()
