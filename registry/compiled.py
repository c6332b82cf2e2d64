"""The checked, resolved form of a feature repo: what plan, apply and the tier plans are made of.

Specs are what the user wrote; these are what it means: durations in seconds, the effective slide,
the parsed ``where`` AST, the inferred dtype, the entity's join key, the cost estimate.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from headwater.registry.avro import EventSchema
from headwater.registry.diagnostics import Diagnostics
from headwater.registry.durations import Duration
from headwater.registry.expr import Expr
from headwater.registry.expr_value import Value, size_of
from headwater.registry.models import BudgetFile, EntitySpec, ExpectationSpec, SourceSpec


@dataclass(frozen=True)
class Operand:
    """One side of a ratio (its ``where`` already combined with the feature's own)."""

    agg: str
    field: str | None
    where: Expr | None
    where_text: str | None


@dataclass(frozen=True)
class CompiledFeature:
    """A feature with its window, slide, filter and dtype resolved."""

    name: str
    agg: str
    window: Duration
    slide: Duration
    dtype: str
    field: str | None = None
    k: int | None = None
    where: Expr | None = None
    where_text: str | None = None
    numerator: Operand | None = None
    denominator: Operand | None = None
    description: str = ""
    line: int = 0
    expect: ExpectationSpec | None = None
    """What ``headwater monitor`` checks the served values against; no part of the view's version."""


@dataclass(frozen=True)
class CompiledView:
    """A checked feature view, ready for the cost model, plan and apply."""

    name: str
    entity: str
    join_key: str
    source: str
    tier: str
    freshness_sla: Duration
    compute_cost: float
    owner: str
    description: str
    features: tuple[CompiledFeature, ...]
    file: str
    line: int
    tags: tuple[tuple[str, str], ...] = ()
    estimated_cost: float = 0.0
    late: str = "drop"
    """The late-event policy (``drop`` | ``heal``); no part of the view's version (see PlanView.late)."""

    @property
    def charged_cost(self) -> float:
        """What the budget counts: the declared cost, or the estimate when that is higher."""
        return max(self.compute_cost, self.estimated_cost)

    @property
    def longest_window_s(self) -> float:
        """The longest window of the view's features, in seconds."""
        return max(f.window.seconds for f in self.features) if self.features else 0.0


@dataclass(frozen=True)
class SourceRule:
    """A condition every valid event of a source meets (``rules`` in ``sources.yaml``)."""

    text: str
    expr: Expr


@dataclass(frozen=True)
class CompiledSource:
    """A source with its current event schema, every earlier version, and its parsed rules."""

    spec: SourceSpec
    schema: EventSchema
    previous: tuple[EventSchema, ...] = ()
    rules: tuple[SourceRule, ...] = ()


@dataclass(frozen=True)
class CompiledOnDemandFeature:
    """A request-time feature: its checked expression (:mod:`headwater.registry.expr_value`)."""

    name: str
    expression: str
    ast: Value
    description: str = ""
    line: int = 0


@dataclass(frozen=True)
class CompiledOnDemandView:
    """A checked ``tier: on_demand`` view: computed by the service, on no streaming tier."""

    name: str
    inputs: tuple[str, ...]
    owner: str
    description: str
    features: tuple[CompiledOnDemandFeature, ...]
    file: str
    line: int
    tags: tuple[tuple[str, str], ...] = ()

    @property
    def ops(self) -> int:
        """Vector operations per request (AST nodes of every expression): the serving cost unit."""
        return sum(size_of(f.ast) for f in self.features)


@dataclass
class CheckResult:
    """The outcome of ``headwater check``: findings plus everything that compiled."""

    root: Path
    diagnostics: Diagnostics
    entities: dict[str, EntitySpec] = field(default_factory=dict)
    sources: dict[str, CompiledSource] = field(default_factory=dict)
    views: list[CompiledView] = field(default_factory=list)
    on_demand: list[CompiledOnDemandView] = field(default_factory=list)
    """On-demand views in evaluation order (an input before the features that read it)."""
    budget: BudgetFile | None = None
    view_files: int = 0

    @property
    def ok(self) -> bool:
        """True when there is no error (warnings allowed)."""
        return not self.diagnostics.errors
