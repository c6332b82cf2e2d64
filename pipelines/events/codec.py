"""Encode and decode behaviour events; build dead-letter records for what cannot be decoded.

Wire format of one Kafka record on topic ``events``:

- key: ``user_id`` as UTF-8 (so a user's events stay in one partition, in order);
- value: the Avro binary encoding of one :class:`BehaviorEvent` (no container, no magic byte);
- headers: ``schema-fp`` = the writer schema's CRC-64-AVRO fingerprint (16 hex digits, ASCII),
  ``produce-ts`` = the produce time in UTC milliseconds (ASCII decimal).

:meth:`EventCodec.decode` never raises on bad input: it returns a :class:`DecodeError` with a
:class:`Reason`, so a consumer sends the record to the dead-letter topic (see
:func:`dead_letter`) and goes on.
"""

from __future__ import annotations

import io
import math
import struct
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol, cast

from fastavro import schemaless_reader, schemaless_writer

from headwater.pipelines.events.schema import BehaviorEvent, EventSchema, load_schema

HEADER_SCHEMA_FP = "schema-fp"
HEADER_PRODUCE_TS = "produce-ts"

Headers = Sequence[tuple[str, bytes | None]]
"""Kafka headers as kafka-python gives and takes them."""

MIN_EVENT_TIME_MS = 946_684_800_000  # 2000-01-01T00:00:00Z
MAX_EVENT_TIME_MS = 4_102_444_800_000  # 2100-01-01T00:00:00Z
MAX_ID_CHARS = 128
MAX_DETAIL_CHARS = 500

# What fastavro's reader raises on bytes that are not a valid encoding (found by fuzzing:
# truncation, bit flips, random bytes; see tests/unit/pipelines/events/test_events_codec.py).
_CORRUPT_ERRORS = (EOFError, IndexError, UnicodeDecodeError, ValueError, OverflowError, struct.error)


class Reason(StrEnum):
    """Why a record was rejected; the value is what the ``dlq-reason`` header carries."""

    MISSING_FINGERPRINT = "missing_fingerprint"
    UNKNOWN_FINGERPRINT = "unknown_fingerprint"
    INVALID_HEADER = "invalid_header"
    EMPTY_PAYLOAD = "empty_payload"
    CORRUPT_PAYLOAD = "corrupt_payload"
    INVALID_FIELD = "invalid_field"
    LATE = "late"
    """Not produced by the codec: a tier rejects an event older than its allowed lateness."""
    FUTURE_DATED = "future_dated"
    """Not produced by the codec: a tier rejects an event time too far ahead of its clock."""


@dataclass(frozen=True, slots=True)
class DecodedEvent:
    """A record that decoded and validated."""

    event: BehaviorEvent
    fingerprint: str
    produce_ts_ms: int | None


@dataclass(frozen=True, slots=True)
class DecodeError:
    """A record that did not decode or validate: the reason code and a human-readable detail."""

    reason: Reason
    detail: str


class EncodeError(ValueError):
    """An event could not be encoded with the writer schema (a bug in the caller)."""


class EventCodec:
    """Avro codec for behaviour events, bound to one schema (the writer and the only reader).

    A payload whose ``schema-fp`` is not this schema's fingerprint is rejected as
    ``unknown_fingerprint``: deploy a consumer that knows a new schema before a producer that
    writes it. One instance reuses its parsed schema and an output buffer, so it is cheap per
    event but not thread-safe: use one per thread.
    """

    def __init__(self, schema: EventSchema | None = None) -> None:
        """Bind to ``schema`` (default: :func:`load_schema`)."""
        self.schema = schema if schema is not None else load_schema()
        self._wire: dict[str, Any] = self.schema.wire
        self._fp_header: bytes = self.schema.fingerprint_header
        self._fingerprint: str = self.schema.fingerprint
        self._buffer = io.BytesIO()

    @property
    def fingerprint(self) -> str:
        """The writer schema's fingerprint (16 hex digits)."""
        return self._fingerprint

    def encode(self, event: BehaviorEvent) -> bytes:
        """Return the Avro binary encoding of ``event``.

        Raises:
            EncodeError: a field has a type the schema does not allow (for example an unknown
                ``event_type``); the message names the event.
        """
        buffer = self._buffer
        buffer.seek(0)
        buffer.truncate()
        try:
            schemaless_writer(buffer, self._wire, event)
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            msg = f"cannot encode event {event.get('event_id')!r} with {self.schema.path}: {exc!r}"
            raise EncodeError(msg) from exc
        return buffer.getvalue()

    def headers(self, produce_ts_ms: int | None = None) -> list[tuple[str, bytes]]:
        """Kafka headers for a record produced now (or at ``produce_ts_ms``)."""
        ts = produce_ts_ms if produce_ts_ms is not None else time.time_ns() // 1_000_000
        return [(HEADER_SCHEMA_FP, self._fp_header), (HEADER_PRODUCE_TS, str(ts).encode("ascii"))]

    def decode(self, value: bytes | None, headers: Headers | None) -> DecodedEvent | DecodeError:
        """Decode and validate one record; never raises on malformed input.

        Steps: 1. check the ``schema-fp`` header names this schema; 2. parse ``produce-ts``;
        3. read the Avro payload and require that it uses every byte; 4. validate the fields.
        """
        # Step 1
        fp = _header(headers, HEADER_SCHEMA_FP)
        if fp is None:
            return DecodeError(Reason.MISSING_FINGERPRINT, f"no {HEADER_SCHEMA_FP!r} header on the record")
        if fp != self._fp_header:
            return DecodeError(
                Reason.UNKNOWN_FINGERPRINT,
                f"{HEADER_SCHEMA_FP} {fp[:40]!r} is not the schema this consumer knows "
                f"({self._fingerprint}, {self.schema.path})",
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
        stream = io.BytesIO(value)
        try:
            record = schemaless_reader(stream, self._wire, None)
        except _CORRUPT_ERRORS as exc:
            detail = f"not an Avro {self.schema.raw.get('name')} record: {type(exc).__name__}: {exc}"
            return DecodeError(Reason.CORRUPT_PAYLOAD, detail[:MAX_DETAIL_CHARS])
        if stream.tell() != len(value):
            detail = f"{len(value) - stream.tell()} trailing bytes after a {stream.tell()}-byte record"
            return DecodeError(Reason.CORRUPT_PAYLOAD, detail)
        # Step 4
        event = cast(BehaviorEvent, record)
        problem = validate_event(event)
        if problem is not None:
            return DecodeError(Reason.INVALID_FIELD, problem[:MAX_DETAIL_CHARS])
        return DecodedEvent(event=event, fingerprint=self._fingerprint, produce_ts_ms=produce_ts)


def _header(headers: Headers | None, name: str) -> bytes | None:
    for key, value in headers or ():
        if key == name:
            return value
    return None


def validate_event(event: BehaviorEvent) -> str | None:
    """Check the rules Avro cannot express; return what is wrong, or None when the event is valid.

    Rules: ids are 1..128 characters; ``event_time`` lies in 2000..2100; ``item_id`` is set for
    every type but ``search``; a search has a ``query``; a dwell has ``dwell_ms``; ``price`` is
    finite and >= 0; ``dwell_ms`` >= 0; ``position`` (1 = top of the slate) >= 1.
    """
    for name in ("event_id", "user_id", "session_id"):
        value: str = event[name]
        if not 0 < len(value) <= MAX_ID_CHARS:
            return f"{name}: expected 1..{MAX_ID_CHARS} characters, found {len(value)} ({value[:40]!r})"
    kind = event["event_type"]
    ts = event["event_time"]
    if not MIN_EVENT_TIME_MS <= ts < MAX_EVENT_TIME_MS:
        return f"event_time: expected UTC ms between years 2000 and 2100, found {ts}"
    if kind != "search" and not event["item_id"]:
        return f"item_id: required for a {kind} event, found {event['item_id']!r}"
    if kind == "search" and not event["query"]:
        return f"query: required for a search event, found {event['query']!r}"
    dwell = event["dwell_ms"]
    if kind == "dwell" and dwell is None:
        return "dwell_ms: required for a dwell event, found null"
    if dwell is not None and dwell < 0:
        return f"dwell_ms: expected >= 0, found {dwell}"
    price = event["price"]
    if price is not None and not (math.isfinite(price) and price >= 0):
        return f"price: expected a finite number >= 0, found {price}"
    position = event["position"]
    if position is not None and position < 1:
        return f"position: expected >= 1 (1 = top of the slate), found {position}"
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
