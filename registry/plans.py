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
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from headwater.registry.compiled import (
    CheckResult,
    CompiledFeature,
    CompiledOnDemandView,
    CompiledSource,
    CompiledView,
    Operand,
)
from headwater.registry.errors import HeadwaterError
from headwater.registry.expr import Compare, Expr, InList, IsNull, fields_of, from_json, to_json
from headwater.registry.expr_sql import DIALECTS, to_sql
from headwater.registry.expr_value import to_json as value_json
from headwater.registry.sources import DEFAULT_ID_CHARSET, DEFAULT_ID_MAX_BYTES, resolve_ids, resolve_timing
from headwater.registry.tiers import TIER_NAMES, TIERS

SCHEMA_VERSION = 2


class NoPlanError(HeadwaterError, FileNotFoundError):
    """No plan of a tier was applied: run `headwater apply` first."""


class PlanError(HeadwaterError, ValueError):
    """An applied plan this code cannot read: not JSON, not a plan, or of another schema_version."""


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
    version: str
    """What defines the view's values (see :func:`view_version`): a new version restarts its state."""
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
    late: str = "drop"
    """Late events (landed ``late = true``): ``drop`` or ``heal`` (the offline job also writes healed
    values counting them, in their own table). No part of :attr:`version`: the streaming tiers and
    the served tables compute the same values under both, so changing it restarts no state."""


class PlanSchema(PlanModel):
    """One version of a source's Avro schema: its fingerprint and its JSON text."""

    fingerprint: str
    """CRC-64-AVRO of the Parsing Canonical Form: the ``schema-fp`` header of events written with it."""
    json_text: str


class PlanField(PlanModel):
    """One field of a source's current (reader) schema, as the registry types it."""

    name: str
    kind: str
    """string | enum | int | long | float | double | boolean | timestamp."""
    nullable: bool
    symbols: list[str] = []
    time_unit: str = ""
    """``ms`` or ``us`` for a timestamp."""


class PlanSource(PlanModel):
    """A source: its topic, every schema version, keys, rules and event-time limits.

    Everything a tier needs to read the source's events is here, resolved: no tier keeps a field
    name, a topic or a default of its own (the defaults live in :mod:`headwater.registry.sources`).
    Times are milliseconds.
    """

    name: str
    topic: str
    schemas: list[PlanSchema]
    """Every version the topic's events may be written with, oldest first; the last is current."""
    fields: list[PlanField]
    """The current schema's fields, in Avro order: what every tier decodes events into."""
    event_time: str
    key: str | None
    """The field the topic is keyed by (records of one key stay in order in one partition)."""
    event_id: str | None
    """The field that identifies an event for de-duplication; None: events are not de-duplicated."""
    expected_rate_per_s: float
    max_out_of_orderness_ms: int
    allowed_lateness_ms: int
    max_future_ms: int
    min_event_time_ms: int
    max_event_time_ms: int
    rules: list[PlanWhere]
    """Conditions every valid event meets; a failing event is dead-lettered as ``invalid_field``."""
    id_max_bytes: int = DEFAULT_ID_MAX_BYTES
    """The longest string key / event id in UTF-8 bytes (``ids.max_bytes``); longer: ``invalid_id``."""
    id_charset: str = DEFAULT_ID_CHARSET
    """``any`` (no NUL) or ``printable`` (``ids.charset``): see :mod:`headwater.pipelines.events.ids`."""

    @property
    def current(self) -> PlanSchema:
        """The schema events are read into (the newest version)."""
        return self.schemas[-1]

    @property
    def event_time_unit(self) -> str:
        """``ms`` or ``us``: the unit of the event-time field on the wire."""
        return next(f.time_unit or "ms" for f in self.fields if f.name == self.event_time)

    def field(self, name: str) -> PlanField | None:
        """Return the current schema's field ``name``, or None."""
        return next((f for f in self.fields if f.name == name), None)


class PlanOnDemandFeature(PlanModel):
    """A request-time feature: the expression as written and its AST (:mod:`.expr_value`)."""

    name: str
    expression: str
    ast: dict[str, Any]
    description: str = ""


class PlanOnDemandView(PlanModel):
    """A ``tier: on_demand`` view: computed by the service per (user, item, request)."""

    name: str
    version: str
    inputs: list[str]
    owner: str
    description: str
    tags: dict[str, str]
    features: list[PlanOnDemandFeature]
    ops: int
    """Vector operations per request (the serving cost unit)."""
    defined_at: str


class TierPlan(PlanModel):
    """Everything one tier runs, stamped with the registry hash.

    ``on_demand`` (the same in every plan) lists the request-time views the service computes.
    """

    schema_version: int
    tier: str
    registry_hash: str
    generated_at: str
    tier_spec: dict[str, float]
    entities: dict[str, str]
    sources: list[PlanSource]
    views: list[PlanView]
    on_demand: list[PlanOnDemandView] = []


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


def plan_view(v: CompiledView, source: PlanSource) -> PlanView:
    """Build the plan form of a compiled view that reads ``source``."""
    features = [plan_feature(f) for f in v.features]
    return PlanView(
        name=v.name,
        version=view_version(v.entity, v.join_key, v.tier, features, source),
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
        features=features,
        defined_at=f"{v.file}:{v.line}",
        late=v.late,
    )


_VALUE_KEYS = (
    "name",
    "agg",
    "dtype",
    "window_s",
    "slide_s",
    "field",
    "k",
    "where",
    "numerator",
    "denominator",
)


def view_version(
    entity: str, join_key: str, tier: str, features: list[PlanFeature], source: PlanSource
) -> str:
    """Hash what defines a view's values, and nothing else: ``v`` + 16 hex digits.

    In: the entity and join key, the tier, each feature's aggregation, dtype, field, filter, window
    and slide, and of the source what these values are computed from (topic, event-time field and
    rules, event id, rules, a non-default id policy, and the types of the fields the view reads).
    Out: description, owner, cost, SLA, tags, and schema changes to fields the view does not read.
    Editing only those keeps the view's streaming state and online values.
    """
    used = {source.event_time, join_key, *(n for n in (source.event_id,) if n)}
    for f in features:
        for part in (f, f.numerator, f.denominator):
            if part is None:
                continue
            used.update(n for n in (part.field,) if n)
            if part.where is not None:
                leaves = fields_of(from_json(part.where.ast))
                used.update(leaf.field for leaf in leaves if isinstance(leaf, Compare | InList | IsNull))
    payload = {
        "entity": entity,
        "join_key": join_key,
        "tier": tier,
        "features": [{k: _plain(getattr(f, k)) for k in _VALUE_KEYS} for f in features],
        "source": {
            "name": source.name,
            "topic": source.topic,
            "event_time": source.event_time,
            "event_id": source.event_id,
            "timing": [
                source.max_out_of_orderness_ms,
                source.allowed_lateness_ms,
                source.max_future_ms,
                source.min_event_time_ms,
            ],
            "rules": [r.text for r in source.rules],
            "fields": [f.model_dump() for f in source.fields if f.name in used],
        },
    }
    # The id policy decides which events count, as the rules do; the default one is left out of the
    # hash so that views defined before ``ids:`` existed keep their version.
    if (source.id_max_bytes, source.id_charset) != (DEFAULT_ID_MAX_BYTES, DEFAULT_ID_CHARSET):
        payload["source"]["ids"] = [source.id_max_bytes, source.id_charset]  # type: ignore[index]
    canonical = json.dumps(payload, sort_keys=True, separators=(",", ":"))
    return "v" + hashlib.sha256(canonical.encode()).hexdigest()[:16]


def _plain(value: Any) -> Any:
    if isinstance(value, PlanWhere):
        return value.ast
    if isinstance(value, PlanOperand):
        return {"agg": value.agg, "field": value.field, "where": value.where.ast if value.where else None}
    return value


def plan_source(src: CompiledSource) -> PlanSource:
    """Build the plan form of a checked source (defaults resolved by :func:`resolve_timing`)."""
    spec = src.spec
    timing = resolve_timing(spec)
    id_max_bytes, id_charset = resolve_ids(spec)
    versions = [*src.previous, src.schema]
    return PlanSource(
        name=spec.name,
        topic=spec.topic,
        schemas=[PlanSchema(fingerprint=s.fingerprint, json_text=s.raw_json) for s in versions],
        fields=[
            PlanField(
                name=f.name, kind=f.kind, nullable=f.nullable, symbols=list(f.symbols), time_unit=f.time_unit
            )
            for f in src.schema.fields.values()
        ],
        event_time=spec.event_time,
        key=spec.key,
        event_id=spec.event_id,
        expected_rate_per_s=spec.expected_rate_per_s,
        max_out_of_orderness_ms=timing.max_out_of_orderness_ms,
        allowed_lateness_ms=timing.allowed_lateness_ms,
        max_future_ms=timing.max_future_ms,
        min_event_time_ms=timing.min_event_time_ms,
        max_event_time_ms=timing.max_event_time_ms,
        rules=[w for r in src.rules if (w := _where(r.expr, r.text)) is not None],
        id_max_bytes=id_max_bytes,
        id_charset=id_charset,
    )


def plan_sources(result: CheckResult) -> list[PlanSource]:
    """Build the plan form of every checked source, by name."""
    return [plan_source(src) for _, src in sorted(result.sources.items())]


def plan_views(result: CheckResult) -> list[PlanView]:
    """Build the plan form of every checked view, by name."""
    sources = {s.name: s for s in plan_sources(result)}
    return [plan_view(v, sources[v.source]) for v in sorted(result.views, key=lambda v: v.name)]


def plan_on_demand(v: CompiledOnDemandView) -> PlanOnDemandView:
    """Build the plan form of a checked on-demand view (its version hashes the expressions)."""
    features = [
        PlanOnDemandFeature(
            name=f.name, expression=f.expression, ast=value_json(f.ast), description=f.description
        )
        for f in v.features
    ]
    defining = json.dumps([[f.name, f.ast] for f in features], sort_keys=True, separators=(",", ":"))
    return PlanOnDemandView(
        name=v.name,
        version="v" + hashlib.sha256(defining.encode()).hexdigest()[:16],
        inputs=list(v.inputs),
        owner=v.owner,
        description=v.description,
        tags=dict(v.tags),
        features=features,
        ops=v.ops,
        defined_at=f"{v.file}:{v.line}",
    )


def short_version(registry_hash: str) -> str:
    """Return the short form of a registry hash: 16 hex digits after ``sha256:``."""
    return registry_hash.removeprefix("sha256:")[:16]


def view_versions(views: Iterable[PlanView]) -> dict[str, str]:
    """Return ``{view name: view version}``: what a training set, a model and the service record."""
    return {v.name: v.version for v in sorted(views, key=lambda v: v.name)}


def registry_hash(result: CheckResult) -> str:
    """sha256 of the checked definitions (not of file names or line numbers)."""
    # ``late: drop`` (the default) is left out, so a repo that never set ``late`` keeps its hash
    views = [v.model_dump(exclude={"defined_at", *(("late",) if v.late == "drop" else ())})
             for v in plan_views(result)]  # fmt: skip
    payload = {
        "entities": {n: e.join_key for n, e in sorted(result.entities.items())},
        "sources": [s.model_dump() for s in plan_sources(result)],
        "views": views,
    }
    if result.on_demand:  # only when there is one: the hash of a repo without any stays what it was
        payload["on_demand"] = [
            plan_on_demand(v).model_dump(exclude={"defined_at"}) for v in result.on_demand
        ]
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
        views = [v for v in plan_views(result) if v.tier == tier]
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
            on_demand=[plan_on_demand(v) for v in result.on_demand],
        )
    return plans


def plan_path(state_dir: Path, tier: str) -> Path:
    """Where the plan of ``tier`` lives under the state folder."""
    return state_dir / "plans" / f"{tier}.json"


def read_plan(state_dir: Path, tier: str) -> TierPlan:
    """Read the plan of ``tier`` written by ``headwater apply``.

    Raises:
        NoPlanError: when no plan was applied (run ``headwater apply``); a FileNotFoundError.
        PlanError: when the plan is not JSON, not a plan, or of another schema_version; a ValueError.
    """
    path = plan_path(state_dir, tier)
    if not path.is_file():
        msg = f"no {tier} plan at {path}; run `headwater apply` first"
        raise NoPlanError(msg)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        msg = f"{path} is not JSON ({exc}); re-run `headwater apply`"
        raise PlanError(msg) from exc
    if not isinstance(data, dict) or data.get("schema_version") != SCHEMA_VERSION:
        found = data.get("schema_version") if isinstance(data, dict) else None
        msg = (
            f"{path} has plan schema_version {found}, this code reads "
            f"{SCHEMA_VERSION}; re-run `headwater apply` with this version"
        )
        raise PlanError(msg)
    try:
        return TierPlan.model_validate(data)
    except ValidationError as exc:
        msg = f"{path} is not a {tier} plan this code reads: {exc}; re-run `headwater apply`"
        raise PlanError(msg) from exc
