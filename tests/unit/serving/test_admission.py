"""Admission by user class: token buckets (fake clock, hypothesis), classes, priorities, the gate order."""

from __future__ import annotations

import asyncio
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest
from pydantic import ValidationError

from headwater.serving.admission import Admission, PriorityGate, Throttled, TokenBucket
from headwater.serving.config import AdmissionConfig, ClassQuota, ServingConfig


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


ON = AdmissionConfig(enabled=True)


def test_the_defaults_are_vip_50_regular_20_new_5_and_off() -> None:
    config = ServingConfig().admission
    assert config.enabled is False
    assert {name: (q.rate_per_s, q.capacity, q.priority) for name, q in config.classes.items()} == {
        "vip": (50.0, 50.0, "high"),
        "regular": (20.0, 20.0, "normal"),
        "new": (5.0, 5.0, "low"),
    }
    assert config.default_class == "regular"


def test_a_default_class_that_is_not_a_class_is_an_error() -> None:
    with pytest.raises(ValidationError, match="default_class: 'gold' is not one of the classes"):
        AdmissionConfig(classes={"vip": ClassQuota(rate_per_s=1.0)}, default_class="gold")


def test_a_bucket_admits_its_burst_then_says_when_the_next_token_comes() -> None:
    clock = Clock()
    bucket = TokenBucket(5.0, 5.0, clock)
    assert [bucket.take() for _ in range(5)] == [0.0] * 5
    assert bucket.take() == pytest.approx(0.2)
    clock.now += 0.05
    assert bucket.take() == pytest.approx(0.15)
    clock.now += 0.15
    assert bucket.take() == 0.0
    clock.now += 60.0  # a quiet minute fills it to its capacity, no more
    assert sum(bucket.take() == 0.0 for _ in range(10)) == 5


@settings(max_examples=200, deadline=None)
@given(
    rate=st.floats(0.5, 200.0),
    capacity=st.floats(1.0, 100.0),
    gaps=st.lists(st.floats(0.0, 0.5), min_size=1, max_size=300),
)
def test_a_bucket_never_admits_more_than_capacity_plus_rate_times_time(
    rate: float, capacity: float, gaps: list[float]
) -> None:
    clock = Clock()
    bucket = TokenBucket(rate, capacity, clock)
    start, admitted = clock.now, 0
    for gap in gaps:
        clock.now += gap
        wait = bucket.take()
        if wait == 0.0:
            admitted += 1
            continue
        assert 0.0 < wait <= 1.0 / rate + 1e-9  # never longer than one token's time
        clock.now += wait + 1e-9  # the wait it promised: then there is a token
        assert bucket.take() == 0.0
        admitted += 1
    assert admitted <= capacity + rate * (clock.now - start) + 1e-6


def test_the_header_wins_unknown_is_regular_and_the_class_sets_the_priority() -> None:
    admission = Admission(ON)
    assert admission.classify("VIP", "new") == "vip"
    assert admission.classify(None, "new") == "new"
    assert admission.classify("gold", None) == "regular"
    assert admission.classify("gold", "new") == "new"
    assert admission.classify(None, None) == "regular"
    assert admission.admit("vip", None, None).priority == "high"
    assert admission.admit(None, "new", None).priority == "low"
    assert admission.admit(None, None, None).priority == "normal"
    assert admission.admit(None, None, "high").priority == "normal"  # never above the class
    assert admission.admit("vip", None, "low").priority == "low"  # lower is allowed


def test_over_quota_is_throttled_with_whole_seconds_and_counted() -> None:
    clock, registry = Clock(), CollectorRegistry()
    admission = Admission(ON, registry, clock)
    for _ in range(5):
        admission.admit(None, "new", None)
    with pytest.raises(Throttled) as caught:
        admission.admit(None, "new", None)
    assert caught.value.retry_after_s == pytest.approx(0.2)
    assert caught.value.retry_after_header == "1"
    assert "'new' is over its quota of 5 requests/s" in str(caught.value)
    for _ in range(50):
        admission.admit("vip", None, None)
    text = generate_latest(registry).decode()
    assert 'headwater_admission_requests_total{result="admitted",user_class="new"} 5.0' in text
    assert 'headwater_admission_requests_total{result="throttled",user_class="new"} 1.0' in text
    assert 'headwater_admission_requests_total{result="admitted",user_class="vip"} 50.0' in text
    assert 'headwater_admission_requests_total{result="throttled",user_class="regular"} 0.0' in text


def test_off_everything_is_admitted_at_most_at_its_class_priority_and_counted() -> None:
    registry = CollectorRegistry()
    admission = Admission(AdmissionConfig(), registry)
    got = [admission.admit(None, "new", "high") for _ in range(100)]
    # Off, no quota applies, but a request still cannot ask above its class (issue 32 item 2).
    assert {(a.user_class, a.priority) for a in got} == {("new", "low")}
    assert admission.admit(None, None, None).priority == "normal"
    assert 'result="admitted",user_class="new"} 100.0' in generate_latest(registry).decode()


def test_retry_after_header_rounds_up() -> None:
    assert Throttled("vip", 50.0, 0.02).retry_after_header == "1"
    assert Throttled("x", 0.5, 1.5).retry_after_header == "2"
    assert math.ceil(2.0) == int(Throttled("x", 0.5, 2.0).retry_after_header)


def test_the_gate_lets_waiters_in_by_priority_then_arrival() -> None:
    async def run() -> list[str]:
        gate = PriorityGate(1)
        order: list[str] = []
        await gate.acquire("normal")  # the one slot is busy

        async def wait(name: str, priority: str) -> None:
            async with gate.slot(priority):
                order.append(name)

        tasks = []
        for name, priority in [("low1", "low"), ("n1", "normal"), ("vip1", "high"), ("n2", "normal"),
                               ("vip2", "high")]:  # fmt: skip
            tasks.append(asyncio.create_task(wait(name, priority)))
            await asyncio.sleep(0)
        assert gate.waiting("high") == 2
        gate.release()
        await asyncio.gather(*tasks)
        assert gate.busy == 0
        return order

    assert asyncio.run(run()) == ["vip1", "vip2", "n1", "n2", "low1"]


def test_a_cancelled_waiter_leaves_the_gate_and_passes_on_a_slot() -> None:
    async def run() -> int:
        gate = PriorityGate(1)
        await gate.acquire("normal")
        gone = asyncio.create_task(gate.acquire("high"))
        await asyncio.sleep(0)
        stays = asyncio.create_task(gate.acquire("low"))
        await asyncio.sleep(0)
        gone.cancel()
        await asyncio.sleep(0)
        gate.release()
        await stays
        gate.release()
        return gate.busy

    assert asyncio.run(run()) == 0
