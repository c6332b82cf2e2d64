"""The retrieval runtime against a real Redis of its own: loaded and bound in one call, refreshed in the
background, and still serving its index while the store is down."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

from headwater.pipelines.store import OnlineStore, freshness_key
from headwater.pipelines.store.layout import changes_key
from headwater.pipelines.store.testing import OwnRedis
from headwater.ranking.artifact import ArtifactError
from headwater.ranking.features import BoundRegistry, registry_from_repo
from headwater.ranking.synthetic import make_world, small_registry, training_set, write_world
from headwater.serving.config import ServingConfig
from headwater.serving.retrieval import TowerOptions, load_retrieval, save_towers, train_two_tower
from headwater.serving.store import OnlineStoreReader, now_ms

REGISTRY: BoundRegistry = registry_from_repo(
    Path(__file__).resolve().parents[3] / "features", ServingConfig().popularity
)


def wait_for(predicate: object, timeout_s: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return True
        time.sleep(0.05)
    return False


def test_runtime_refreshes_in_the_background_and_survives_an_outage(
    own_redis: OwnRedis, tmp_path: Path
) -> None:
    world = make_world(REGISTRY, users=200, items=2_000, seed=31)
    ts = training_set(REGISTRY, world, slates=2_000, seed=31)
    save_towers(tmp_path, train_two_tower(ts, TowerOptions(epochs=3, threads=1)), ts)
    store = OnlineStore.from_url(own_redis.url)
    write_world(OnlineStoreReader(store), REGISTRY, world, now_ms())

    runtime = load_retrieval(tmp_path, REGISTRY, store, threads=1)
    assert runtime.last.added == 2_000
    assert runtime.version.endswith(".1")
    user = world.users[0]
    ranked, scores = runtime.retriever.retrieve(user, 2_000)
    assert len(ranked) == 2_000
    assert np.all(np.diff(scores) <= 1e-6)

    # A new item with the best item's vector appears after a background refresh.
    best = world.item_ids.index(ranked[0])
    for j, layout in enumerate(REGISTRY.item.layouts):
        lo, hi = REGISTRY.item.offsets[j], REGISTRY.item.offsets[j + 1]
        store.write_batch(layout, ["fresh"], world.items[best : best + 1, lo:hi], now_ms())
    runtime.start(interval_s=0.2)
    try:
        assert wait_for(lambda: "fresh" in runtime.index)  # upserted before that refresh's report is set
        assert len(runtime.index) == 2_001
        assert "fresh" in runtime.retriever.retrieve(user, 2)[0]
        # The store goes away: refreshes fail and are counted, the index keeps answering.
        own_redis.stop()
        assert wait_for(lambda: runtime.failures >= 2)
        assert runtime.retriever.retrieve(user, 5, exclude={"fresh"})[0][0] == ranked[0]
        own_redis.start()
        before = runtime.refresher.refreshes
        assert wait_for(lambda: runtime.refresher.refreshes > before)
    finally:
        runtime.stop()
    assert len(runtime.index) == 2_001
    store.close()


def test_an_artifact_of_other_slots_is_refused_with_the_slots(own_redis: OwnRedis, tmp_path: Path) -> None:
    other = small_registry({"u_a": ["c1", "c2"]}, {"i_a": ["x1", "x2", "p:avg"]}, "i_a.x1")
    world = make_world(other, users=100, items=200, seed=1)
    ts = training_set(other, world, slates=600, seed=1)
    save_towers(tmp_path, train_two_tower(ts, TowerOptions(epochs=1, threads=1)), ts)
    store = OnlineStore.from_url(own_redis.url)
    with pytest.raises(ArtifactError, match="slots the model needs but the registry lacks"):
        load_retrieval(tmp_path, REGISTRY, store)
    store.close()


def test_a_look_without_a_written_row_scans_nothing_and_a_write_refreshes(
    own_redis: OwnRedis, tmp_path: Path
) -> None:
    world = make_world(REGISTRY, users=100, items=300, seed=32)
    ts = training_set(REGISTRY, world, slates=600, seed=32)
    save_towers(tmp_path, train_two_tower(ts, TowerOptions(epochs=1, threads=1)), ts)
    store = OnlineStore.from_url(own_redis.url)
    write_world(OnlineStoreReader(store), REGISTRY, world, now_ms())
    runtime = load_retrieval(tmp_path, REGISTRY, store, threads=1)
    assert runtime.version.endswith(".1")
    # The freshness log did not move: no scan, same version.
    assert runtime.refresh_if_changed(full_scan_s=3600.0) is None
    # A tier's progress entry (no row written) is not a change either.
    store.publish_progress(REGISTRY.item.layouts[0], now_ms())
    assert runtime.refresh_if_changed(full_scan_s=3600.0) is None
    assert runtime.skipped == 2
    assert runtime.version.endswith(".1")
    # A written row is: the next look refreshes and embeds it.
    layout = REGISTRY.item.layouts[0]
    lo, hi = REGISTRY.item.offsets[0], REGISTRY.item.offsets[1]
    store.write_batch(layout, ["fresh"], world.items[:1, lo:hi], now_ms())
    report = runtime.refresh_if_changed(full_scan_s=3600.0)
    assert report is not None
    # write.lua named it in the item view's change feed: embedded without a scan (0 others looked at)
    assert (report.added, report.unchanged, report.version.rsplit(".", 1)[1]) == (1, 0, "2")
    assert "fresh" in runtime.index
    # A key that goes away writes nothing to the log: only the full-scan period removes it.
    for lay in REGISTRY.item.layouts:
        store.client.delete(f"{store.namespace}:{{{lay.view}}}:fresh")
    assert runtime.refresh_if_changed(full_scan_s=3600.0) is None
    assert "fresh" in runtime.index
    report = runtime.refresh_if_changed(full_scan_s=0.0)
    assert report is not None
    assert report.removed == 1
    assert "fresh" not in runtime.index
    store.close()


def test_the_change_feed_applies_what_it_names_without_a_scan(own_redis: OwnRedis, tmp_path: Path) -> None:
    world = make_world(REGISTRY, users=100, items=300, seed=33)
    ts = training_set(REGISTRY, world, slates=600, seed=33)
    save_towers(tmp_path, train_two_tower(ts, TowerOptions(epochs=1, threads=1)), ts)
    store = OnlineStore.from_url(own_redis.url)
    write_world(OnlineStoreReader(store), REGISTRY, world, now_ms())
    runtime = load_retrieval(tmp_path, REGISTRY, store, threads=1, mirror_sla_share=0.1)
    mirror = runtime.mirror
    assert mirror is not None
    for lay in REGISTRY.item.layouts:  # the refresher subscribed: each item view has its feed
        assert store.client.exists(changes_key(lay.view, store.namespace))
    layout = REGISTRY.item.layouts[0]
    lo, hi = REGISTRY.item.offsets[0], REGISTRY.item.offsets[1]

    # write.lua names the written ids in the feed, in the same call as the freshness entry.
    store.write_batch(layout, ["fresh", world.item_ids[0]], world.items[5:7, lo:hi] * 2.0, now_ms())
    report = runtime.refresh_if_changed(full_scan_s=3600.0)
    assert report is not None
    assert (report.added, report.updated, report.removed, report.unchanged) == (1, 1, 0, 0)  # no scan
    assert "fresh" in runtime.index
    ids = ["fresh", world.item_ids[0], world.item_ids[1]]
    look = mirror.lookup(ids, mirror.confirmed_ms)
    assert look is not None
    assert look.rows[0] is not None
    stored = store.read_many([(layout, ids)])[0]
    np.testing.assert_array_equal(look.rows[0].values, stored.values)
    np.testing.assert_array_equal(look.rows[0].event_time_ms, stored.event_time_ms)
    # Nothing written since: a look reads the feeds, no scan, same version.
    assert runtime.refresh_if_changed(full_scan_s=3600.0) is None
    # The feed gone (deleted): it cannot say what it missed, so the next look scans; the scan
    # re-creates it, and fed writes apply without a scan again.
    store.client.delete(changes_key(layout.view, store.namespace))
    store.write_batch(layout, [world.item_ids[1]], world.items[8:9, lo:hi] * 3.0, now_ms())
    report = runtime.refresh_if_changed(full_scan_s=3600.0)
    assert report is not None
    assert (report.updated, report.unchanged) == (1, 300)
    store.write_batch(layout, [world.item_ids[2]], world.items[9:10, lo:hi] * 3.0, now_ms())
    report = runtime.refresh_if_changed(full_scan_s=3600.0)
    assert report is not None
    assert (report.updated, report.unchanged) == (1, 0)
    # A write the feed does not name (a writer of an older write.lua: a freshness entry with rows and
    # no feed entry): the feed cannot be trusted for it, the look scans.
    store.client.xadd(freshness_key(layout.view, store.namespace), {"w": now_ms(), "n": 1, "r": 1})
    report = runtime.refresh_if_changed(full_scan_s=3600.0)
    assert report is not None
    assert (report.updated, report.unchanged) == (0, 301)
    store.close()


def test_a_restart_loads_the_snapshot_and_re_embeds_only_what_was_written_meanwhile(
    own_redis: OwnRedis, tmp_path: Path
) -> None:
    world = make_world(REGISTRY, users=100, items=2_000, seed=34)
    ts = training_set(REGISTRY, world, slates=1_000, seed=34)
    models, snap = tmp_path / "models", tmp_path / "snapshot"
    save_towers(models, train_two_tower(ts, TowerOptions(epochs=1, threads=1)), ts)
    store = OnlineStore.from_url(own_redis.url)
    write_world(OnlineStoreReader(store), REGISTRY, world, now_ms())

    first = load_retrieval(models, REGISTRY, store, threads=1, mirror_sla_share=0.1, snapshot_dir=snap)
    assert first.snapshot is not None
    assert first.snapshot.restored is None  # nothing there yet: built from the store
    assert (first.last.added, first.version.rsplit(".", 1)[1]) == (2_000, "1")
    first.stop()  # saves what it built
    assert first.snapshot.saved is not None
    assert first.snapshot.saved.items == 2_000

    # While it is down: one item rewritten with other values, one new.
    layout = REGISTRY.item.layouts[0]
    lo, hi = REGISTRY.item.offsets[0], REGISTRY.item.offsets[1]
    changed = world.item_ids[3]
    store.write_batch(layout, [changed, "fresh"], world.items[10:12, lo:hi] * 3.0, now_ms())

    again = load_retrieval(models, REGISTRY, store, threads=1, mirror_sla_share=0.1, snapshot_dir=snap)
    assert again.snapshot is not None
    assert again.snapshot.restored is not None
    assert again.snapshot.restored.items == 2_000
    report = again.last
    assert (report.added, report.updated, report.removed, report.unchanged) == (1, 1, 0, 1_999)
    assert again.version.rsplit(".", 1)[1] == "2"  # numbered on from the snapshot's

    # It answers as an index built from the store now does, and its item rows are the store's.
    built = load_retrieval(models, REGISTRY, store, threads=1, mirror_sla_share=0.1)
    for user in world.users[:10]:
        assert again.retriever.retrieve(user, 20)[0] == built.retriever.retrieve(user, 20)[0]
    ids = [changed, "fresh", world.item_ids[0], world.item_ids[1_999]]
    a, b = again.mirror, built.mirror
    assert a is not None
    assert b is not None
    at = max(a.confirmed_ms or 0, b.confirmed_ms or 0)
    got, want = a.lookup(ids, at), b.lookup(ids, at)
    assert got is not None
    assert want is not None
    assert got.known.tolist() == want.known.tolist() == [True] * 4
    for mine, theirs in zip(got.rows, want.rows, strict=True):
        assert mine is not None
        assert theirs is not None
        np.testing.assert_array_equal(mine.values, theirs.values)
        np.testing.assert_array_equal(mine.event_time_ms, theirs.event_time_ms)
    again.stop()
    store.close()
