"""What the JVM decode of a source returns, and the source as the decoder reads it.

The realtime job decodes each source's records in the JVM (``dev.headwater.flink.DecodeEvent`` and
``EventTime`` in infra/maven/flink-udfs), built from :func:`decoder_config`: the plan source's every
schema version (the ``schema-fp`` header picks the writer schema, resolved into the current one), its
fields and kinds, event-time field and unit, the string key/event-id fields and their id policy (with
:mod:`headwater.pipelines.events.ids`'s forbidden code points, so Java keeps no list), its event-time
limits, and
the Python codec's size bounds (payload bytes, string characters: ``oversized`` beyond them), passed here
so that the two decoders share one definition of each limit. No field name is written in code: the
columns come from :attr:`PlanSource.fields`.

The decoded row is :data:`HEAD` (reason, detail, future-dated detail, event time in ms) and then one
column per field of the current schema (:func:`event_columns`). The source's rules are evaluated by
the SQL of :mod:`.sql`, after the decode; the JVM flags a future-dated event and the SQL rejects it
after the rules, so each record gets the verdict and reason of the Python codec
(``EventCodec.decode``, then the future-dated check of the tiers).
"""

from __future__ import annotations

import json

from headwater.pipelines.events.codec import MAX_EVENT_BYTES, MAX_STRING_CHARS
from headwater.pipelines.events.codec import id_fields as codec_id_fields
from headwater.pipelines.events.ids import CHARSETS
from headwater.registry.plans import PlanSource

SQL_TYPES: dict[str, str] = {
    "string": "STRING",
    "enum": "STRING",
    "int": "INT",
    "long": "BIGINT",
    "float": "DOUBLE",
    "double": "DOUBLE",
    "boolean": "BOOLEAN",
    "timestamp": "BIGINT",
}
"""Flink SQL type of each registry field kind (``DecodeEvent.sqlType`` in Java): a timestamp is its raw
integer in the field's unit, like the Python codec's value; float is widened to DOUBLE."""

REASON, DETAIL, FUTURE, TIME_MS = "hw_reason", "hw_detail", "hw_future", "hw_time_ms"
HEAD: tuple[tuple[str, str], ...] = (
    (REASON, "STRING"),
    (DETAIL, "STRING"),
    (FUTURE, "STRING"),
    (TIME_MS, "BIGINT"),
)
"""The decoded row's columns before the fields: reason (NULL for a record that decodes), its detail, the
future-dated detail (NULL unless the event time is too far ahead), and the event time in UTC ms."""


def event_columns(source: PlanSource) -> tuple[tuple[str, str], ...]:
    """Return the source's fields as Flink SQL columns (name, type), in Avro order of the current schema."""
    return tuple((f.name, SQL_TYPES[f.kind]) for f in source.fields)


def id_fields(source: PlanSource) -> list[str]:
    """Return the fields the source's id policy bounds: the string key and event id (the codec's)."""
    return [name for _, name in codec_id_fields(source)]


def decoder_config(
    source: PlanSource,
    *,
    max_event_bytes: int = MAX_EVENT_BYTES,
    max_string_chars: int = MAX_STRING_CHARS,
) -> str:
    """Return the JSON the JVM decoder (``EventDecoder.Config``) is built from: all it needs of ``source``.

    ``max_event_bytes`` and ``max_string_chars`` are the bounds of ``EventCodec`` (same defaults, same
    meaning): a payload or string field over them is rejected as ``oversized`` by both decoders.
    """
    return json.dumps(
        {
            "source": source.name,
            "schemas": [{"fingerprint": s.fingerprint, "json": s.json_text} for s in source.schemas],
            "fields": [{"name": f.name, "kind": f.kind} for f in source.fields],
            "event_time": source.event_time,
            "time_unit": source.event_time_unit,
            "id_fields": id_fields(source),
            # the id policy (pipelines/events/ids.py): roles for the reason text, the forbidden code points
            "id_roles": [role for role, _ in codec_id_fields(source)],
            "id_max_bytes": source.id_max_bytes,
            "id_charset": source.id_charset,
            "id_forbidden": [list(r) for r in CHARSETS[source.id_charset]],
            "min_event_time_ms": source.min_event_time_ms,
            "max_event_time_ms": source.max_event_time_ms,
            "max_future_ms": source.max_future_ms,
            "max_event_bytes": max_event_bytes,
            "max_string_chars": max_string_chars,
        },
        separators=(",", ":"),
    )
