"""Read a push request's body into rows: a JSON array, JSON Lines, Avro binary, or a Feast push payload.

Every reader raises :class:`~headwater.serving.ingest.core.BadBody` (or ``UnsupportedMedia``) for a
body that is not a batch at all, with what was expected; a body that is a batch but holds a bad
event gives that event a :class:`~headwater.pipelines.events.readers.FileRow` with its error, so it
is rejected alone and the rest go on.

Avro binary (``Content-Type: application/avro``): the writer's schema fingerprint in the
``X-Schema-Fp`` header (any schema version of the source: it is read into the current one, as the
tiers read it), and the body a sequence of Avro ``bytes`` values (a zig-zag varint length, then
that many bytes), each one datum of that schema. Framing each datum keeps a corrupt one from
losing the boundary of the next; each is decoded by the source's codec exactly as the tiers decode
a record (:meth:`~headwater.pipelines.events.codec.EventCodec.decode`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from headwater.pipelines.events.codec import HEADER_SCHEMA_FP, DecodeError, EventCodec
from headwater.pipelines.events.readers import FileRow
from headwater.serving.ingest.core import BadBody, UnsupportedMedia

JSON_TYPES = frozenset({"application/json"})
JSON_LINES_TYPES = frozenset(
    {"application/x-ndjson", "application/jsonl", "application/jsonlines", "application/x-jsonlines"}
)
AVRO_TYPES = frozenset({"application/avro", "avro/binary", "application/vnd.apache.avro+binary"})
FINGERPRINT_HEADER = "x-schema-fp"
MAX_SHOWN = 60


def media_type(content_type: str | None) -> str:
    """Return the media type of a ``Content-Type`` (no parameters, lower case; JSON when absent)."""
    if not content_type:
        return "application/json"
    return content_type.split(";", 1)[0].strip().lower()


def read_rows(body: bytes, content_type: str | None, codec: EventCodec, fingerprint: str | None) -> list[Any]:
    """Return the rows of a ``POST /v1/sources/{source}/events`` body.

    Raises:
        BadBody: not a batch of the declared type.
        UnsupportedMedia: a type other than JSON, JSON Lines and Avro.
    """
    kind = media_type(content_type)
    if kind in JSON_TYPES:
        return json_array(body)
    if kind in JSON_LINES_TYPES:
        return json_lines(body)
    if kind in AVRO_TYPES:
        return avro_datums(body, codec, fingerprint)
    accepted = ", ".join(sorted({"application/json", "application/x-ndjson", "application/avro"}))
    msg = f"Content-Type {kind[:MAX_SHOWN]!r} is not read here; send one of {accepted}"
    raise UnsupportedMedia(msg)


def json_value(body: bytes) -> Any:
    """Return the JSON value of a body.

    Raises:
        BadBody: not JSON (not UTF-8, a syntax error, nested too deep, a number out of range).
    """
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        lines = "JSON Lines as application/x-ndjson"
        msg = f"the body is not JSON ({exc}); send a JSON array of events, or {lines}"
        raise BadBody(msg) from None


def json_array(body: bytes) -> list[Any]:
    """Return the elements of a JSON array body.

    Raises:
        BadBody: not JSON, or JSON but not an array.
    """
    parsed = json_value(body)
    if not isinstance(parsed, list):
        found = type(parsed).__name__
        msg = f"expected a JSON array of events, found a JSON {found}; wrap a single event in [ ]"
        raise BadBody(msg)
    return parsed


def json_lines(body: bytes) -> list[Any]:
    """Return one row per non-blank line; a line that is not JSON is a row with that error."""
    rows: list[Any] = []
    for number, line in enumerate(body.split(b"\n"), start=1):
        if not line.strip():
            continue
        try:
            rows.append(orjson.loads(line))
        except orjson.JSONDecodeError as exc:
            raw = line[:MAX_SHOWN].decode("utf-8", "replace")
            rows.append(FileRow(len(rows), None, f"line {number} is not JSON: {exc}", raw))
    return rows


def _varint(body: bytes, at: int) -> tuple[int, int]:
    """Read one zig-zag varint (an Avro long) at ``at``; its value and the next position."""
    shift = result = 0
    for i in range(at, min(at + 10, len(body))):
        byte = body[i]
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return (result >> 1) ^ -(result & 1), i + 1
        shift += 7
    msg = f"byte {at}: a datum's length is not an Avro long (truncated or over 10 bytes)"
    raise BadBody(msg)


def avro_datums(body: bytes, codec: EventCodec, fingerprint: str | None) -> list[Any]:
    """Return the decoded events of an Avro body (see the module); a datum that does not decode is a bad row.

    Raises:
        BadBody: no fingerprint, one of no schema version of the source, or broken framing.
    """
    if not fingerprint:
        where = "GET /v1/sources/NAME shows the current one"
        msg = f"Avro needs the writer's schema fingerprint in the {FINGERPRINT_HEADER} header ({where})"
        raise BadBody(msg)
    known = [v.fingerprint for v in codec.source.schemas]
    if fingerprint not in known:
        msg = (
            f"{FINGERPRINT_HEADER} {fingerprint[:40]!r} is no schema version of source {codec.source.name!r} "
            f"(known: {', '.join(known)})"
        )
        raise BadBody(msg)
    headers = [(HEADER_SCHEMA_FP, fingerprint.encode("ascii"))]
    rows: list[Any] = []
    at = 0
    while at < len(body):
        size, start = _varint(body, at)
        if size < 0 or start + size > len(body):
            msg = f"byte {at}: datum {len(rows)} claims {size} bytes, {len(body) - start} remain"
            raise BadBody(msg)
        decoded = codec.decode(body[start : start + size], headers)
        if isinstance(decoded, DecodeError):
            rows.append(FileRow(len(rows), None, f"{decoded.reason}: {decoded.detail}", None))
        else:
            rows.append(decoded.event)
        at = start + size
    return rows


def feast_rows(payload: Any, mapping: Mapping[str, str]) -> tuple[str, list[Any]]:
    """Return the headwater source and the rows of a Feast push payload.

    A Feast push (``POST /push``) is ``{"push_source_name": NAME, "df": {column: [values, ...]}, "to":
    "online" | "offline" | "online_and_offline"}``: the columns become one row per position.
    ``mapping`` names the headwater source of each push source (a name it does not list is taken
    as the source's own name). ``to`` is accepted and ignored: every tier reads the source's topic.

    Raises:
        BadBody: not that shape, or columns of different lengths.
    """
    if not isinstance(payload, dict) or not isinstance(payload.get("push_source_name"), str):
        msg = 'expected a Feast push payload: {"push_source_name": NAME, "df": {column: [values]}}'
        raise BadBody(msg)
    frame = payload.get("df")
    if not isinstance(frame, dict) or not all(isinstance(v, list) for v in frame.values()):
        msg = 'a Feast push payload\'s "df" must be an object of columns, each a list of values'
        raise BadBody(msg)
    lengths = {len(v) for v in frame.values()}
    if len(lengths) > 1:
        found = sorted(lengths)
        msg = f'the "df" columns have different lengths ({found}); every column needs one value per row'
        raise BadBody(msg)
    count = lengths.pop() if lengths else 0
    columns = list(frame.items())
    rows = [{name: values[i] for name, values in columns} for i in range(count)]
    name = payload["push_source_name"]
    return mapping.get(name, name), rows
