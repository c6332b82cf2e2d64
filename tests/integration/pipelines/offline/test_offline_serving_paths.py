"""Training sets (no future value leaks) and materialize (read back = offline values): Spark + Redis."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import date
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from headwater.pipelines.offline.bronze import append_events
from headwater.pipelines.offline.job import read_bronze, run_view
from headwater.pipelines.offline.lake import bronze_path, days
from headwater.pipelines.offline.materialize import materialize
from headwater.pipelines.offline.testing import DAY_MS, HOUR_MS, T0, behaviour, event, feature, view
from headwater.pipelines.store import OnlineStore
from headwater.pipelines.windows import (
    RedisDictionary,
    compile_view,
    reference_values,
    to_vectors,
    view_layout,
)
from headwater.ranking.training_set import build_training_set, read_labels
from headwater.ranking.trainset import read_parquet

REGISTRY = "sha256:" + "ab" * 32
USERS = view("pit_user", "user", "user_id", [
    feature("clicks_1d", "count", "1d", filter_="event_type = 'click'", dtype="int64"),
    feature("top_cat_2d", "top_k", "2d", field="category", k=2),
    feature("last_item_2d", "last", "2d", field="item_id", filter_="event_type = 'click'", dtype="string"),
])  # fmt: skip
ITEMS = view("pit_item", "item", "item_id", [
    feature("item_clicks_1d", "count", "1d", filter_="event_type = 'click'", dtype="int64"),
    feature("item_price_max_2d", "max", "2d", field="price"),
])  # fmt: skip


def history() -> list[dict[str, Any]]:
    """One click of u1 on day 0; 50 planted clicks (and a pricier item) on day 1, after the label time."""
    ev = [event(1, "u1", "click", T0 + 3 * HOUR_MS, item_id="i1", category="music", price=5.0),
          event(2, "u2", "click", T0 + 4 * HOUR_MS, item_id="i2", category="books", price=8.0)]  # fmt: skip
    ev += [
        event(
            100 + n, "u1", "click", T0 + DAY_MS + 13 * HOUR_MS + n, item_id="i1", category="art", price=999.0
        )
        for n in range(50)
    ]
    return ev


@pytest.fixture(scope="module")
def lake(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("lake")
    append_events(spark, behaviour(), history(), bronze_path(root, "events"))
    bronze = read_bronze(spark, root, behaviour())
    for v in (USERS, ITEMS):
        run_view(spark, bronze, v, behaviour(), root, days(date(2026, 1, 1), date(2026, 1, 2)), zorder=False)
    return root


@pytest.fixture
def store(redis_url: str) -> Iterator[OnlineStore]:
    namespace = f"hwtest-{uuid.uuid4().hex[:8]}"
    s = OnlineStore.from_url(redis_url, namespace=namespace)
    yield s
    for key in s.client.scan_iter(match=f"{namespace}:*"):
        s.client.delete(key)
    s.close()


def test_planted_future_value_never_reaches_a_training_row(
    spark: Any, lake: Path, store: OnlineStore, tmp_path: Path
) -> None:
    labels = tmp_path / "labels.parquet"
    pq.write_table(pa.table({
        "user_id": ["u1", "u1", "u1", "u2"],
        "item_id": ["i1", "i1", "i1", "i2"],
        "event_time": [T0 + DAY_MS + 12 * HOUR_MS, T0 + DAY_MS, T0 + 2 * DAY_MS + HOUR_MS,
                       T0 + DAY_MS + 14 * HOUR_MS],
        "label": [1.0, 0.0, 1.0, 0.0],
    }), labels)  # fmt: skip
    out = tmp_path / "train.parquet"
    ids = RedisDictionary(store.client, store.namespace).ids
    result = build_training_set(spark, read_labels(spark, labels), [USERS, ITEMS], lake, out, REGISTRY, ids)
    assert result.rows == 4
    ts = read_parquet(out)  # the format `headwater model train --training-set` reads
    order = np.argsort(ts.event_time_ms * 10 + (ts.user_ids == "u2"))
    user = dict(zip(ts.user_features, ts.user[order].T, strict=True))
    item = dict(zip(ts.item_features, ts.item[order].T, strict=True))
    times = ts.event_time_ms[order]
    assert list(times) == [
        T0 + DAY_MS,
        T0 + DAY_MS + 12 * HOUR_MS,
        T0 + DAY_MS + 14 * HOUR_MS,
        T0 + 2 * DAY_MS + HOUR_MS,
    ]
    # At day 1 00:00 and 12:00 u1 has day 0's single click; the 50 clicks of 13:00 are in the future.
    assert list(user["clicks_1d"]) == [1.0, 1.0, 1.0, 50.0]
    assert list(item["item_price_max_2d"]) == [5.0, 5.0, 8.0, 999.0]
    music, art = ids("category", ["music", "art"])
    assert list(user["top_cat_2d.top1"][:2]) == [music, music]
    assert user["top_cat_2d.top1"][3] == art
    assert user["top_cat_2d.share1"][3] == pytest.approx(50 / 51)
    assert np.isnan(user["top_cat_2d.top2"][0])
    assert user["top_cat_2d.share2"][0] == 0.0
    assert ts.registry_version == REGISTRY[7:23]


def test_materialize_then_read_back_gives_the_offline_values(
    spark: Any, lake: Path, store: OnlineStore
) -> None:
    done = materialize(spark, store, [USERS, ITEMS], lake)
    assert [(m.view, m.date, m.rows) for m in done] == [
        ("pit_user", date(2026, 1, 2), 2),
        ("pit_item", date(2026, 1, 2), 2),
    ]
    as_of = T0 + 2 * DAY_MS
    dictionary = RedisDictionary(store.client, store.namespace)
    for plan_view in (USERS, ITEMS):
        spec = compile_view(plan_view)
        expected = reference_values(spec, history(), as_of)
        entities = sorted(expected)
        want = to_vectors(spec, [list(expected[e].values()) for e in entities], dictionary.ids)
        got = store.read_batch(view_layout(spec), entities)
        assert got.found.all()
        assert (got.event_time_ms == as_of).all()
        np.testing.assert_array_equal(got.values, want)
    again = materialize(spark, store, [USERS], lake)
    assert again[0].written == 0  # same boundary and values: unchanged
