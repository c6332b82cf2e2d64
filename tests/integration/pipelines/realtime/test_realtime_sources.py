"""Two sources in ONE realtime job: the behaviour events and payments (micros, enums, another key).

``headwater run realtime --source events --source payments`` runs one Flink job with a pipeline per
source; the values of ``account_payments_realtime`` (keyed by ``account_id``, de-duplicated by
``payment_id``, event time ``occurred_at`` in micros) must equal the reference, the behaviour views
theirs, and every bad payment must reach the dead-letter topic with the Python codec's reason: the
rules run as Flink SQL there, so generated edge values check the SQL against the registry's
evaluator. A last phase at the wall clock's time sends one accepted event 4 minutes in the future
into normal traffic (issue 16 item 1): no normal event may be dead-lettered as late.
"""

from __future__ import annotations

import random
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis
from kafka import KafkaAdminClient
from kafka.admin import NewTopic

from headwater.pipelines.events.codec import DecodeError, EventCodec
from headwater.registry.plans import PlanSource, TierPlan

from .conftest import (
    T0,
    Feed,
    JobProcess,
    Names,
    dead_letters,
    event,
    expected_vectors,
    last_change_ms,
    read_store,
    wait_for,
)

B_PAY = T0 + 26_000
"""The payments boundary checked: the last payment (T0+26.5 s) moves that pipeline's clock past it."""
B_EVENTS = T0 + 26_000
"""The behaviour views' boundary checked (the item view's slide is 5 s: T0+25 s there)."""


def payment(i: int, account: str, status: str, t_ms: int, amount: float, **fields: Any) -> dict[str, Any]:
    base = {
        "payment_id": f"p{i}",
        "account_id": account,
        "merchant_id": f"m{i % 3}",
        "method": "card",
        "status": status,
        "amount": amount,
        "currency": "EUR",
        "risk_score": None,
        "occurred_at": (T0 + t_ms) * 1000,  # timestamp-micros
    }
    return {**base, **fields}


def as_reference(p: dict[str, Any]) -> dict[str, Any]:
    """A payment as the reference computation reads events: event time in ms, the event id."""
    return {**p, "event_time": p["occurred_at"] // 1000, "event_id": p["payment_id"]}


def script() -> list[dict[str, Any]]:
    return [
        payment(1, "a1", "captured", 500, 10.0),
        payment(2, "a1", "declined", 1_500, 99.0, risk_score=0.75),
        payment(3, "a1", "captured", 3_000, 5.5),
        payment(4, "a2", "authorized", 4_000, 20.0, risk_score=0.5),
        payment(5, "a2", "declined", 8_000, 7.0),
        payment(6, "a1", "captured", 12_000, 12.25),
        payment(6, "a1", "captured", 12_000, 12.25),  # a duplicate delivery: counts once
        payment(8, "a2", "captured", 17_000, 3.0),
        payment(7, "a2", "captured", 15_000, 30.0),  # 2 s out of order: within the allowed lateness
        payment(9, "a1", "refunded", 19_000, 3.0, method="wallet"),
    ]


def reason(codec: EventCodec, p: dict[str, Any]) -> str | None:
    """The Python codec's reason for payment ``p`` (None: it decodes and validates)."""
    result = codec.decode(codec.encode(p), codec.headers())
    return str(result.reason) if isinstance(result, DecodeError) else None


def ok(codec: EventCodec, p: dict[str, Any]) -> bool:
    return reason(codec, p) is None


def edge_payments(rng: random.Random, n: int) -> list[dict[str, Any]]:
    """Payments of fresh accounts with edge values for the rules (NaN, inf, negatives, nulls, bounds)."""
    amounts = [0.0, -0.0, -1e-9, 1e300, -1.0, float("nan"), float("inf"), float("-inf"), 42.5]
    risks = [None, 0.0, 1.0, -0.01, 1.0000001, float("nan"), 0.5]
    return [
        payment(
            100 + i,
            f"edge{i}",
            rng.choice(["captured", "declined"]),
            20_000 + i,
            rng.choice(amounts),
            risk_score=rng.choice(risks),
        )
        for i in range(n)
    ]


@pytest.fixture
def pay_topic(kafka_bootstrap: str) -> Any:
    topic = f"test.rt.pay.{uuid.uuid4().hex[:8]}"
    admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    admin.create_topics([NewTopic(topic, 1, 1)])
    yield topic
    admin.delete_topics([topic])
    admin.close()


def test_payments_and_behaviour_events_in_one_job(
    plan: tuple[TierPlan, Path],
    names: Names,
    pay_topic: str,
    kafka_bootstrap: str,
    redis_url: str,
    tmp_path: Path,
) -> None:
    tier_plan, state = plan
    source: PlanSource = next(s for s in tier_plan.sources if s.name == "payments")
    codec = EventCodec(source)
    pays = Feed(kafka_bootstrap, pay_topic, codec)
    feed = Feed(kafka_bootstrap, names.topic)
    log = tmp_path / "job.log"
    job = JobProcess(state, names, tmp_path / "checkpoints", log,
                     sources={"events": names.topic, "payments": pay_topic})  # fmt: skip
    client = redis.Redis.from_url(redis_url)
    try:
        # behaviour events: a few good ones, and one per kind of broken rule
        behaviour = [
            event(1, "u1", "impression", 500, position=1, category="c1"),
            event(2, "u1", "click", 1_500, position=1, category="c1"),
            event(3, "u2", "purchase", 6_500, price=9.5, category="c3"),
            event(4, "u1", "click", 18_500, position=2, category="c2"),
        ]
        feed.send(*behaviour)
        bad_events = [
            event(5, "u1", "click", 19_000, session_id=""),  # session_id != ''
            event(6, "u1", "click", 19_000, item_id=None),  # a click needs an item
            event(7, "u1", "search", 19_000, query=""),  # a search needs a query
            event(8, "u1", "dwell", 19_000, dwell_ms=-5),
        ]
        bad_event_offsets = list(range(feed.offset, feed.offset + len(bad_events)))
        feed.send(*bad_events)
        # zz's first slice enters at T0+26 s, which the second event moves the pipeline's clock past
        movers = [event(9, "zz", "impression", 25_000), event(10, "zz", "impression", 26_500)]
        feed.send(*movers)

        # payments: the script, broken rules, a corrupt record, edge values (up to T0+20.04 s)
        good = script()
        pays.send(*good)
        broken = [
            payment(10, "a1", "captured", 19_500, -1.0),
            payment(11, "a2", "declined", 19_500, 1.0, risk_score=1.5),
        ]
        broken_offsets = list(range(pays.offset, pays.offset + len(broken)))
        pays.send(*broken)
        corrupt_offset = pays.send_raw(b"\x02\xff not a payment", codec.headers())
        edges = edge_payments(random.Random(13), 40)
        edge_offsets = list(range(pays.offset, pays.offset + len(edges)))
        pays.send(*edges)

        def published(view: str, entity: str, b_ms: int) -> bool:
            _, res = read_store(redis_url, names.namespace, tier_plan, view, [entity])
            return bool(res.found[0]) and int(res.event_time_ms[0]) >= b_ms

        # a1's last payment (T0+19 s) enters at T0+20 s; then a payment far behind its partition's newest
        # accepted one is late (judged per partition in offset order: no wait for a watermark)
        wait_for(lambda: published("account_payments_realtime", "a1", T0 + 20_000), 300, "a1 at T0+20 s", log)
        late_offset = pays.offset
        pays.send(payment(12, "a1", "captured", -40_000, 1000.0))  # beyond the 30 s allowed lateness
        pays.send(payment(13, "zz", "authorized", 25_000, 1.0), payment(14, "zz", "authorized", 26_500, 1.0))
        wait_for(lambda: published("account_payments_realtime", "zz", B_PAY), 120, "payments at T0+26 s", log)
        wait_for(lambda: published("rt_all", "zz", B_EVENTS), 120, "behaviour events at T0+26 s", log)

        accepted = [as_reference(p) for p in good]
        accepted += [as_reference(p) for p in edges if ok(codec, p)]
        ids = ["a1", "a2"]
        view = "account_payments_realtime"
        _, res = read_store(redis_url, names.namespace, tier_plan, view, ids)
        assert res.found.all()
        ref, want = expected_vectors(tier_plan, view, accepted, ids, client, names.namespace, B_PAY)
        np.testing.assert_allclose(res.values, want, rtol=1e-6, equal_nan=True)
        changed = last_change_ms(tier_plan, view, accepted, ids, client, names.namespace, B_PAY)
        assert res.event_time_ms.tolist() == changed
        # the duplicate counts once, the broken and late payments not at all
        assert ref["a1"]["attempts_1m"] == 5.0
        assert ref["a1"]["captured_amount_5m"] == 10.0 + 5.5 + 12.25
        assert ref["a2"]["declines_5m"] == 1.0
        assert ref["a2"]["max_amount_5m"] == 30.0
        for v, vids, slide in (
            ("rt_all", ["u1", "u2", "zz"], 1_000),
            ("rt_items", ["i0", "i1", "i2"], 5_000),
        ):
            _, res = read_store(redis_url, names.namespace, tier_plan, v, vids)
            assert res.found.all(), v
            b = B_EVENTS // slide * slide
            _, want = expected_vectors(tier_plan, v, [*behaviour, *movers], vids, client, names.namespace, b)
            np.testing.assert_allclose(res.values, want, rtol=1e-6, equal_nan=True, err_msg=v)

        expected_edges = {
            off: reason(codec, p) for off, p in zip(edge_offsets, edges, strict=True) if not ok(codec, p)
        }
        assert expected_edges, "no edge payment breaks a rule: the test shows nothing of the rules' SQL"
        n_letters = len(bad_events) + len(broken) + 2 + len(expected_edges)
        letters = dead_letters(kafka_bootstrap, names.dlq, expected=n_letters, timeout_s=60)
        pay_letters = {d.source_offset: d for d in letters if d.source_topic == pay_topic}
        ev_letters = {d.source_offset: d for d in letters if d.source_topic == names.topic}
        assert sorted(ev_letters) == bad_event_offsets
        assert {d.reason for d in ev_letters.values()} == {"invalid_field"}
        session_rule = "rule \"session_id != ''\" of source 'events' does not hold"
        assert ev_letters[bad_event_offsets[0]].detail == session_rule
        assert [pay_letters[o].reason for o in broken_offsets] == ["invalid_field", "invalid_field"]
        assert (
            pay_letters[broken_offsets[0]].detail == "rule 'amount >= 0' of source 'payments' does not hold"
        )
        assert pay_letters[corrupt_offset].reason == "corrupt_payload"
        assert pay_letters[late_offset].reason == "late"
        assert pay_letters[late_offset].detail.startswith("occurred_at ")
        # the rules' Flink SQL gives the registry evaluator's verdict on every edge value
        assert {o: pay_letters[o].reason for o in edge_offsets if o in pay_letters} == expected_edges
        assert len(letters) == n_letters

        # issue 16 item 1: an accepted event 4 minutes ahead must not make the normal ones after it late
        at = time.time_ns() // 1_000_000 - T0
        start = pays.offset
        pays.send(*[payment(200 + i, "live", "captured", at - 3_000 + i * 200, 1.0) for i in range(5)])
        pays.send(payment(299, "live", "captured", at + 240_000, 1.0))  # within max_future (5 min)
        pays.send(*[payment(300 + i, "live", "captured", at + 1_000 + i * 100, 1.0) for i in range(10)])
        sentinel = pays.send_raw(b"\x02\xff the last record", codec.headers())
        more = dead_letters(kafka_bootstrap, names.dlq, expected=n_letters + 1, timeout_s=120)
        after = [d for d in more if d.source_topic == pay_topic and d.source_offset >= start]
        assert [(d.source_offset, d.reason) for d in after] == [(sentinel, "corrupt_payload")]
    finally:
        job.kill()
        client.close()
        feed.close()
        pays.close()
