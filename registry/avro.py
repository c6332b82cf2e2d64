"""Event fields from a source's Avro schema: what ``where`` filters, keys and aggregations may use.

Only the flat record shape that event schemas use is supported: fields of type string, int, long,
float, double, boolean, an enum, or a ``long`` with logical type ``timestamp-millis`` /
``timestamp-micros``, each optionally nullable (a ``["null", T]`` union). Anything else (bytes,
arrays, maps, nested records, fixed, decimals) is a :class:`SchemaError` that names the file, the
line and the field, because no tier could aggregate it.

:func:`compatibility_problems` applies Avro's schema-resolution rules to a schema change: what a
reader of the new schema cannot read from events written with an older one.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastavro import parse_schema
from fastavro import schema as avro_schema

from headwater.registry.errors import HeadwaterError

# Field kinds as the registry types them; the pipelines map them back to Avro.
NUMERIC_KINDS = frozenset({"int", "long", "float", "double", "timestamp"})
INTEGER_KINDS = frozenset({"int", "long", "timestamp"})
_PRIMITIVES = frozenset({"string", "int", "long", "float", "double", "boolean"})
TIME_UNITS = {"timestamp-millis": "ms", "timestamp-micros": "us"}
FINGERPRINT_ALGORITHM = "CRC-64-AVRO"
SUPPORTED = (
    "string, int, long, float, double, boolean, an enum, or a long with logicalType "
    'timestamp-millis/timestamp-micros; each may be nullable as ["null", T]'
)
# Avro's promotions: a reader of the right-hand type reads a writer's left-hand type.
_PROMOTIONS = {
    ("int", "long"),
    ("int", "float"),
    ("int", "double"),
    ("long", "float"),
    ("long", "double"),
    ("float", "double"),
}


class SchemaError(HeadwaterError, ValueError):
    """The Avro schema file is missing, not JSON, or uses a shape the registry cannot read.

    Attributes:
        line: the line of the offending field in the ``.avsc`` file (1 when unknown).
        field: the offending field, when there is one.
    """

    def __init__(self, message: str, line: int = 1, field: str | None = None) -> None:
        super().__init__(message)
        self.line = line
        self.field = field


@dataclass(frozen=True)
class EventField:
    """One top-level field of the event record.

    Attributes:
        name: field name.
        kind: string | enum | int | long | float | double | boolean | timestamp.
        nullable: whether the field is a union with null.
        symbols: enum symbols (empty for other kinds).
        time_unit: ``ms`` or ``us`` for a timestamp, empty otherwise.
        has_default: whether the field declares a default (what schema evolution needs).
    """

    name: str
    kind: str
    nullable: bool = False
    symbols: tuple[str, ...] = ()
    time_unit: str = ""
    has_default: bool = False

    @property
    def numeric(self) -> bool:
        """True for int/long/float/double/timestamp fields."""
        return self.kind in NUMERIC_KINDS

    def describe(self) -> str:
        """E.g. ``enum(impression, click)`` or ``double|null``."""
        base = f"enum({', '.join(self.symbols)})" if self.kind == "enum" else self.kind
        if self.kind == "timestamp":
            base = f"timestamp({self.time_unit})"
        return f"{base}|null" if self.nullable else base


@dataclass(frozen=True)
class EventSchema:
    """The fields of one event record, by name, and the file they came from.

    Attributes:
        fingerprint: CRC-64-AVRO of the schema's Parsing Canonical Form, 16 hex digits: what the
            ``schema-fp`` Kafka header carries for events written with this schema.
    """

    name: str
    path: Path
    fields: dict[str, EventField]
    raw_json: str
    fingerprint: str

    def field_list(self) -> str:
        """Comma-separated field names, for error messages."""
        return ", ".join(self.fields)

    def line_of(self, field: str) -> int:
        """Return the line of ``field``'s declaration in the ``.avsc`` file (1 when not found)."""
        return field_line(self.raw_json, field)


def field_line(raw: str, field: str) -> int:
    """Return the 1-based line of ``"name": "<field>"`` in the schema text (1 when not found)."""
    found = re.search(r'"name"\s*:\s*"' + re.escape(field) + '"', raw)
    return raw.count("\n", 0, found.start()) + 1 if found else 1


def fingerprint(schema: dict[str, Any]) -> str:
    """CRC-64-AVRO of the Parsing Canonical Form of ``schema`` (16 lowercase hex digits)."""
    canonical = avro_schema.to_parsing_canonical_form(parse_schema(schema, _write_hint=False))
    return str(avro_schema.fingerprint(canonical, FINGERPRINT_ALGORITHM))


def load_event_schema(path: Path) -> EventSchema:
    """Read a flat Avro record schema from ``path``.

    Raises:
        SchemaError: when the file cannot be read or is not a flat record of supported fields.
    """
    try:
        raw = path.read_text(encoding="utf-8")
    except OSError as exc:
        msg = f"cannot read Avro schema {path}: {exc.strerror}"
        raise SchemaError(msg) from exc
    except UnicodeDecodeError as exc:
        msg = f"Avro schema {path} is not UTF-8 text (byte {exc.start})"
        raise SchemaError(msg) from exc
    return parse_event_schema(raw, path)


def parse_event_schema(raw: str, path: Path) -> EventSchema:
    """Parse the text of a flat Avro record schema (``path`` names it in errors).

    Raises:
        SchemaError: when the text is not JSON, not valid Avro, or not a flat record of supported fields.
    """
    try:
        schema = json.loads(raw)
    except json.JSONDecodeError as exc:
        msg = f"Avro schema {path} is not JSON: {exc.msg} at line {exc.lineno}"
        raise SchemaError(msg, exc.lineno) from exc
    except RecursionError as exc:
        msg = f"Avro schema {path} nests too deeply to be an event record"
        raise SchemaError(msg) from exc
    if not isinstance(schema, dict) or schema.get("type") != "record":
        msg = f'Avro schema {path} is not a record schema (a JSON object with "type": "record")'
        raise SchemaError(msg)
    entries = schema.get("fields")
    if not isinstance(entries, list) or not entries:
        msg = f"Avro schema {path} has no fields"
        raise SchemaError(msg)
    fields: dict[str, EventField] = {}
    for entry in entries:
        name = entry.get("name") if isinstance(entry, dict) else None
        if not isinstance(name, str) or "type" not in entry:
            msg = f"Avro schema {path}: every field needs a string `name` and a `type`, found {entry!r:.80}"
            raise SchemaError(msg)
        if name in fields:
            msg = f"Avro schema {path}: field '{name}' is declared twice"
            raise SchemaError(msg, field_line(raw, name), name)
        fields[name] = _field(name, entry["type"], "default" in entry, path, raw)
    try:
        fp = fingerprint(schema)
    except (avro_schema.SchemaParseException, avro_schema.UnknownType, KeyError, TypeError) as exc:
        msg = f"Avro schema {path} is not valid Avro: {exc}; fix the file (see the Avro specification)"
        raise SchemaError(msg) from exc
    return EventSchema(
        name=str(schema.get("name", path.stem)), path=path, fields=fields, raw_json=raw, fingerprint=fp
    )


def _field(name: str, avro_type: Any, has_default: bool, path: Path, raw: str) -> EventField:
    nullable = False
    if isinstance(avro_type, list):
        others = [t for t in avro_type if t != "null"]
        nullable = len(others) != len(avro_type)
        if len(others) != 1:
            msg = (
                f"field '{name}' in {path}: union {json.dumps(avro_type)} is not supported; "
                f'only ["null", T] unions are'
            )
            raise SchemaError(msg, field_line(raw, name), name)
        avro_type = others[0]
    if isinstance(avro_type, str) and avro_type in _PRIMITIVES:
        return EventField(name, avro_type, nullable, has_default=has_default)
    if isinstance(avro_type, dict):
        kind = avro_type.get("type")
        logical = avro_type.get("logicalType")
        if kind == "enum" and isinstance(avro_type.get("symbols"), list):
            symbols = tuple(str(s) for s in avro_type["symbols"])
            return EventField(name, "enum", nullable, symbols, has_default=has_default)
        if kind == "long" and logical in TIME_UNITS:
            return EventField(
                name, "timestamp", nullable, time_unit=TIME_UNITS[logical], has_default=has_default
            )
        if kind in _PRIMITIVES and logical is None:
            return EventField(name, kind, nullable, has_default=has_default)
    found = json.dumps(avro_type)[:120]
    msg = f"field '{name}' in {path}: unsupported Avro type {found}; supported: {SUPPORTED}"
    raise SchemaError(msg, field_line(raw, name), name)


@dataclass(frozen=True)
class Incompatibility:
    """One reason a reader of the new schema cannot read events written with an old one."""

    field: str
    problem: str
    fix: str


def compatibility_problems(writer: EventSchema, reader: EventSchema) -> list[Incompatibility]:
    """List what a reader of ``reader`` cannot read from events written with ``writer`` (Avro's rules).

    A field added without a default, a type change that is not an Avro promotion, a nullable field
    made required, an enum symbol removed, or a timestamp unit changed: each is a problem. A field
    the reader drops is fine (its values are skipped).
    """
    out = []
    for name, new in reader.fields.items():
        old = writer.fields.get(name)
        if old is None:
            if not new.has_default:
                out.append(
                    Incompatibility(
                        name,
                        "added without a default",
                        'give it a default (e.g. "default": null with a ["null", T] type)',
                    )
                )
            continue
        problem = _type_change(old, new)
        if problem is not None:
            out.append(
                Incompatibility(
                    name, problem, "keep the old type, or add a new field and stop writing the old one"
                )
            )
    return out


def _type_change(old: EventField, new: EventField) -> str | None:
    if old.nullable and not new.nullable:
        return f"was nullable ({old.describe()}), now required ({new.describe()})"
    if old.kind == new.kind:
        if old.kind == "enum":
            gone = [s for s in old.symbols if s not in new.symbols]
            return f"enum symbols {gone} removed" if gone else None
        if old.time_unit != new.time_unit:
            return f"timestamp unit changed from {old.time_unit} to {new.time_unit}"
        return None
    if (old.kind, new.kind) in _PROMOTIONS:
        return None
    return f"type changed from {old.describe()} to {new.describe()}, which Avro cannot promote"
