"""The prediction log's record version 2: each value's view, version and own event time, from the fetch."""

from __future__ import annotations

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from headwater.ranking.skew_pit import parse_logged
from headwater.ranking.synthetic import small_registry
from headwater.serving.fetch import FeatureFetcher, ItemVectorCache
from headwater.serving.skew import prediction_record
from headwater.serving.store import InMemoryFeatureStore

REGISTRY = small_registry({"u": ["a", "b"]}, {"i": ["x"], "j": ["y"]}, "i.x")


def test_the_record_holds_each_values_own_time_through_the_item_cache() -> None:
    store = InMemoryFeatureStore()
    user_view = REGISTRY.user.layouts[0]
    i_view, j_view = REGISTRY.item.layouts
    store.write(user_view, ["u1"], np.array([[1.0, 2.0]], np.float32), 1_000)
    store.write(i_view, ["i1", "i2"], np.array([[1.0], [2.0]], np.float32), 2_000)
    store.write(j_view, ["i1"], np.array([[5.0]], np.float32), 3_000)  # i2 has no row in j
    with ThreadPoolExecutor(1) as io:
        fetcher = FeatureFetcher(store, REGISTRY, ItemVectorCache(100, 60.0, dim=2), io)
        first = asyncio.run(fetcher.fetch("u1", ["i1", "i2"], 5.0))
        cached = asyncio.run(fetcher.fetch("u1", ["i2", "i1"], 5.0))  # both items from the cache
    assert first.items_view_ms is not None
    assert first.items_view_ms.tolist() == [[2_000, 3_000], [2_000, 0]]
    assert cached.items_view_ms is not None
    assert cached.items_view_ms.tolist() == [[2_000, 0], [2_000, 3_000]]
    assert first.user is not None
    answer = {
        "items": [{"item_id": "i2", "score": 0.9}, {"item_id": "i1", "score": 0.4}],
        "model_version": "m1",
    }
    record = prediction_record("r1", 4_000, "u1", answer, ["i1", "i2"], first.user, first.items,
                               first.items_found, first.user_event_ms, REGISTRY, first)  # fmt: skip
    assert record["v"] == 2
    assert record["views"][user_view.view] == {
        "side": "user",
        "version": user_view.version,
        "event_ms": 1_000,
    }
    assert record["views"][j_view.view] == {"side": "item", "version": j_view.version}
    assert record["item_views"] == [i_view.view, j_view.view]
    assert record["item_event_ms"] == [[2_000, 0], [2_000, 3_000]]  # in answer order: i2, then i1
    (logged,), notes = parse_logged([json.dumps(record)])
    assert notes == []
    assert logged.has_value_times
