"""On-demand features: the service's path and the training-set path give the same numbers.

The example registry (``features/``, with ``user_item_on_demand.yaml``) is bound as the service
binds it; the same user and item vectors are (a) written to an in-memory store and fetched for a
ranker trained on the on-demand slots, and (b) laid out as a training set's ``user.<slot>`` /
``item.<slot>`` columns and passed through the training-set hook. Both must agree to 1e-6.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headwater.ranking.artifact import ArtifactError, check_binding
from headwater.ranking.features import BoundRegistry, bind_plans
from headwater.ranking.on_demand import OnDemandBindingError, OnDemandProgram, slot_index
from headwater.ranking.training_set import _on_demand_columns
from headwater.ranking.trainset import TrainingSet, read_parquet, write_parquet
from headwater.registry.plans import PlanView, TierPlan, build_plans, registry_hash
from headwater.registry.validate import check_repo
from headwater.serving import fetch as fetch_module
from headwater.serving.fetch import FeatureFetcher, ItemVectorCache
from headwater.serving.store import InMemoryFeatureStore

FEATURES = Path(__file__).resolve().parents[3] / "features"
AT_MS = 1_767_245_400_000  # 2026-01-01T05:30:00Z: hour 5, a Thursday
OD_NAMES = ("price_vs_usual", "ctr_momentum", "click_propensity", "request_hour", "session_focus")


@pytest.fixture(scope="module")
def plans() -> list[TierPlan]:
    result = check_repo(FEATURES)
    assert result.ok
    built = build_plans(result, registry_hash(result))
    return [built[t] for t in ("realtime", "nearline", "offline")]


@pytest.fixture(scope="module")
def bound(plans: list[TierPlan]) -> tuple[BoundRegistry, list[PlanView]]:
    return bind_plans(plans, "item_popularity_offline.item_ctr_7d"), [v for p in plans for v in p.views]


def _vectors(reg: BoundRegistry, n_users: int, n_items: int) -> tuple[npt.NDArray[np.float32], ...]:
    """Random vectors with the edge cases: NaN (empty avg), zero divisors, a share_of hit."""
    rng = np.random.default_rng(7)
    users = rng.uniform(0.0, 5.0, (n_users, reg.user.dim)).astype(np.float32)
    items = rng.uniform(0.0, 5.0, (n_items, reg.item.dim)).astype(np.float32)
    od = reg.on_demand
    assert od is not None
    avg = od.user_columns["user_purchase_offline.avg_order_value_30d"]
    users[0, avg] = 0.0  # safe division: NaN, not inf
    users[1, avg] = np.nan  # a user without orders
    top1 = od.user_columns["user_session_realtime.category_share_5m.top1"]
    fav = od.user_columns["user_category_affinity_nearline.favourite_categories_24h.top3"]
    users[:, top1] = 11.0
    users[2, fav] = 11.0  # user 2's current category is their 3rd favourite of the day
    ctr5 = od.item_columns["item_trending_realtime.item_ctr_5m"]
    items[0, ctr5] = np.nan  # coalesce falls back to the 7-day rate
    return users, items


def test_the_example_registry_binds_its_on_demand_view(bound: tuple[BoundRegistry, list[PlanView]]) -> None:
    reg, _ = bound
    assert reg.on_demand is not None
    assert reg.on_demand.names == OD_NAMES
    assert not set(reg.on_demand.names) & set(reg.item.slots)


def test_values_follow_the_declared_semantics(bound: tuple[BoundRegistry, list[PlanView]]) -> None:
    reg, _ = bound
    od = reg.on_demand
    assert od is not None
    users, items = _vectors(reg, 3, 4)
    cols = od.item_columns
    out = [od.compute(users[u], items, AT_MS) for u in range(3)]
    price, ctr7 = (
        items[:, cols["item_conversion_offline.item_price_max_30d"]],
        items[:, cols["item_popularity_offline.item_ctr_7d"]],
    )
    avg = users[2, od.user_columns["user_purchase_offline.avg_order_value_30d"]]
    np.testing.assert_allclose(out[2][:, 0], price.astype(np.float64) / float(avg), rtol=1e-6)
    assert np.isnan(out[0][:, 0]).all()  # divisor 0
    assert np.isnan(out[1][:, 0]).all()  # divisor missing
    assert out[0][0, 1] == 0.0  # ctr_5m missing: coalesce(ctr7, ctr7) - ctr7
    assert (out[0][:, 3] == 5.0).all()  # request.hour_of_day at 05:30 UTC
    share3 = users[2, od.user_columns["user_category_affinity_nearline.favourite_categories_24h.share3"]]
    np.testing.assert_allclose(out[2][:, 4], share3, rtol=1e-6)
    assert (out[0][:, 4] == 0.0).all()  # not among user 0's favourites
    assert np.isfinite(ctr7).all()


def test_serving_and_training_set_compute_the_same_values(
    bound: tuple[BoundRegistry, list[PlanView]], plans: list[TierPlan], monkeypatch: pytest.MonkeyPatch
) -> None:
    reg, views = bound
    users, items = _vectors(reg, 4, 6)
    user_ids, item_ids = [f"u{i}" for i in range(4)], [f"i{i}" for i in range(6)]
    store = InMemoryFeatureStore()
    for side, ids, matrix in ((reg.user, user_ids, users), (reg.item, item_ids, items)):
        for j, layout in enumerate(side.layouts):
            block = np.ascontiguousarray(matrix[:, side.offsets[j] : side.offsets[j + 1]])
            store.write(layout, ids, block, AT_MS - 60_000)
    assert reg.on_demand is not None
    meta = {"user_features": list(reg.user.slots), "item_features": [*reg.item.slots, *OD_NAMES]}
    binding = check_binding(meta, reg)
    assert binding.item_columns is not None
    assert len(binding.item_columns) == reg.item.dim + len(OD_NAMES)
    monkeypatch.setattr(fetch_module, "now_ms", lambda: AT_MS)
    served: dict[tuple[int, int], npt.NDArray[np.float32]] = {}
    with ThreadPoolExecutor(1) as io:
        cache = ItemVectorCache(100, 60.0, dim=reg.item.dim)
        fetcher = FeatureFetcher(store, reg, cache, io, (binding.user_columns, binding.item_columns))
        for u, user_id in enumerate(user_ids):
            got = asyncio.run(fetcher.fetch(user_id, item_ids, 5.0))  # the 2nd user on reads the cache
            for i in range(len(item_ids)):
                served[u, i] = got.items[i, reg.item.dim :]
            np.testing.assert_array_equal(got.items[:, : reg.item.dim], items)  # stored slots unchanged
    # the training-set path: one row per (user, item), the same slots as Parquet columns
    rows_u, rows_i = np.repeat(np.arange(4), 6), np.tile(np.arange(6), 4)
    columns: dict[str, pa.Array] = {"event_time": pa.array(np.full(len(rows_u), AT_MS, dtype=np.int64))}
    columns.update({f"user.{s}": pa.array(users[rows_u, j]) for j, s in enumerate(reg.user.slots)})
    columns.update({f"item.{s}": pa.array(items[rows_i, j]) for j, s in enumerate(reg.item.slots)})
    trained = _on_demand_columns(columns, views, plans[0].on_demand)
    assert list(trained) == [f"pair.{n}" for n in OD_NAMES]
    expect = np.column_stack([trained[f"pair.{n}"].to_numpy(zero_copy_only=False) for n in OD_NAMES])
    got = np.stack([served[u, i] for u, i in zip(rows_u.tolist(), rows_i.tolist(), strict=True)])
    assert np.isnan(expect).any()  # the missing values (divisor 0 or NaN) are part of the comparison
    np.testing.assert_allclose(got.astype(np.float64), expect, rtol=1e-6, atol=1e-6, equal_nan=True)


def test_a_model_without_on_demand_slots_fetches_no_pairs(
    bound: tuple[BoundRegistry, list[PlanView]],
) -> None:
    reg, _ = bound
    binding = check_binding(
        {"user_features": list(reg.user.slots), "item_features": list(reg.item.slots)}, reg
    )
    assert binding.item_columns is None
    with ThreadPoolExecutor(1) as io:
        fetcher = FeatureFetcher(InMemoryFeatureStore(), reg, ItemVectorCache(10, 60.0, reg.item.dim), io)
        got = asyncio.run(fetcher.fetch("u", ["i"], 5.0))
    assert got.items.shape == (1, reg.item.dim)


def test_a_model_with_an_unknown_pair_slot_is_refused(bound: tuple[BoundRegistry, list[PlanView]]) -> None:
    reg, _ = bound
    meta = {
        "user_features": list(reg.user.slots),
        "item_features": [*reg.item.slots, "price_vs_usual", "gone"],
    }
    with pytest.raises(ArtifactError, match="gone"):
        check_binding(meta, reg)


def test_binding_names_a_slot_no_view_has(plans: list[TierPlan]) -> None:
    with pytest.raises(
        OnDemandBindingError, match=r"reads item_conversion_offline\.item_price_max_30d, which no"
    ):
        OnDemandProgram.bind(plans[0].on_demand, {}, slot_index([("item_conversion_offline", ["x"])]))


def test_training_set_pairs_round_trip_and_become_ranker_inputs(tmp_path: Path) -> None:
    n = 4
    ts = TrainingSet(
        ("a",), ("b",), "v1", np.ones((n, 1), np.float32), np.full((n, 1), 2.0, np.float32),
        np.zeros(n, np.float32), np.arange(n), np.arange(n) * 1000, np.array(["u"] * n), np.array(["i"] * n),
        pair={"p": np.arange(n, dtype=np.float32), "q": np.full(n, np.nan, np.float32)},
    )  # fmt: skip
    write_parquet(ts, tmp_path / "t.parquet")
    back = read_parquet(tmp_path / "t.parquet")
    assert back.item_features == ("b",)  # the two-tower's item tower never sees pairs
    assert list(back.pair) == ["p", "q"]
    ranker = back.take(np.array([3, 1])).for_ranker()
    assert ranker.item_features == ("b", "p", "q")
    assert ranker.item[:, 1].tolist() == [3.0, 1.0]
    assert np.isnan(ranker.item[:, 2]).all()
    assert not ranker.pair


def test_a_ranker_trained_on_on_demand_features_serves_them(
    bound: tuple[BoundRegistry, list[PlanView]], tmp_path: Path
) -> None:
    """Train on a training set with pair columns, load it as the service does, rank over HTTP."""
    from fastapi.testclient import TestClient

    from headwater.ranking.synthetic import make_world, training_set, write_world
    from headwater.ranking.train import TrainOptions, train_and_save
    from headwater.serving.app import create_app
    from headwater.serving.config import ServingConfig
    from headwater.serving.runtime import load_models
    from headwater.serving.store import now_ms

    reg, _ = bound
    assert reg.on_demand is not None
    world = make_world(reg, users=30, items=30, seed=5, empty_share=0.0)
    base = training_set(reg, world, slates=60, seed=5)
    pairs = reg.on_demand.compute(base.user, base.item, base.event_time_ms)
    ts = replace(base, pair={n: pairs[:, j] for j, n in enumerate(reg.on_demand.names)})
    report = train_and_save(ts, tmp_path / "models", TrainOptions(epochs=1, deep=(16,), device="cpu"))
    assert report is not None
    loaded = load_models(tmp_path / "models", reg, "cpu")
    assert loaded.models().neural_version is not None
    store = InMemoryFeatureStore()
    write_world(store, reg, world, now_ms())
    with TestClient(create_app(ServingConfig(default_deadline_ms=5000.0), reg, store, loaded)) as client:
        answer = client.post(
            "/v1/rank", json={"user_id": world.user_ids[0], "candidates": world.item_ids[:20], "k": 5}
        )
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["fallback"] is None  # the DCN answered, with the on-demand slots as inputs
    assert len(body["items"]) == 5


def test_the_training_set_writer_adds_pair_columns_from_its_packed_slots(
    bound: tuple[BoundRegistry, list[PlanView]], plans: list[TierPlan]
) -> None:
    """``_flatten`` (each Spark batch of ``headwater training-set``) writes ``pair.*`` after the slots."""
    from headwater.ranking.training_set import LABEL_COLUMNS, _flatten

    reg, views = bound
    rng = np.random.default_rng(3)
    n = 8
    used = [v for v in views if v.join_key in ("user_id", "item_id")]
    part: dict[str, pa.Array] = {
        "group": pa.array(np.arange(n)), "user_id": pa.array([f"u{i}" for i in range(n)]),
        "item_id": pa.array([f"i{i}" for i in range(n)]),
        "event_time": pa.array(AT_MS + np.arange(n, dtype=np.int64) * 3_600_000),
        "label": pa.array(np.zeros(n, np.float32)),
    }  # fmt: skip
    top_k = pa.list_(pa.struct([("value", pa.string()), ("share", pa.float64())]))
    for view in used:
        for f in view.features:
            if f.agg == "top_k":
                rows = [
                    [{"value": c, "share": 0.5} for c in rng.choice(["a", "b", "c"], 2, replace=False)]
                    for _ in range(n)
                ]
                part[f"{view.name}.{f.name}"] = pa.array(rows, type=top_k)
            elif f.dtype == "string":
                part[f"{view.name}.{f.name}"] = pa.array(rng.choice(["x", "y"], n).tolist())
            else:
                values = rng.uniform(0.0, 3.0, n)
                values[0] = 0.0  # a zero divisor on the first row
                part[f"{view.name}.{f.name}"] = pa.array(values)
    ids = {"a": 1, "b": 2, "c": 3, "x": 4, "y": 5}
    table = _flatten(
        pa.table(part),
        used,
        lambda _field, vals: [ids[v] for v in vals],
        "sha256:" + "0" * 64,
        plans[0].on_demand,
    )
    names = table.column_names
    assert names[: len(LABEL_COLUMNS)] == list(LABEL_COLUMNS)
    assert names[-len(OD_NAMES) :] == [f"pair.{x}" for x in OD_NAMES]
    users = np.column_stack([table.column(f"user.{s}").to_numpy() for s in reg.user.slots])
    items = np.column_stack([table.column(f"item.{s}").to_numpy() for s in reg.item.slots])
    assert reg.on_demand is not None
    expect = reg.on_demand.compute(users, items, table.column("event_time").to_numpy())
    got = np.column_stack([table.column(f"pair.{x}").to_numpy(zero_copy_only=False) for x in OD_NAMES])
    np.testing.assert_allclose(got, expect, rtol=1e-6, equal_nan=True)
    assert got[:, OD_NAMES.index("request_hour")].tolist() == [5.0 + h for h in range(n)]
    assert np.isnan(got[0, OD_NAMES.index("price_vs_usual")])


VALUES = st.one_of(
    st.floats(-1e6, 1e6, allow_nan=False),
    st.just(float("nan")),
    st.just(0.0),
    st.sampled_from([1.0, 2.0, 3.0]),
)


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_one_user_broadcast_equals_one_row_per_item(
    bound: tuple[BoundRegistry, list[PlanView]], data: st.DataObject
) -> None:
    """The service's form (one user vector for all candidates) and the training set's (one user row
    per item row) give the same values, whatever the slots hold (NaN, 0, ids that match or not)."""
    reg, _ = bound
    od = reg.on_demand
    assert od is not None
    n = data.draw(st.integers(1, 5))
    user = np.full(reg.user.dim, np.nan, dtype=np.float32)
    items = np.full((n, reg.item.dim), np.nan, dtype=np.float32)
    for j in od.user_columns.values():
        user[j] = data.draw(VALUES)
    for j in od.item_columns.values():
        items[:, j] = data.draw(st.lists(VALUES, min_size=n, max_size=n))
    at = data.draw(st.integers(0, 4_102_444_800_000))
    with np.errstate(all="ignore"):
        served = od.compute(user, items, at)
        trained = od.compute(np.tile(user, (n, 1)), items, np.full(n, at, dtype=np.int64))
    np.testing.assert_array_equal(served, trained)
    if user[od.user_columns["user_purchase_offline.avg_order_value_30d"]] == 0.0:  # safe division
        assert np.isnan(served[:, OD_NAMES.index("price_vs_usual")]).all()
