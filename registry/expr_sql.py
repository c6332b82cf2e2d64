"""Compile a ``where`` AST to a SQL predicate for Flink SQL or Spark SQL.

Both dialects quote identifiers with backticks (``position`` and ``query`` are reserved words).
They differ in string literals: Flink doubles a single quote and takes backslashes literally;
Spark reads backslash escapes, so both the quote and the backslash are escaped there. SQL's
three-valued logic matches :mod:`headwater.registry.expr_eval`.
"""

from __future__ import annotations

from headwater.registry.expr import And, Compare, Expr, InList, IsNull, Literal, Not

DIALECTS = ("flink", "spark")
_SQL_OPS = {"=": "=", "!=": "<>", "<": "<", "<=": "<=", ">": ">", ">=": ">="}


def to_sql(expr: Expr, dialect: str = "flink") -> str:
    """Return the SQL predicate for ``expr`` in ``dialect`` (``flink`` or ``spark``).

    Raises:
        ValueError: on an unknown dialect.
    """
    if dialect not in DIALECTS:
        msg = f"unknown SQL dialect {dialect!r}; expected one of {', '.join(DIALECTS)}"
        raise ValueError(msg)
    return _sql(expr, dialect, top=True)


def _sql(expr: Expr, dialect: str, top: bool = False) -> str:
    if isinstance(expr, Compare):
        return f"{_ident(expr.field)} {_SQL_OPS[expr.op]} {_literal(expr.value, dialect)}"
    if isinstance(expr, InList):
        values = ", ".join(_literal(v, dialect) for v in expr.values)
        return f"{_ident(expr.field)} {'NOT IN' if expr.negated else 'IN'} ({values})"
    if isinstance(expr, IsNull):
        return f"{_ident(expr.field)} IS {'NOT NULL' if expr.negated else 'NULL'}"
    if isinstance(expr, Not):
        return f"NOT ({_sql(expr.arg, dialect, top=True)})"
    joiner = " AND " if isinstance(expr, And) else " OR "
    text = joiner.join(_sql(arg, dialect) for arg in expr.args)
    return text if top else f"({text})"


def _ident(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _literal(value: Literal, dialect: str) -> str:
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, int | float):
        return repr(value)
    if dialect == "spark":
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    return "'" + value.replace("'", "''") + "'"
