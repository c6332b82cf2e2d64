"""Plan views, example sources and scripted histories built in code, for the offline tests and benchmarks.

``feature("clicks", "count", "2d", where="event_type = 'click'")`` gives the same
:class:`~headwater.registry.plans.PlanFeature` that ``headwater apply`` writes (filters compiled
to AST and Spark SQL by the registry), without a YAML repo.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from headwater.pipelines.events.schema import example_source
from headwater.registry.durations import parse_duration
from headwater.registry.expr import parse, to_json
from headwater.registry.expr_sql import DIALECTS, to_sql
from headwater.registry.plans import PlanFeature, PlanOperand, PlanSource, PlanView, PlanWhere

DAY_MS = 86_400_000
HOUR_MS = 3_600_000
T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z


def where(text: str | None) -> PlanWhere | None:
    """Return the plan form of a filter."""
    if text is None:
        return None
    expr = parse(text)
    return PlanWhere(text=text, ast=to_json(expr), sql={d: to_sql(expr, d) for d in DIALECTS})


def seconds(text: str) -> float:
    """Return a duration such as ``2d`` or ``PT1H`` in seconds."""
    return float(parse_duration(text).seconds)


def feature(
    name: str,
    agg: str,
    window: str,
    slide: str = "1d",
    field: str | None = None,
    filter_: str | None = None,
    k: int | None = None,
    dtype: str = "float64",
    num: tuple[str, str | None, str | None] | None = None,
    den: tuple[str, str | None, str | None] | None = None,
) -> PlanFeature:
    """One plan feature; ``num``/``den`` are (agg, field, filter) of a ratio's operands."""

    def operand(spec: tuple[str, str | None, str | None] | None) -> PlanOperand | None:
        return None if spec is None else PlanOperand(agg=spec[0], field=spec[1], where=where(spec[2]))

    return PlanFeature(
        name=name, agg=agg, dtype=dtype, window=window, window_s=seconds(window), slide_s=seconds(slide),
        field=field, k=k, where=where(filter_), numerator=operand(num), denominator=operand(den),
    )  # fmt: skip


def behaviour() -> PlanSource:
    """Return the example behaviour source (``events``: ms event time ``event_time``, id ``event_id``)."""
    return example_source("events")


def payments() -> PlanSource:
    """Return the example payments source (micros event time ``occurred_at``, event id ``payment_id``)."""
    return example_source("payments")


def view(
    name: str,
    entity: str,
    join_key: str,
    features: list[PlanFeature],
    tier: str = "offline",
    source: str = "events",
) -> PlanView:
    """One plan view (of the example behaviour source unless ``source`` says otherwise)."""
    return PlanView(
        name=name, version=f"vtest-{name}", entity=entity, join_key=join_key, source=source, tier=tier,
        freshness_sla="P1D",
        freshness_sla_s=86400.0, compute_cost=1.0, estimated_cost=1.0, owner="tests", description="",
        tags={}, features=features, defined_at=f"<code>:{name}",
    )  # fmt: skip


def event(n: int, user: str, kind: str, t: int, **fields: Any) -> dict[str, Any]:
    """Return a behaviour event with id ``e<n>`` (fields default to null, device ``web``)."""
    base: dict[str, Any] = {
        "event_id": f"e{n:05d}", "user_id": user, "item_id": None, "event_type": kind, "event_time": t,
        "session_id": f"s-{user}", "category": None, "price": None, "dwell_ms": None, "query": None,
        "position": None, "device": "web",
    }  # fmt: skip
    base.update(fields)
    return base


def payment(n: int, account: str, t_ms: int, **fields: Any) -> dict[str, Any]:
    """Return a payment ``p<n>`` at ``t_ms`` (``occurred_at`` in micros), by default 10.0 captured by card."""
    base: dict[str, Any] = {
        "payment_id": f"p{n:05d}", "account_id": account, "merchant_id": "m1", "method": "card",
        "status": "captured", "amount": 10.0, "currency": "EUR", "risk_score": None,
        "occurred_at": t_ms * 1000,
    }  # fmt: skip
    base.update(fields)
    return base


def write_plan(
    state_dir: Path,
    tier: str,
    views: list[PlanView],
    sources: list[PlanSource] | None = None,
    registry_hash: str = "sha256:" + "ab" * 32,
) -> Path:
    """Write a tier plan as ``headwater apply`` would (default sources: the example repo's two)."""
    from headwater.registry.plans import SCHEMA_VERSION, TierPlan, plan_path

    plan = TierPlan(
        schema_version=SCHEMA_VERSION, tier=tier, registry_hash=registry_hash,
        generated_at="2026-01-01T00:00:00+00:00", tier_spec={},
        entities={"user": "user_id", "item": "item_id", "account": "account_id", "merchant": "merchant_id"},
        sources=sources if sources is not None else [behaviour(), payments()], views=views,
    )  # fmt: skip
    path = plan_path(state_dir, tier)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(plan.model_dump_json(), encoding="utf-8")
    return path
