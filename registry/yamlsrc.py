"""Read a YAML file into plain data plus the line of every node.

The file is composed into a node tree (every node carries its start line) and turned into plain
dicts/lists/scalars by one constructor that applies the YAML 1.2 core schema, so ``no`` stays a
string and ``1:30`` is not a number. The line of each key and list item is kept in
:attr:`YamlDoc.lines`, keyed by its path (``("features", 2, "window")``), for error messages.

Two composers give the same node tree: ruamel.yaml's (pure Python, always available) and libyaml's
through PyYAML's ``CBaseLoader`` (about 15x faster, used when present, so ``check`` on a
1,000-view repo stays well under two seconds). ``HEADWATER_YAML_PARSER=ruamel`` forces ruamel.

Hostile input ends in a :class:`YamlSyntaxError` with a line, never in a crash: an alias that
contains itself, aliases that expand to more than :data:`MAX_VALUES` values (an "alias bomb" of a few
hundred bytes can expand to millions), nesting deeper than :data:`MAX_DEPTH`, and integers too long
for Python to convert are all rejected.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any, Protocol

from headwater.registry.errors import HeadwaterError

Path_ = tuple[str | int, ...]

#: Deepest nesting of lists/mappings a registry file may have (the real files nest 4 deep); deeper
#: input would exhaust Python's recursion limit in the composers and in :func:`_construct`.
MAX_DEPTH = 64
#: Most values (scalars, lists, mappings) one document may expand to, aliases included; a
#: 1,000-view repo's largest file has a few hundred. Bounds the time and memory an alias bomb costs.
MAX_VALUES = 100_000

_INT = re.compile(r"^[-+]?[0-9]+$|^0o[0-7]+$|^0x[0-9a-fA-F]+$")
_FLOAT = re.compile(r"^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?$")
_NULLS = {"", "~", "null", "Null", "NULL"}
_BOOLS = {"true": True, "True": True, "TRUE": True, "false": False, "False": False, "FALSE": False}
_SPECIAL_FLOATS = {".inf": float("inf"), "-.inf": float("-inf"), ".nan": float("nan")}


class YamlSyntaxError(HeadwaterError, ValueError):
    """The text is not YAML (or not the kind this registry reads); carries a 1-based line.

    ``code`` is the diagnostic code (``bad-yaml`` unless a more precise one applies) and ``hint``
    the fix, when the generic "fix the syntax" hint would mislead.
    """

    def __init__(self, message: str, line: int, code: str = "bad-yaml", hint: str | None = None) -> None:
        super().__init__(message)
        self.line = line
        self.code = code
        self.hint = hint


class _Mark(Protocol):
    line: int


class _Node(Protocol):
    value: Any
    start_mark: _Mark
    tag: str


@dataclass(frozen=True)
class YamlDoc:
    """A parsed YAML document: plain ``data`` and the 1-based line of every node by path."""

    data: Any
    lines: dict[Path_, int]

    def line_of(self, path: Path_) -> int:
        """Return the line of ``path``, or of its nearest ancestor that has one (1 for the document)."""
        probe = tuple(path)
        while probe:
            if probe in self.lines:
                return self.lines[probe]
            probe = probe[:-1]
        return self.lines.get((), 1)


def parser_name() -> str:
    """Which composer :func:`parse_yaml` uses: ``libyaml`` or ``ruamel``."""
    if os.environ.get("HEADWATER_YAML_PARSER", "").lower() == "ruamel":
        return "ruamel"
    try:
        import yaml
    except ImportError:
        return "ruamel"
    return "libyaml" if getattr(yaml, "__with_libyaml__", False) else "ruamel"


def parse_yaml(text: str) -> YamlDoc:
    """Parse one YAML document.

    Raises:
        YamlSyntaxError: on a syntax error, a duplicate key, a non-string key or several documents.
    """
    try:
        node = _compose(text)
    except RecursionError:
        # Both composers recurse per nesting level: find the line where the text gets too deep.
        raise _too_deep(_deepest_line(text)) from None
    if node is None:
        return YamlDoc(data=None, lines={(): 1})
    lines: dict[Path_, int] = {(): node.start_mark.line + 1}
    data = _Constructor(lines).build(node, ())
    return YamlDoc(data=data, lines=lines)


def _too_deep(line: int) -> YamlSyntaxError:
    return YamlSyntaxError(
        f"the YAML nests deeper than {MAX_DEPTH} levels",
        line,
        code="too-deep",
        hint="flatten the structure; registry files need only a few levels of nesting",
    )


def _deepest_line(text: str) -> int:
    """Line where nesting first exceeds :data:`MAX_DEPTH`, from the parser's (iterative) event stream."""
    from ruamel.yaml import YAML

    depth = 0
    last_line = 1
    try:
        for event in YAML(typ="safe", pure=True).parse(text):
            last_line = int(event.start_mark.line) + 1
            kind = type(event).__name__
            if kind in ("SequenceStartEvent", "MappingStartEvent"):
                depth += 1
                if depth > MAX_DEPTH:
                    return last_line
            elif kind in ("SequenceEndEvent", "MappingEndEvent"):
                depth -= 1
    except Exception:  # any parse error: the deepest line seen so far is the answer
        return last_line
    return last_line


def _compose(text: str) -> _Node | None:
    if parser_name() == "libyaml":
        import yaml

        try:
            node: _Node | None = yaml.compose(text, Loader=yaml.CBaseLoader)
        except yaml.MarkedYAMLError as exc:
            raise _syntax_error(exc) from exc
        except yaml.YAMLError as exc:
            raise YamlSyntaxError(str(exc), 1) from exc
        return node
    from ruamel.yaml import YAML
    from ruamel.yaml.error import MarkedYAMLError, YAMLError

    try:
        composed: _Node | None = YAML(typ="safe", pure=True).compose(text)
    except MarkedYAMLError as exc:
        raise _syntax_error(exc) from exc
    except YAMLError as exc:
        raise YamlSyntaxError(str(exc), 1) from exc
    return composed


def _syntax_error(exc: Any) -> YamlSyntaxError:
    mark = exc.problem_mark or exc.context_mark
    line = mark.line + 1 if mark is not None else 1
    problem = exc.problem or "invalid YAML"
    context = f" ({exc.context})" if exc.context else ""
    return YamlSyntaxError(f"{problem}{context}", line)


class _Constructor:
    """Turns a composed node tree into plain data, bounding depth, alias cycles and expansion."""

    def __init__(self, lines: dict[Path_, int]) -> None:
        self.lines = lines
        self.values = 0
        # ids of the nodes being built (the current path): a node met again on its own path is an
        # alias of one of its ancestors, which would expand forever.
        self.open: set[int] = set()

    def build(self, node: _Node, path: Path_) -> Any:
        line = node.start_mark.line + 1
        self.values += 1
        if self.values > MAX_VALUES:
            msg = f"the document expands to more than {MAX_VALUES:,} values (YAML aliases repeat them)"
            # An aliased node carries its anchor's line; the top-level key being expanded is the
            # line a reader can act on.
            line = self.lines.get(path[:1], line)
            raise YamlSyntaxError(
                msg, line, code="yaml-alias", hint="write the values out instead of nesting aliases"
            )
        if len(path) > MAX_DEPTH:
            raise _too_deep(line)
        kind = type(node).__name__
        if kind == "ScalarNode":
            return _scalar(node)
        if id(node) in self.open:
            msg = "a YAML alias refers to a list or mapping that contains it (a recursive alias)"
            raise YamlSyntaxError(
                msg, line, code="yaml-alias", hint="remove the alias (*name) inside its own anchor"
            )
        self.open.add(id(node))
        try:
            if kind == "SequenceNode":
                return self._sequence(node, path)
            if kind == "MappingNode":
                return self._mapping(node, path)
        finally:
            self.open.discard(id(node))
        msg = f"unsupported YAML node {kind}"
        raise YamlSyntaxError(msg, line)

    def _sequence(self, node: _Node, path: Path_) -> list[Any]:
        items = []
        for index, item in enumerate(node.value):
            self.lines[(*path, index)] = item.start_mark.line + 1
            items.append(self.build(item, (*path, index)))
        return items

    def _mapping(self, node: _Node, path: Path_) -> dict[str, Any]:
        result: dict[str, Any] = {}
        for key_node, value_node in node.value:
            key = _scalar(key_node) if type(key_node).__name__ == "ScalarNode" else None
            line = key_node.start_mark.line + 1
            if not isinstance(key, str):
                msg = f"mapping key {key!r} is not a plain name; keys must be strings"
                raise YamlSyntaxError(msg, line)
            if key in result:
                msg = f"duplicate key '{key}' (first on line {self.lines[(*path, key)]}); keep one of them"
                raise YamlSyntaxError(msg, line)
            self.lines[(*path, key)] = line
            result[key] = self.build(value_node, (*path, key))
        return result


def _scalar(node: Any) -> Any:
    value: str = node.value
    if node.style not in (None, ""):
        return value
    if value in _NULLS:
        return None
    if value in _BOOLS:
        return _BOOLS[value]
    if _INT.match(value):
        try:
            return int(value, 0) if value[:2] in ("0o", "0x") else int(value)
        except ValueError:
            # Python refuses to convert integers of more than 4,300 digits (a DoS guard).
            msg = f"the number {value[:20]}... has {len(value)} digits; too long to be a number"
            raise YamlSyntaxError(msg, node.start_mark.line + 1, hint="quote it if it is text") from None
    if _FLOAT.match(value):
        return float(value)
    return _SPECIAL_FLOATS.get(value.lower(), value)
