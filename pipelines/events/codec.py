"""Encode and decode any source's events; build dead-letter records for what cannot be decoded.

The codec is generic: it is built from a source of the applied plan
(:class:`~headwater.registry.plans.PlanSource`), which carries every version of the source's
Avro schema, the key and event-id fields, the rules and the event-time limits. Nothing here
knows a field name.

Wire format of one Kafka record on a source's topic:

- key: the source's ``key`` field as UTF-8 text (so one key's events stay in order in one partition);
- value: the Avro binary encoding of one record (no container, no magic byte);
- headers: ``schema-fp`` = the writer schema's CRC-64-AVRO fingerprint (16 hex digits, ASCII),
  ``produce-ts`` = the produce time in UTC milliseconds (ASCII decimal).

Bounds: a payload over ``max_event_bytes`` (default :data:`MAX_EVENT_BYTES`) and a string field over
``max_string_chars`` characters (default :data:`MAX_STRING_CHARS`) are rejected as ``oversized``;
the encoding is walked before fastavro reads it (:mod:`~headwater.pipelines.events.wire_check`), so
an out-of-range enum or union index is ``corrupt_payload`` as in Avro's Java decoder, not a symbol
picked Python-style from the end of the list.

:meth:`EventCodec.decode` never raises on bad input: it returns a :class:`DecodeError` with a
:class:`Reason`, so a consumer sends the record to the dead-letter topic (see
:func:`dead_letter`) and goes on. The writer's fingerprint selects the writer schema among the
source's versions, and the record is resolved into the current schema (Avro's rules), so events
written before a compatible schema change decode into the same fields as new ones.
"""

from __future__ import annotations

import copy
import io
import json
import struct
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

from fastavro import parse_schema, schemaless_reader, schemaless_writer

from headwater.pipelines.events.ids import IdPolicy, check_id
from headwater.pipelines.events.wire_check import Noncanonical, WireError, compile_checker
from headwater.registry.errors import HeadwaterError
from headwater.registry.expr import from_json
from headwater.registry.expr_eval import compile_rule
from headwater.registry.plans import PlanSource

HEADER_SCHEMA_FP = "schema-fp"
HEADER_PRODUCE_TS = "produce-ts"

Headers = Sequence[tuple[str, bytes | None]]
"""Kafka headers as kafka-python gives and takes them."""

Event = dict[str, Any]
"""A decoded event: the current schema's fields by name (timestamps as integers in their unit)."""

MAX_DETAIL_CHARS = 500
MAX_EVENT_BYTES = 64 * 1024
"""Default bound on one payload: the example events are 60-200 bytes; Kafka's own limit is 1 MiB."""
MAX_STRING_CHARS = 4096
"""Default bound on any string field (key, id, free text such as a search query)."""

# What fastavro's reader raises on bytes that are not a valid encoding (found by fuzzing:
# truncation, bit flips, random bytes; see tests/unit/pipelines/events/test_events_codec.py).
_CORRUPT_ERRORS = (
    EOFError,
    IndexError,
    UnicodeDecodeError,
    ValueError,
    OverflowError,
    struct.error,
    KeyError,
    TypeError,
)


class Reason(StrEnum):
    """Why a record was rejected; the value is what the ``dlq-reason`` header carries."""

    MISSING_FINGERPRINT = "missing_fingerprint"
    UNKNOWN_FINGERPRINT = "unknown_fingerprint"
    INVALID_HEADER = "invalid_header"
    EMPTY_PAYLOAD = "empty_payload"
    CORRUPT_PAYLOAD = "corrupt_payload"
    INVALID_FIELD = "invalid_field"
    INVALID_ID = "invalid_id"
    """The string key or event id breaks the source's id policy (``ids:``, :mod:`.ids`): the detail
    starts with the kind, ``id-too-long``, ``id-not-printable``, ``id-has-nul``, ``id-empty``..."""
    OVERSIZED = "oversized"
    """The payload is over the codec's byte bound, or a string field over its character bound."""
    LATE = "late"
    """Not produced by the codec: a tier rejects an event older than its allowed lateness."""
    FUTURE_DATED = "future_dated"
    """Not produced by the codec: a tier rejects an event time too far ahead of its clock."""


@dataclass(frozen=True, slots=True)
class DecodedEvent:
    """A record that decoded and validated.

    Attributes:
        event: the current schema's fields.
        fingerprint: the writer schema's fingerprint.
        produce_ts_ms: the ``produce-ts`` header, when present.
        event_time_ms: the event time in UTC milliseconds (whatever the field's unit on the wire).
    """

    event: Event
    fingerprint: str
    produce_ts_ms: int | None
    event_time_ms: int


@dataclass(frozen=True, slots=True)
class DecodeError:
    """A record that did not decode or validate: the reason code and a human-readable detail."""

    reason: Reason
    detail: str
    field: str | None = None
    """The field at fault, when the codec knows it (an ``invalid_id``'s key or event-id field)."""


class EncodeError(HeadwaterError, ValueError):
    """An event could not be encoded with the writer schema (a bug in the caller, or a bad input row)."""


def wire_schema(json_text: str) -> dict[str, Any]:
    """Parse a schema version for the wire: logical timestamp types dropped, so times stay integers.

    The bytes and the canonical form are the same; only the Python value differs (an ``int`` in the
    field's unit instead of a ``datetime``), which is what window arithmetic wants.
    """
    raw = json.loads(json_text)
    wire = copy.deepcopy(raw)
    for entry in wire.get("fields", []):
        entry["type"] = _strip_logical(entry["type"])
    parsed: dict[str, Any] = parse_schema(wire)  # type: ignore[assignment]  # a record schema parses to a dict
    return parsed


def _strip_logical(avro_type: Any) -> Any:
    if isinstance(avro_type, list):
        return [_strip_logical(t) for t in avro_type]
    if isinstance(avro_type, dict) and avro_type.get("type") == "long" and "logicalType" in avro_type:
        return "long"
    return avro_type


class EventCodec:
    """Avro codec for one source's events: writes its current schema, reads every version.

    A payload whose ``schema-fp`` is none of the source's versions is rejected as
    ``unknown_fingerprint``: apply a registry that lists a new schema (and restart the tiers)
    before producers write it. One instance reuses its parsed schemas and an output buffer, so it
    is cheap per event but not thread-safe: use one per thread.
    """

    def __init__(
        self,
        source: PlanSource | None = None,
        *,
        max_event_bytes: int = MAX_EVENT_BYTES,
        max_string_chars: int = MAX_STRING_CHARS,
    ) -> None:
        """Bind to ``source`` (default: the example behaviour source, for the demo generator and tests).

        ``max_event_bytes`` bounds a payload and ``max_string_chars`` every string field: larger ones
        are rejected as ``oversized``.
        """
        if source is None:
            from headwater.pipelines.events.schema import behavior_source

            source = behavior_source()
        self.source = source
        self.max_event_bytes = max_event_bytes
        self.max_string_chars = max_string_chars
        current = source.current
        self._fingerprint = current.fingerprint
        self._fp_header = current.fingerprint.encode("ascii")
        self._wire = wire_schema(current.json_text)
        # fingerprint header -> writer schema; None for the current one (read without resolution).
        self._writers: dict[bytes, dict[str, Any] | None] = {
            v.fingerprint.encode("ascii"): (None if v is current else wire_schema(v.json_text))
            for v in source.schemas
        }
        self._checkers = {
            v.fingerprint.encode("ascii"): compile_checker(json.loads(v.json_text)) for v in source.schemas
        }
        self._strings = tuple(f.name for f in source.fields if f.kind == "string")
        self._time = source.event_time
        self._time_div = 1000 if source.event_time_unit == "us" else 1
        self.ids = IdPolicy(max_bytes=source.id_max_bytes, charset=source.id_charset)
        self._ids = id_fields(source)
        self._rules = [(w.text, compile_rule(from_json(w.ast))) for w in source.rules]
        self._buffer = io.BytesIO()

    @property
    def fingerprint(self) -> str:
        """The current schema's fingerprint (16 hex digits)."""
        return self._fingerprint

    @property
    def fingerprint_header(self) -> bytes:
        """The current fingerprint as the ASCII bytes of the ``schema-fp`` header."""
        return self._fp_header

    def encode(self, event: Mapping[str, Any]) -> bytes:
        """Return the Avro binary encoding of ``event`` with the current schema.

        Raises:
            EncodeError: a field has a type the schema does not allow; the message names the source.
        """
        buffer = self._buffer
        buffer.seek(0)
        buffer.truncate()
        try:
            schemaless_writer(buffer, self._wire, event)
        except (ValueError, TypeError, KeyError, AttributeError, OverflowError) as exc:
            ident = event.get(self.source.event_id) if self.source.event_id else None
            msg = f"cannot encode event {ident!r} of source {self.source.name!r}: {exc!r}"
            raise EncodeError(msg) from exc
        return buffer.getvalue()

    def key(self, event: Mapping[str, Any]) -> bytes | None:
        """Return the Kafka key of ``event``: its ``key`` field as UTF-8 text (None for an unkeyed source)."""
        if self.source.key is None:
            return None
        value = event.get(self.source.key)
        return None if value is None else str(value).encode("utf-8")

    def event_time_ms(self, event: Mapping[str, Any]) -> int:
        """Return the event time of a decoded (or to-be-encoded) event in UTC milliseconds."""
        return int(event[self._time]) // self._time_div

    def headers(self, produce_ts_ms: int | None = None) -> list[tuple[str, bytes]]:
        """Kafka headers for a record produced now (or at ``produce_ts_ms``)."""
        ts = produce_ts_ms if produce_ts_ms is not None else time.time_ns() // 1_000_000
        return [(HEADER_SCHEMA_FP, self._fp_header), (HEADER_PRODUCE_TS, str(ts).encode("ascii"))]

    def decode(self, value: bytes | None, headers: Headers | None) -> DecodedEvent | DecodeError:
        """Decode and validate one record; never raises on malformed input.

        Steps: 1. the ``schema-fp`` header names one of the source's schema versions; 2. parse
        ``produce-ts``; 3. read the Avro payload with that writer schema into the current one and
        require that it uses every byte; 4. validate (:meth:`validate`).
        """
        # Step 1
        fp = _header(headers, HEADER_SCHEMA_FP)
        if fp is None:
            return DecodeError(Reason.MISSING_FINGERPRINT, f"no {HEADER_SCHEMA_FP!r} header on the record")
        if fp not in self._writers:
            known = ", ".join(v.fingerprint for v in self.source.schemas)
            return DecodeError(
                Reason.UNKNOWN_FINGERPRINT,
                f"{HEADER_SCHEMA_FP} {fp[:40]!r} is no schema version of source {self.source.name!r} "
                f"(known: {known}); list the new schema in sources.yaml and apply",
            )
        # Step 2
        produce_ts: int | None = None
        raw_ts = _header(headers, HEADER_PRODUCE_TS)
        if raw_ts is not None:
            if not raw_ts.isdigit() or len(raw_ts) > 16:
                detail = (
                    f"{HEADER_PRODUCE_TS} must be UTC milliseconds in ASCII digits, found {raw_ts[:40]!r}"
                )
                return DecodeError(Reason.INVALID_HEADER, detail)
            produce_ts = int(raw_ts)
        # Step 3
        if not value:
            return DecodeError(Reason.EMPTY_PAYLOAD, "the record has no value (tombstone or empty bytes)")
        if len(value) > self.max_event_bytes:
            detail = f"a {len(value)}-byte payload is over the {self.max_event_bytes}-byte limit"
            return DecodeError(Reason.OVERSIZED, f"{detail} of source {self.source.name!r}")
        try:
            value = _canonical(self._checkers[fp], value)
        except WireError as exc:
            detail = f"not an Avro record of source {self.source.name!r}: {exc}"
            return DecodeError(Reason.CORRUPT_PAYLOAD, detail[:MAX_DETAIL_CHARS])
        stream = io.BytesIO(value)
        writer = self._writers[fp]
        try:
            if writer is None:
                record = schemaless_reader(stream, self._wire, None)
            else:
                record = schemaless_reader(stream, writer, self._wire)
        except _CORRUPT_ERRORS as exc:
            detail = f"not an Avro record of source {self.source.name!r}: {type(exc).__name__}: {exc}"
            return DecodeError(Reason.CORRUPT_PAYLOAD, detail[:MAX_DETAIL_CHARS])
        if stream.tell() != len(value):
            detail = f"{len(value) - stream.tell()} trailing bytes after a {stream.tell()}-byte record"
            return DecodeError(Reason.CORRUPT_PAYLOAD, detail)
        # Step 4
        event: Event = record  # type: ignore[assignment]
        # A string has at most as many characters as bytes: a payload within the character bound
        # cannot hold a string over it (the common case skips the look at every string field).
        if len(value) > self.max_string_chars:
            problem = self._oversized(event)
            if problem is not None:
                return DecodeError(Reason.OVERSIZED, problem)
        failed = self._failed(event)
        if failed is not None:
            return failed
        return DecodedEvent(
            event=event,
            fingerprint=self._fingerprint if writer is None else fp.decode("ascii"),
            produce_ts_ms=produce_ts,
            event_time_ms=int(event[self._time]) // self._time_div,
        )

    def validate(self, event: Mapping[str, Any]) -> str | None:
        """Check what Avro cannot express; return what is wrong, or None when the event is valid.

        Rules: the event time lies in the source's ``[min_event_time, 2100)``; the string key and
        event-id fields meet the source's id policy (:meth:`check_ids`); every rule of the source
        holds (a rule that is unknown because of a null, as in a SQL CHECK constraint, holds); no
        string field is over ``max_string_chars`` characters.
        """
        failed = self.check(event)
        return None if failed is None else failed.detail

    def check(self, event: Mapping[str, Any]) -> DecodeError | None:
        """Return what :meth:`validate` finds, with the reason a tier dead-letters the event with.

        The reason is ``invalid_field``, ``invalid_id`` (the id policy) or ``oversized``; None: valid.
        """
        failed = self._failed(event)
        if failed is not None:
            return failed
        over = self._oversized(event)
        return None if over is None else DecodeError(Reason.OVERSIZED, over)

    def check_ids(self, event: Mapping[str, Any]) -> str | None:
        """Return why the event's string key or event id breaks the source's id policy, or None.

        The text is :func:`~headwater.pipelines.events.ids.check_id`'s (``id-too-long: key user_id is
        300 bytes, limit 256``), what every tier writes as the detail of an ``invalid_id`` dead letter.
        """
        failed = self._id_failed(event)
        return None if failed is None else failed.detail

    def _id_failed(self, event: Mapping[str, Any]) -> DecodeError | None:
        for role, name in self._ids:
            problem = check_id(role, name, event.get(name), self.ids)
            if problem is not None:
                return DecodeError(Reason.INVALID_ID, problem, name)
        return None

    def _failed(self, event: Mapping[str, Any]) -> DecodeError | None:
        """:meth:`validate` without the string bound (decode checks that first, only when it can fail)."""
        src = self.source
        ts = event.get(self._time)
        if ts is None:
            return DecodeError(Reason.INVALID_FIELD, f"{self._time}: the event time is null")
        if not isinstance(ts, int):
            detail = f"{self._time}: expected an integer event time, found {type(ts).__name__}"
            return DecodeError(Reason.INVALID_FIELD, detail)
        ms = int(ts) // self._time_div
        if not src.min_event_time_ms <= ms < src.max_event_time_ms:
            detail = (
                f"{self._time}: expected UTC ms in [{src.min_event_time_ms}, {src.max_event_time_ms}) "
                f"(source {src.name!r}: min_event_time in sources.yaml), found {ms}"
            )
            return DecodeError(Reason.INVALID_FIELD, detail)
        failed = self._id_failed(event)
        if failed is not None:
            return failed
        for text, holds in self._rules:
            if not holds(event):
                detail = f"rule {text!r} of source {src.name!r} does not hold"
                return DecodeError(Reason.INVALID_FIELD, detail[:MAX_DETAIL_CHARS])
        return None

    def _oversized(self, event: Mapping[str, Any]) -> str | None:
        """Name the first string field over ``max_string_chars`` characters, if any."""
        for name in self._strings:
            text = event.get(name)
            if text is not None and len(text) > self.max_string_chars:
                return (
                    f"{name}: {len(text)} characters ({text[:40]!r}...) is over the limit of "
                    f"{self.max_string_chars} characters of source {self.source.name!r}"
                )
        return None


def id_fields(source: PlanSource) -> tuple[tuple[str, str], ...]:
    """Return (role, field) of the source's string id fields, the ones its id policy bounds.

    Roles are ``key`` and ``event_id``; a field that is both is checked once, as the key. Integer
    ids need no check (their digits are short and printable).
    """
    out: dict[str, str] = {}
    for role, name in (("key", source.key), ("event_id", source.event_id)):
        if name and name not in out and (f := source.field(name)) is not None and f.kind == "string":
            out[name] = role
    return tuple((role, name) for name, role in out.items())


def _header(headers: Headers | None, name: str) -> bytes | None:
    for key, value in headers or ():
        if key == name:
            return value
    return None


class SourceRecord(Protocol):
    """The fields of a consumed record that a dead letter keeps (kafka-python's ConsumerRecord)."""

    @property
    def topic(self) -> str: ...  # noqa: D102
    @property
    def partition(self) -> int: ...  # noqa: D102
    @property
    def offset(self) -> int: ...  # noqa: D102
    @property
    def key(self) -> bytes | None: ...  # noqa: D102
    @property
    def value(self) -> bytes | None: ...  # noqa: D102
    @property
    def headers(self) -> Headers | None: ...  # noqa: D102


DLQ_HEADER_PREFIX = "dlq-"
_DLQ_FIELDS = ("reason", "detail", "source-topic", "source-partition", "source-offset", "failed-at")


@dataclass(frozen=True)
class DeadLetter:
    """A rejected record as written to the dead-letter topic.

    The value, key and original headers are kept byte for byte (so the record can be replayed);
    the reason and the source coordinates travel in ``dlq-*`` headers.
    """

    value: bytes | None
    key: bytes | None
    reason: str
    detail: str
    source_topic: str
    source_partition: int
    source_offset: int
    failed_at_ms: int
    original_headers: list[tuple[str, bytes | None]] = field(default_factory=list)

    def kafka_headers(self) -> list[tuple[str, bytes]]:
        """Return the original headers, then ``dlq-reason``, ``-detail``, ``-source-*``, ``-failed-at``."""
        meta = {
            "reason": self.reason,
            "detail": self.detail[:MAX_DETAIL_CHARS],
            "source-topic": self.source_topic,
            "source-partition": str(self.source_partition),
            "source-offset": str(self.source_offset),
            "failed-at": str(self.failed_at_ms),
        }
        kept = [(k, v if v is not None else b"") for k, v in self.original_headers]
        return kept + [(DLQ_HEADER_PREFIX + k, v.encode("utf-8")) for k, v in meta.items()]


def dead_letter(record: SourceRecord, reason: str, detail: str, now_ms: int | None = None) -> DeadLetter:
    """Build the dead letter for a consumed ``record`` rejected for ``reason`` (a :class:`Reason` value)."""
    return DeadLetter(
        value=record.value,
        key=record.key,
        reason=str(reason),
        detail=detail,
        source_topic=record.topic,
        source_partition=record.partition,
        source_offset=record.offset,
        failed_at_ms=now_ms if now_ms is not None else time.time_ns() // 1_000_000,
        original_headers=list(record.headers or ()),
    )


def parse_dead_letter(value: bytes | None, key: bytes | None, headers: Headers) -> DeadLetter:
    """Read back a record of the dead-letter topic (the inverse of :meth:`DeadLetter.kafka_headers`).

    Raises:
        ValueError: a ``dlq-*`` header is missing or not what :func:`dead_letter` writes.
    """
    meta: dict[str, str] = {}
    original: list[tuple[str, bytes | None]] = []
    for k, v in headers:
        if k.startswith(DLQ_HEADER_PREFIX):
            meta[k.removeprefix(DLQ_HEADER_PREFIX)] = (v or b"").decode("utf-8", "replace")
        else:
            original.append((k, v))
    missing = [name for name in _DLQ_FIELDS if name not in meta]
    if missing:
        msg = f"not a headwater dead letter: missing header(s) {[DLQ_HEADER_PREFIX + m for m in missing]}"
        raise ValueError(msg)
    try:
        numbers = [int(meta[name]) for name in ("source-partition", "source-offset", "failed-at")]
    except ValueError as exc:
        msg = f"not a headwater dead letter: a dlq-source-*/failed-at header is not an integer ({exc})"
        raise ValueError(msg) from exc
    return DeadLetter(
        value=value,
        key=key,
        reason=meta["reason"],
        detail=meta["detail"],
        source_topic=meta["source-topic"],
        source_partition=numbers[0],
        source_offset=numbers[1],
        failed_at_ms=numbers[2],
        original_headers=original,
    )


def _canonical(check: Callable[[bytes], None], value: bytes) -> bytes:
    """Check ``value``; return it with the bits Java's decoder drops cleared (almost always unchanged).

    Raises:
        WireError: the bytes are not a record of the schema, whatever Java drops.
    """
    for _ in range(len(value) + 1):  # each fix clears bits of one byte: the loop ends
        try:
            check(value)
        except Noncanonical as fix:
            value = value[: fix.pos] + bytes((fix.byte,)) + value[fix.pos + 1 :]
        else:
            return value
    msg = "varints past their width could not be made canonical"  # pragma: no cover - see the bound
    raise WireError(msg)
