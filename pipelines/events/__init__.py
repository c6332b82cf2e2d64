"""The behaviour-event stream: Avro schema, codec, a synthetic generator, the producer and tail.

Every tier reads events through :mod:`headwater.pipelines.events.codec`: ``EventCodec.decode``
never raises on broken input, it returns a :class:`DecodeError` with a reason code, and
``dead_letter`` turns such a record into one for the dead-letter topic.
"""

from headwater.pipelines.events.codec import (
    HEADER_PRODUCE_TS,
    HEADER_SCHEMA_FP,
    DeadLetter,
    DecodedEvent,
    DecodeError,
    EventCodec,
    Reason,
    dead_letter,
    parse_dead_letter,
)
from headwater.pipelines.events.schema import BehaviorEvent, EventSchema, load_schema

__all__ = [
    "HEADER_PRODUCE_TS",
    "HEADER_SCHEMA_FP",
    "BehaviorEvent",
    "DeadLetter",
    "DecodeError",
    "DecodedEvent",
    "EventCodec",
    "EventSchema",
    "Reason",
    "dead_letter",
    "load_schema",
    "parse_dead_letter",
]
