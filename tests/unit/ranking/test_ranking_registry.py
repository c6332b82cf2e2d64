"""Binding the ranker to the applied registry: every user and item view, slots, empty vectors, errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from headwater.pipelines.windows.testing import plan_feature, plan_view
from headwater.ranking.features import (
    RegistryBindingError,
    bind_plans,
    empty_vector,
    load_registry,
    registry_from_repo,
)
from headwater.registry.plans import TierPlan

FEATURES = Path(__file__).resolve().parents[3] / "features"


def test_the_example_registry_binds_every_user_and_item_view_in_tier_order() -> None:
    registry = registry_from_repo(FEATURES, "item_popularity_offline.item_clicks_1d")
    assert [lay.view for lay in registry.user.layouts] == [
        "user_dwell_realtime",
        "user_session_realtime",
        "user_category_affinity_nearline",
        "user_engagement_nearline",
        "user_search_nearline",
        "user_activity_offline",
        "user_purchase_offline",
        "user_search_offline",
    ]
    assert [lay.view for lay in registry.item.layouts] == [
        "item_trending_realtime",
        "item_engagement_nearline",
        "item_conversion_offline",
        "item_popularity_offline",
    ]
    assert registry.user.tiers[:2] == ("realtime", "realtime")
    assert "clicks_30s" in registry.user.slots
    assert "category_share_30s.top5" in registry.user.slots
    assert registry.user.dim == len(registry.user.slots) == registry.user.empty_vector.shape[0]
    assert len(registry.registry_version) == 16
    assert registry.popularity.view == "item_popularity_offline"
    assert registry.popularity.features[registry.popularity_slot] == "item_clicks_1d"


def test_empty_vector_is_the_empty_window_of_each_aggregation() -> None:
    view = plan_view(
        "v",
        [
            plan_feature("n", "count", 5, 1),
            plan_feature("s", "sum", 5, 1, field="price"),
            plan_feature("a", "avg", 5, 1, field="price"),
            plan_feature("t", "top_k", 5, 1, field="category", k=2),
        ],
    )
    out = empty_vector(view)
    assert out[:2].tolist() == [0.0, 0.0]
    assert np.isnan(out[2])
    assert np.isnan(out[3:5]).all()  # top_k ids
    assert out[5:].tolist() == [0.0, 0.0]  # top_k shares


def _plan(*views: object) -> TierPlan:
    return TierPlan(
        schema_version=1, tier="nearline", registry_hash="sha256:" + "ab" * 32, generated_at="x",
        tier_spec={}, entities={}, sources=[], views=list(views),
    )  # fmt: skip


def test_binding_errors_say_what_to_do(tmp_path: Path) -> None:
    user = plan_view("u", [plan_feature("n", "count", 5, 1)])
    item = plan_view("i", [plan_feature("n", "count", 5, 1)], entity="item", join_key="item_id")
    with pytest.raises(RegistryBindingError, match="no item view"):
        bind_plans([_plan(user)], "i.n")
    with pytest.raises(RegistryBindingError, match=r"popularity feature 'i\.m'.*known: i\.n"):
        bind_plans([_plan(user, item)], "i.m")
    twice = plan_view("u2", [plan_feature("n", "count", 5, 1)])
    with pytest.raises(RegistryBindingError, match="'u' and 'u2' both have a slot 'n'"):
        bind_plans([_plan(user, twice, item)], "i.n")
    with pytest.raises(RegistryBindingError, match="headwater apply"):
        load_registry(tmp_path, "i.n")
