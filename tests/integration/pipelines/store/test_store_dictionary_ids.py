"""Dictionary ids fit their float32 slots (issue 16 item 8), at the 2^24 boundary, on real Redis.

``top_k`` ids (and ``last`` of a text field) are stored as float32, exact only up to 2^24: two ids
above it can round to the same float and two values would read back as one. The dictionary
stops at ``MAX_DICTIONARY_ID``; later values get ``OVERFLOW_ID``, never another value's id.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import numpy as np
import pytest
import redis

from headwater.pipelines.windows import vector
from headwater.pipelines.windows.vector import (
    ASSIGN_LUA,
    MAX_DICTIONARY_ID,
    OVERFLOW_ID,
    RedisDictionary,
    assign_script,
)


@pytest.fixture
def dictionary(redis_url: str) -> Iterator[RedisDictionary]:
    client = redis.Redis.from_url(redis_url)
    namespace = f"hwtest-dict-{uuid.uuid4().hex[:8]}"
    yield RedisDictionary(client, namespace)
    keys = list(client.scan_iter(match=f"{namespace}:*"))
    if keys:
        client.delete(*keys)
    client.close()


def test_the_boundary_is_where_float32_stops_being_exact() -> None:
    assert MAX_DICTIONARY_ID == 2**24
    last = np.float32(MAX_DICTIONARY_ID)
    assert int(last) == MAX_DICTIONARY_ID
    assert np.float32(MAX_DICTIONARY_ID + 1) == last  # the collision the cap prevents
    assert OVERFLOW_ID == 0


def test_ids_stop_at_the_boundary_never_collide_and_count_the_overflow(dictionary: RedisDictionary) -> None:
    # The production cap is 2^24 (above); the same script text with a cap of 4 shows its behaviour.
    small = RedisDictionary(dictionary.client, dictionary.namespace, max_id=4)
    assert small.ids("item_id", ["a", "b"]) == [1, 2]
    ids = small.ids("item_id", ["c", "d", "e", "f"])
    assert ids == [3, 4, OVERFLOW_ID, OVERFLOW_ID]
    assert small.overflowed("item_id") == 2  # a full dictionary is counted, never a silent 0
    # Known values keep their ids; a value past the cap stays unassigned (not written to the hash).
    fresh = RedisDictionary(dictionary.client, dictionary.namespace, max_id=4)  # no in-process cache
    assert fresh.ids("item_id", ["b", "a", "e"]) == [2, 1, OVERFLOW_ID]
    assert fresh.lookup("item_id", ["a", "e"]) == {"a": 1, "e": None}
    assert fresh.overflowed("item_id") == 3
    assert dictionary.client.hlen(dictionary.key("item_id")) == 4


def test_the_production_script_caps_at_two_to_the_24() -> None:
    assert f">= {MAX_DICTIONARY_ID} then" in ASSIGN_LUA
    assert assign_script() == ASSIGN_LUA


def test_no_lost_key_can_hand_out_an_id_twice(dictionary: RedisDictionary) -> None:
    """The old design kept the next id in a second key (``:next``); losing it reused ids 1, 2, ..."""
    assert dictionary.ids("query", ["a", "b", "c"]) == [1, 2, 3]
    # What an old deployment has, and what a kill -9, a failover or an eviction could leave of it.
    dictionary.client.set(dictionary.key("query") + ":next", 3)
    dictionary.client.delete(dictionary.key("query") + ":next", dictionary.overflow_key("query"))
    fresh = RedisDictionary(dictionary.client, dictionary.namespace)
    assert fresh.ids("query", ["d", "a"]) == [4, 1]
    got = dictionary.client.hgetall(dictionary.key("query"))
    assert sorted(int(v) for v in got.values()) == [1, 2, 3, 4]  # one value per id


def test_an_old_hash_whose_counter_was_already_lost_gets_unused_ids(dictionary: RedisDictionary) -> None:
    # Old design after a lost counter: ids 1..3 given twice (6 entries, ids <= 3). Size + 1 is unused.
    key = dictionary.key("query")
    dictionary.client.hset(key, mapping={"a": 1, "b": 2, "c": 3, "x": 1, "y": 2, "z": 3})
    assert dictionary.ids("query", ["new"]) == [7]


def test_the_process_cache_is_bounded(dictionary: RedisDictionary, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vector, "CACHE_BOUND", 10)
    values = [f"v{i:03d}" for i in range(100)]
    for start in range(0, 100, 5):
        assert dictionary.ids("q", values[start : start + 5]) == list(range(start + 1, start + 6))
        assert len(dictionary._cache["q"]) <= 10 + 5
    assert dictionary.ids("q", ["v000", "v099"]) == [1, 100]  # what left the cache is read again


def test_ids_below_the_boundary_are_dense_from_one(dictionary: RedisDictionary) -> None:
    # New values get ids in sorted order within a call: android 1, ios 2, web 3.
    assert dictionary.ids("device", ["web", "ios", "web", "android"]) == [3, 2, 3, 1]


def test_features_describe_shows_a_full_dictionary(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from click.testing import CliRunner

    from headwater.cli.registry import features
    from headwater.registry.resources import checkout_root

    isolated = redis_url.rsplit("/", 1)[0] + "/9"  # a database of its own: the tiers' namespace is "hw"
    client = redis.Redis.from_url(isolated)
    client.flushdb()
    monkeypatch.setenv("HEADWATER_REDIS_URL", isolated)
    try:
        full = RedisDictionary(client, max_id=2)
        assert full.ids("query", ["a", "b", "c", "d", "e"]) == [1, 2, OVERFLOW_ID, OVERFLOW_ID, OVERFLOW_ID]
        shown = CliRunner().invoke(
            features, ["describe", "user_search_nearline", str(checkout_root() / "features")]
        )
        assert shown.exit_code == 0, shown.output
        assert (
            "  dictionary query: 2 of 16,777,216 values, FULL, 3 values refused (stored as id 0)"
            in shown.output
        )
        client.flushdb()
        shown = CliRunner().invoke(
            features, ["describe", "user_search_nearline", str(checkout_root() / "features")]
        )
        assert "  dictionary query: 0 of 16,777,216 values, not full" in shown.output
    finally:
        client.flushdb()
        client.close()
