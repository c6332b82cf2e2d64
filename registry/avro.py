"""Event fields from a source's Avro schema: what ``where`` filters and aggregations may use.

Only the flat record shape that event schemas use is supported: primitive fields, enums, logical
timestamps, each optionally nullable (a ``["null", T]`` union).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Field kinds as the registry types them; the pipelines map them back to Avro.
NUMERIC_KINDS = frozenset({"int", "long", "float", "double", "timestamp"})
INTEGER_KINDS = frozenset({"int", "long", "timestamp"})
_PRIMITIVES = {name: name for name in ("string", "int", "long", "float", "double", "boolean")}


class SchemaError(ValueError):
    """The Avro schema file is missing, not JSON, or uses a shape the registry cannot read."""


@dataclass(frozen=True)
class EventField:
    """One top-level field of the event record.

    Attributes:
        name: field name.
        kind: string | enum | int | long | float | double | boolean | timestamp.
        nullable: whether the field is a union with null.
        symbols: enum symbols (empty for other kinds).
    """

    name: str
    kind: str
    nullable: bool = False
    symbols: tuple[str, ...] = ()

    @property
    def numeric(self) -> bool:
        """True for int/long/float/double/timestamp fields."""
        return self.kind in NUMERIC_KINDS

    def describe(self) -> str:
        """E.g. ``enum(impression, click)`` or ``double|null``."""
        base = f"enum({', '.join(self.symbols)})" if self.kind == "enum" else self.kind
        return f"{base}|null" if self.nullable else base


@dataclass(frozen=True)
class EventSchema:
    """The fields of one event record, by name, and the file they came from."""

    name: str
    path: Path
    fields: dict[str, EventField]
    raw_json: str

    def field_list(self) -> str:
        """Comma-separated field names, for error messages."""
        return ", ".join(self.fields)


def load_event_schema(path: Path) -> EventSchema:
    """Read a flat Avro record schema from ``path``.

    Raises:
        SchemaError: when the file cannot be read or is not a flat record of supported fields.
    """
    try:
        raw = path.read_text(encoding="utf-8")
        schema = json.loads(raw)
    except OSError as exc:
        msg = f"cannot read Avro schema {path}: {exc.strerror}"
        raise SchemaError(msg) from exc
    except json.JSONDecodeError as exc:
        msg = f"Avro schema {path} is not JSON: {exc.msg} at line {exc.lineno}"
        raise SchemaError(msg) from exc
    if not isinstance(schema, dict) or schema.get("type") != "record":
        msg = f"Avro schema {path} is not a record schema"
        raise SchemaError(msg)
    fields = {}
    for entry in schema.get("fields", []):
        fields[entry["name"]] = _field(entry["name"], entry["type"], path)
    return EventSchema(name=str(schema.get("name", path.stem)), path=path, fields=fields, raw_json=raw)


def _field(name: str, avro_type: Any, path: Path) -> EventField:
    nullable = False
    if isinstance(avro_type, list):
        others = [t for t in avro_type if t != "null"]
        nullable = len(others) != len(avro_type)
        if len(others) != 1:
            msg = f"field '{name}' in {path}: only [\"null\", T] unions are supported"
            raise SchemaError(msg)
        avro_type = others[0]
    if isinstance(avro_type, str) and avro_type in _PRIMITIVES:
        return EventField(name, _PRIMITIVES[avro_type], nullable)
    if isinstance(avro_type, dict):
        if avro_type.get("type") == "enum":
            return EventField(name, "enum", nullable, tuple(avro_type.get("symbols", ())))
        if str(avro_type.get("logicalType", "")).startswith("timestamp"):
            return EventField(name, "timestamp", nullable)
        if avro_type.get("type") in _PRIMITIVES:
            return EventField(name, _PRIMITIVES[avro_type["type"]], nullable)
    msg = f"field '{name}' in {path}: unsupported Avro type {json.dumps(avro_type)}"
    raise SchemaError(msg)
