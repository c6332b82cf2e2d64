"""The behaviour-event Avro schema: where it lives, its fingerprint, and the typed record.

The schema file ``features/schemas/behavior_event.avsc`` is the contract between the producer
and every tier. It is parsed once per process (:func:`load_schema` is cached). Its CRC-64-AVRO
fingerprint of the Parsing Canonical Form travels in the ``schema-fp`` Kafka header, so a
consumer can tell a payload written with a schema it does not know from a corrupt one.

On the wire ``event_time`` is an Avro ``long`` with logical type ``timestamp-millis``. In
Python it stays an ``int`` of UTC milliseconds (window arithmetic is done in ms);
:func:`event_datetime` gives the timezone-aware datetime when one is wanted.
"""

from __future__ import annotations

import copy
import json
import os
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal, TypedDict, cast, get_args

import fastavro
from fastavro import schema as avro_schema

SCHEMA_ENV = "HEADWATER_EVENT_SCHEMA"
"""Environment variable that overrides the schema path."""

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_SCHEMA_PATH = REPO_ROOT / "features" / "schemas" / "behavior_event.avsc"
FINGERPRINT_ALGORITHM = "CRC-64-AVRO"

EventType = Literal["impression", "click", "like", "share", "purchase", "search", "dwell"]
Device = Literal["ios", "android", "web"]
EVENT_TYPES: tuple[EventType, ...] = get_args(EventType)
DEVICES: tuple[Device, ...] = get_args(Device)


class BehaviorEvent(TypedDict):
    """One behaviour event, exactly the Avro record (``event_time`` in UTC milliseconds)."""

    event_id: str
    user_id: str
    item_id: str | None
    event_type: EventType
    event_time: int
    session_id: str
    category: str | None
    price: float | None
    dwell_ms: int | None
    query: str | None
    position: int | None
    device: Device


FIELD_NAMES: tuple[str, ...] = tuple(BehaviorEvent.__annotations__)


class SchemaError(ValueError):
    """The schema file is missing, not valid Avro, or disagrees with :class:`BehaviorEvent`."""


@dataclass(frozen=True)
class EventSchema:
    """A parsed event schema and its fingerprint.

    Attributes:
        path: the ``.avsc`` file it was read from.
        raw: the JSON document as written.
        wire: the parsed schema used to read and write payloads. It equals ``raw`` except that
            ``event_time`` has no logical type, so it is read and written as an ``int`` of ms;
            the bytes and the canonical form are the same.
        fingerprint: CRC-64-AVRO of the Parsing Canonical Form, 16 lowercase hex digits.
    """

    path: Path
    raw: dict[str, Any]
    wire: dict[str, Any]
    fingerprint: str

    @property
    def fingerprint_header(self) -> bytes:
        """The fingerprint as the ASCII bytes carried in the ``schema-fp`` header."""
        return self.fingerprint.encode("ascii")


def schema_path(path: str | os.PathLike[str] | None = None) -> Path:
    """Resolve the schema path: the argument, else ``$HEADWATER_EVENT_SCHEMA``, else the repo's file."""
    if path is not None:
        return Path(path)
    env = os.environ.get(SCHEMA_ENV)
    return Path(env) if env else DEFAULT_SCHEMA_PATH


def load_schema(path: str | os.PathLike[str] | None = None) -> EventSchema:
    """Load, parse and fingerprint the event schema (cached per resolved path).

    Raises:
        SchemaError: the file is missing or unreadable, is not valid Avro JSON, or its fields or
            enum symbols differ from :class:`BehaviorEvent`.
    """
    return _load_schema(schema_path(path).resolve())


@lru_cache(maxsize=8)
def _load_schema(path: Path) -> EventSchema:
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        msg = (
            f"event schema not found at {path}; expected the Avro file features/schemas/"
            f"behavior_event.avsc of the headwater repo, or set ${SCHEMA_ENV} to its path"
        )
        raise SchemaError(msg) from None
    except json.JSONDecodeError as exc:
        msg = f"{path}:{exc.lineno}:{exc.colno}: event schema is not valid JSON: {exc.msg}"
        raise SchemaError(msg) from exc
    if not isinstance(raw, dict) or raw.get("type") != "record":
        msg = f'{path}: expected an Avro record schema (a JSON object with "type": "record")'
        raise SchemaError(msg)
    try:
        parsed = fastavro.parse_schema(raw)
        wire = cast(dict[str, Any], fastavro.parse_schema(_without_time_logical_type(raw)))
    except (avro_schema.SchemaParseException, avro_schema.UnknownType, KeyError, TypeError) as exc:
        msg = f"{path}: not a valid Avro schema: {exc}; fix the file (see the Avro specification)"
        raise SchemaError(msg) from exc
    _check_matches_typed_record(path, raw)
    fp = avro_schema.fingerprint(avro_schema.to_parsing_canonical_form(parsed), FINGERPRINT_ALGORITHM)
    return EventSchema(path=path, raw=raw, wire=wire, fingerprint=fp)


def _without_time_logical_type(raw: dict[str, Any]) -> dict[str, Any]:
    wire = copy.deepcopy(raw)
    for field in wire.get("fields", []):
        if field.get("name") == "event_time" and isinstance(field.get("type"), dict):
            field["type"] = {"type": "long"}
    return wire


def _check_matches_typed_record(path: Path, raw: dict[str, Any]) -> None:
    fields = {f["name"]: f["type"] for f in raw.get("fields", [])}
    if tuple(fields) != FIELD_NAMES:
        msg = (
            f"{path}: fields are {list(fields)}, but headwater's BehaviorEvent expects "
            f"{list(FIELD_NAMES)}; change both together (pipelines/events/schema.py)"
        )
        raise SchemaError(msg)
    for name, expected in (("event_type", EVENT_TYPES), ("device", DEVICES)):
        symbols = tuple(fields[name].get("symbols", ())) if isinstance(fields[name], dict) else ()
        if symbols != expected:
            msg = (
                f"{path}: enum {name} has symbols {list(symbols)}, but the code expects "
                f"{list(expected)}; change both together (pipelines/events/schema.py)"
            )
            raise SchemaError(msg)


def event_datetime(event: BehaviorEvent) -> datetime:
    """Return the event time as a timezone-aware UTC datetime."""
    return datetime.fromtimestamp(event["event_time"] / 1000, tz=UTC)
