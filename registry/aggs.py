"""The aggregations: which fields each accepts and what dtype it yields.

One table, read by validation (type rules) and the compiled plans (``dtype``); what an aggregation
costs is the calibrated cost model's (registry/cost.py). ``ratio`` divides two aggregations over
the same window (CTR = count where click / count where impression); its value is null when the
denominator is zero.
"""

from __future__ import annotations

from dataclasses import dataclass

from headwater.registry.avro import EventField

ANY = frozenset({"string", "enum", "int", "long", "float", "double", "boolean", "timestamp"})
NUMBERS = frozenset({"int", "long", "float", "double"})
ORDERED = NUMBERS | {"timestamp"}
DISCRETE = frozenset({"string", "enum", "int", "long", "boolean"})


@dataclass(frozen=True)
class AggRule:
    """What one aggregation accepts and yields.

    Attributes:
        field: ``none`` (takes no field), ``optional`` or ``required``.
        kinds: the event field kinds it accepts when given a field.
        kinds_text: those kinds in words, for error messages.
    """

    name: str
    field: str
    kinds: frozenset[str]
    kinds_text: str


AGGS: dict[str, AggRule] = {
    "count": AggRule("count", "optional", ANY, "any field (counts events where it is not null)"),
    "sum": AggRule("sum", "required", NUMBERS, "a numeric field (int, long, float, double)"),
    "avg": AggRule("avg", "required", NUMBERS, "a numeric field (int, long, float, double)"),
    "min": AggRule("min", "required", ORDERED, "a numeric or timestamp field"),
    "max": AggRule("max", "required", ORDERED, "a numeric or timestamp field"),
    "last": AggRule("last", "required", ANY, "any field"),
    "distinct_count": AggRule(
        "distinct_count", "required", DISCRETE, "a string, enum, integer or boolean field"
    ),
    "top_k": AggRule("top_k", "required", DISCRETE, "a string, enum, integer or boolean field"),
    "ratio": AggRule("ratio", "none", frozenset(), "no field (give numerator and denominator)"),
}
AGG_NAMES: tuple[str, ...] = tuple(AGGS)
"""Every aggregation, in order: the one list the tiers, the models' Literal and the JVM operator follow."""
OPERAND_AGG_NAMES: tuple[str, ...] = ("count", "sum", "avg", "min", "max", "distinct_count")
"""The aggregations a ratio may divide (a subset of ``AGG_NAMES``)."""
FIELD_REQUIRED = frozenset(name for name, rule in AGGS.items() if rule.field == "required")
"""The aggregations that need a ``field``."""
DTYPES = ("int64", "float64", "string", "bool", "map<string,float64>")
WIDENINGS = {("int64", "float64")}


def field_dtype(event_field: EventField) -> str:
    """Return the registry dtype of an event field's values."""
    if event_field.kind in ("string", "enum"):
        return "string"
    if event_field.kind in ("float", "double"):
        return "float64"
    if event_field.kind == "boolean":
        return "bool"
    return "int64"


def output_dtype(agg: str, event_field: EventField | None) -> str:
    """Return the dtype ``agg`` yields over ``event_field`` (``None`` for field-less aggregations)."""
    if agg in ("count", "distinct_count"):
        return "int64"
    if agg in ("avg", "ratio"):
        return "float64"
    if agg == "top_k":
        return "map<string,float64>"
    if event_field is None:
        return "float64"
    return field_dtype(event_field)


def dtype_accepts(declared: str, inferred: str) -> bool:
    """Whether a declared dtype may hold the inferred one (equal, or int64 widened to float64)."""
    return declared == inferred or (inferred, declared) in WIDENINGS
