"""Random events for any source from its schema and rules (the payments example, and made-up rules)."""

from __future__ import annotations

import itertools
import time
from collections import Counter

import pytest

from headwater.pipelines.events.codec import DecodedEvent, EventCodec
from headwater.pipelines.events.sources import example_sources
from headwater.pipelines.events.synthetic import (
    Bounds,
    RuleBounds,
    SchemaGenerator,
    produce_synthetic,
    rule_bounds,
)
from headwater.pipelines.events.testing import orders_source
from headwater.registry.expr import parse
from headwater.registry.plans import PlanSource

NOW_MS = 1_796_032_800_000


@pytest.fixture(scope="module")
def payments() -> PlanSource:
    return next(s for s in example_sources() if s.name == "payments")


def test_bounds_are_read_off_the_easy_rule_shapes(payments: PlanSource) -> None:
    bounds = rule_bounds(payments)
    assert bounds.of("amount") == Bounds(low=0.0)
    assert bounds.of("risk_score") == Bounds(low=0.0, high=1.0)
    made_up = RuleBounds()
    for text in ("n > 2 and n < 9", "s in ('a', 'b')", "c = 'EUR'", "x is null or y > 1", "not (z > 3)"):
        made_up.add(parse(text))
    assert made_up.of("n") == Bounds(low=2.0, high=9.0, low_strict=True, high_strict=True)
    assert made_up.of("s").choices == ["a", "b"]
    assert made_up.of("c").choices == ["EUR"]
    assert made_up.of("y") == Bounds()  # a condition on another field than the null test: left to validation
    assert made_up.of("z") == Bounds()


def test_every_generated_payment_is_valid_and_keyed_by_account(payments: PlanSource) -> None:
    generator = SchemaGenerator(payments, seed=3)
    codec = EventCodec(payments)
    events = [generator.event(NOW_MS + i) for i in range(3_000)]
    assert all(e is not None for e in events)
    methods, accounts, nulls = Counter[str](), set[str](), 0
    for i, event in enumerate(events):
        assert event is not None
        decoded = codec.decode(codec.encode(event), codec.headers(1))
        assert isinstance(decoded, DecodedEvent), decoded
        assert decoded.event_time_ms == NOW_MS + i  # micros on the wire, ms in the decoded time
        assert event["occurred_at"] == (NOW_MS + i) * 1000
        assert event["amount"] >= 0
        assert codec.key(event) == event["account_id"].encode()
        methods[event["method"]] += 1
        accounts.add(event["account_id"])
        nulls += event["risk_score"] is None
    assert set(methods) == {"card", "wallet", "bank_transfer"}
    assert methods["card"] > methods["bank_transfer"]
    assert 100 < len(accounts) <= 1_000  # a pool: keys repeat
    assert 150 < nulls < 450  # about 10% of a nullable field is null
    assert len({e["payment_id"] for e in events if e}) == 3_000


def test_same_seed_same_events(payments: PlanSource) -> None:
    first = [SchemaGenerator(payments, seed=5).draw(NOW_MS) for _ in range(1)]
    second = [SchemaGenerator(payments, seed=5).draw(NOW_MS) for _ in range(1)]
    assert first == second


def test_the_behaviour_schema_too_with_rules_it_cannot_read_counted_not_sent() -> None:
    behaviour = next(s for s in example_sources() if s.name == "events")
    generator = SchemaGenerator(behaviour, seed=1)
    codec = EventCodec(behaviour)
    events = [generator.event(NOW_MS) for _ in range(500)]
    valid = [e for e in events if e is not None]
    assert len(valid) >= 490  # rules on several fields (event_type and item_id) are met by redrawing
    assert all(codec.validate(e) is None for e in valid)


def test_a_run_sends_to_the_topic_asked_for_keyed_by_the_source_key(payments: PlanSource) -> None:
    sent: list[tuple[str, bytes | None]] = []

    class Kafka:
        def send(self, topic: str, value: bytes, key: bytes | None = None, headers: object = None) -> Kafka:
            sent.append((topic, key))
            return self

        def add_errback(self, _callback: object) -> Kafka:
            return self

        def flush(self, timeout: float | None = None) -> None:
            pass

    stats = produce_synthetic(Kafka(), payments, rate=0, duration_s=60, max_events=50, topic="elsewhere")  # type: ignore[arg-type]
    assert (stats.read, stats.sent, stats.rejected) == (50, 50, 0)
    assert {topic for topic, _ in sent} == {"elsewhere"}
    assert all(key is not None and key.startswith(b"account-") for _, key in sent)


def test_any_schema_numeric_ids_and_rule_ranges() -> None:
    orders = orders_source()
    generator = SchemaGenerator(orders, seed=2)
    codec = EventCodec(orders)
    events = [generator.event(NOW_MS + i) for i in range(1_000)]
    valid = [e for e in events if e is not None]
    # "shipped_at is null or paid = true" is not a shape the bounds read: a draw breaks it with p = 0.45,
    # five draws in a row with p = 0.45 ** 5 = 1.8%: those count as rejected
    assert 950 <= len(valid) < 1_000
    for event in valid:
        assert 1 <= event["qty"] <= 10
        assert event["total"] >= 0.5
        assert event["created_at"] <= NOW_MS + 1_000
        decoded = codec.decode(codec.encode(event), codec.headers(1))
        assert isinstance(decoded, DecodedEvent), decoded
        assert codec.key(event) == str(event["customer_id"]).encode()
    assert len({e["order_id"] for e in valid}) == len(valid)  # event ids never repeat
    assert len({e["customer_id"] for e in valid}) < 1_000  # keys do


def test_a_history_steps_evenly_through_the_span_before_now(payments: PlanSource) -> None:
    values: list[bytes] = []

    class Kafka:
        def send(self, topic: str, value: bytes, key: bytes | None = None, headers: object = None) -> Kafka:
            values.append(value)
            return self

        def add_errback(self, _callback: object) -> Kafka:
            return self

        def flush(self, timeout: float | None = None) -> None:
            pass

    before_ms = time.time_ns() // 1_000_000
    stats = produce_synthetic(  # type: ignore[arg-type]
        Kafka(), payments, rate=1, duration_s=0.001, max_events=100, history_s=86_400
    )
    after_ms = time.time_ns() // 1_000_000
    assert (stats.read, stats.sent) == (100, 100)
    codec = EventCodec(payments)
    headers = codec.headers()
    times = [codec.decode(v, headers).event_time_ms for v in values]  # type: ignore[union-attr]
    assert times == sorted(times)
    assert before_ms - 86_400_000 <= times[0] <= before_ms - 86_400_000 + 864_000
    assert after_ms - 864_000 <= times[-1] < after_ms
    gaps = {b - a for a, b in itertools.pairwise(times)}
    assert max(gaps) - min(gaps) <= 1
