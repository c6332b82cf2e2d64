"""Retrieval against real Redis: the item index built from vectors written through the online store,
its recall@100 against exact search, and an incremental refresh after updates, deletes and inserts."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import redis

from headwater.pipelines.store import OnlineStore, freshness_key
from headwater.pipelines.store.layout import changes_key
from headwater.ranking.features import BoundRegistry, registry_from_repo
from headwater.ranking.synthetic import make_world, training_set, write_world
from headwater.serving.config import ServingConfig
from headwater.serving.retrieval import (
    ExactIndex,
    IndexRefresher,
    ItemIndex,
    StoreItemSource,
    TowerOptions,
    TwoTowerRetriever,
    recall_at_k,
    save_towers,
    train_two_tower,
)
from headwater.serving.store import OnlineStoreReader, now_ms

REGISTRY: BoundRegistry = registry_from_repo(
    Path(__file__).resolve().parents[3] / "features", ServingConfig().popularity
)
ITEMS = 5_000


@pytest.fixture
def store(redis_url: str) -> Iterator[OnlineStore]:
    """The shared Redis under a namespace of this test only, emptied at the end."""
    client = redis.Redis.from_url(redis_url)
    online = OnlineStore(client, namespace=f"hwret{uuid.uuid4().hex[:8]}")
    yield online
    for layout in (*REGISTRY.user.layouts, *REGISTRY.item.layouts):
        online.delete_view(layout.view)
    client.close()


def test_index_from_the_store_recall_and_incremental_refresh(store: OnlineStore, tmp_path: Path) -> None:
    world = make_world(REGISTRY, users=400, items=ITEMS, seed=11)
    report = train_two_tower(
        training_set(REGISTRY, world, slates=3000, seed=11), TowerOptions(epochs=4, threads=1)
    )
    artifact = save_towers(tmp_path, report, training_set(REGISTRY, world, slates=3000, seed=11))
    model = artifact.model
    write_world(OnlineStoreReader(store), REGISTRY, world, now_ms())

    source = StoreItemSource(store, REGISTRY.item, batch=1000)
    index = ItemIndex(model.embed_dim, threads=1)
    refresher = IndexRefresher(source, model, index, artifact.version)
    first = refresher.refresh()
    assert (first.added, first.updated, first.removed, first.catalog) == (ITEMS, 0, 0, ITEMS)
    assert first.version == f"{artifact.version}.1"

    # The vectors read back from Redis are the ones written: the index equals an exact one built
    # from the world directly, up to the approximation.
    exact = ExactIndex(model.embed_dim)
    exact.upsert(world.item_ids, model.embed_items(world.items))
    queries = model.embed_users(world.users[:300])
    recall = recall_at_k(index, exact, queries, 100)
    print(f"retrieval recall@100 (usearch HNSW vs exact, {ITEMS} items from Redis, 300 users): {recall:.4f}")
    assert recall >= 0.95
    top_exact, top_scores = exact.search(queries[0], 5)
    top_index, index_scores = index.search(queries[0], 5)
    assert top_index[0] == top_exact[0]
    np.testing.assert_allclose(index_scores[0], top_scores[0], atol=1e-5)

    # Nothing changed: nothing is re-read, and the freshness logs have not moved.
    position = refresher.log_position()
    again = refresher.refresh()
    assert (again.added, again.updated, again.removed, again.unchanged) == (0, 0, 0, ITEMS)
    assert refresher.log_position() == position

    # Changes through the store: the user's best item is deleted (every item view), the item it
    # ranked last gets the best one's vector in ONE view's slots only (others keep theirs), 40 more
    # are deleted, 25 new ones are written.
    retriever = TwoTowerRetriever(model, index)
    user = world.users[0]
    ranked, _ = retriever.retrieve(user, ITEMS)
    best, worst = ranked[0], ranked[-1]
    best_row, worst_row = world.item_ids.index(best), world.item_ids.index(worst)
    deleted = [best, *ranked[100:140]]
    for layout in REGISTRY.item.layouts:
        store.client.delete(*[f"{store.namespace}:{{{layout.view}}}:{i}" for i in deleted])
    new_vector = world.items[worst_row].copy()
    offsets = REGISTRY.item.offsets
    changed_view = max(range(len(offsets) - 1), key=lambda j: offsets[j + 1] - offsets[j])
    lo, hi = offsets[changed_view], offsets[changed_view + 1]
    new_vector[lo:hi] = world.items[best_row, lo:hi]
    later = now_ms() + 1000
    store.write_batch(REGISTRY.item.layouts[changed_view], [worst], new_vector[None, lo:hi], later)
    new_ids = [f"new{j:03d}" for j in range(25)]
    new_items = make_world(REGISTRY, users=1, items=25, seed=12).items
    for j, layout in enumerate(REGISTRY.item.layouts):
        block = np.ascontiguousarray(new_items[:, offsets[j] : offsets[j + 1]])
        store.write_batch(layout, new_ids, block, later)

    step = refresher.refresh()
    assert (step.added, step.updated, step.removed) == (25, 1, 41)
    assert step.unchanged == ITEMS - 41 - 1
    assert step.catalog == ITEMS - 41 + 25 == len(index)
    assert step.version == f"{artifact.version}.3"
    assert refresher.log_position() != position
    ranked_after, _ = retriever.retrieve(user, ITEMS)
    assert not set(deleted) & set(ranked_after)
    assert set(new_ids) <= set(ranked_after)
    # The changed item is scored from its new vector (exactly what an exact search says).
    exact.remove(deleted)
    exact.upsert([worst, *new_ids], model.embed_items(np.vstack([new_vector[None, :], new_items])))
    want, _ = exact.search(model.embed_users(user[None])[0], 10)
    got, _ = retriever.retrieve(user, 10)
    assert len(set(got) & set(want)) >= 9
    assert ranked_after.index(worst) < ranked.index(worst)


def test_the_change_feed_is_named_in_one_place_and_delete_view_removes_it(store: OnlineStore) -> None:
    """``write.lua`` appends to the feed at ``changes_key`` (the name the refresher creates), and
    ``OnlineStore.delete_view`` leaves neither the values, the freshness log nor the feed behind."""
    layout = REGISTRY.item.layouts[0]
    client = store.client
    feed, fresh = changes_key(layout.view, store.namespace), freshness_key(layout.view, store.namespace)
    source = StoreItemSource(store, REGISTRY.item, batch=100)
    assert source.feed_position() is not None  # the refresher's subscription creates the feed
    assert client.exists(feed) == 1
    values = np.ones((2, layout.dim), dtype=np.float32)
    store.write_batch(layout, ["a1", "a2"], values, now_ms())
    entries = client.xrange(feed)
    assert [dict(fields) for _, fields in entries] == [{b"k": b""}, {b"e": b"2:a12:a2"}]  # subscribe, write

    assert store.delete_view(layout.view) == 2
    assert (client.exists(feed), client.exists(fresh)) == (0, 0)
    assert [store.delete_view(lay.view) for lay in REGISTRY.item.layouts[1:]] == [0] * (
        len(REGISTRY.item.layouts) - 1
    )
    assert list(client.scan_iter(match=f"{store.namespace}:*")) == []  # every item view's feed too
    # Deleted, the feed stays gone: a write does not re-create it (only a reader does).
    store.write_batch(layout, ["a3"], values[:1], now_ms())
    assert client.exists(feed) == 0
