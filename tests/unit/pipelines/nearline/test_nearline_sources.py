"""Nearline over any source: the plan split per source, time and ids from the plan, no poisoned watermark."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headwater.pipelines.events.codec import EventCodec
from headwater.pipelines.events.generator import EventGenerator, GeneratorConfig
from headwater.pipelines.events.testing import Record as Rec
from headwater.pipelines.events.timing import SourceTiming
from headwater.pipelines.nearline.plan import NearlinePlan, NearlinePlanError
from headwater.pipelines.nearline.state import PartitionStore
from headwater.pipelines.nearline.task import PartitionTask
from headwater.pipelines.windows import compile_view, empty_values, reference_values, split_late
from headwater.pipelines.windows.testing import plan_feature, plan_view
from headwater.registry.plans import PlanField, PlanView, TierPlan

_path = Path(__file__).parents[3] / "integration/pipelines/nearline/harness.py"
_spec = importlib.util.spec_from_file_location("nl_harness_sources_unit", _path)
assert _spec is not None
assert _spec.loader is not None
h = importlib.util.module_from_spec(_spec)
sys.modules["nl_harness_sources_unit"] = h
_spec.loader.exec_module(h)

MIN = 60_000
T0 = 1_767_225_600_000 + 10 * 3_600_000


def _example_plan(tmp: Path) -> TierPlan:
    return h.example_plan()


def test_the_example_plan_splits_by_each_source_key(tmp_path: Path) -> None:
    plan = NearlinePlan.from_plan(_example_plan(tmp_path))
    events, payments = plan.source("events"), plan.source("payments")
    assert [s.name for s in plan.sources] == ["events", "payments"]
    assert sorted(v.name for v in events.views) == [
        "user_category_affinity_nearline",
        "user_engagement_nearline",
        "user_search_nearline",
    ]
    assert {k: [v.name for v in vs] for k, vs in events.repartitioned.items()} == {
        "item_id": ["item_engagement_nearline"]
    }
    assert payments.views == ()  # keyed by account_id; its one view by merchant_id
    assert {k: [v.name for v in vs] for k, vs in payments.repartitioned.items()} == {
        "merchant_id": ["merchant_risk_nearline"]
    }
    assert payments.timing == SourceTiming(2_000, 30_000, 300_000)  # sources.yaml + registry default
    assert events.timing == SourceTiming(5_000, 60_000, 300_000)
    assert set(plan.layouts) == {v.name for s in plan.sources for v in s.all_views()}
    only = NearlinePlan.from_plan(_example_plan(tmp_path), only=["payments"])
    assert [s.name for s in only.sources] == ["payments"]
    with pytest.raises(
        NearlinePlanError, match=r"--source nope: no nearline view reads it.*'events', 'payments'"
    ):
        NearlinePlan.from_plan(_example_plan(tmp_path), only=["nope"])


def test_a_source_without_key_puts_every_view_behind_a_repartition(tmp_path: Path) -> None:
    plan = _example_plan(tmp_path)
    unkeyed = [s.model_copy(update={"key": None}) if s.name == "payments" else s for s in plan.sources]
    account = [
        v.model_copy(update={"name": "by_account", "entity": "account", "join_key": "account_id"})
        for v in plan.views
        if v.source == "payments"
    ]
    compiled = NearlinePlan.from_plan(
        plan.model_copy(update={"sources": unkeyed, "views": [*plan.views, *account]})
    )
    payments = compiled.source("payments")
    assert payments.views == ()
    assert sorted(payments.repartitioned) == ["account_id", "merchant_id"]


def test_a_field_named_like_the_window_codes_time_or_id_is_refused(tmp_path: Path) -> None:
    plan = _example_plan(tmp_path)
    pay = next(s for s in plan.sources if s.name == "payments")
    extra = PlanField(name="event_time", kind="long", nullable=False)
    clash = pay.model_copy(update={"fields": [*pay.fields, extra]})
    sources = [clash if s.name == "payments" else s for s in plan.sources]
    with pytest.raises(
        NearlinePlanError, match="source 'payments': field 'event_time' is not the source's event"
    ):
        NearlinePlan.from_plan(plan.model_copy(update={"sources": sources}))


# -- payments: event time in micros, dedup by payment_id, a view keyed by the topic key -------------------


def _payment(i: int, account: str, t_us: int, **kw: Any) -> dict[str, Any]:
    return {
        "payment_id": f"p{i}",
        "account_id": account,
        "merchant_id": f"m{i % 3}",
        "method": "card",
        "status": "declined" if i % 4 == 0 else "captured",
        "amount": 10.0 + i,
        "currency": "EUR",
        "risk_score": None if i % 5 == 0 else (i % 10) / 10,
        "occurred_at": t_us,
        **kw,
    }


def _account_view() -> PlanView:
    """merchant_risk_nearline as the example repo defines it, keyed by the topic key instead."""
    merchant = next(v for v in h.example_plan().views if v.name == "merchant_risk_nearline")
    return merchant.model_copy(update={"name": "account_risk", "entity": "account", "join_key": "account_id"})


def test_payments_event_time_in_micros_and_dedup_by_payment_id(tmp_path: Path) -> None:
    source = h.PAYMENTS
    codec = EventCodec(source)
    spec = compile_view(_account_view())
    task = PartitionTask(
        0,
        PartitionStore(tmp_path, 0),
        [spec],
        SourceTiming.of(source),
        codec,
        forward_keys=["merchant_id"],
    )
    events = [_payment(i, f"a{i % 4}", (T0 + i * 7_000) * 1000 + 999) for i in range(300)]
    events.insert(43, dict(events[40]))  # a retried delivery of p40, 21 s later: within the lateness
    events.insert(200, _payment(999, "a1", (T0 + 100 * 7_000 - 40_000) * 1000))  # late: 40 s behind
    recs = [Rec(i, codec.encode(e), codec.headers()) for i, e in enumerate(events)]
    out_all = [task.process(recs[s : s + 50], now_ms=T0 + 3_600_000) for s in range(0, len(recs), 50)]
    assert sum(o.duplicates for o in out_all) == 1
    assert [d.reason for o in out_all for d in o.dead] == ["late"]
    forwarded = [e for o in out_all for _, _, e, _ in o.forward]
    assert len(forwarded) == 300
    assert forwarded[1]["event_time"] == T0 + 7_000  # occurred_at // 1000: micros read as ms
    assert forwarded[1]["event_id"] == "p1"
    window = [{**e, "event_time": e["occurred_at"] // 1000, "event_id": e["payment_id"]} for e in events]
    accepted, late = split_late(window, 2_000, 30_000)
    assert len(late) == 1
    t_pub = task.views[spec.name].t_pub
    assert t_pub == (T0 + 299 * 7_000 - 2_000) // MIN * MIN
    ref = reference_values(spec, accepted, t_pub)
    accounts = [f"a{i}" for i in range(4)]
    for account, row in zip(accounts, task.values(spec.name, accounts, t_pub), strict=True):
        want = list(ref[account].values()) if account in ref else list(empty_values(spec).values())
        assert row == pytest.approx(want, nan_ok=True), account
    task.store.close()


def test_a_source_without_event_id_counts_every_delivery(tmp_path: Path) -> None:
    source = h.PAYMENTS.model_copy(update={"event_id": None})
    codec = EventCodec(source)
    spec = compile_view(_account_view())
    task = PartitionTask(0, PartitionStore(tmp_path, 0), [spec], SourceTiming.of(source), codec)
    events = [_payment(i, "a0", (T0 + i * 1_000) * 1000) for i in range(10)]
    events.append(dict(events[5]))
    recs = [Rec(i, codec.encode(e), codec.headers(), partition=2) for i, e in enumerate(events)]
    out = task.process(recs, now_ms=T0 + 3_600_000)
    assert (out.events, out.duplicates) == (11, 0)
    assert task.seen == {}
    assert not any(k.startswith(b"d") for k in out.changes)  # no dedup records in the store
    task.store.close()


# -- issue 16 item 1: an accepted future event does not poison the watermark ----------------------------


def _behaviour_events(n: int) -> list[dict[str, Any]]:
    gen = EventGenerator(GeneratorConfig(seed=8, rate=20.0, users=5, malformed_share=0.0))
    return [dict(em.event) for em in gen.take(n * 2) if em.event is not None][:n]


def _count_task(tmp: Path) -> tuple[PartitionTask, EventCodec, Any]:
    codec = EventCodec(h.BEHAVIOUR)
    spec = compile_view(plan_view("counts", [plan_feature("events_10m", "count", 10, 1)]))
    task = PartitionTask(0, PartitionStore(tmp, 0), [spec], SourceTiming.of(h.BEHAVIOUR), codec)
    return task, codec, spec


def test_one_event_four_minutes_ahead_does_not_make_normal_events_late(tmp_path: Path) -> None:
    task, codec, spec = _count_task(tmp_path)
    template = _behaviour_events(1)[0]
    user = template["user_id"]
    offset = 0

    def batch(times: list[int], now: int) -> list[str]:
        nonlocal offset
        recs = []
        for t in times:
            event = {**template, "event_id": f"e{offset}", "event_time": t}
            recs.append(Rec(offset, codec.encode(event), codec.headers()))
            offset += 1
        return [d.reason for d in task.process(recs, now_ms=now).dead]

    assert batch([T0 - 10_000 + i * 1_000 for i in range(10)], T0) == []
    # 4 min ahead: within max_future (5 min), accepted; normal traffic goes on in the same batch
    assert batch([T0 + 240_000, T0 + 500, T0 + 1_000], T0 + 1_000) == []
    assert batch([T0 + 2_000 + i * 1_000 for i in range(30)], T0 + 32_000) == []
    assert task.max_t == T0 + 31_000  # the wall clock bounded it, not the future event
    assert batch([T0 + 6 * 60_000], T0 + 6 * 60_000) == []  # the clock passes the future event
    t_pub = task.views[spec.name].t_pub
    assert t_pub == (T0 + 6 * 60_000 - 5_000) // MIN * MIN > T0 + 240_000
    assert task.values(spec.name, [user], t_pub) == [[10 + 3 + 30]]  # the future event counted once


@settings(max_examples=40, deadline=None)
@given(
    steps=st.lists(
        st.tuples(
            st.integers(0, 30_000),  # how far the clock moves before the record
            st.integers(-150_000, 400_000),  # event time - clock: late, normal or ahead (some beyond 5 min)
        ),
        min_size=1,
        max_size=60,
    )
)
def test_no_event_within_the_lateness_of_the_clock_is_ever_late(steps: list[tuple[int, int]]) -> None:
    """Whatever future events came first, an event no older than the clock - (out-of-orderness +
    lateness) is accepted; an event beyond max_future is dead-lettered; the watermark never passes
    the clock - out-of-orderness."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        task, codec, _ = _count_task(Path(tmp))
        template = _behaviour_events(1)[0]
        timing, clock = task.timing, T0
        for i, (advance, ahead) in enumerate(steps):
            clock += advance
            t = clock + ahead
            rec = Rec(i, codec.encode({**template, "event_id": f"e{i}", "event_time": t}), codec.headers())
            dead = [d.reason for d in task.process([rec], now_ms=clock).dead]
            if ahead > timing.max_future_ms:
                assert dead == ["future_dated"]
            elif ahead >= -(timing.max_out_of_orderness_ms + timing.allowed_lateness_ms):
                assert dead == [], (i, ahead)
            wm = task.watermark()
            assert wm is None or wm <= clock - timing.max_out_of_orderness_ms
        task.store.close()
