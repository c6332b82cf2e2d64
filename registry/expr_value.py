"""Value expressions of on-demand features: arithmetic over stored slots and the request.

Grammar (function names are case-insensitive)::

    expr    := term (("+" | "-") term)*
    term    := unary (("*" | "/") unary)*
    unary   := "-" unary | atom
    atom    := number | REF | FUNC "(" expr ("," expr)* ")" | "(" expr ")"
    REF     := view "." slot          a slot of a user or item view's online vector
             | view "." feature       a top_k feature as a whole (only as share_of's first argument)
             | on_demand_view "." feature
             | "request" "." field    time (epoch s), hour_of_day (0-23 UTC), day_of_week (0 = Monday)

Functions: ``coalesce(a, b)`` (b where a is missing), ``min(a, b)``, ``max(a, b)``, ``abs(a)``,
``log1p(a)``, ``same(a, b)`` (1 when equal, 0 when not; dictionary ids of one field or numbers),
``share_of(top_k feature, id)`` (the share of that value among the top_k; 0 when absent).

Semantics (one evaluator, :func:`evaluate`, over numpy columns: serving and training sets both call
it): values are float64; a missing value is NaN and propagates; ``/`` is a *safe* division, NaN
where the divisor is 0 or missing (never inf); ``log1p`` is NaN below -1. Nothing is ever ``eval``-ed.
The same nesting limit as the ``where`` language (:data:`headwater.registry.expr.MAX_NESTING`) holds.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from dataclasses import field as _field
from typing import Any

import numpy as np
import numpy.typing as npt

from headwater.registry.expr import MAX_NESTING, ExprError

REQUEST = "request"
REQUEST_FIELDS = ("time", "hour_of_day", "day_of_week")
FUNCTIONS: dict[str, tuple[int, str]] = {
    "coalesce": (2, "coalesce(a, b): b where a is missing"),
    "min": (2, "min(a, b)"),
    "max": (2, "max(a, b)"),
    "abs": (1, "abs(a)"),
    "log1p": (1, "log1p(a): ln(1 + a), missing below -1"),
    "same": (2, "same(a, b): 1 when equal, 0 when not"),
    "share_of": (2, "share_of(view.top_k_feature, id): the value's share among the top k"),
}
_TOKEN = re.compile(
    r"""(?P<ws>\s+)
      |(?P<number>(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?)
      |(?P<op>[-+*/])
      |(?P<punct>[(),])
      |(?P<name>[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*)""",
    re.VERBOSE,
)


@dataclass(frozen=True)
class Num:
    """A number literal."""

    value: float


@dataclass(frozen=True)
class Ref:
    """``view.slot`` / ``view.feature`` (``request.<field>`` too): ``name`` is the dotted text."""

    name: str
    pos: int = _field(default=0, compare=False)

    @property
    def view(self) -> str:
        """The part before the first dot (a view, or ``request``)."""
        return self.name.split(".", 1)[0]

    @property
    def member(self) -> str:
        """The part after the first dot (a slot, a feature or a request field)."""
        return self.name.split(".", 1)[1]


@dataclass(frozen=True)
class Neg:
    """``-arg``."""

    arg: Value


@dataclass(frozen=True)
class Binary:
    """``left op right`` with op one of ``+ - * /``."""

    op: str
    left: Value
    right: Value
    pos: int = _field(default=0, compare=False)


@dataclass(frozen=True)
class Call:
    """``func(args...)``."""

    func: str
    args: tuple[Value, ...]
    pos: int = _field(default=0, compare=False)


Value = Num | Ref | Neg | Binary | Call


def _tokens(text: str) -> list[tuple[str, str, int]]:
    out: list[tuple[str, str, int]] = []
    pos = 0
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        if match is None:
            msg = f"unexpected character {text[pos]!r} at position {pos + 1}"
            raise ExprError(msg, pos, "use view.slot references, numbers, + - * / and functions")
        if match.lastgroup != "ws":
            out.append((match.lastgroup or "", match.group(), pos))
        pos = match.end()
    out.append(("end", "", len(text)))
    return out


@functools.lru_cache(maxsize=1024)
def parse_value(text: str) -> Value:
    """Parse an on-demand ``expression`` into an AST.

    Raises:
        ExprError: with the position of the first token that does not fit the grammar.
    """
    parser = _Parser(_tokens(text))
    if parser.peek()[0] == "end":
        msg = "the expression is empty"
        raise ExprError(msg, 0, "write e.g. item_view.price / user_view.avg_price")
    result = parser.expr()
    kind, raw, pos = parser.peek()
    if kind != "end":
        msg = f"unexpected {raw!r} at position {pos + 1} after a complete expression"
        raise ExprError(msg, pos, "join terms with + - * /")
    return result


class _Parser:
    def __init__(self, tokens: list[tuple[str, str, int]]) -> None:
        self.tokens = tokens
        self.index = 0
        self.depth = 0

    def peek(self) -> tuple[str, str, int]:
        return self.tokens[self.index]

    def take(self) -> tuple[str, str, int]:
        token = self.tokens[self.index]
        self.index += 1
        return token

    def enter(self, pos: int) -> None:
        self.depth += 1
        if self.depth > MAX_NESTING:
            msg = f"the expression nests deeper than {MAX_NESTING} levels at position {pos + 1}"
            raise ExprError(msg, pos, "split it into several on-demand features")

    def expr(self) -> Value:
        left = self.term()
        while self.peek()[0] == "op" and self.peek()[1] in "+-":
            _, op, pos = self.take()
            left = Binary(op, left, self.term(), pos)
        return left

    def term(self) -> Value:
        left = self.unary()
        while self.peek()[0] == "op" and self.peek()[1] in "*/":
            _, op, pos = self.take()
            left = Binary(op, left, self.unary(), pos)
        return left

    def unary(self) -> Value:
        kind, raw, pos = self.peek()
        if kind == "op" and raw == "-":
            self.take()
            self.enter(pos)
            inner = self.unary()
            self.depth -= 1
            return Num(-inner.value) if isinstance(inner, Num) else Neg(inner)
        return self.atom()

    def atom(self) -> Value:
        kind, raw, pos = self.take()
        if kind == "number":
            return Num(float(raw))
        if kind == "punct" and raw == "(":
            self.enter(pos)
            inner = self.expr()
            self.expect(")", "')' to close the parenthesis")
            self.depth -= 1
            return inner
        if kind == "name" and self.peek()[:2] == ("punct", "("):
            return self.call(raw.lower(), pos)
        if kind == "name":
            if "." not in raw:
                msg = f"'{raw}' at position {pos + 1} is neither a reference nor a function"
                hint = "write view.feature (or request.time); functions: " + ", ".join(FUNCTIONS)
                raise ExprError(msg, pos, hint)
            return Ref(raw, pos)
        found = "the end of the expression" if kind == "end" else repr(raw)
        msg = f"expected a number, a view.feature reference or '(' at position {pos + 1}, found {found}"
        raise ExprError(msg, pos)

    def call(self, func: str, pos: int) -> Value:
        if func not in FUNCTIONS:
            msg = f"unknown function '{func}' at position {pos + 1}"
            raise ExprError(msg, pos, "use one of: " + ", ".join(FUNCTIONS))
        self.take()
        self.enter(pos)
        args = [self.expr()]
        while self.peek()[:2] == ("punct", ","):
            self.take()
            args.append(self.expr())
        self.expect(")", f"')' to close {func}(")
        self.depth -= 1
        arity, usage = FUNCTIONS[func]
        if len(args) != arity:
            msg = f"{func} takes {arity} argument(s), found {len(args)} at position {pos + 1}"
            raise ExprError(msg, pos, f"write {usage}")
        return Call(func, tuple(args), pos)

    def expect(self, text: str, what: str) -> None:
        kind, raw, pos = self.take()
        if kind != "punct" or raw != text:
            found = "the end of the expression" if kind == "end" else repr(raw)
            raise ExprError(f"expected {what} at position {pos + 1}, found {found}", pos)


def refs_of(expr: Value) -> list[Ref]:
    """Every reference of ``expr``, left to right (``request.*`` included)."""
    if isinstance(expr, Ref):
        return [expr]
    if isinstance(expr, Neg):
        return refs_of(expr.arg)
    if isinstance(expr, Binary):
        return refs_of(expr.left) + refs_of(expr.right)
    if isinstance(expr, Call):
        return [r for a in expr.args for r in refs_of(a)]
    return []


def size_of(expr: Value) -> int:
    """Count the AST nodes: the vector operations :func:`evaluate` runs (the serving cost unit)."""
    if isinstance(expr, Neg):
        return 1 + size_of(expr.arg)
    if isinstance(expr, Binary):
        return 1 + size_of(expr.left) + size_of(expr.right)
    if isinstance(expr, Call):
        return 1 + sum(size_of(a) for a in expr.args)
    return 1


# --- type check -----------------------------------------------------------------------------------

NUMBER = "number"


@dataclass(frozen=True)
class SlotType:
    """What a reference holds: a number, a dictionary id of ``field``, or a top_k feature of ``field``."""

    kind: str
    """``number``, ``id`` or ``top_k``."""
    field: str | None = None

    def describe(self) -> str:
        """Human text for messages (with its article)."""
        if self.kind == NUMBER:
            return "a number"
        return f"{'an' if self.kind == 'id' else 'a'} {self.kind} of field '{self.field}'"


def check_value(
    expr: Value, types: Callable[[Ref], SlotType | None]
) -> tuple[SlotType | None, list[ExprError]]:
    """Type ``expr``; ``types`` gives each reference's type (None: unknown, already reported).

    Arithmetic and the numeric functions need numbers; ``same`` needs two values of one kind;
    ``share_of`` needs a top_k feature and an id of the same field. Returns the type and every error.
    """
    problems: list[ExprError] = []
    result = _type(expr, types, problems)
    return result, problems


def _type(expr: Value, types: Callable[[Ref], SlotType | None], out: list[ExprError]) -> SlotType | None:
    if isinstance(expr, Num):
        return SlotType(NUMBER)
    if isinstance(expr, Ref):
        found = types(expr)
        if found is not None and found.kind == "top_k":
            msg = f"'{expr.name}' is a whole top_k feature; only share_of() reads it"
            out.append(ExprError(msg, expr.pos, f"write share_of({expr.name}, <an id of {found.field}>)"))
            return None
        return found
    if isinstance(expr, Neg):
        return _number(expr.arg, types, out, "-", 0)
    if isinstance(expr, Binary):
        left = _number(expr.left, types, out, expr.op, expr.pos)
        right = _number(expr.right, types, out, expr.op, expr.pos)
        return SlotType(NUMBER) if left and right else None
    if expr.func == "share_of":
        return _share_of(expr, types, out)
    if expr.func == "same":
        a, b = (_type(arg, types, out) for arg in expr.args)
        if a is not None and b is not None and a != b:
            msg = f"same() compares {a.describe()} with {b.describe()} at position {expr.pos + 1}"
            out.append(ExprError(msg, expr.pos, "compare two numbers, or two ids of one field"))
            return None
        return SlotType(NUMBER) if a and b else None
    kinds = [_number(arg, types, out, f"{expr.func}()", expr.pos) for arg in expr.args]
    return SlotType(NUMBER) if all(kinds) else None


def _number(
    expr: Value, types: Callable[[Ref], SlotType | None], out: list[ExprError], what: str, pos: int
) -> SlotType | None:
    found = _type(expr, types, out)
    if found is not None and found.kind != NUMBER:
        where = expr.pos if isinstance(expr, Ref) else pos
        name = expr.name if isinstance(expr, Ref) else "a value"
        msg = f"'{what}' needs numbers; {name} is {found.describe()} (a dictionary id, not a quantity)"
        out.append(ExprError(msg, where, "compare ids with same(a, b), or read a numeric slot"))
        return None
    return found


def _share_of(expr: Call, types: Callable[[Ref], SlotType | None], out: list[ExprError]) -> SlotType | None:
    first, second = expr.args
    top = types(first) if isinstance(first, Ref) else None
    if top is None or top.kind != "top_k":
        if not isinstance(first, Ref) or top is not None:
            msg = f"share_of() needs a top_k feature (view.feature) first, at position {expr.pos + 1}"
            out.append(ExprError(msg, expr.pos, "name a top_k feature, e.g. user_view.favourite_categories"))
        _type(second, types, out)
        return None
    key = _type(second, types, out)
    if key is not None and (key.kind != "id" or key.field != top.field):
        msg = f"share_of() looks up a value of field '{top.field}'; found {key.describe()}"
        out.append(ExprError(msg, expr.pos, f"pass an id of '{top.field}' (a top_k or last slot of it)"))
        return None
    return SlotType(NUMBER) if key else None


# --- JSON (the plan) --------------------------------------------------------------------------------


def to_json(expr: Value) -> dict[str, Any]:
    """Return the AST as JSON-ready dicts (the form stored in tier plans)."""
    if isinstance(expr, Num):
        return {"op": "num", "value": expr.value}
    if isinstance(expr, Ref):
        return {"op": "ref", "name": expr.name}
    if isinstance(expr, Neg):
        return {"op": "neg", "arg": to_json(expr.arg)}
    if isinstance(expr, Binary):
        return {"op": expr.op, "left": to_json(expr.left), "right": to_json(expr.right)}
    return {"op": "call", "func": expr.func, "args": [to_json(a) for a in expr.args]}


def from_json(data: Mapping[str, Any]) -> Value:
    """Rebuild an AST from :func:`to_json` output.

    Raises:
        ValueError: on an unknown ``op`` or function.
    """
    op = data["op"]
    if op == "num":
        return Num(float(data["value"]))
    if op == "ref":
        return Ref(str(data["name"]))
    if op == "neg":
        return Neg(from_json(data["arg"]))
    if op in ("+", "-", "*", "/"):
        return Binary(op, from_json(data["left"]), from_json(data["right"]))
    if op == "call" and data.get("func") in FUNCTIONS:
        return Call(str(data["func"]), tuple(from_json(a) for a in data["args"]))
    msg = f"unknown expression op {op!r} (func {data.get('func')!r}) in plan; re-run `headwater apply`"
    raise ValueError(msg)


# --- evaluation -------------------------------------------------------------------------------------

Array = npt.NDArray[np.float64]
Columns = Mapping[str, Array | float]
"""``ref name -> values``: a float (one user's slot, broadcast) or an (n,) array (one per row)."""


def request_columns(time_ms: npt.ArrayLike) -> dict[str, Array]:
    """Return the ``request.*`` columns for request (or label) times in epoch milliseconds (UTC)."""
    ms = np.asarray(time_ms, dtype=np.int64)
    days = np.floor_divide(ms, 86_400_000)
    return {
        "request.time": ms.astype(np.float64) / 1000.0,
        "request.hour_of_day": (np.floor_divide(ms, 3_600_000) % 24).astype(np.float64),
        "request.day_of_week": ((days + 3) % 7).astype(np.float64),  # 1970-01-01 was a Thursday
    }


def evaluate(expr: Value, columns: Columns, n: int) -> Array:
    """Evaluate a checked ``expr`` over ``n`` rows; returns an (n,) float64 array (NaN = missing).

    ``columns`` holds every reference of ``expr`` (top_k features as their ``.top<i>`` and
    ``.share<i>`` slots). Serving calls it with one user's slots as floats and the candidates'
    slots as arrays; a training set with one array per column: the numbers are the same.
    """
    out = np.broadcast_to(_eval(expr, columns), (n,))
    return np.array(out, dtype=np.float64)


def _eval(expr: Value, cols: Columns) -> Array | float:
    if isinstance(expr, Num):
        return expr.value
    if isinstance(expr, Ref):
        return cols[expr.name]
    if isinstance(expr, Neg):
        return np.negative(_eval(expr.arg, cols))
    if isinstance(expr, Binary):
        a, b = _eval(expr.left, cols), _eval(expr.right, cols)
        if expr.op == "+":
            return np.add(a, b)
        if expr.op == "-":
            return np.subtract(a, b)
        if expr.op == "*":
            return np.multiply(a, b)
        return _safe_div(a, b)
    if expr.func == "share_of":
        return _share(expr, cols)
    args = [_eval(a, cols) for a in expr.args]
    return _FUNCS[expr.func](*args)


def _safe_div(a: Array | float, b: Array | float) -> Array:
    b_arr = np.asarray(b, dtype=np.float64)
    ok = b_arr != 0  # NaN != 0 holds, and NaN / NaN is NaN anyway
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(ok, np.divide(a, np.where(ok, b_arr, 1.0)), np.nan)


def _log1p(a: Array | float) -> Array:
    x = np.asarray(a, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(x > -1.0, np.log1p(np.where(x > -1.0, x, 0.0)), np.nan)


def _same(a: Array | float, b: Array | float) -> Array:
    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return np.where(np.isnan(x) | np.isnan(y), np.nan, (x == y).astype(np.float64))


def _share(expr: Call, cols: Columns) -> Array:
    top, key = expr.args
    name = top.name if isinstance(top, Ref) else ""
    value = np.asarray(_eval(key, cols), dtype=np.float64)
    total: Array = np.zeros(np.shape(value), dtype=np.float64)
    i = 1
    while f"{name}.top{i}" in cols:
        ids = np.asarray(cols[f"{name}.top{i}"], dtype=np.float64)
        shares = np.nan_to_num(np.asarray(cols[f"{name}.share{i}"], dtype=np.float64), nan=0.0)
        total = total + np.where(ids == value, shares, 0.0)
        i += 1
    return np.where(np.isnan(value), np.nan, total)


_FUNCS: dict[str, Callable[..., Array]] = {
    "coalesce": lambda a, b: np.where(np.isnan(np.asarray(a, dtype=np.float64)), b, a),
    "min": np.minimum,
    "max": np.maximum,
    "abs": np.abs,
    "log1p": _log1p,
    "same": _same,
}
