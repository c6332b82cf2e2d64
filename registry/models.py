"""The strict schema of the feature repo's YAML files (pydantic v2, unknown keys are errors).

Files:
    ``entities.yaml``  ``entities: [{name, join_key, description}]``
    ``sources.yaml``   ``sources: [{name, topic, schema, event_time, expected_rate_per_s, ...}]``
    ``budget.yaml``    ``tiers: {realtime: 30, ...}`` and optional ``owners: {team: 20}`` (CPU-h/day)
    one file per view  :class:`ViewSpec`

Models are frozen and strict (no silent ``"5" -> 5``); durations are parsed into
:class:`~headwater.registry.durations.Duration` as they load. Cross-references (entity, source,
event fields, tiers, costs) are checked later by :mod:`headwater.registry.validate`.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PlainValidator

from headwater.registry.durations import EXPECTED_FORMS, Duration, DurationError, parse_duration

NAME_PATTERN = r"^[a-z][a-z0-9_]*$"
TierName = Literal["realtime", "nearline", "offline"]
AggName = Literal["count", "sum", "avg", "min", "max", "last", "distinct_count", "top_k", "ratio"]
OperandAggName = Literal["count", "sum", "avg", "min", "max", "distinct_count"]
DtypeName = Literal["int64", "float64", "string", "bool", "map<string,float64>"]
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


class SourceSpec(Spec):
    """An event stream: a Kafka topic with an Avro schema and its expected rate."""

    name: Name
    topic: NonEmpty
    schema_path: NonEmpty = Field(alias="schema")
    event_time: Name
    expected_rate_per_s: Annotated[float, Field(gt=0)]
    max_out_of_orderness: DurationField | None = None
    allowed_lateness: DurationField | None = None
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


class OperandSpec(Spec):
    """One side of a ``ratio``: an aggregation over the feature's window."""

    agg: OperandAggName
    field: Name | None = None
    where: NonEmpty | None = None


class FeatureSpec(Spec):
    """One feature of a view: an aggregation of event fields over a window."""

    name: Name
    agg: AggName
    window: DurationField
    field: Name | None = None
    where: NonEmpty | None = None
    slide: DurationField | None = None
    k: Annotated[int, Field(ge=1, le=1000)] | None = None
    numerator: OperandSpec | None = None
    denominator: OperandSpec | None = None
    dtype: DtypeName | None = None
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


class ViewSpec(ViewHeader):
    """One feature view file, features included."""

    features: Annotated[list[FeatureSpec], Field(min_length=1)]


def is_name(text: str) -> bool:
    """Whether ``text`` is a valid registry name (lower snake case)."""
    return bool(_NAME.match(text))
