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

A caller's retries of one request carry one request id (``X-Request-Id``, checked by
:func:`checked_request_id`); :class:`ImpressionLedger` remembers the ids answered in the last
minutes, so a retried request logs its impressions once, not once per attempt.
"""

from __future__ import annotations

import json
import logging
import struct
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from headwater.pipelines.events.codec import EventCodec
from headwater.pipelines.events.schema import BehaviorEvent, Device
from headwater.registry.errors import HeadwaterError

logger = logging.getLogger(__name__)

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


# --- one logical request, one set of impressions ---------------------------------------------------

REQUEST_ID_HEADER = "X-Request-Id"
"""The header (gRPC metadata ``x-request-id``) naming a caller's logical request, the same on retries."""
_REQUEST_ID_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-")
MAX_REQUEST_ID = 64


class InvalidRequestId(HeadwaterError, ValueError):
    """A caller's request id is not 1 to 64 characters of ``A-Z a-z 0-9 . _ -``."""


def checked_request_id(value: str | None) -> str | None:
    """Return the caller's request id as given (None: none given), or raise :class:`InvalidRequestId`.

    The id becomes the prefix of the impressions' event ids (``<id>:<position>``), so it is held to
    a plain alphabet; ``:`` is the separator and is not allowed in it.
    """
    if value is None:
        return None
    if not 1 <= len(value) <= MAX_REQUEST_ID or not _REQUEST_ID_CHARS.issuperset(value):
        shown = value[:80].encode("unicode_escape").decode("ascii")
        msg = (
            f"{REQUEST_ID_HEADER}: must be 1 to {MAX_REQUEST_ID} characters of A-Z a-z 0-9 . _ -;"
            f" got {len(value)} characters ({shown!r}); send the same id on every retry of one request,"
            " or none"
        )
        raise InvalidRequestId(msg)
    return value


class ImpressionLedger:
    """The request ids whose impressions were logged in the last ``ttl_s``: a retry logs them once.

    A client that retries a ranking (its first attempt timed out, but the service answered it)
    sends the same request id each time; :meth:`first` is true for the first answer of an id and
    false for the repeats, so impressions, the seen set and the business metrics count one logical
    request once. The key is the user and the id, so one caller's id cannot silence another user's
    impressions. Bounded: at most ``max_entries`` ids; past it the oldest is forgotten before its
    time, which :attr:`evicted_early` counts (and the first time, the log says).
    """

    def __init__(self, ttl_s: float, max_entries: int, clock: Callable[[], float] | None = None) -> None:
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self._clock = clock or time.monotonic
        self._seen: OrderedDict[tuple[str, str], float] = OrderedDict()
        self.repeats = 0
        """Answers whose impressions were not logged again (a retry of a request already answered)."""
        self.evicted_early = 0
        """Ids forgotten before ``ttl_s`` because the ledger was full."""

    def __len__(self) -> int:
        """Return how many ids are remembered."""
        return len(self._seen)

    def first(self, user_id: str, request_id: str) -> bool:
        """Record ``request_id`` for ``user_id``; True unless it was recorded within ``ttl_s``."""
        now = self._clock()
        seen = self._seen
        while seen:  # expire from the oldest (insertion order is time order)
            oldest, at = next(iter(seen.items()))
            if now - at < self.ttl_s:
                break
            del seen[oldest]
        key = (user_id, request_id)
        if key in seen:
            self.repeats += 1
            return False
        seen[key] = now
        if len(seen) > self.max_entries:
            seen.popitem(last=False)
            self.evicted_early += 1
            if self.evicted_early == 1:
                logger.warning(
                    "impression ledger full (%d request ids in %g s): the oldest are forgotten early,"
                    " so a late retry of one may log its impressions twice; raise"
                    " edge.request_id_entries",
                    self.max_entries,
                    self.ttl_s,
                )
        return True
