"""Test helpers: a consumed Kafka record built in code, and a made-up source unlike both examples.

:class:`Record` carries exactly the fields :class:`headwater.pipelines.events.codec.SourceRecord`
names, in the order kafka-python's ``ConsumerRecord`` gives them to the code under test (nearline
tasks, landing, checks). :func:`orders_source` is a source with a numeric key and event id, a
millisecond event time, a float, a boolean and a nullable micros timestamp, for tests of code that
must work on any schema.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from headwater.registry.expr import parse, to_json
from headwater.registry.plans import PlanField, PlanSchema, PlanSource, PlanWhere

ORDERS_AVSC: dict[str, Any] = {
    "type": "record",
    "name": "Order",
    "fields": [
        {"name": "order_id", "type": "long"},
        {"name": "customer_id", "type": "int"},
        {"name": "qty", "type": "int"},
        {"name": "total", "type": "float"},
        {"name": "paid", "type": "boolean"},
        {"name": "channel", "type": {"type": "enum", "name": "Channel", "symbols": ["web", "store"]}},
        {"name": "created_at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {
            "name": "shipped_at",
            "type": ["null", {"type": "long", "logicalType": "timestamp-micros"}],
            "default": None,
        },
    ],
}
ORDERS_RULES = ("qty > 0 and qty <= 10", "total >= 0.5", "shipped_at is null or paid = true")


def orders_source() -> PlanSource:
    """Return the plan form of a made-up ``orders`` source (key customer_id, event id order_id)."""

    def field(
        name: str, kind: str, nullable: bool = False, symbols: tuple[str, ...] = (), unit: str = ""
    ) -> PlanField:
        return PlanField(name=name, kind=kind, nullable=nullable, symbols=list(symbols), time_unit=unit)

    return PlanSource(
        name="orders",
        topic="orders",
        schemas=[PlanSchema(fingerprint="0123456789abcdef", json_text=json.dumps(ORDERS_AVSC))],
        fields=[
            field("order_id", "long"),
            field("customer_id", "int"),
            field("qty", "int"),
            field("total", "float"),
            field("paid", "boolean"),
            field("channel", "enum", symbols=("web", "store")),
            field("created_at", "timestamp", unit="ms"),
            field("shipped_at", "timestamp", nullable=True, unit="us"),
        ],
        event_time="created_at",
        key="customer_id",
        event_id="order_id",
        expected_rate_per_s=10,
        max_out_of_orderness_ms=0,
        allowed_lateness_ms=60_000,
        max_future_ms=300_000,
        min_event_time_ms=946_684_800_000,
        max_event_time_ms=4_102_444_800_000,
        rules=[PlanWhere(text=r, ast=to_json(parse(r)), sql={}) for r in ORDERS_RULES],
    )


@dataclass
class Record:
    """The fields of a Kafka ConsumerRecord that the tiers read."""

    offset: int
    value: bytes | None
    headers: list[tuple[str, bytes]]
    key: bytes | None = None
    topic: str = "events"
    partition: int = 0
