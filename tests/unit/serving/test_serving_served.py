"""Feedback you can trust (issue 32 item 3): only items served to the user, and only catalog items.

The ledger alone (bounds, TTL, per-user cap, hypothesis against a model of served-within-TTL),
then /v1/feedback through the in-process app over the in-memory store: never served is 409 and
nothing reaches the sink; served is 202; after the TTL 409; an unknown item is 409 even for a
caller allowed unsolicited events; a store that cannot answer is 409, never a 5xx.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from hypothesis import given, settings
from hypothesis import strategies as st

from headwater.ranking.model import LinearRanker
from headwater.ranking.synthetic import small_registry
from headwater.serving.app import create_app
from headwater.serving.config import FeedbackConfig, ServingConfig
from headwater.serving.feedback import FeedbackProducer
from headwater.serving.runtime import LoadedModels
from headwater.serving.served import (
    CATALOG_UNAVAILABLE,
    NOT_SERVED,
    UNKNOWN_ITEM,
    FeedbackGate,
    FeedbackTrustConfig,
    FeedbackUntrusted,
    ItemCatalog,
    ServedLedger,
)
from headwater.serving.store import InMemoryFeatureStore, now_ms
from tests.unit.serving.four_items import REGISTRY as FOUR
from tests.unit.serving.four_items import four_item_store
from tests.unit.serving.test_serving_feedback import FakeSink, decoded, wait_for

REGISTRY = small_registry({"u": ["a"]}, {"i": ["x"]}, "i.x")


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


# --- the ledger ------------------------------------------------------------------------------------


def test_a_served_item_is_held_for_its_user_and_request_until_the_ttl() -> None:
    clock = Clock()
    ledger = ServedLedger(ttl_s=60.0, per_user=10, max_entries=100, clock=clock)
    ledger.serve("u1", "r1", ["a", "b"], known={"a"})
    assert ledger.served("u1", "a") is not None
    assert ledger.served("u1", "a", "r1") is not None
    assert ledger.served("u1", "a", "r2") is None  # another request did not show it
    assert ledger.served("u2", "a") is None  # another user was not shown it
    assert ledger.served("u1", "c") is None
    assert (ledger.served("u1", "a").known, ledger.served("u1", "b").known) == (True, False)  # type: ignore[union-attr]
    clock.t += 59.9
    assert ledger.served("u1", "b", "r1") is not None
    clock.t += 0.1
    assert ledger.served("u1", "a") is None
    assert ledger.served("u1", "a", "r1") is None
    ledger.serve("u9", "r", ["z"])  # any serve drops the expired users
    assert (len(ledger), ledger.users) == (1, 1)


def test_a_retried_answer_is_one_pair_and_refreshes_its_time() -> None:
    clock = Clock()
    ledger = ServedLedger(ttl_s=10.0, per_user=10, max_entries=100, clock=clock)
    ledger.serve("u1", "r1", ["a"])
    clock.t += 8
    ledger.serve("u1", "r1", ["a"], known={"a"})
    clock.t += 8
    assert len(ledger) == 1
    assert ledger.served("u1", "a", "r1") == ledger.served("u1", "a")
    assert ledger.served("u1", "a").known is True  # type: ignore[union-attr]


def test_the_per_user_cap_forgets_the_users_oldest_pairs() -> None:
    ledger = ServedLedger(ttl_s=60.0, per_user=3, max_entries=100, clock=Clock())
    ledger.serve("u1", "r1", ["a", "b"])
    ledger.serve("u1", "r2", ["c", "d"])
    ledger.serve("u2", "r3", ["a"])
    assert [ledger.served("u1", i) is not None for i in "abcd"] == [False, True, True, True]
    assert ledger.served("u2", "a") is not None  # another user's pairs are not touched
    assert (len(ledger), ledger.evicted) == (4, 1)


def test_an_item_stays_served_while_any_of_its_pairs_is_held() -> None:
    ledger = ServedLedger(ttl_s=60.0, per_user=2, max_entries=100, clock=Clock())
    ledger.serve("u1", "r1", ["a"])
    ledger.serve("u1", "r2", ["a"])
    ledger.serve("u1", "r3", ["b"])  # r1's pair goes, r2's stays
    assert ledger.served("u1", "a", "r1") is None
    assert ledger.served("u1", "a", "r2") is not None
    assert ledger.served("u1", "a") is not None
    ledger.serve("u1", "r4", ["c"])
    assert ledger.served("u1", "a") is None


def test_memory_does_not_grow_with_distinct_users_past_the_global_cap() -> None:
    ledger = ServedLedger(ttl_s=3600.0, per_user=5, max_entries=1000, clock=Clock())
    for n in range(20_000):
        ledger.serve(f"user-{n}", f"r{n}", [f"i{n % 7}", f"j{n % 11}"])
        assert len(ledger) <= 1000
    assert ledger.users <= 500
    assert ledger.evicted == 40_000 - 1000
    assert ledger.served("user-19999", f"i{19999 % 7}", "r19999") is not None  # the newest are held
    assert ledger.served("user-0", "i0") is None  # the least recently served went first


IDS = st.text(min_size=1, max_size=6)  # any text: separators, NUL, surrogates are all just keys
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("serve"), IDS, st.sampled_from(["r1", "r2", "r3"]), st.lists(IDS, max_size=4)),
        st.tuples(st.just("wait"), st.floats(0.0, 40.0)),
        st.tuples(st.just("check"), IDS, IDS, st.sampled_from([None, "r1", "r2", "r3"])),
    ),
    max_size=60,
)


@settings(max_examples=200, deadline=None)
@given(OPS, st.data())
def test_feedback_is_accepted_iff_served_within_the_ttl(
    ops: list[tuple[Any, ...]], data: st.DataObject
) -> None:
    """Under roomy caps the ledger agrees with a model: (user, request, item) -> last serve time."""
    clock = Clock()
    ledger = ServedLedger(ttl_s=60.0, per_user=10_000, max_entries=100_000, clock=clock)
    model: dict[tuple[str, str, str], float] = {}
    served_users: list[str] = []
    for op in ops:
        if op[0] == "serve":
            _, user, rid, items = op
            ledger.serve(user, rid, items)
            served_users.append(user)
            for item in items:
                model[(user, rid, item)] = clock.t
        elif op[0] == "wait":
            clock.t += op[1]
        else:
            _, user, item, rid = op
            if served_users and data.draw(st.booleans()):
                user = data.draw(st.sampled_from(served_users))  # mostly ask about users served
            times = [t for (u, r, i), t in model.items() if u == user and i == item and rid in (None, r)]
            expected = any(clock.t - t < 60.0 for t in times)
            assert (ledger.served(user, item, rid) is not None) == expected


@settings(max_examples=200, deadline=None)
@given(OPS, st.integers(1, 4), st.integers(1, 8))
def test_under_tight_caps_nothing_unserved_is_ever_accepted(
    ops: list[tuple[Any, ...]], per_user: int, most: int
) -> None:
    """Tight caps forget early, never invent: accepted implies served within the TTL; sizes stay bounded."""
    clock = Clock()
    ledger = ServedLedger(ttl_s=60.0, per_user=per_user, max_entries=most, clock=clock)
    model: dict[tuple[str, str, str], float] = {}
    for op in ops:
        if op[0] == "serve":
            _, user, rid, items = op
            ledger.serve(user, rid, items)
            for item in items:
                model[(user, rid, item)] = clock.t
            assert len(ledger) <= most
            assert ledger.users <= most
        elif op[0] == "wait":
            clock.t += op[1]
        else:
            _, user, item, rid = op
            if ledger.served(user, item, rid) is not None:
                times = [t for (u, r, i), t in model.items() if u == user and i == item and rid in (None, r)]
                assert any(clock.t - t < 60.0 for t in times)


def test_the_config_refuses_bad_bounds_and_has_documented_defaults() -> None:
    assert FeedbackTrustConfig() == FeedbackTrustConfig(
        ttl_s=3600.0, per_user=1000, max_entries=500_000, allow_unsolicited=False
    )
    for bad in ({"ttl_s": 0}, {"per_user": 0}, {"max_entries": 0}, {"extra": 1}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            FeedbackTrustConfig(**bad)  # type: ignore[arg-type]


# --- the gate (the catalog) -------------------------------------------------------------------------


def _gate(store: InMemoryFeatureStore, allow: bool = False) -> FeedbackGate:
    ledger = ServedLedger(60.0, 10, 100)
    return FeedbackGate(ledger, ItemCatalog(store, REGISTRY.item.layouts), allow)


def _store(*items: str) -> InMemoryFeatureStore:
    store = InMemoryFeatureStore()
    if items:
        values = np.arange(len(items), dtype=np.float32).reshape(-1, 1)
        store.write(REGISTRY.item.layouts[0], list(items), values, now_ms())
    return store


def _refusal(
    gate: FeedbackGate, user: str, item: str, rid: str | None = None, allowed: bool = False
) -> str | None:
    try:
        asyncio.run(gate.check(user, item, rid, allowed))
    except FeedbackUntrusted as exc:
        return f"{exc.status} {exc.field} {exc.reason}"
    return None


def test_the_gate_checks_served_then_the_catalog() -> None:
    store = _store("i1")
    gate = _gate(store)
    gate.served("u1", "r1", ["i1", "ghost"])  # a ranking of the caller's candidates, rows not read
    assert _refusal(gate, "u1", "i1") is None  # served, and the store holds it
    assert _refusal(gate, "u1", "ghost") == f"409 item_id {UNKNOWN_ITEM}"  # served, but no item view holds it
    assert _refusal(gate, "u2", "i1") == f"409 item_id {NOT_SERVED}"
    assert _refusal(gate, "u2", "i1", allowed=True) is None  # unsolicited: a catalog item
    assert _refusal(gate, "u2", "ghost", allowed=True) == f"409 item_id {UNKNOWN_ITEM}"  # never a new item
    assert gate.refused == {NOT_SERVED: 1, UNKNOWN_ITEM: 2, CATALOG_UNAVAILABLE: 0}
    assert _refusal(_gate(store, allow=True), "u9", "i1") is None  # the config allows every caller


def test_a_store_that_cannot_answer_refuses_unknown_items_but_not_known_ones() -> None:
    store = _store("i1")
    gate = _gate(store)
    gate.served("u1", "r1", ["i1", "i2"], known={"i1"})  # the ranking found i1's rows
    store.fail = "the store is down"
    reads = store.reads
    assert _refusal(gate, "u1", "i1", "r1") is None  # no read needed
    assert store.reads == reads
    assert _refusal(gate, "u1", "i2", "r1") == f"409 item_id {CATALOG_UNAVAILABLE}"
    assert _refusal(gate, "u1", "i1", allowed=True) is None


# --- through the service ----------------------------------------------------------------------------


def _client(sink: FakeSink, **trust: Any) -> TestClient:
    store = _store("i1", "i2", "i3")
    producer = FeedbackProducer("events-test", lambda: sink)
    config = ServingConfig(feedback=FeedbackConfig(trust=FeedbackTrustConfig(**trust)))
    loaded = LoadedModels(None, None, None, None, "cpu")
    return TestClient(create_app(config, REGISTRY, store, loaded, producer))


def _rank(c: TestClient, user: str, candidates: list[str], rid: str) -> list[str]:
    body = {"user_id": user, "candidates": candidates, "k": len(candidates)}
    answer = c.post("/v1/rank", json=body, headers={"X-Request-Id": rid})
    assert answer.status_code == 200, answer.text
    return [x["item_id"] for x in answer.json()["items"]]


def _click(c: TestClient, user: str, item: str, rid: str | None = None) -> Any:
    body = {"user_id": user, "item_id": item, "event_type": "click"}
    return c.post("/v1/feedback", json={**body, "request_id": rid} if rid else body)


def _kinds(sink: FakeSink) -> list[tuple[str, str]]:
    return [(d.event["event_type"], d.event["item_id"]) for d in decoded(sink)]


def test_feedback_for_an_item_never_served_is_409_and_nothing_is_produced() -> None:
    sink = FakeSink()
    with _client(sink) as c:
        refused = _click(c, "u1", "i1")
        _rank(c, "u2", ["i1"], "rq-u2")  # served to another user
        other_user = _click(c, "u1", "i1", "rq-u2")
        purchase = c.post("/v1/feedback", json={"user_id": "u1", "item_id": "i2", "event_type": "purchase"})
        wait_for(lambda: len(sink.records) == 1)
        time.sleep(0.1)
        metrics = c.get("/metrics").text
    for response in (refused, other_user, purchase):
        assert response.status_code == 409, response.text
        (error,) = response.json()["errors"]
        assert error["field"] == "item_id"
        assert error["message"].startswith("item-not-served: item ")
    assert _kinds(sink) == [("impression", "i1")]  # only u2's impression: no click, no purchase
    assert 'headwater_rejected_total{reason="invalid"} 3.0' in metrics


def test_feedback_for_a_served_item_is_accepted_and_for_another_request_refused() -> None:
    sink = FakeSink()
    with _client(sink) as c:
        shown = _rank(c, "u1", ["i1", "i2"], "rq-1")
        by_request = _click(c, "u1", "i2", "rq-1")
        without_request = _click(c, "u1", "i1")
        wrong_request = _click(c, "u1", "i1", "rq-2")
        not_shown = _click(c, "u1", "i3", "rq-1")  # in the catalog but not in the answer
        wait_for(lambda: len(sink.records) == 4)
    assert sorted(shown) == ["i1", "i2"]
    assert [r.status_code for r in (by_request, without_request, wrong_request, not_shown)] == [
        202,
        202,
        409,
        409,
    ]
    assert _kinds(sink)[2:] == [("click", "i2"), ("click", "i1")]


def test_feedback_after_the_ttl_is_refused() -> None:
    sink = FakeSink()
    with _client(sink, ttl_s=0.3) as c:
        _rank(c, "u1", ["i1"], "rq-1")
        fresh = _click(c, "u1", "i1", "rq-1")
        time.sleep(0.4)
        late = _click(c, "u1", "i1", "rq-1")
    assert (fresh.status_code, late.status_code) == (202, 409)
    assert "in the last 0.3 s" in late.json()["errors"][0]["message"]


def test_an_unknown_item_is_refused_even_when_served_or_unsolicited_allowed() -> None:
    sink = FakeSink()
    with _client(sink, allow_unsolicited=True) as c:
        _rank(c, "u1", ["i1", "made-up"], "rq-1")  # /v1/rank serves the caller's candidates
        served_ghost = _click(c, "u1", "made-up", "rq-1")
        unsolicited_ghost = _click(c, "u2", "never-existed")
        unsolicited_real = _click(c, "u2", "i3")
        wait_for(lambda: len(sink.records) == 3)
    assert [r.status_code for r in (served_ghost, unsolicited_ghost, unsolicited_real)] == [409, 409, 202]
    assert served_ghost.json()["errors"][0]["message"].startswith("item-unknown: item 'made-up'")
    assert ("click", "i3") in _kinds(sink)
    assert not {"made-up", "never-existed"} & {i for k, i in _kinds(sink) if k == "click"}


def test_the_core_takes_the_callers_permission_for_unsolicited_events() -> None:
    sink = FakeSink()
    with _client(sink) as c:
        service = c.app.state.service  # type: ignore[attr-defined]
        from headwater.serving.schemas import FeedbackRequest

        body = FeedbackRequest(user_id="u7", item_id="i2", event_type="purchase", price=3.0)
        with pytest.raises(FeedbackUntrusted, match="item-not-served"):
            asyncio.run(service.feedback(body))
        answer = asyncio.run(service.feedback(body, unsolicited_allowed=True))
        wait_for(lambda: len(sink.records) == 1)
    assert answer["queued"] is True
    assert _kinds(sink) == [("purchase", "i2")]


def test_a_failing_store_never_makes_feedback_a_5xx() -> None:
    """Items whose rows a ranking read need no read at feedback; the others cannot be checked: 409."""
    f32 = np.float32
    linear = LinearRanker(
        {
            "user_mean": np.zeros(2, f32), "user_scale": np.ones(2, f32), "item_mean": np.zeros(3, f32),
            "item_scale": np.ones(3, f32), "w_user": np.zeros(2, f32), "w_item": np.array([0, 1, 0], f32),
            "w_cross": np.zeros((2, 3), f32), "bias": np.zeros(1, f32),
        }
    )  # fmt: skip
    loaded = LoadedModels(None, None, linear, type("A", (), {"version": "linlinlinlin"})(), "cpu")
    store, sink = four_item_store(), FakeSink()
    config = ServingConfig(item_cache_ttl_s=0.0)
    with TestClient(create_app(config, FOUR, store, loaded, FeedbackProducer("t", lambda: sink))) as c:
        shown = _rank(c, "u1", ["i0", "i1"], "rq-1")  # the linear model read both items' rows
        store.fail = "the store is down"
        fallback = _rank(c, "u1", ["i2"], "rq-2")  # the editorial fallback: i2's rows never read
        known = _click(c, "u1", "i1", "rq-1")
        unknown = _click(c, "u1", "i2", "rq-2")
    assert (shown, fallback) == (["i1", "i0"], ["i2"])
    assert known.status_code == 202, known.text
    assert unknown.status_code == 409
    assert unknown.json()["errors"][0]["message"].startswith("catalog-unavailable: ")


def test_a_made_up_candidate_gets_no_impression_so_it_never_enters_the_catalog() -> None:
    """The ranking read the rows: a candidate in no item view ranks last and its impression is not sent."""
    f32 = np.float32
    linear = LinearRanker(
        {
            "user_mean": np.zeros(2, f32), "user_scale": np.ones(2, f32), "item_mean": np.zeros(3, f32),
            "item_scale": np.ones(3, f32), "w_user": np.zeros(2, f32), "w_item": np.array([0, 1, 0], f32),
            "w_cross": np.zeros((2, 3), f32), "bias": np.zeros(1, f32),
        }
    )  # fmt: skip
    loaded = LoadedModels(None, None, linear, type("A", (), {"version": "linlinlinlin"})(), "cpu")
    sink = FakeSink()
    config = ServingConfig(item_cache_ttl_s=0.0)
    app = create_app(config, FOUR, four_item_store(), loaded, FeedbackProducer("t", lambda: sink))
    with TestClient(app) as c:
        shown = _rank(c, "u1", ["made-up", "i0", "i1"], "rq-1")
        wait_for(lambda: len(sink.records) == 2)
        time.sleep(0.1)
    assert shown == ["i1", "i0", "made-up"]  # answered as before, the made-up candidate last
    events = [d.event for d in decoded(sink)]
    assert [(e["item_id"], e["position"]) for e in events] == [("i1", 1), ("i0", 2)]


def test_the_unsolicited_role_lets_a_credential_post_for_items_it_was_not_served(tmp_path: Path) -> None:
    """A key with ``unsolicited`` beside ``feedback`` skips the served check, never the catalog check.

    A ``feedback`` key alone is held to items served to that user; so is every caller with
    ``auth: none`` (a browser page can post to a loopback service).
    """
    from headwater.serving.auth import OPEN, add_api_key
    from headwater.serving.config import AuthConfig

    keys = tmp_path / "keys.yaml"
    tracker = add_api_key(keys, "order-system", ["feedback", "unsolicited"])
    web = add_api_key(keys, "web", ["rank", "feedback"])
    sink = FakeSink()
    store = _store("i1", "i2", "i3")
    producer = FeedbackProducer("events-test", lambda: sink)
    config = ServingConfig(auth=AuthConfig(api_keys_file=keys, reload_check_s=0))
    loaded = LoadedModels(None, None, None, None, "cpu")
    with TestClient(create_app(config, REGISTRY, store, loaded, producer)) as c:

        def click(key: str, item: str) -> Any:
            body = {"user_id": "u5", "item_id": item, "event_type": "purchase", "price": 2.0}
            return c.post("/v1/feedback", json=body, headers={"Authorization": f"Bearer {key}"})

        by_web, by_tracker, ghost = click(web, "i2"), click(tracker, "i2"), click(tracker, "never-existed")
        wait_for(lambda: len(sink.records) == 1)
    assert (by_web.status_code, by_tracker.status_code, ghost.status_code) == (409, 202, 409)
    assert by_web.json()["errors"][0]["message"].startswith(NOT_SERVED)
    assert ghost.json()["errors"][0]["message"].startswith(UNKNOWN_ITEM)
    assert _kinds(sink) == [("purchase", "i2")]
    assert "unsolicited" not in OPEN.roles
    assert "feedback" in OPEN.roles
