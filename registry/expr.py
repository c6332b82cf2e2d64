"""The ``where`` filter language: a tokenizer and recursive-descent parser to a small AST.

Grammar (keywords are case-insensitive)::

    expr      := or
    or        := and ("or" and)*
    and       := unary ("and" unary)*
    unary     := "not" unary | "(" expr ")" | predicate
    predicate := FIELD op literal
               | FIELD ["not"] "in" "(" literal ("," literal)* ")"
               | FIELD "is" ["not"] "null"
    op        := "=" | "==" | "!=" | "<>" | "<" | "<=" | ">" | ">="
    literal   := 'string' | "string" | number | true | false

Parentheses and ``not`` may nest at most :data:`MAX_NESTING` deep (the parser, the checker, the
evaluator and the SQL back ends all recurse per level); deeper text is an :class:`ExprError`.

Nothing is ever evaluated with ``eval``: the AST is checked against the event schema
(:mod:`headwater.registry.expr_check`), evaluated over a dict event
(:mod:`headwater.registry.expr_eval`) and compiled to SQL (:mod:`headwater.registry.expr_sql`).
The AST round-trips through JSON (:func:`to_json` / :func:`from_json`) inside the tier plans.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from dataclasses import field as _field
from typing import Any

from headwater.registry.errors import HeadwaterError

Literal = str | int | float | bool
COMPARE_OPS = ("=", "!=", "<", "<=", ">", ">=")
_OP_ALIASES = {"==": "=", "<>": "!="}
#: Deepest nesting of parentheses and ``not`` a filter may use; real filters use two or three.
MAX_NESTING = 32
_KEYWORDS = {"and", "or", "not", "in", "is", "null", "true", "false"}
_TOKEN = re.compile(
    r"""(?P<ws>\s+)
      |(?P<number>-?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?)
      |(?P<string>'(?:[^'\\]|\\.|'')*'|"(?:[^"\\]|\\.)*")
      |(?P<op>==|!=|<>|<=|>=|=|<|>)
      |(?P<punct>[(),])
      |(?P<name>[A-Za-z_][A-Za-z0-9_]*)""",
    re.VERBOSE,
)


class ExprError(HeadwaterError, ValueError):
    """A ``where`` text that does not parse or type-check; ``pos`` is the 0-based character offset."""

    def __init__(self, message: str, pos: int, hint: str | None = None) -> None:
        super().__init__(message)
        self.pos = pos
        self.hint = hint


@dataclass(frozen=True)
class Compare:
    """``field op value``."""

    field: str
    op: str
    value: Literal
    pos: int = _field(default=0, compare=False)


@dataclass(frozen=True)
class InList:
    """``field [not] in (v1, v2, ...)``."""

    field: str
    values: tuple[Literal, ...]
    negated: bool = False
    pos: int = _field(default=0, compare=False)


@dataclass(frozen=True)
class IsNull:
    """``field is [not] null``."""

    field: str
    negated: bool = False
    pos: int = _field(default=0, compare=False)


@dataclass(frozen=True)
class And:
    """All of ``args``."""

    args: tuple[Expr, ...]


@dataclass(frozen=True)
class Or:
    """Any of ``args``."""

    args: tuple[Expr, ...]


@dataclass(frozen=True)
class Not:
    """The negation of ``arg``."""

    arg: Expr


Expr = Compare | InList | IsNull | And | Or | Not


@dataclass(frozen=True)
class Token:
    """One lexical token: kind is number, string, op, punct, name or keyword; ``end`` at the end."""

    kind: str
    text: str
    pos: int
    value: Literal | None = None


def tokenize(text: str) -> list[Token]:
    """Split ``text`` into tokens, ending with an ``end`` token.

    Raises:
        ExprError: at the first character that starts no token (e.g. an unclosed quote).
    """
    tokens: list[Token] = []
    pos = 0
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        if match is None:
            bad = text[pos]
            hint = "close the quote" if bad in "'\"" else "use only field names, literals and operators"
            msg = f"unexpected character {bad!r} at position {pos + 1}"
            raise ExprError(msg, pos, hint)
        kind = match.lastgroup or "ws"
        raw = match.group()
        if kind == "number":
            tokens.append(Token(kind, raw, pos, float(raw) if any(c in raw for c in ".eE") else int(raw)))
        elif kind == "string":
            tokens.append(Token(kind, raw, pos, _unquote(raw)))
        elif kind == "name" and raw.lower() in _KEYWORDS:
            tokens.append(Token("keyword", raw.lower(), pos))
        elif kind != "ws":
            tokens.append(Token(kind, _OP_ALIASES.get(raw, raw), pos))
        pos = match.end()
    tokens.append(Token("end", "", len(text)))
    return tokens


def _unquote(raw: str) -> str:
    body = raw[1:-1]
    if raw[0] == "'":
        body = body.replace("''", "'")
    return re.sub(r"\\(.)", r"\1", body)


@functools.lru_cache(maxsize=4096)
def parse(text: str) -> Expr:
    """Parse a ``where`` text into an AST (cached: ASTs are immutable and filters repeat).

    Raises:
        ExprError: with the position of the first token that does not fit the grammar.
    """
    parser = _Parser(tokenize(text))
    if parser.peek().kind == "end":
        msg = "the filter is empty"
        raise ExprError(msg, 0, "remove `where` or write a condition such as event_type = 'click'")
    result = parser.parse_or()
    tail = parser.peek()
    if tail.kind != "end":
        msg = f"unexpected {tail.text!r} at position {tail.pos + 1} after a complete condition"
        raise ExprError(msg, tail.pos, "join conditions with `and` / `or`")
    return result


class _Parser:
    def __init__(self, tokens: list[Token]) -> None:
        self.tokens = tokens
        self.index = 0
        self.depth = 0

    def peek(self) -> Token:
        return self.tokens[self.index]

    def take(self) -> Token:
        token = self.tokens[self.index]
        self.index += 1
        return token

    def accept(self, kind: str, text: str) -> bool:
        token = self.peek()
        if token.kind == kind and token.text == text:
            self.index += 1
            return True
        return False

    def expect(self, kind: str, text: str, what: str) -> Token:
        token = self.take()
        if token.kind != kind or token.text != text:
            raise _unexpected(token, what)
        return token

    def parse_or(self) -> Expr:
        args = [self.parse_and()]
        while self.accept("keyword", "or"):
            args.append(self.parse_and())
        return args[0] if len(args) == 1 else Or(tuple(args))

    def parse_and(self) -> Expr:
        args = [self.parse_unary()]
        while self.accept("keyword", "and"):
            args.append(self.parse_unary())
        return args[0] if len(args) == 1 else And(tuple(args))

    def parse_unary(self) -> Expr:
        token = self.peek()
        if self.accept("keyword", "not"):
            self._enter(token)
            negated = Not(self.parse_unary())
            self.depth -= 1
            return negated
        if self.accept("punct", "("):
            self._enter(token)
            inner = self.parse_or()
            self.expect("punct", ")", "')' to close the parenthesis")
            self.depth -= 1
            return inner
        return self.parse_predicate()

    def _enter(self, token: Token) -> None:
        self.depth += 1
        if self.depth > MAX_NESTING:
            msg = f"parentheses and 'not' nest deeper than {MAX_NESTING} levels at position {token.pos + 1}"
            raise ExprError(msg, token.pos, "remove redundant parentheses, or split the condition")

    def parse_predicate(self) -> Expr:
        token = self.take()
        if token.kind != "name":
            if token.kind in ("string", "number"):
                msg = f"a condition must start with a field name, found literal {token.text} at position "
                raise ExprError(
                    f"{msg}{token.pos + 1}", token.pos, "put the field on the left: field = value"
                )
            raise _unexpected(token, "a field name")
        name = token.text
        nxt = self.take()
        if nxt.kind == "op":
            return Compare(name, nxt.text, self.literal(), pos=token.pos)
        negated = nxt.kind == "keyword" and nxt.text == "not"
        if negated:
            nxt = self.take()
        if nxt.kind == "keyword" and nxt.text == "in":
            return InList(name, self.literal_list(), negated=negated, pos=token.pos)
        if nxt.kind == "keyword" and nxt.text == "is" and not negated:
            is_not = self.accept("keyword", "not")
            self.expect("keyword", "null", "null after 'is'")
            return IsNull(name, negated=is_not, pos=token.pos)
        raise _unexpected(nxt, f"an operator (=, !=, <, <=, >, >=), 'in' or 'is' after field '{name}'")

    def literal(self) -> Literal:
        token = self.take()
        if token.kind in ("string", "number") and token.value is not None:
            return token.value
        if token.kind == "keyword" and token.text in ("true", "false"):
            return token.text == "true"
        if token.kind == "keyword" and token.text == "null":
            msg = f"comparison with null at position {token.pos + 1} is never true"
            raise ExprError(msg, token.pos, "write `field is null` or `field is not null`")
        if token.kind == "name":
            msg = f"expected a literal at position {token.pos + 1}, found name '{token.text}'"
            raise ExprError(msg, token.pos, f"quote text values: '{token.text}'")
        raise _unexpected(token, "a literal ('text', number, true or false)")

    def literal_list(self) -> tuple[Literal, ...]:
        self.expect("punct", "(", "'(' after 'in'")
        values = [self.literal()]
        while self.accept("punct", ","):
            values.append(self.literal())
        self.expect("punct", ")", "')' to close the 'in' list")
        return tuple(values)


def _unexpected(token: Token, what: str) -> ExprError:
    found = "the end of the filter" if token.kind == "end" else repr(token.text)
    return ExprError(f"expected {what} at position {token.pos + 1}, found {found}", token.pos)


def fields_of(expr: Expr) -> list[Expr]:
    """All leaf predicates (Compare, InList, IsNull) of ``expr``, left to right."""
    if isinstance(expr, And | Or):
        return [leaf for arg in expr.args for leaf in fields_of(arg)]
    if isinstance(expr, Not):
        return fields_of(expr.arg)
    return [expr]


def to_json(expr: Expr) -> dict[str, Any]:
    """Return the AST as JSON-ready dicts (the form stored in tier plans)."""
    if isinstance(expr, Compare):
        return {"op": expr.op, "field": expr.field, "value": expr.value}
    if isinstance(expr, InList):
        return {"op": "not_in" if expr.negated else "in", "field": expr.field, "values": list(expr.values)}
    if isinstance(expr, IsNull):
        return {"op": "is_not_null" if expr.negated else "is_null", "field": expr.field}
    if isinstance(expr, Not):
        return {"op": "not", "arg": to_json(expr.arg)}
    return {"op": "and" if isinstance(expr, And) else "or", "args": [to_json(a) for a in expr.args]}


def from_json(data: dict[str, Any]) -> Expr:
    """Rebuild an AST from :func:`to_json` output (as read from a tier plan).

    Raises:
        ValueError: on an unknown ``op``.
    """
    op = data["op"]
    if op in COMPARE_OPS:
        return Compare(data["field"], op, data["value"])
    if op in ("in", "not_in"):
        return InList(data["field"], tuple(data["values"]), negated=op == "not_in")
    if op in ("is_null", "is_not_null"):
        return IsNull(data["field"], negated=op == "is_not_null")
    if op == "not":
        return Not(from_json(data["arg"]))
    if op in ("and", "or"):
        args = tuple(from_json(a) for a in data["args"])
        return And(args) if op == "and" else Or(args)
    msg = f"unknown filter op {op!r} in plan; expected one of {', '.join(COMPARE_OPS)}, in, not, and, or"
    raise ValueError(msg)
