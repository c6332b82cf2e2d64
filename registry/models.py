"""The strict schema of the feature repo's YAML files (pydantic v2, unknown keys are errors).

Files:
    ``entities.yaml``  ``entities: [{name, join_key, description}]``
    ``sources.yaml``   ``sources: [{name, topic, schema, event_time, expected_rate_per_s, ...}]``
    ``budget.yaml``    ``tiers: {realtime: 30, ...}`` and optional ``owners: {team: 20}`` (CPU-h/day)
    one file per view  :class:`ViewDefinition`, or :class:`OnDemandViewDefinition` (``tier: on_demand``)

Models are frozen and strict (no silent ``"5" -> 5``); durations are parsed into
:class:`~headwater.registry.durations.Duration` as they load. Cross-references (entity, source,
event fields, tiers, costs) are checked later by :mod:`headwater.registry.validate`.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PlainValidator, model_validator

from headwater.registry.durations import EXPECTED_FORMS, Duration, DurationError, parse_duration

NAME_PATTERN = r"^[a-z][a-z0-9_]*$"
TierName = Literal["realtime", "nearline", "offline"]
AggName = Literal["count", "sum", "avg", "min", "max", "last", "distinct_count", "top_k", "ratio"]
OperandAggName = Literal["count", "sum", "avg", "min", "max", "distinct_count"]
DtypeName = Literal["int64", "float64", "string", "bool", "map<string,float64>"]
LatePolicy = Literal["drop", "heal"]
_NAME = re.compile(NAME_PATTERN)


def _duration(value: Any) -> Duration:
    if isinstance(value, Duration):
        return value
    if isinstance(value, bool) or not isinstance(value, str):
        msg = f"{value!r} is not a duration; expected {EXPECTED_FORMS} (a bare number has no unit)"
        raise DurationError(msg)
    return parse_duration(value)


DurationField = Annotated[Duration, PlainValidator(_duration)]
Name = Annotated[str, Field(pattern=NAME_PATTERN, max_length=100)]
NonEmpty = Annotated[str, Field(min_length=1)]


class Spec(BaseModel):
    """Base of every YAML model: frozen, strict, unknown keys forbidden."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class EntitySpec(Spec):
    """An entity: what feature values are keyed by (``user`` keyed by ``user_id``)."""

    name: Name
    join_key: Name
    description: str = ""


class EntitiesFile(Spec):
    """``entities.yaml``."""

    entities: list[EntitySpec]


class IdsSpec(Spec):
    """A source's id policy: what text its string key and event-id fields may hold (``ids:``).

    An event whose id breaks it is dead-lettered as ``invalid_id`` by every tier (and refused by
    ``headwater events produce``), with the same reason text (:mod:`headwater.pipelines.events.ids`).
    """

    max_bytes: Annotated[int, Field(ge=1, le=4096)] | None = None
    """The longest id in UTF-8 bytes (1 to 4096; unset: 256): ids are in every key, changelog and
    state of every tier."""
    charset: Literal["any", "printable"] | None = None
    """Unset or ``any``: any valid UTF-8 but NUL; ``printable``: also no control, line-separator,
    bidirectional or invisible format character (the list is ``NOT_PRINTABLE`` in pipelines/events/ids.py)."""


class SourceSpec(Spec):
    """An event stream: a Kafka topic with an Avro schema, its keys and its event-time rules.

    Every rule the tiers apply to a source's events is declared here and resolved once by the
    registry into the plan (:class:`~headwater.registry.plans.PlanSource`); no tier keeps a default
    of its own. Unset values take the defaults of :mod:`headwater.registry.sources`.
    """

    name: Name
    topic: NonEmpty
    schema_path: NonEmpty = Field(alias="schema")
    previous_schemas: list[NonEmpty] = Field(default_factory=list)
    """Every schema the topic's events were written with before ``schema``, oldest first, so old
    events still decode (each must be readable by the current schema: Avro's resolution rules)."""
    event_time: Name
    key: Name | None = None
    """The field the topic is keyed (partitioned) by; unset: records are not keyed."""
    event_id: Name | None = None
    """The field that identifies an event, so a duplicate delivery counts once; unset: no dedup."""
    expected_rate_per_s: Annotated[float, Field(gt=0)]
    max_out_of_orderness: DurationField | None = None
    allowed_lateness: DurationField | None = None
    max_future: DurationField | None = None
    """Events further ahead of the tier's clock are dead-lettered as ``future_dated``."""
    min_event_time: Annotated[str, Field(pattern=r"^\d{4}-\d{2}-\d{2}$")] | None = None
    """Events before this UTC date are invalid (history of any age: set it early enough)."""
    rules: list[NonEmpty] = Field(default_factory=list)
    """Conditions every valid event meets (the ``where`` grammar); a failing event is dead-lettered."""
    ids: IdsSpec | None = None
    """The policy for the text of the string ``key`` and ``event_id`` fields; unset: 256 bytes, ``any``
    (the defaults of :mod:`headwater.registry.sources`)."""
    description: str = ""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, populate_by_name=True)


class SourcesFile(Spec):
    """``sources.yaml``."""

    sources: list[SourceSpec]


class BudgetFile(Spec):
    """``budget.yaml``: CPU-hours per day per tier, optionally per owner."""

    unit: Literal["cpu_hours_per_day"] = "cpu_hours_per_day"
    tiers: dict[TierName, Annotated[float, Field(ge=0)]]
    owners: dict[str, Annotated[float, Field(ge=0)]] = Field(default_factory=dict)
    state: dict[TierName, Annotated[float, Field(ge=0)]] = Field(default_factory=dict)
    """GiB of pipeline state per tier (optional): RocksDB / Flink keyed state, offline feature tables."""
    online_memory: dict[TierName, Annotated[float, Field(ge=0)]] = Field(default_factory=dict)
    """GiB of Redis memory per tier (optional): the online values of the tier's views."""
    entities: dict[str, Annotated[int, Field(ge=1)]] = Field(default_factory=dict)
    """Expected distinct keys per entity (optional): the state and memory estimates' input."""


class OperandDefinition(Spec):
    """One side of a ``ratio``: an aggregation over the feature's window."""

    agg: OperandAggName
    field: Name | None = None
    where: NonEmpty | None = None


class ExpectationSpec(Spec):
    """What a feature's values are expected to be (``expect:``), checked by ``headwater monitor``.

    Every key is optional; an unset key checks nothing. Expectations describe the data, not the
    computation: they version nothing (editing them keeps the view's state and online values).
    """

    min: Annotated[float, Field(allow_inf_nan=False)] | None = None
    """The smallest valid value: a served value below it is a breach (missing values are not counted)."""
    max: Annotated[float, Field(allow_inf_nan=False)] | None = None
    """The largest valid value: a served value above it is a breach."""
    max_missing_rate: Annotated[float, Field(ge=0, le=1)] | None = None
    """The largest share of served values that may be missing (null, NaN or infinite), 0 to 1."""
    max_drift_psi: Annotated[float, Field(ge=0, allow_inf_nan=False)] | None = None
    """The largest population stability index of the served values against the training set and
    against the previous day (0.1: a small shift, 0.25: a large one)."""
    max_drift_ks: Annotated[float, Field(ge=0, le=1)] | None = None
    """The largest two-sample Kolmogorov-Smirnov statistic (the widest gap of the two CDFs), 0 to 1."""

    @model_validator(mode="after")
    def _consistent(self) -> ExpectationSpec:
        # A contradictory range can never pass: refuse it at check time, not as a breach every day.
        if self.min is not None and self.max is not None and self.min > self.max:
            msg = f"min {self.min:g} is above max {self.max:g}: swap them"
            raise ValueError(msg)
        if all(getattr(self, key) is None for key in type(self).model_fields):
            msg = "an empty expect block checks nothing: give min, max, max_missing_rate, max_drift_psi"
            msg += " or max_drift_ks"
            raise ValueError(msg)
        return self


class FeatureDefinition(Spec):
    """One feature of a view: an aggregation of event fields over a window."""

    name: Name
    agg: AggName
    window: DurationField
    field: Name | None = None
    where: NonEmpty | None = None
    slide: DurationField | None = None
    k: Annotated[int, Field(ge=1, le=1000)] | None = None
    numerator: OperandDefinition | None = None
    denominator: OperandDefinition | None = None
    dtype: DtypeName | None = None
    expect: ExpectationSpec | None = None
    """Expectations on the feature's served values (range, missing rate, drift); unset: none."""
    description: str = ""


class ViewHeader(Spec):
    """A feature view file with its features not yet checked (each is validated on its own)."""

    feature_view: Name
    entity: Name
    source: Name
    tier: TierName
    freshness_sla: DurationField
    compute_cost: Annotated[float, Field(ge=0)]
    owner: NonEmpty
    description: NonEmpty
    features: Annotated[list[Any], Field(min_length=1)]
    tags: dict[str, str] = Field(default_factory=dict)
    late: LatePolicy = "drop"
    """Events the streaming tiers dead-letter as late: ``drop`` (no value counts them) or ``heal`` (the
    offline job writes corrected values counting them too, beside the served ones)."""


class ViewDefinition(ViewHeader):
    """One feature view file, features included."""

    features: Annotated[list[FeatureDefinition], Field(min_length=1)]


class OnDemandFeatureDefinition(Spec):
    """One request-time feature: an ``expression`` (:mod:`headwater.registry.expr_value`)."""

    name: Name
    expression: NonEmpty
    description: str = ""


class OnDemandViewDefinition(Spec):
    """A view of ``tier: on_demand``: features the service computes per (user, item, request).

    ``inputs`` lists the ``view.feature`` values the expressions read (user and item views, or
    other on-demand views); nothing runs on a streaming tier, so there is no source, SLA or cost.
    """

    feature_view: Name
    tier: Literal["on_demand"]
    inputs: Annotated[list[NonEmpty], Field(min_length=1)]
    owner: NonEmpty
    description: NonEmpty
    features: Annotated[list[OnDemandFeatureDefinition], Field(min_length=1)]
    tags: dict[str, str] = Field(default_factory=dict)


def is_name(text: str) -> bool:
    """Whether ``text`` is a valid registry name (lower snake case)."""
    return bool(_NAME.match(text))
