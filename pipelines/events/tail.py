"""Read a source's topic back: decode every record with its codec, report what is valid and why the rest not.

``tail`` reads without a consumer group (it assigns every partition itself and commits
nothing), so it never disturbs the tiers' consumer groups.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from headwater.pipelines import kafka as kafka_clients
from headwater.pipelines.events.codec import DecodedEvent, DecodeError, EventCodec
from headwater.registry.errors import HeadwaterError


class TailError(HeadwaterError, RuntimeError):
    """The broker or topic cannot be read; the message says which and what to do."""


@dataclass(frozen=True, slots=True)
class TailedRecord:
    """One record read back, with where it came from and what the codec made of it."""

    partition: int
    offset: int
    result: DecodedEvent | DecodeError


@dataclass
class TailSummary:
    """What a tail saw: counts by the first enum field, rejects by reason, duplicates and record age."""

    records: int = 0
    by_type: Counter[str] = field(default_factory=Counter)
    """Valid records by the value of ``by_field`` (all under "" when the source has no enum)."""
    by_field: str | None = None
    """The source's first enum field (``event_type`` for the behaviour events), or None."""
    invalid: Counter[str] = field(default_factory=Counter)
    duplicate_ids: int = 0
    ages_ms: list[int] = field(default_factory=list)
    """Read time minus the ``produce-ts`` header, per valid record."""

    def as_dict(self) -> dict[str, Any]:
        """Return the summary as plain JSON-able values (ages as p50/p99)."""
        ages = sorted(self.ages_ms)
        return {
            "records": self.records,
            "valid": sum(self.by_type.values()),
            "by_field": self.by_field,
            "by_type": dict(self.by_type.most_common()),
            "invalid": dict(self.invalid.most_common()),
            "duplicate_ids": self.duplicate_ids,
            "age_ms_p50": ages[len(ages) // 2] if ages else None,
            "age_ms_p99": ages[min(len(ages) - 1, int(len(ages) * 0.99))] if ages else None,
        }


def tail(
    bootstrap: str,
    topic: str,
    *,
    max_records: int | None = None,
    from_beginning: bool = False,
    timeout_s: float = 5.0,
    on_record: Callable[[TailedRecord], None] | None = None,
    codec: EventCodec | None = None,
    connect_timeout_s: float = 10.0,
) -> TailSummary:
    """Read ``topic`` until ``max_records`` records or ``timeout_s`` seconds without a new one.

    Raises:
        TailError: no broker at ``bootstrap`` or no such topic.
    """
    from kafka import TopicPartition
    from kafka.errors import KafkaTimeoutError

    codec = codec or EventCodec()
    try:
        consumer = kafka_clients.consumer(
            bootstrap,
            client_id="headwater-events-tail",
            group_id=None,
            enable_auto_commit=False,
            consumer_timeout_ms=int(timeout_s * 1000),
            bootstrap_timeout_ms=int(connect_timeout_s * 1000),
            isolation_level="read_committed",  # nearline dead letters are written in transactions
        )
    except KafkaTimeoutError:
        msg = f"no Kafka broker answers at {bootstrap} within {connect_timeout_s:g}s; run `make services-up`"
        raise TailError(msg) from None
    source = codec.source
    kind = next((f.name for f in source.fields if f.kind == "enum"), None)
    summary, seen = TailSummary(by_field=kind), set[str]()
    try:
        partitions = consumer.partitions_for_topic(topic)
        if not partitions:
            msg = f"topic {topic!r} not found on {bootstrap}; create it with `headwater topics create`"
            raise TailError(msg)
        assigned = [TopicPartition(topic, p) for p in sorted(partitions)]
        consumer.assign(assigned)
        if from_beginning:
            consumer.seek_to_beginning(*assigned)
        else:
            consumer.seek_to_end(*assigned)
        for record in consumer:
            result = codec.decode(record.value, record.headers)
            _count(summary, seen, result, source.event_id)
            if on_record is not None:
                on_record(TailedRecord(record.partition, record.offset, result))
            if max_records is not None and summary.records >= max_records:
                break
    finally:
        consumer.close()
    return summary


def _count(
    summary: TailSummary, seen: set[str], result: DecodedEvent | DecodeError, id_field: str | None
) -> None:
    summary.records += 1
    if isinstance(result, DecodeError):
        summary.invalid[result.reason.value] += 1
        return
    event = result.event
    summary.by_type[str(event[summary.by_field]) if summary.by_field else ""] += 1
    if id_field is not None:
        ident = str(event[id_field])
        if ident in seen:
            summary.duplicate_ids += 1
        seen.add(ident)
    if result.produce_ts_ms is not None:
        summary.ages_ms.append(time.time_ns() // 1_000_000 - result.produce_ts_ms)
