"""Event streams: the generic codec of any source, the example behaviour events, producer and tail.

Every tier reads a source's events through :mod:`headwater.pipelines.events.codec`, built from
the source in the applied plan: ``EventCodec.decode``
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
from headwater.pipelines.events.schema import BehaviorEvent, behavior_source

__all__ = [
    "HEADER_PRODUCE_TS",
    "HEADER_SCHEMA_FP",
    "BehaviorEvent",
    "DeadLetter",
    "DecodeError",
    "DecodedEvent",
    "EventCodec",
    "Reason",
    "behavior_source",
    "dead_letter",
    "parse_dead_letter",
]
