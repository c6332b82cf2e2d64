"""Evaluate a ``where`` AST over one event (a dict), with SQL's three-valued logic.

A comparison with a missing or null field is *unknown* (``None``), ``not unknown`` is unknown,
and a filter keeps an event only when the result is ``True``. This is exactly what the compiled
SQL predicate does on the realtime and offline tiers, so the nearline tier (which uses
:func:`compile_predicate`) keeps the same events as they do.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping
from typing import Any

from headwater.registry.expr import And, Compare, Expr, InList, IsNull, Not

Event = Mapping[str, Any]
Tri = bool | None
_OPS: dict[str, Callable[[Any, Any], bool]] = {
    "=": operator.eq,
    "!=": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}


def evaluate(expr: Expr, event: Event) -> Tri:
    """Return the three-valued truth of ``expr`` for ``event``: True, False, or None (unknown)."""
    return _compile(expr)(event)


def matches(expr: Expr | None, event: Event) -> bool:
    """Whether a filter keeps ``event`` (no filter keeps everything)."""
    return expr is None or _compile(expr)(event) is True


def compile_predicate(expr: Expr | None) -> Callable[[Event], bool]:
    """Turn ``expr`` into a fast ``event -> bool`` closure (built once, called per event)."""
    if expr is None:
        return lambda _event: True
    tri = _compile(expr)
    return lambda event: tri(event) is True


def compile_rule(expr: Expr) -> Callable[[Event], bool]:
    """Turn a source rule into an ``event -> holds`` closure with a SQL CHECK's meaning.

    A rule fails only when it is ``False``; an unknown result (a null compared) holds, as a CHECK
    constraint does in SQL, so the realtime SQL (``(rule) IS FALSE``) rejects the same events.
    """
    check = _compile(expr)
    return lambda event: check(event) is not False


def _compile(expr: Expr) -> Callable[[Event], Tri]:
    if isinstance(expr, Compare):
        return _compare(expr)
    if isinstance(expr, InList):
        return _in_list(expr)
    if isinstance(expr, IsNull):
        name, negated = expr.field, expr.negated
        return lambda event: (event.get(name) is None) != negated
    if isinstance(expr, Not):
        inner = _compile(expr.arg)
        return lambda event: _not(inner(event))
    parts = [_compile(arg) for arg in expr.args]
    return _all(parts) if isinstance(expr, And) else _any(parts)


def _compare(expr: Compare) -> Callable[[Event], Tri]:
    name, value, op = expr.field, expr.value, _OPS[expr.op]

    def run(event: Event) -> Tri:
        found = event.get(name)
        if found is None:
            return None
        try:
            return op(found, value)
        except TypeError:
            return None

    return run


def _in_list(expr: InList) -> Callable[[Event], Tri]:
    name, values, negated = expr.field, frozenset(expr.values), expr.negated

    def run(event: Event) -> Tri:
        found = event.get(name)
        if found is None:
            return None
        return (found in values) != negated

    return run


def _not(value: Tri) -> Tri:
    return None if value is None else not value


def _all(parts: list[Callable[[Event], Tri]]) -> Callable[[Event], Tri]:
    def run(event: Event) -> Tri:
        result: Tri = True
        for part in parts:
            value = part(event)
            if value is False:
                return False
            if value is None:
                result = None
        return result

    return run


def _any(parts: list[Callable[[Event], Tri]]) -> Callable[[Event], Tri]:
    def run(event: Event) -> Tri:
        result: Tri = False
        for part in parts:
            value = part(event)
            if value is True:
                return True
            if value is None:
                result = None
        return result

    return run
