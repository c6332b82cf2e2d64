"""The compiled tier plans: the versioned JSON contract between the registry and the pipelines.

``headwater apply`` writes one plan per tier to ``<state>/plans/<tier>.json``. Each carries the
``registry_hash`` of the whole checked repo (the same in all three), so a tier can tell which
definitions its online values were computed from. Pipelines read plans with :func:`read_plan`
and never the YAML. Filters come both as AST JSON (for :mod:`headwater.registry.expr_eval`) and
as SQL for Flink and Spark (:mod:`headwater.registry.expr_sql`).
"""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from headwater.registry.compiled import CheckResult, CompiledFeature, CompiledView, Operand
from headwater.registry.expr import Expr, to_json
from headwater.registry.expr_sql import DIALECTS, to_sql
from headwater.registry.tiers import TIER_NAMES, TIERS

SCHEMA_VERSION = 1


class PlanModel(BaseModel):
    """Base of the plan models: frozen, unknown keys rejected (a newer writer is noticed)."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class PlanWhere(PlanModel):
    """A filter: the text written, its AST as JSON, and SQL per dialect."""

    text: str
    ast: dict[str, Any]
    sql: dict[str, str]


class PlanOperand(PlanModel):
    """One side of a ratio."""

    agg: str
    field: str | None
    where: PlanWhere | None


class PlanFeature(PlanModel):
    """One feature: aggregation, window and slide in seconds, filter, dtype."""

    name: str
    agg: str
    dtype: str
    window: str
    window_s: float
    slide_s: float
    field: str | None = None
    k: int | None = None
    where: PlanWhere | None = None
    numerator: PlanOperand | None = None
    denominator: PlanOperand | None = None
    description: str = ""


class PlanView(PlanModel):
    """One feature view as the tiers see it."""

    name: str
    entity: str
    join_key: str
    source: str
    tier: str
    freshness_sla: str
    freshness_sla_s: float
    compute_cost: float
    estimated_cost: float
    owner: str
    description: str
    tags: dict[str, str]
    features: list[PlanFeature]
    defined_at: str


class PlanSource(PlanModel):
    """A source: topic, schema and event-time handling."""

    name: str
    topic: str
    schema_path: str
    schema_sha256: str
    event_time: str
    expected_rate_per_s: float
    max_out_of_orderness_s: float | None
    allowed_lateness_s: float | None


class TierPlan(PlanModel):
    """Everything one tier runs, stamped with the registry hash."""

    schema_version: int
    tier: str
    registry_hash: str
    generated_at: str
    tier_spec: dict[str, float]
    entities: dict[str, str]
    sources: list[PlanSource]
    views: list[PlanView]


def _where(expr: Expr | None, text: str | None) -> PlanWhere | None:
    if expr is None or text is None:
        return None
    return PlanWhere(text=text, ast=to_json(expr), sql={d: to_sql(expr, d) for d in DIALECTS})


def _operand(op: Operand | None) -> PlanOperand | None:
    if op is None:
        return None
    return PlanOperand(agg=op.agg, field=op.field, where=_where(op.where, op.where_text))


def plan_feature(f: CompiledFeature) -> PlanFeature:
    """Build the plan form of a compiled feature."""
    return PlanFeature(
        name=f.name,
        agg=f.agg,
        dtype=f.dtype,
        window=str(f.window),
        window_s=f.window.seconds,
        slide_s=f.slide.seconds,
        field=f.field,
        k=f.k,
        where=_where(f.where, f.where_text),
        numerator=_operand(f.numerator),
        denominator=_operand(f.denominator),
        description=f.description,
    )


def plan_view(v: CompiledView) -> PlanView:
    """Build the plan form of a compiled view."""
    return PlanView(
        name=v.name,
        entity=v.entity,
        join_key=v.join_key,
        source=v.source,
        tier=v.tier,
        freshness_sla=str(v.freshness_sla),
        freshness_sla_s=v.freshness_sla.seconds,
        compute_cost=v.compute_cost,
        estimated_cost=round(v.estimated_cost, 4),
        owner=v.owner,
        description=v.description,
        tags=dict(v.tags),
        features=[plan_feature(f) for f in v.features],
        defined_at=f"{v.file}:{v.line}",
    )


def plan_sources(result: CheckResult) -> list[PlanSource]:
    """Build the plan form of every checked source."""
    out = []
    for name, src in sorted(result.sources.items()):
        spec = src.spec
        out.append(
            PlanSource(
                name=name,
                topic=spec.topic,
                schema_path=spec.schema_path,
                schema_sha256=hashlib.sha256(src.schema.raw_json.encode()).hexdigest(),
                event_time=spec.event_time,
                expected_rate_per_s=spec.expected_rate_per_s,
                max_out_of_orderness_s=spec.max_out_of_orderness.seconds
                if spec.max_out_of_orderness
                else None,
                allowed_lateness_s=spec.allowed_lateness.seconds if spec.allowed_lateness else None,
            )
        )
    return out


def registry_hash(result: CheckResult) -> str:
    """sha256 of the checked definitions (not of file names or line numbers)."""
    views = [
        plan_view(v).model_dump(exclude={"defined_at"}) for v in sorted(result.views, key=lambda v: v.name)
    ]
    payload = {
        "entities": {n: e.join_key for n, e in sorted(result.entities.items())},
        "sources": [s.model_dump() for s in plan_sources(result)],
        "views": views,
    }
    canonical = json.dumps(payload, sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


def build_plans(result: CheckResult, reg_hash: str) -> dict[str, TierPlan]:
    """One plan per tier (all three, possibly with no views)."""
    now = datetime.now(UTC).isoformat(timespec="seconds")
    sources = plan_sources(result)
    entities = {n: e.join_key for n, e in sorted(result.entities.items())}
    plans = {}
    for tier in TIER_NAMES:
        t = TIERS[tier]
        views = [plan_view(v) for v in sorted(result.views, key=lambda v: v.name) if v.tier == tier]
        plans[tier] = TierPlan(
            schema_version=SCHEMA_VERSION,
            tier=tier,
            registry_hash=reg_hash,
            generated_at=now,
            tier_spec={
                "freshness_floor_s": t.freshness_floor_s,
                "max_window_s": t.max_window_s,
                "default_slide_s": t.default_slide_s,
            },
            entities=entities,
            sources=sources,
            views=views,
        )
    return plans


def plan_path(state_dir: Path, tier: str) -> Path:
    """Where the plan of ``tier`` lives under the state folder."""
    return state_dir / "plans" / f"{tier}.json"


def read_plan(state_dir: Path, tier: str) -> TierPlan:
    """Read the plan of ``tier`` written by ``headwater apply``.

    Raises:
        FileNotFoundError: when no plan was applied (run ``headwater apply``).
        ValueError: when the plan's schema_version is not the one this code reads.
    """
    path = plan_path(state_dir, tier)
    if not path.is_file():
        msg = f"no {tier} plan at {path}; run `headwater apply` first"
        raise FileNotFoundError(msg)
    data = json.loads(path.read_text(encoding="utf-8"))
    if data.get("schema_version") != SCHEMA_VERSION:
        msg = (
            f"{path} has plan schema_version {data.get('schema_version')}, this code reads "
            f"{SCHEMA_VERSION}; re-run `headwater apply` with this version"
        )
        raise ValueError(msg)
    return TierPlan.model_validate(data)
