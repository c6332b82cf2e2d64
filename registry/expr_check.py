"""Type-check a ``where`` AST against the event schema of the view's source.

Each leaf must name a field of the schema; literals must fit the field's kind (text for strings,
a declared symbol for enums, numbers for numeric fields); ordering comparisons need a numeric or
string field; ``is null`` needs a nullable field. All problems are returned, not only the first.
"""

from __future__ import annotations

import difflib

from headwater.registry.avro import EventField, EventSchema
from headwater.registry.expr import Compare, Expr, ExprError, InList, IsNull, Literal, fields_of


def check_expr(expr: Expr, schema: EventSchema) -> list[ExprError]:
    """Every type error in ``expr``; an empty list when it is well typed."""
    problems: list[ExprError] = []
    for leaf in fields_of(expr):
        if not isinstance(leaf, Compare | InList | IsNull):
            continue
        event_field = schema.fields.get(leaf.field)
        if event_field is None:
            problems.append(unknown_field(leaf.field, leaf.pos, schema))
            continue
        problems.extend(_check_leaf(leaf, event_field))
    return problems


def unknown_field(name: str, pos: int, schema: EventSchema) -> ExprError:
    """Build the error for a field that the schema does not have, with a did-you-mean hint."""
    close = difflib.get_close_matches(name, list(schema.fields), n=1)
    hint = f"did you mean '{close[0]}'?" if close else f"use one of: {schema.field_list()}"
    msg = f"unknown event field '{name}' (schema {schema.path.name})"
    return ExprError(msg, pos, hint)


def _check_leaf(leaf: Compare | InList | IsNull, event_field: EventField) -> list[ExprError]:
    if isinstance(leaf, IsNull):
        if not event_field.nullable:
            msg = f"field '{leaf.field}' ({event_field.describe()}) is never null, so `is null` is constant"
            return [ExprError(msg, leaf.pos, "remove the null test")]
        return []
    if isinstance(leaf, Compare) and leaf.op not in ("=", "!=") and event_field.kind in ("enum", "boolean"):
        msg = f"'{leaf.op}' does not order {event_field.kind} field '{leaf.field}'"
        return [ExprError(msg, leaf.pos, f"use = / != / in with {event_field.describe()}")]
    values = (leaf.value,) if isinstance(leaf, Compare) else leaf.values
    return [e for v in values if (e := _check_literal(leaf, event_field, v)) is not None]


def _check_literal(leaf: Compare | InList, event_field: EventField, value: Literal) -> ExprError | None:
    kind = event_field.kind
    if kind == "enum":
        if isinstance(value, str) and value in event_field.symbols:
            return None
        close = difflib.get_close_matches(str(value), event_field.symbols, n=1)
        hint = f"did you mean '{close[0]}'?" if close else f"use one of: {', '.join(event_field.symbols)}"
        msg = f"{value!r} is not a value of enum field '{leaf.field}' ({', '.join(event_field.symbols)})"
        return ExprError(msg, leaf.pos, hint)
    if kind == "string" and not isinstance(value, str):
        msg = f"string field '{leaf.field}' compared with {value!r}"
        return ExprError(msg, leaf.pos, f"quote the value: '{value}'")
    if event_field.numeric and (isinstance(value, bool) or not isinstance(value, int | float)):
        msg = f"numeric field '{leaf.field}' ({event_field.describe()}) compared with {value!r}"
        return ExprError(msg, leaf.pos, "compare with a number, without quotes")
    if kind == "boolean" and not isinstance(value, bool):
        msg = f"boolean field '{leaf.field}' compared with {value!r}"
        return ExprError(msg, leaf.pos, "compare with true or false")
    return None
