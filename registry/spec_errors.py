"""Translate pydantic validation errors into registry diagnostics with file, line and a fix.

Pydantic reports a ``loc`` path (``("features", 2, "windw")``); the YAML document knows the line
of every path, and the models know which keys are allowed where, so each error becomes a message
that names the key, what was expected, what was found and what to do.
"""

from __future__ import annotations

import difflib
import types
import typing
from typing import Any, TypedDict

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from headwater.registry.diagnostics import Diagnostic
from headwater.registry.yamlsrc import YamlDoc


class _Where(TypedDict):
    file: str
    line: int
    view: str | None
    feature: str | None


def model_at(model: type[BaseModel], loc: tuple[str | int, ...]) -> type[BaseModel] | None:
    """Find the model class that holds the last element of ``loc`` (for listing its allowed keys)."""
    current: type[BaseModel] | None = model
    for part in loc[:-1]:
        if current is None:
            return None
        if isinstance(part, int):
            continue
        info = _field_by_key(current, part)
        current = _inner_model(info.annotation) if info is not None else None
    return current


def allowed_keys(model: type[BaseModel]) -> list[str]:
    """List the keys a YAML mapping for ``model`` may use (aliases where declared)."""
    return [info.alias or name for name, info in model.model_fields.items()]


def _field_by_key(model: type[BaseModel], key: str) -> Any:
    for name, info in model.model_fields.items():
        if key in (name, info.alias):
            return info
    return None


def _inner_model(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _inner_model(typing.get_args(annotation)[0])
    if origin in (list, tuple, dict, typing.Union, types.UnionType):
        for arg in typing.get_args(annotation):
            found = _inner_model(arg)
            if found is not None:
                return found
    return None


def spec_diagnostics(
    exc: ValidationError, model: type[BaseModel], doc: YamlDoc, file: str, view: str | None
) -> list[Diagnostic]:
    """One diagnostic per pydantic error in ``exc``, located through ``doc``."""
    return [_one(error, model, doc, file, view) for error in exc.errors(include_url=False)]


def _one(
    error: ErrorDetails, model: type[BaseModel], doc: YamlDoc, file: str, view: str | None
) -> Diagnostic:
    loc = tuple(error["loc"])
    where = ".".join(str(p) for p in loc) or "(document)"
    feature = _feature_name(doc, loc)
    base: _Where = {"file": file, "line": doc.line_of(loc), "view": view, "feature": feature}
    kind = error["type"]
    found = _show(error.get("input"))
    if kind == "extra_forbidden":
        holder = model_at(model, loc)
        keys = allowed_keys(holder) if holder else []
        close = difflib.get_close_matches(str(loc[-1]), keys, n=1)
        hint = f"did you mean '{close[0]}'?" if close else "remove it"
        return Diagnostic(
            code="unknown-key",
            message=f"unknown key '{loc[-1]}'",
            expected=f"one of: {', '.join(keys)}",
            found=str(loc[-1]),
            hint=hint,
            **base,
        )
    if kind == "missing":
        return Diagnostic(
            code="missing-key",
            message=f"missing required key '{loc[-1]}'",
            expected=f"'{loc[-1]}' at {where}",
            found="nothing",
            hint=f"add '{loc[-1]}: ...'",
            **base,
        )
    ctx_error = (error.get("ctx") or {}).get("error")
    if ctx_error is not None and type(ctx_error).__name__ == "DurationError":
        return Diagnostic(
            code="bad-duration",
            message=f"'{where}' is not a valid duration",
            expected="a duration such as 30s, 5m, 1h, 7d, PT30S, P7D",
            found=found,
            hint=str(ctx_error),
            **base,
        )
    if loc == ("late",):  # the two policies' meaning is the fix, not only their names
        return Diagnostic(
            code="bad-value",
            message="'late' has a bad value",
            expected="drop or heal",
            found=found,
            hint="write 'late: drop' (the default: late events reach no value) or 'late: heal' (the"
            " offline job writes corrected values that count them)",
            **base,
        )
    return Diagnostic(
        code="bad-value",
        message=f"'{where}' has a bad value",
        expected=_expected(error),
        found=found,
        hint=f"fix '{where}'",
        **base,
    )


def _expected(error: ErrorDetails) -> str:
    ctx = error.get("ctx") or {}
    if error["type"] == "literal_error":
        return "one of " + str(ctx.get("expected", "")).replace("'", "")
    if error["type"] == "string_pattern_mismatch":
        return "a lower_snake_case name (letters, digits, _; starting with a letter)"
    return str(error["msg"]).removeprefix("Value error, ").replace("Input should be", "a value that is")


def _feature_name(doc: YamlDoc, loc: tuple[str | int, ...]) -> str | None:
    if len(loc) >= 2 and loc[0] == "features" and isinstance(loc[1], int):
        data = doc.data if isinstance(doc.data, dict) else {}
        features = data.get("features")
        if isinstance(features, list) and loc[1] < len(features) and isinstance(features[loc[1]], dict):
            name = features[loc[1]].get("name")
            return str(name) if name is not None else f"#{loc[1] + 1}"
    return None


def _show(value: Any) -> str:
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if value is None:
        return "nothing (null)"
    return f"{value!r} ({type(value).__name__})"
