"""Read a YAML file into plain data plus the line of every node.

The file is composed into a node tree (every node carries its start line) and turned into plain
dicts/lists/scalars by one constructor that applies the YAML 1.2 core schema, so ``no`` stays a
string and ``1:30`` is not a number. The line of each key and list item is kept in
:attr:`YamlDoc.lines`, keyed by its path (``("features", 2, "window")``), for error messages.

Two composers give the same node tree: ruamel.yaml's (pure Python, always available) and libyaml's
through PyYAML's ``CBaseLoader`` (about 15x faster, used when present, so ``check`` on a
1,000-view repo stays well under two seconds). ``HEADWATER_YAML_PARSER=ruamel`` forces ruamel.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any, Protocol

Path_ = tuple[str | int, ...]

_INT = re.compile(r"^[-+]?[0-9]+$|^0o[0-7]+$|^0x[0-9a-fA-F]+$")
_FLOAT = re.compile(r"^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?$")
_NULLS = {"", "~", "null", "Null", "NULL"}
_BOOLS = {"true": True, "True": True, "TRUE": True, "false": False, "False": False, "FALSE": False}
_SPECIAL_FLOATS = {".inf": float("inf"), "-.inf": float("-inf"), ".nan": float("nan")}


class YamlSyntaxError(ValueError):
    """The text is not YAML (or not the kind this registry reads); carries a 1-based line."""

    def __init__(self, message: str, line: int) -> None:
        super().__init__(message)
        self.line = line


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
    node = _compose(text)
    if node is None:
        return YamlDoc(data=None, lines={(): 1})
    lines: dict[Path_, int] = {(): node.start_mark.line + 1}
    data = _construct(node, (), lines)
    return YamlDoc(data=data, lines=lines)


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


def _construct(node: _Node, path: Path_, lines: dict[Path_, int]) -> Any:
    kind = type(node).__name__
    if kind == "ScalarNode":
        return _scalar(node)
    if kind == "SequenceNode":
        items = []
        for index, item in enumerate(node.value):
            lines[(*path, index)] = item.start_mark.line + 1
            items.append(_construct(item, (*path, index), lines))
        return items
    if kind == "MappingNode":
        return _mapping(node, path, lines)
    msg = f"unsupported YAML node {kind}"
    raise YamlSyntaxError(msg, node.start_mark.line + 1)


def _mapping(node: _Node, path: Path_, lines: dict[Path_, int]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key_node, value_node in node.value:
        key = _scalar(key_node) if type(key_node).__name__ == "ScalarNode" else None
        line = key_node.start_mark.line + 1
        if not isinstance(key, str):
            msg = f"mapping key {key!r} is not a plain name; keys must be strings"
            raise YamlSyntaxError(msg, line)
        if key in result:
            msg = f"duplicate key '{key}' (first on line {lines[(*path, key)]}); keep one of them"
            raise YamlSyntaxError(msg, line)
        lines[(*path, key)] = line
        result[key] = _construct(value_node, (*path, key), lines)
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
        return int(value, 0) if value[:2] in ("0o", "0x") else int(value)
    if _FLOAT.match(value):
        return float(value)
    return _SPECIAL_FLOATS.get(value.lower(), value)
