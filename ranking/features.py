"""The features the ranker reads, bound to the applied registry: every user view and every item view.

``headwater apply`` writes one plan per tier; the service reads all three and keeps, per side,
the views of that entity (``user`` or ``item``) in plan order (tiers realtime, nearline,
offline; views by name within a tier). Each view's store layout is the one its tier writes
(:func:`headwater.pipelines.windows.view_layout`), so a request reads exactly the keys the
pipelines wrote. A side's vector is its views' online vectors concatenated; its slot names are
those of the training-set Parquet (``user.<slot>`` / ``item.<slot>``, see
:mod:`headwater.ranking.training_set`), without the prefix.

Missing values mean the same thing as in a training set: a view with no value for an entity
holds its *empty-window* vector (count, sum, distinct_count 0; avg, min, max, last, ratio NaN;
top_k ids NaN and shares 0), exactly what the offline tier joins for an entity without events.
The models turn the remaining NaNs into the training mean (:mod:`headwater.ranking.model`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from headwater.pipelines.store import ViewLayout
from headwater.pipelines.windows import compile_view, empty_values, to_vectors, view_layout
from headwater.ranking.on_demand import OnDemandProgram, slot_index
from headwater.registry.errors import HeadwaterError
from headwater.registry.plans import PlanView, TierPlan, read_plan, short_version
from headwater.registry.tiers import TIER_NAMES

SIDES = {"user": "user_id", "item": "item_id"}
"""The two sides of a ranking pair and the join key a view of that side must have."""


class RegistryBindingError(HeadwaterError, ValueError):
    """The applied registry cannot feed the ranker (no plans, no user or item view, bad popularity)."""


@dataclass(frozen=True)
class SideViews:
    """The views of one side (``user`` or ``item``), in vector order, with their empty vectors."""

    entity: str
    layouts: tuple[ViewLayout, ...]
    empty: tuple[npt.NDArray[np.float32], ...]
    tiers: tuple[str, ...]
    """The tier of each view."""
    freshness_s: tuple[float, ...] = ()
    """Each view's declared freshness SLA in seconds (empty: unknown, e.g. a side built by hand)."""

    @property
    def slots(self) -> tuple[str, ...]:
        """Slot names of the concatenated vector (the training set's columns without the prefix)."""
        return tuple(slot for layout in self.layouts for slot in layout.features)

    @property
    def dim(self) -> int:
        """Width of the concatenated vector."""
        return sum(layout.dim for layout in self.layouts)

    @property
    def offsets(self) -> tuple[int, ...]:
        """Start column of each view in the concatenated vector (and the end, last)."""
        out = [0]
        for layout in self.layouts:
            out.append(out[-1] + layout.dim)
        return tuple(out)

    @property
    def empty_vector(self) -> npt.NDArray[np.float32]:
        """The whole side's vector for an entity without any value."""
        return np.concatenate(self.empty).astype(np.float32, copy=False)


@dataclass(frozen=True)
class BoundRegistry:
    """What one service reads: user and item views, the popularity slot, the registry version."""

    registry_version: str
    user: SideViews
    item: SideViews
    popularity: ViewLayout
    popularity_slot: int
    on_demand: OnDemandProgram | None = None
    """The registry's on-demand features (pair slots, after the item slots), when it has any."""

    def side(self, name: str) -> SideViews:
        """Return the ``user`` or ``item`` side."""
        return self.user if name == "user" else self.item

    @property
    def view_versions(self) -> dict[str, str]:
        """Return ``{view: version}`` of every bound user and item view.

        A model records these at training; the service checks them against the applied ones.
        """
        return {lay.view: lay.version for lay in (*self.user.layouts, *self.item.layouts)}

    @property
    def vectors_version(self) -> str:
        """Return one id of the bound views' versions.

        Cached vectors are keyed by it, so editing another view's description does not flush the
        cache, while a changed user or item view does.
        """
        text = ",".join(f"{v}={ver}" for v, ver in sorted(self.view_versions.items()))
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def empty_vector(view: PlanView) -> npt.NDArray[np.float32]:
    """Return the online vector of ``view`` for an entity with no event in any window."""
    spec = compile_view(view)
    values = empty_values(spec)
    row = tuple(values[f.name] for f in spec.features)
    matrix = to_vectors(spec, [row], lambda _field, vals: [0] * len(vals))
    vector: npt.NDArray[np.float32] = matrix[0]
    return vector


def side_views(entity: str, views: Sequence[PlanView]) -> SideViews:
    """Bind the ``views`` of ``entity`` (join key ``SIDES[entity]``), in order."""
    chosen = [v for v in views if v.join_key == SIDES[entity]]
    if not chosen:
        msg = (
            f"the applied registry has no {entity} view (join key {SIDES[entity]}); the ranker needs at"
            f" least one: add one under features/ and run `headwater apply`"
        )
        raise RegistryBindingError(msg)
    layouts = tuple(view_layout(compile_view(v)) for v in chosen)
    seen: dict[str, str] = {}
    for layout in layouts:
        for slot in layout.features:
            if slot in seen:
                msg = (
                    f"{entity} views {seen[slot]!r} and {layout.view!r} both have a slot {slot!r}; the"
                    f" ranker's {entity} vector names each slot once: rename one feature"
                )
                raise RegistryBindingError(msg)
            seen[slot] = layout.view
    return SideViews(
        entity,
        layouts,
        tuple(empty_vector(v) for v in chosen),
        tuple(v.tier for v in chosen),
        tuple(float(v.freshness_sla_s) for v in chosen),
    )


def bind_plans(plans: Sequence[TierPlan], popularity: str) -> BoundRegistry:
    """Bind the tier ``plans`` (in tier order); ``popularity`` is ``<item view>.<slot>``."""
    if not plans:
        msg = "no tier plan to bind the ranker to; run `headwater apply features/`"
        raise RegistryBindingError(msg)
    views = [v for p in plans for v in p.views]
    user, item = side_views("user", views), side_views("item", views)
    view_name, _, slot = popularity.partition(".")
    layout = next((lay for lay in item.layouts if lay.view == view_name), None)
    if layout is None or slot not in layout.features:
        known = [f"{lay.view}.{s}" for lay in item.layouts for s in lay.features if "." not in s]
        msg = (
            f"popularity feature {popularity!r}: expected <item view>.<slot> of the applied registry;"
            f" known: {', '.join(known)}"
        )
        raise RegistryBindingError(msg)
    on_demand = None
    if plans[0].on_demand:
        on_demand = OnDemandProgram.bind(
            plans[0].on_demand,
            slot_index([(lay.view, lay.features) for lay in user.layouts]),
            slot_index([(lay.view, lay.features) for lay in item.layouts]),
        )
    return BoundRegistry(
        short_version(plans[0].registry_hash), user, item, layout, layout.features.index(slot), on_demand
    )


def load_registry(state_dir: Path, popularity: str) -> BoundRegistry:
    """Read the applied plans of every tier under ``state_dir`` and bind them."""
    plans = []
    for tier in TIER_NAMES:
        try:
            plans.append(read_plan(state_dir, tier))
        except FileNotFoundError as exc:
            raise RegistryBindingError(str(exc)) from exc
        except ValueError as exc:
            msg = f"{state_dir}: the {tier} plan cannot be read: {exc}"
            raise RegistryBindingError(msg) from exc
    hashes = {p.registry_hash for p in plans}
    if len(hashes) > 1:
        msg = (
            f"{state_dir}/plans: the tier plans come from different registry versions {sorted(hashes)};"
            " run `headwater apply` again"
        )
        raise RegistryBindingError(msg)
    return bind_plans(plans, popularity)


def registry_from_repo(repo: Path, popularity: str) -> BoundRegistry:
    """Check a feature repo (e.g. ``features/``) and bind its plans without applying them (tests, benches)."""
    from headwater.registry.plans import build_plans, registry_hash
    from headwater.registry.validate import check_repo

    result = check_repo(repo)
    if not result.ok:
        msg = f"feature repo {repo}: `headwater check {repo}` reports errors; fix them first"
        raise RegistryBindingError(msg)
    plans = build_plans(result, registry_hash(result))
    return bind_plans([plans[t] for t in TIER_NAMES], popularity)
