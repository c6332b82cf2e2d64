"""One answer's impressions as one unit: offered once, validated and encoded together, sent in one call.

An answer of K items becomes K ``impression`` records, exactly as before (the source's schema has one
item per record; every tier counts the same records, byte for byte). What changed is the Python work
around them: the request path offers one :class:`Impressions` (no per-item dict, no per-item
validation on the event loop, one buffer slot); the sender thread builds and validates the K events,
then :class:`AnswerEncoder` writes their Avro bytes from one template (the fields every impression of
an answer shares are encoded once; only ``event_id``, ``item_id`` and ``position`` are encoded per
item), and the sink queues the K records in one call with one key, one header list and one delivery
handle (``EventSink.send_many``).

The template encoder is a small Avro binary writer for flat records (primitive fields, enums, and
unions of those with null): the bytes equal ``EventCodec.encode``'s (fastavro) for every event, which
a property test checks. A schema it cannot write (a nested record, an array, a map, a fixed) or a
value it does not know how to write makes it fall back to the codec, per event.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from headwater.pipelines.events.codec import EventCodec
from headwater.pipelines.events.schema import BehaviorEvent, Device

VARYING = ("event_id", "item_id", "position")
"""The fields in which one answer's impressions differ; every other field is the same in all of them."""

_INT32 = (-(2**31), 2**31 - 1)
_INT64 = (-(2**63), 2**63 - 1)


@dataclass(frozen=True, slots=True)
class Impressions:
    """The impressions of one answer: item ``j`` (0-based) is shown at position ``j + 1``.

    ``event_id`` of item ``j`` is ``<request_id>:<j + 1>``; the session is ``session_id`` or, without
    one, the request id (so a click posted with the session and position joins its impression).
    """

    request_id: str
    user_id: str
    items: tuple[str, ...]
    at_ms: int
    session_id: str | None = None
    device: Device = "web"
    arm: str | None = None

    def __len__(self) -> int:
        """Return how many records this answer becomes."""
        return len(self.items)

    def events(self) -> list[BehaviorEvent]:
        """Return the ``impression`` events, one per item, in position order (not validated)."""
        session = self.session_id or self.request_id
        out: list[BehaviorEvent] = []
        for pos, item in enumerate(self.items, start=1):
            event: BehaviorEvent = {
                "event_id": f"{self.request_id}:{pos}",
                "user_id": self.user_id,
                "item_id": item,
                "event_type": "impression",
                "event_time": self.at_ms,
                "session_id": session,
                "category": None,
                "price": None,
                "dwell_ms": None,
                "query": None,
                "position": pos,
                "device": self.device,
            }
            if self.arm is not None:
                event["arm"] = self.arm
            out.append(event)
        return out


class _Unwritable(Exception):
    """A schema or a value the template encoder does not write: the codec encodes instead."""


def _varint(n: int) -> bytes:
    """Avro's zig-zag varint of a long."""
    if -64 <= n < 64:
        return _SMALL[n]
    z = (n << 1) ^ (n >> 63)
    out = bytearray()
    while z > 0x7F:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


_SMALL = {n: bytes([(n << 1) ^ (n >> 63)]) for n in range(-64, 64)}
"""The one-byte varints (lengths and positions are almost always among them)."""


def _string(value: Any) -> bytes:
    if not isinstance(value, str):
        raise _Unwritable
    data = value.encode("utf-8")
    return _varint(len(data)) + data


def _bytes(value: Any) -> bytes:
    if not isinstance(value, bytes | bytearray):
        raise _Unwritable
    return _varint(len(value)) + bytes(value)


def _integer(bounds: tuple[int, int]) -> Callable[[Any], bytes]:
    def write(value: Any) -> bytes:
        if isinstance(value, bool) or not isinstance(value, int) or not bounds[0] <= value <= bounds[1]:
            raise _Unwritable
        return _varint(value)

    return write


def _real(fmt: str) -> Callable[[Any], bytes]:
    packer = struct.Struct(fmt)

    def write(value: Any) -> bytes:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise _Unwritable
        try:
            return packer.pack(value)
        except (OverflowError, struct.error):
            raise _Unwritable from None

    return write


def _boolean(value: Any) -> bytes:
    if not isinstance(value, bool):
        raise _Unwritable
    return b"\x01" if value else b"\x00"


def _null(value: Any) -> bytes:
    if value is not None:
        raise _Unwritable
    return b""


_PRIMITIVES: dict[str, Callable[[Any], bytes]] = {
    "null": _null,
    "boolean": _boolean,
    "int": _integer(_INT32),
    "long": _integer(_INT64),
    "float": _real("<f"),
    "double": _real("<d"),
    "string": _string,
    "bytes": _bytes,
}


def _enum(symbols: Sequence[str]) -> Callable[[Any], bytes]:
    index = {s: _varint(j) for j, s in enumerate(symbols)}

    def write(value: Any) -> bytes:
        try:
            return index[value]
        except (KeyError, TypeError):
            raise _Unwritable from None

    return write


def _writer(avro_type: Any) -> Callable[[Any], bytes]:
    """Return the writer of one field type, or raise :class:`_Unwritable` for a type it does not write."""
    if isinstance(avro_type, str) and avro_type in _PRIMITIVES:
        return _PRIMITIVES[avro_type]
    if isinstance(avro_type, dict):
        kind = avro_type.get("type")
        if kind == "enum":
            return _enum(avro_type["symbols"])
        if kind in ("int", "long") and avro_type.get("logicalType") in (
            None, "timestamp-millis", "timestamp-micros", "time-millis", "time-micros", "date",
        ):  # fmt: skip
            return _PRIMITIVES[kind]  # the codec writes these times as integers (wire_schema)
        if isinstance(kind, str) and kind in _PRIMITIVES and "logicalType" not in avro_type:
            return _PRIMITIVES[kind]
    if isinstance(avro_type, list) and all(not isinstance(t, list) for t in avro_type):
        return _union([_writer(t) for t in avro_type], avro_type)
    raise _Unwritable


def _union(branches: list[Callable[[Any], bytes]], types: list[Any]) -> Callable[[Any], bytes]:
    """Return a union's writer: the first branch that takes the value, as fastavro picks it here.

    Only unions whose branches cannot both take one value are written (null with one other type, the
    common optional field); others fall back to the codec.
    """
    names = [t if isinstance(t, str) else t.get("type") for t in types]
    if len(types) != 2 or len(set(names)) != 2 or "null" not in names:
        raise _Unwritable
    null = names.index("null")
    null_tag, tag, branch = _varint(null), _varint(1 - null), branches[1 - null]

    def write(value: Any) -> bytes:
        return null_tag if value is None else tag + branch(value)

    return write


class AnswerEncoder:
    """Write the Avro bytes of one answer's impressions (see the module docstring); one per thread."""

    def __init__(self, codec: EventCodec) -> None:
        """Compile the template for ``codec``'s current schema (the codec encodes what this cannot)."""
        self.codec = codec
        self._fields: list[tuple[str, Any, Callable[[Any], bytes]]] | None
        try:
            schema = json.loads(codec.source.current.json_text)
            if schema.get("type") != "record":
                raise _Unwritable
            fields = [(f["name"], f.get("default"), _writer(f["type"])) for f in schema["fields"]]
            if not set(VARYING) <= {name for name, _, _ in fields}:
                raise _Unwritable
            self._fields = fields
        except (_Unwritable, KeyError, TypeError, AttributeError, ValueError):
            self._fields = None

    @property
    def templated(self) -> bool:
        """Whether the schema is one the template writes (else every event goes through the codec)."""
        return self._fields is not None

    def encode(self, events: Sequence[BehaviorEvent]) -> list[bytes]:
        """Return the Avro bytes of ``events`` (one answer: they differ only in :data:`VARYING`), in order.

        Raises:
            EncodeError: an event the codec cannot encode (from :meth:`EventCodec.encode`).
        """
        if not events:
            return []
        try:
            return self._templated(events)
        except _Unwritable:
            return [self.codec.encode(e) for e in events]

    def _templated(self, events: Sequence[BehaviorEvent]) -> list[bytes]:
        if self._fields is None:
            raise _Unwritable
        first: dict[str, Any] = dict(events[0])
        # Segments: the shared fields between two varying ones, encoded once.
        segments: list[bytes] = []
        varying: list[tuple[str, Callable[[Any], bytes]]] = []
        current = bytearray()
        for name, default, write in self._fields:
            if name in VARYING:
                segments.append(bytes(current))
                current = bytearray()
                varying.append((name, write))
            elif name in first:
                current += write(first[name])
            else:
                current += write(default)  # an absent field is written with its default, as fastavro does
        segments.append(bytes(current))
        out: list[bytes] = []
        for event in events:
            parts = [segments[0]]
            for j, (name, write) in enumerate(varying):
                parts.append(write(event[name]))  # type: ignore[literal-required]  # VARYING are fields
                parts.append(segments[j + 1])
            out.append(b"".join(parts))
        return out
