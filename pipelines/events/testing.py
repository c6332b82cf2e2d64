"""A consumed Kafka record built in code, for tests of the consumers (nearline tasks, landing, checks).

It carries exactly the fields :class:`headwater.pipelines.events.codec.SourceRecord` names, in the order
kafka-python's ``ConsumerRecord`` gives them to the code under test.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Record:
    """The fields of a Kafka ConsumerRecord that the tiers read."""

    offset: int
    value: bytes | None
    headers: list[tuple[str, bytes]]
    key: bytes | None = None
    topic: str = "events"
    partition: int = 0
