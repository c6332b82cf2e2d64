"""Idempotent feedback (issue 16 item 7): a retry with the same key produces the same event bytes.

Before the fix a retry without ``event_time_ms`` got a new time (so the realtime tier counted it
twice) and the client chose the event id verbatim (``event_id``), so it could pick an impression's.
"""

from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import given, settings
from hypothesis import strategies as st

from headwater.serving.feedback import (
    FEEDBACK_ID,
    IMPRESSION_ID,
    IdempotencyKeys,
    feedback_event_id,
    impression_events,
    new_request_id,
    receive_feedback,
)
from headwater.serving.schemas import FeedbackRequest

_spec = importlib.util.spec_from_file_location(
    "fb_units", Path(__file__).with_name("test_serving_feedback.py")
)
assert _spec is not None
assert _spec.loader is not None
fb = importlib.util.module_from_spec(_spec)
sys.modules["fb_units"] = fb
_spec.loader.exec_module(fb)

# These posts stand for a trusted caller's (allow_unsolicited): the items are in the catalog, never served.
CLICK = {"user_id": "u1", "item_id": "i2", "event_type": "click", "request_id": "r42", "position": 1}


def _post(c: TestClient, body: dict[str, Any], key: str | None = None) -> Any:
    headers = {"Idempotency-Key": key} if key is not None else {}
    return c.post("/v1/feedback", json=body, headers=headers)


def test_a_retry_without_event_time_produces_the_same_event_bytes() -> None:
    sink = fb.FakeSink()
    with fb.client(sink, allow_unsolicited=True) as c:
        first = _post(c, {**CLICK, "idempotency_key": "k-1"})
        time.sleep(0.02)  # the retry comes later: a new receipt time if the key were not remembered
        retry = _post(c, {**CLICK, "idempotency_key": "k-1"})
        by_header = _post(c, CLICK, key="k-1")
        other = _post(c, {**CLICK, "idempotency_key": "k-2"})
        fb.wait_for(lambda: len(sink.records) == 4)
    assert [r.status_code for r in (first, retry, by_header, other)] == [202] * 4
    assert [r.json()["replayed"] for r in (first, retry, by_header, other)] == [False, True, True, False]
    first_record, retry_record, header_record, _ = sink.records
    # same topic, Kafka key and Avro value (the produce-ts header is the send time, so it differs)
    assert retry_record[:3] == first_record[:3] == header_record[:3]
    events = [d.event for d in fb.decoded(sink)]
    assert events[0]["event_id"] == feedback_event_id("u1", "k-1") == first.json()["event_id"]
    assert events[0]["event_time"] == retry.json()["event_time_ms"] == first.json()["event_time_ms"]
    assert events[3]["event_id"] == feedback_event_id("u1", "k-2") != events[0]["event_id"]


def test_the_event_id_comes_from_the_key_and_user_alone_so_another_replica_agrees() -> None:
    stamp = int(time.time() * 1000)
    body = {**CLICK, "idempotency_key": "k-9", "event_time_ms": stamp}
    sinks = [fb.FakeSink(), fb.FakeSink()]
    for sink in sinks:  # two replicas: nothing shared but the request
        with fb.client(sink, allow_unsolicited=True) as c:
            assert _post(c, body).status_code == 202
            fb.wait_for(lambda s=sink: len(s.records) == 1)  # type: ignore[misc]
    assert sinks[0].records[0][1:3] == sinks[1].records[0][1:3]  # same key and Avro bytes


def test_a_key_reused_for_another_feedback_is_422_naming_the_field() -> None:
    sink = fb.FakeSink()
    with fb.client(sink, allow_unsolicited=True) as c:
        assert _post(c, {**CLICK, "idempotency_key": "k-1"}).status_code == 202
        other_item = _post(c, {**CLICK, "item_id": "i1", "idempotency_key": "k-1"})
        other_user = _post(c, {**CLICK, "user_id": "u2", "idempotency_key": "k-1"})  # keys are per user
    assert other_item.status_code == 422
    assert other_item.json()["errors"] == [
        {"field": "idempotency_key", "message": other_item.json()["errors"][0]["message"]}
    ]
    assert "another feedback" in other_item.json()["detail"]
    assert other_user.status_code == 202


@pytest.mark.parametrize(
    ("body", "key", "field", "message"),
    [
        ({**CLICK, "event_id": "0123456789abcdef0123456789abcdef:1"}, None, "event_id", "service chooses"),
        ({**CLICK, "idempotency_key": "has space"}, None, "idempotency_key", ""),
        ({**CLICK, "idempotency_key": "x" * 129}, None, "idempotency_key", ""),
        (CLICK, "has space", "Idempotency-Key", "printable ASCII"),
        ({**CLICK, "idempotency_key": "a"}, "b", "idempotency_key", "differs from the Idempotency-Key"),
    ],
)
def test_client_chosen_ids_and_bad_keys_are_422(
    body: dict[str, Any], key: str | None, field: str, message: str
) -> None:
    sink = fb.FakeSink()
    with fb.client(sink, allow_unsolicited=True) as c:
        response = _post(c, body, key)
    assert response.status_code == 422, response.text
    assert [e["field"] for e in response.json()["errors"]] == [field]
    assert message in response.json()["detail"]
    assert sink.records == []


def test_a_replay_older_than_the_tiers_accept_is_answered_but_not_sent_again() -> None:
    clock = [0.0]
    keys = IdempotencyKeys(ttl_s=600.0, clock=lambda: clock[0])
    body = FeedbackRequest.model_validate({**CLICK, "idempotency_key": "k"})
    now = int(time.time() * 1000)
    first = receive_feedback(body, None, keys, now)
    again = receive_feedback(body, None, keys, now + 30_000)
    late = receive_feedback(body, None, keys, now + 61_000)
    assert (first.replayed, first.send, again.replayed, again.send) == (False, True, True, True)
    assert (late.replayed, late.send) == (True, False)  # sent when fresh; now it would be a late letter
    assert first.event == again.event == late.event


def test_keys_expire_after_their_ttl() -> None:
    clock = [0.0]
    keys = IdempotencyKeys(ttl_s=600.0, clock=lambda: clock[0])
    keys.remember("u1", "k", "f", "fb-" + "0" * 32, 1000)
    clock[0] = 599.0
    assert keys.first("u1", "k") is not None
    clock[0] = 600.0
    assert keys.first("u1", "k") is None  # expired


def test_the_key_map_is_bounded_oldest_first() -> None:
    keys = IdempotencyKeys(ttl_s=600.0, max_keys=3)
    for i in range(5):
        keys.remember("u", f"k{i}", "f", f"id{i}", i)
    assert len(keys) == 3
    assert [keys.first("u", f"k{i}") is not None for i in range(5)] == [False, False, True, True, True]
    keys.remember("u", "k4", "other", "other", 9)  # the first receipt stays
    first = keys.first("u", "k4")
    assert first is not None
    assert (first.event_id, first.event_time_ms) == ("id4", 4)


@settings(max_examples=300, deadline=None)
@given(
    user=st.text(min_size=1, max_size=128),
    key=st.text(alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=128),
)
def test_feedback_and_impression_ids_live_in_separate_spaces(user: str, key: str) -> None:
    fid = feedback_event_id(user, key)
    assert FEEDBACK_ID.fullmatch(fid)
    assert not IMPRESSION_ID.fullmatch(fid)
    (imp,) = impression_events(new_request_id(), "u1", ["i"])
    assert IMPRESSION_ID.fullmatch(imp["event_id"])
    assert not FEEDBACK_ID.fullmatch(imp["event_id"])
    assert feedback_event_id(user, key) == fid  # deterministic
    assert feedback_event_id(user + "x", key) != fid
