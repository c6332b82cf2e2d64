"""The item-vector cache and the fetcher: hits, expiry, LRU eviction, version change, store misses."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import numpy.typing as npt
import pytest

from headwater.ranking.synthetic import small_registry
from headwater.serving.fetch import FeatureFetcher, ItemVectorCache
from headwater.serving.store import InMemoryFeatureStore


class Clock:
    """A settable clock for the cache."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def rows(*values: float) -> npt.NDArray[np.float32]:
    return np.array([[v, -v] for v in values], dtype=np.float32)


def cache_of(max_entries: int = 10, ttl_s: float = 5.0) -> tuple[ItemVectorCache, Clock]:
    clock = Clock()
    return ItemVectorCache(max_entries, ttl_s, dim=2, clock=clock), clock


def test_hits_return_the_cached_rows_and_event_times() -> None:
    cache, _ = cache_of()
    cache.put(["a", "b"], rows(1.0, 2.0), np.array([10, 20]), "v1")
    look = cache.lookup(["b", "x", "a"], "v1")
    assert look.hit.tolist() == [True, False, True]
    values, event_ms = cache.rows(look.slots[look.hit])
    np.testing.assert_array_equal(values, rows(2.0, 1.0))
    assert event_ms.tolist() == [20, 10]
    assert (cache.hits, cache.misses) == (2, 1)


def test_entries_expire_after_ttl_and_are_replaced_in_place() -> None:
    cache, clock = cache_of(ttl_s=5.0)
    cache.put(["a"], rows(1.0), np.array([10]), "v1")
    clock.now += 5.0
    assert cache.lookup(["a"], "v1").hit.tolist() == [True]
    clock.now += 0.001
    assert cache.lookup(["a"], "v1").hit.tolist() == [False]
    cache.put(["a"], rows(7.0), np.array([70]), "v1")
    look = cache.lookup(["a"], "v1")
    assert look.hit.tolist() == [True]
    np.testing.assert_array_equal(cache.rows(look.slots)[0], rows(7.0))
    assert len(cache) == 1


def test_a_new_registry_version_empties_the_cache() -> None:
    cache, _ = cache_of()
    cache.put(["a", "b"], rows(1.0, 2.0), np.array([10, 20]), "v1")
    assert cache.lookup(["a", "b"], "v2").hit.tolist() == [False, False]
    assert len(cache) == 0
    assert cache.version == "v2"


def test_a_full_cache_evicts_the_least_recently_used() -> None:
    cache, clock = cache_of(max_entries=8, ttl_s=100.0)
    ids = [f"i{n}" for n in range(8)]
    for n, item in enumerate(ids):
        clock.now += 1.0
        cache.put([item], rows(float(n)), np.array([n]), "v1")
    clock.now += 1.0
    cache.lookup(["i0"], "v1")  # i0 is now the most recently used; i1 the least
    cache.put(["new"], rows(99.0), np.array([99]), "v1")
    look = cache.lookup(["new", "i0", "i1", *ids[2:]], "v1")
    assert look.hit.tolist() == [True, True, False] + [True] * 6
    assert len(cache) == 8
    values, _ = cache.rows(look.slots[:2])
    np.testing.assert_array_equal(values, rows(99.0, 0.0))


def test_a_put_larger_than_the_cache_keeps_the_last_rows() -> None:
    cache, _ = cache_of(max_entries=3)
    ids = [f"i{n}" for n in range(5)]
    cache.put(ids, rows(0, 1, 2, 3, 4), np.arange(5), "v1")
    assert cache.lookup(ids, "v1").hit.tolist() == [False, False, True, True, True]


def test_zero_ttl_caches_nothing() -> None:
    cache, _ = cache_of(ttl_s=0.0)
    cache.put(["a"], rows(1.0), np.array([10]), "v1")
    assert len(cache) == 0
    assert cache.lookup(["a"], "v1").hit.tolist() == [False]


REGISTRY = small_registry({"u": ["a", "b"]}, {"i": ["x", "y:max"]}, "i.x")
USER, ITEM = REGISTRY.user.layouts[0], REGISTRY.item.layouts[0]


def test_fetcher_reads_misses_once_then_serves_them_from_the_cache() -> None:
    store = InMemoryFeatureStore()
    store.write(USER, ["u1"], np.array([[1.0, 2.0]], np.float32), 1_000)
    store.write(ITEM, ["i1", "i2"], rows(1.0, 2.0), 2_000)
    cache = ItemVectorCache(100, 60.0, dim=2)
    with ThreadPoolExecutor(1) as io:
        fetcher = FeatureFetcher(store, REGISTRY, cache, io)
        first = asyncio.run(fetcher.fetch("u1", ["i2", "zz", "i1"], 5.0))
        reads = store.reads
        second = asyncio.run(fetcher.fetch("u1", ["i1", "i2"], 5.0))
    assert first.user is not None
    assert first.user.tolist() == [1.0, 2.0]
    assert first.items_found.tolist() == [True, False, True]
    np.testing.assert_array_equal(first.items[[0, 2]], rows(2.0, 1.0))
    assert first.items[1, 0] == 0.0  # the empty-window vector: count 0, max NaN (as in training)
    assert np.isnan(first.items[1, 1])
    assert first.items_event_ms.tolist() == [2_000, 0, 2_000]
    assert first.missing_item_fraction == pytest.approx(1.0 / 3.0)
    # the second request reads only the user: both items come from the cache
    assert store.reads == reads + 1
    np.testing.assert_array_equal(second.items, rows(1.0, 2.0))
    assert second.items_found.all()
    assert (cache.hits, cache.misses) == (2, 3)


def test_user_rows_read_by_the_caller_are_not_read_again_and_cached_items_need_no_read() -> None:
    store = InMemoryFeatureStore()
    store.write(USER, ["u1"], np.array([[1.0, 2.0]], np.float32), 1_000)
    store.write(ITEM, ["i1", "i2"], rows(1.0, 2.0), 2_000)
    cache = ItemVectorCache(100, 60.0, dim=2)
    with ThreadPoolExecutor(1) as io:
        fetcher = FeatureFetcher(store, REGISTRY, cache, io)
        user_rows = store.read_many([(USER, ["u1"])])
        reads = store.reads
        first = asyncio.run(fetcher.fetch("u1", ["i1", "i2"], 5.0, user_rows))
        assert store.reads == reads + 1  # the items only
        second = asyncio.run(fetcher.fetch("u1", ["i2", "i1"], 5.0, user_rows))
        assert store.reads == reads + 1  # all cached: no read at all
        plain = asyncio.run(fetcher.fetch("u1", ["i2", "i1"], 5.0))
    for got in (first, second, plain):
        assert got.user is not None
        assert got.user.tolist() == [1.0, 2.0]
        assert got.user_event_ms == {USER.view: 1_000}
    np.testing.assert_array_equal(second.items, rows(2.0, 1.0))
    np.testing.assert_array_equal(second.items, plain.items)


MULTI = small_registry({"u1v": ["a"], "u2v": ["b:max", "c"]}, {"i1v": ["x"], "i2v": ["y:avg"]}, "i1v.x")


def test_each_side_concatenates_its_views_and_fills_a_missing_view_with_its_empty_vector() -> None:
    store = InMemoryFeatureStore()
    u1v, u2v = MULTI.user.layouts
    i1v, i2v = MULTI.item.layouts
    store.write(u1v, ["u1"], np.array([[7.0]], np.float32), 5_000)
    store.write(u2v, ["u1"], np.array([[3.0, 4.0]], np.float32), 9_000)
    store.write(u2v, ["u2"], np.array([[1.0, 2.0]], np.float32), 8_000)  # u2 has no u1v row
    store.write(i1v, ["i1", "i2"], np.array([[10.0], [20.0]], np.float32), 6_000)
    store.write(i2v, ["i2"], np.array([[0.5]], np.float32), 4_000)
    cache = ItemVectorCache(100, 60.0, dim=MULTI.item.dim)
    with ThreadPoolExecutor(1) as io:
        fetcher = FeatureFetcher(store, MULTI, cache, io)
        one = asyncio.run(fetcher.fetch("u1", ["i1", "i2"], 5.0))
        reads = store.reads
        two = asyncio.run(fetcher.fetch("u2", ["i2", "i9"], 5.0))
        swapped = FeatureFetcher(store, MULTI, cache, io, (np.array([2, 0, 1]), np.array([1, 0])))
        three = asyncio.run(swapped.fetch("u1", ["i1"], 5.0))
    assert MULTI.user.slots == ("a", "b", "c")
    assert one.user is not None
    assert one.user.tolist() == [7.0, 3.0, 4.0]
    assert one.user_event_ms == {"u1v": 5_000, "u2v": 9_000}
    assert one.items[0, 0] == 10.0
    assert np.isnan(one.items[0, 1])  # i1 has no i2v row: avg of an empty window is NaN
    assert one.items[1].tolist() == [20.0, 0.5]
    assert one.items_event_ms.tolist() == [6_000, 4_000]  # the oldest view of each item
    assert reads == 1  # one round trip for the user's 2 views and the 2 item views
    assert store.reads == 3
    assert two.user is not None
    assert two.user.tolist() == [0.0, 1.0, 2.0]  # u1v missing: count 0 (its empty value)
    assert two.user_event_ms == {"u2v": 8_000}
    assert two.items_found.tolist() == [True, False]
    assert two.items[1, 0] == 0.0
    assert three.user is not None
    assert three.user.tolist() == [4.0, 7.0, 3.0]  # the model's column order
    assert np.isnan(three.items[0, 0])
    assert three.items[0, 1] == 10.0
