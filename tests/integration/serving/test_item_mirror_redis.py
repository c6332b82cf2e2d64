"""The item mirror against a real Redis of its own: the rows the ranker takes from memory are the rows a
store read returns at the same moment, after writes, new items, keys that expire and views that stop
being served from memory."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from headwater.pipelines.store import OnlineStore
from headwater.pipelines.store.testing import OwnRedis
from headwater.ranking.features import BoundRegistry, registry_from_repo
from headwater.ranking.synthetic import make_world, training_set, write_world
from headwater.serving.config import ServingConfig
from headwater.serving.fetch import FeatureFetcher, ItemVectorCache, RequestFeatures
from headwater.serving.retrieval import TowerOptions, load_retrieval, save_towers, train_two_tower
from headwater.serving.store import OnlineStoreReader, now_ms

REGISTRY: BoundRegistry = registry_from_repo(
    Path(__file__).resolve().parents[3] / "features", ServingConfig().popularity
)


def same(a: RequestFeatures, b: RequestFeatures) -> None:
    """Equal vectors (NaN where NaN), found flags and event times."""
    np.testing.assert_array_equal(a.items, b.items)
    np.testing.assert_array_equal(a.items_found, b.items_found)
    np.testing.assert_array_equal(a.items_event_ms, b.items_event_ms)
    assert (a.user is None) == (b.user is None)
    if a.user is not None and b.user is not None:
        np.testing.assert_array_equal(a.user, b.user)


def test_rows_from_memory_equal_a_store_read_at_the_same_moment(own_redis: OwnRedis, tmp_path: Path) -> None:
    world = make_world(REGISTRY, users=50, items=400, seed=41)
    ts = training_set(REGISTRY, world, slates=600, seed=41)
    save_towers(tmp_path, train_two_tower(ts, TowerOptions(epochs=1, threads=1)), ts)
    store = OnlineStore.from_url(own_redis.url)
    reader = OnlineStoreReader(store)
    write_world(reader, REGISTRY, world, now_ms() - 60_000)
    runtime = load_retrieval(tmp_path, REGISTRY, store, threads=1, mirror_sla_share=0.1)
    mirror = runtime.mirror
    assert mirror is not None
    assert len(mirror) == 400
    # Every item view's bound is a tenth of its declared freshness: the realtime view's is the smallest.
    side = REGISTRY.item
    assert mirror.bounds_s == tuple(0.1 * s for s in side.freshness_s)
    realtime = [j for j, t in enumerate(side.tiers) if t == "realtime"]
    assert realtime
    assert all(mirror.bounds_s[j] <= 1.0 for j in realtime)

    io = ThreadPoolExecutor(2)
    from_store = FeatureFetcher(reader, REGISTRY, ItemVectorCache(0, 0.0, side.dim), io)
    from_memory = FeatureFetcher(reader, REGISTRY, ItemVectorCache(0, 0.0, side.dim), io, mirror=mirror)
    user = world.user_ids[0]
    candidates = [*world.item_ids[::2], "not-an-item"]

    def both() -> tuple[RequestFeatures, RequestFeatures]:
        async def go() -> tuple[RequestFeatures, RequestFeatures]:
            return (
                await from_memory.fetch(user, candidates, 10.0),
                await from_store.fetch(user, candidates, 10.0),
            )

        return asyncio.run(go())

    mirror.confirm(now_ms())
    served_before = mirror.served
    got, want = both()
    same(got, want)
    assert mirror.served - served_before == len(candidates) - 1  # the unknown id is read from the store
    assert not got.items_found[-1]

    # A write to one view of 10 items: after the refresh, memory equals the store again.
    j = next(j for j, t in enumerate(side.tiers) if t == "nearline")
    layout, lo, hi = side.layouts[j], side.offsets[j], side.offsets[j + 1]
    changed = world.item_ids[:20:2]
    store.write_batch(layout, changed, world.items[100:110, lo:hi] + 1.0, now_ms())
    stale, fresh = both()
    assert not np.array_equal(stale.items[:10], fresh.items[:10])  # the staleness the mirror adds
    report = runtime.refresh_if_changed(full_scan_s=3600.0)
    assert report is not None
    assert report.updated == 10
    same(*both())

    # A new item and a key that expires within the margin: both read from the store, so still equal.
    store.write_batch(layout, ["new-item"], world.items[:1, lo:hi], now_ms())
    short = dataclasses.replace(layout, ttl_s=1)
    store.write_batch(short, [world.item_ids[2]], world.items[5:6, lo:hi] + 2.0, now_ms())
    assert runtime.refresh_if_changed(full_scan_s=3600.0) is not None
    assert len(mirror) == 401
    candidates.append("new-item")
    read_before = mirror.read
    same(*both())
    assert mirror.read - read_before >= 2  # the expiring one and the unknown id
    deadline = time.monotonic() + 10.0
    while store.client.exists(f"{store.namespace}:{{{layout.view}}}:{world.item_ids[2]}") and (
        time.monotonic() < deadline
    ):
        time.sleep(0.1)
    got, want = both()  # the key is gone in that view: both see the empty-window vector there
    same(got, want)
    # A full scan finds the expired key (write time 0): the item (whose newest write was that key) is
    # re-embedded, and served from memory again.
    report = runtime.refresh_if_changed(full_scan_s=0.0)
    assert report is not None
    assert (report.added, report.updated, report.removed) == (0, 1, 0)
    read_before = mirror.read
    same(*both())
    assert mirror.read - read_before == 1  # only the unknown id

    # Past every view's bound nothing is served from memory: the cache path, the same rows.
    mirror.confirmed_ms = now_ms() - 10**9
    assert not any(mirror.views_served())
    served_before = mirror.served
    same(*both())
    assert mirror.served == served_before
    io.shutdown()
    store.close()


def test_a_look_that_finds_nothing_written_confirms_the_mirror(own_redis: OwnRedis, tmp_path: Path) -> None:
    world = make_world(REGISTRY, users=20, items=100, seed=42)
    ts = training_set(REGISTRY, world, slates=300, seed=42)
    save_towers(tmp_path, train_two_tower(ts, TowerOptions(epochs=1, threads=1)), ts)
    store = OnlineStore.from_url(own_redis.url)
    write_world(OnlineStoreReader(store), REGISTRY, world, now_ms())
    runtime = load_retrieval(tmp_path, REGISTRY, store, threads=1, mirror_sla_share=0.5)
    mirror = runtime.mirror
    assert mirror is not None
    assert mirror.confirmed_ms is not None
    mirror.confirmed_ms -= 100_000
    old = mirror.confirmed_ms
    assert runtime.refresh_if_changed(full_scan_s=3600.0) is None  # nothing written: skipped ...
    assert mirror.confirmed_ms > old  # ... and the mirror is known to be in step as of that look
    assert mirror.age_s() < 100.0
    store.close()
