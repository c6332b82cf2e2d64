"""The item-vector cache and the fetcher: hits, expiry, LRU eviction, version change, store misses."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import numpy.typing as npt
import pytest

from headwater.serving.config import ViewSpec
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


USER = ViewSpec(view="u", entity="user", features=("a", "b"))
ITEM = ViewSpec(view="i", entity="item", features=("x", "y"))


def test_fetcher_reads_misses_once_then_serves_them_from_the_cache() -> None:
    store = InMemoryFeatureStore()
    store.write(USER, ["u1"], np.array([[1.0, 2.0]], np.float32), 1_000)
    store.write(ITEM, ["i1", "i2"], rows(1.0, 2.0), 2_000)
    cache = ItemVectorCache(100, 60.0, dim=2)
    with ThreadPoolExecutor(1) as io:
        fetcher = FeatureFetcher(store, USER, ITEM, cache, io)
        first = asyncio.run(fetcher.fetch("u1", ["i2", "zz", "i1"], 5.0))
        reads = store.reads
        second = asyncio.run(fetcher.fetch("u1", ["i1", "i2"], 5.0))
    assert first.user is not None
    assert first.user.tolist() == [1.0, 2.0]
    assert first.items_found.tolist() == [True, False, True]
    np.testing.assert_array_equal(first.items[[0, 2]], rows(2.0, 1.0))
    assert np.isnan(first.items[1]).all()
    assert first.items_event_ms.tolist() == [2_000, 0, 2_000]
    assert first.missing_item_fraction == pytest.approx(1.0 / 3.0)
    # the second request reads only the user: both items come from the cache
    assert store.reads == reads + 1
    np.testing.assert_array_equal(second.items, rows(1.0, 2.0))
    assert second.items_found.all()
    assert (cache.hits, cache.misses) == (2, 3)
