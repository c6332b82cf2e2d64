"""Builders of plan objects for tests of any tier: a feature or a filter in one line.

Plans normally come from ``headwater apply``; tests of the window semantics (unit tests, the tiers'
integration tests, benchmarks) build small ones directly with these, in minutes of window and slide.
"""

from __future__ import annotations

from typing import Any

from headwater.registry.expr import parse, to_json
from headwater.registry.plans import PlanFeature, PlanView, PlanWhere


def plan_where(text: str | None) -> PlanWhere | None:
    """Return the plan form of a ``where`` filter (AST only; no SQL), or None."""
    return None if text is None else PlanWhere(text=text, ast=to_json(parse(text)), sql={})


def plan_feature(
    name: str,
    agg: str,
    window_min: int,
    slide_min: int,
    field: str | None = None,
    flt: str | None = None,
    **kw: Any,
) -> PlanFeature:
    """Return a float64 plan feature with a window and slide in minutes and an optional filter."""
    return PlanFeature(
        name=name,
        agg=agg,
        dtype="float64",
        window=f"{window_min}m",
        window_s=window_min * 60,
        slide_s=slide_min * 60,
        field=field,
        where=plan_where(flt),
        **kw,
    )


def plan_view(name: str, features: list[PlanFeature], **overrides: Any) -> PlanView:
    """Return a nearline view keyed by user (``overrides`` replace any other field)."""
    fields: dict[str, Any] = {
        "version": f"vtest-{name}",
        "entity": "user",
        "join_key": "user_id",
        "source": "events",
        "tier": "nearline",
        "freshness_sla": "PT5M",
        "freshness_sla_s": 300,
        "compute_cost": 1,
        "estimated_cost": 1,
        "owner": "tests",
        "description": "",
        "tags": {},
        "defined_at": "tests.yaml:1",
    }
    return PlanView(name=name, features=features, **{**fields, **overrides})
