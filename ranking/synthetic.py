"""Synthetic worlds in the registry's shape, for tests and benchmarks of the ranking service.

Real training sets come from the offline tier (``headwater training-set``). Tests and the serving
benchmark need a model and store rows bound to the applied registry without running Spark: this
module makes user and item vectors with the registry's slots (a share of each left empty, i.e.
the empty-window vector), labels with a planted user x item signal, and writes the vectors into
the online store view by view, exactly as the tiers lay them out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

from headwater.pipelines.store import ViewLayout
from headwater.ranking.features import BoundRegistry, SideViews, bind_plans
from headwater.ranking.trainset import TrainingSet


class VectorWriter(Protocol):
    """Anything that writes vectors of one view (the Redis reader/writer or the in-memory store)."""

    def write(
        self, spec: ViewLayout, ids: Sequence[str], values: npt.NDArray[np.float32], event_ms: int
    ) -> None:
        """Write one vector per id."""
        ...


@dataclass(frozen=True)
class World:
    """Users and items with registry-shaped vectors and the hidden preference that drives labels."""

    user_ids: list[str]
    users: npt.NDArray[np.float32]
    item_ids: list[str]
    items: npt.NDArray[np.float32]
    taste: npt.NDArray[np.float32]
    """(user_dim, item_dim) weights of the planted signal: score = user @ taste @ item."""


def _side(side: SideViews, n: int, rng: np.random.Generator, empty_share: float) -> npt.NDArray[np.float32]:
    values = rng.gamma(2.0, 2.0, size=(n, side.dim)).astype(np.float32)
    empty = rng.random((n, len(side.layouts))) < empty_share
    offsets = side.offsets
    for j, vector in enumerate(side.empty):
        rows = np.flatnonzero(empty[:, j])
        values[rows, offsets[j] : offsets[j + 1]] = vector
    return values


def make_world(
    registry: BoundRegistry,
    users: int = 300,
    items: int = 300,
    seed: int = 0,
    empty_share: float = 0.2,
    prefixes: tuple[str, str] = ("u", "i"),
) -> World:
    """``users`` and ``items`` with random vectors (``empty_share`` of their views empty)."""
    rng = np.random.default_rng(seed)
    du, di = registry.user.dim, registry.item.dim
    taste = np.zeros((du, di), dtype=np.float32)
    pairs = rng.choice(du * di, size=min(du * di, max(4, du * di // 50)), replace=False)
    taste.flat[pairs] = rng.normal(0.0, 1.5, size=len(pairs))  # a sparse signal: a few slot pairs matter
    return World(
        [f"{prefixes[0]}{i:06d}" for i in range(users)],
        _side(registry.user, users, rng, empty_share),
        [f"{prefixes[1]}{i:06d}" for i in range(items)],
        _side(registry.item, items, rng, empty_share),
        taste,
    )


def _zscore(x: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    z: npt.NDArray[np.float32] = np.nan_to_num((x - np.nanmean(x, axis=0)) / (np.nanstd(x, axis=0) + 1e-6))
    return z.astype(np.float32)


def training_set(
    registry: BoundRegistry, world: World, slates: int = 2_000, k: int = 10, seed: int = 0
) -> TrainingSet:
    """``slates`` slates of ``k`` impressions, labelled by the planted signal, in time order."""
    rng = np.random.default_rng(seed + 1)
    u = rng.integers(0, len(world.user_ids), size=slates).repeat(k)
    i = rng.integers(0, len(world.item_ids), size=slates * k)
    zu, zi = _zscore(world.users), _zscore(world.items)
    logit = np.einsum("nu,ui,ni->n", zu[u], world.taste, zi[i]) / np.sqrt(np.count_nonzero(world.taste)) * 2.0
    logit -= 2.0
    label = (rng.random(len(u)) < 1.0 / (1.0 + np.exp(-logit))).astype(np.float32)
    start = 1_767_225_600_000  # 2026-01-01T00:00:00Z
    times = start + np.arange(len(u), dtype=np.int64) * 1000
    return TrainingSet(
        registry.user.slots,
        registry.item.slots,
        registry.registry_version,
        world.users[u],
        world.items[i],
        label,
        np.arange(slates, dtype=np.int64).repeat(k),
        times,
        np.asarray(world.user_ids)[u],
        np.asarray(world.item_ids)[i],
    )


def write_world(
    writer: VectorWriter,
    registry: BoundRegistry,
    world: World,
    event_ms: int,
    chunk: int = 5000,
    skip_tiers: Sequence[str] = (),
) -> int:
    """Write every user and item vector into its views (one write per view and chunk); returns rows.

    Views of ``skip_tiers`` (e.g. ``realtime`` when a live job writes them) are left out.
    """
    written = 0
    sides = ((registry.user, world.user_ids, world.users), (registry.item, world.item_ids, world.items))
    for side, ids, matrix in sides:
        offsets = side.offsets
        for j, layout in enumerate(side.layouts):
            if side.tiers[j] in skip_tiers:
                continue
            block = np.ascontiguousarray(matrix[:, offsets[j] : offsets[j + 1]])
            for s in range(0, len(ids), chunk):
                writer.write(layout, ids[s : s + chunk], block[s : s + chunk], event_ms)
            written += len(ids)
    return written


def small_registry(
    user_views: Mapping[str, Sequence[str]],
    item_views: Mapping[str, Sequence[str]],
    popularity: str,
    registry_hash: str = "sha256:" + "0" * 64,
) -> BoundRegistry:
    """Return a registry for tests: ``{view: ["feature" | "feature:agg", ...]}`` per side (default agg count).

    A count's empty value is 0; any other aggregation (over the ``price`` field) is NaN when empty.
    """
    from headwater.pipelines.windows.testing import plan_feature, plan_view
    from headwater.registry.plans import PlanView, TierPlan

    def views(specs: Mapping[str, Sequence[str]], entity: str) -> list[PlanView]:
        out = []
        for name, features in specs.items():
            feats = []
            for text in features:
                fname, _, agg = text.partition(":")
                agg = agg or "count"
                feats.append(plan_feature(fname, agg, 5, 1, field=None if agg == "count" else "price"))
            out.append(plan_view(name, feats, entity=entity, join_key=f"{entity}_id"))
        return out

    plan = TierPlan(
        schema_version=1,
        tier="nearline",
        registry_hash=registry_hash,
        generated_at="2026-01-01T00:00:00+00:00",
        tier_spec={},
        entities={"user": "user_id", "item": "item_id"},
        sources=[],
        views=views(user_views, "user") + views(item_views, "item"),
    )
    return bind_plans([plan], popularity)
