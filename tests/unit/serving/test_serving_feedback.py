"""The feedback loop without Kafka: the producer's buffer and counters, the events, /v1/feedback."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from kafka.errors import KafkaTimeoutError

from headwater.pipelines.events.codec import DecodedEvent, EventCodec
from headwater.ranking.synthetic import small_registry
from headwater.serving.app import create_app
from headwater.serving.config import FeedbackConfig, ServingConfig
from headwater.serving.feedback import EventSink, FeedbackProducer, impression_events
from headwater.serving.runtime import LoadedModels
from headwater.serving.served import FeedbackTrustConfig
from headwater.serving.store import InMemoryFeatureStore, now_ms

REGISTRY = small_registry({"u": ["a"]}, {"i": ["x"]}, "i.x")


class Done:
    """A delivered record's future: calls the callback at once (or the errback when ``fail``)."""

    def __init__(self, fail: bool) -> None:
        self.fail = fail

    def add_callback(self, fn: Callable[[object], None]) -> Done:
        if not self.fail:
            fn(None)
        return self

    def add_errback(self, fn: Callable[[BaseException], None]) -> Done:
        if self.fail:
            fn(TimeoutError("no ack"))
        return self


class FakeSink:
    """Records what a KafkaProducer would have sent."""

    def __init__(self, fail: bool = False) -> None:
        self.records: list[tuple[str, bytes, bytes, list[tuple[str, bytes]]]] = []
        self.fail = fail

    def send(self, topic: str, *, value: bytes, key: bytes, headers: list[tuple[str, bytes]]) -> Any:
        self.records.append((topic, key, value, headers))
        return Done(self.fail)

    def send_many(
        self, topic: str, *, values: Any, key: Any, headers: Any, on_sent: Any, on_failed: Any
    ) -> int:
        for value in values:
            self.send(topic, value=value, key=key, headers=headers).add_callback(on_sent).add_errback(
                on_failed
            )
        return len(values)

    def poll(self) -> None:
        return None

    def flush(self, timeout: float | None = None) -> None:
        return None

    def close(self, timeout: float | None = None) -> None:
        return None


def wait_for(check: Callable[[], bool], seconds: float = 5.0) -> None:
    end = time.monotonic() + seconds
    while not check():
        if time.monotonic() > end:
            pytest.fail("condition not met in time")
        time.sleep(0.01)


def decoded(sink: FakeSink) -> list[DecodedEvent]:
    codec = EventCodec()
    out = []
    for _, _, value, headers in sink.records:
        got = codec.decode(value, headers)
        assert isinstance(got, DecodedEvent), got
        out.append(got)
    return out


def test_offered_events_reach_the_topic_encoded_like_the_pipeline_producer() -> None:
    sink = FakeSink()
    producer = FeedbackProducer("t1", lambda: sink)
    producer.start()
    events = impression_events(
        "r1", "u1", ["i7", "i3"], session_id="s9", device="ios", at_ms=1_800_000_000_000
    )
    assert producer.offer(events) == 2
    wait_for(lambda: producer.counters.sent == 2)
    producer.stop()
    assert [(t, k) for t, k, _, _ in sink.records] == [("t1", b"u1"), ("t1", b"u1")]
    got = [d.event for d in decoded(sink)]
    assert [(e["event_id"], e["item_id"], e["position"], e["event_type"]) for e in got] == [
        ("r1:1", "i7", 1, "impression"),
        ("r1:2", "i3", 2, "impression"),
    ]
    assert {(e["session_id"], e["device"], e["event_time"]) for e in got} == {
        ("s9", "ios", 1_800_000_000_000)
    }
    assert producer.counters.dropped == producer.counters.failed == 0


def test_kafka_down_buffers_then_drops_and_never_blocks() -> None:
    attempts = []

    def down() -> EventSink:
        attempts.append(1)
        raise KafkaTimeoutError()

    producer = FeedbackProducer("t", down, max_buffer=3, reconnect_s=0.05)
    producer.start()
    started = time.perf_counter()
    accepted = producer.offer(impression_events("r", "u", ["a", "b", "c", "d", "e"]))
    took = time.perf_counter() - started
    wait_for(lambda: len(attempts) >= 2)
    assert accepted == 3
    assert (producer.counters.dropped, producer.buffered) == (2, 3)
    assert not producer.connected
    producer.stop(timeout_s=2.0)
    assert producer.counters.dropped == 5  # stopping while Kafka is down drops what is buffered
    assert producer.counters.sent == 0
    assert took < 0.5  # offer() only touches the in-process buffer


def test_unacknowledged_records_count_as_failed() -> None:
    producer = FeedbackProducer("t", lambda: FakeSink(fail=True))
    producer.start()
    producer.offer(impression_events("r", "u", ["a"]))
    wait_for(lambda: producer.counters.failed == 1)
    producer.stop()
    assert producer.counters.sent == 0


def client(sink: FakeSink | None, allow_unsolicited: bool = False) -> TestClient:
    """The app over items i1 and i2; ``allow_unsolicited``: feedback for items never served is accepted."""
    store = InMemoryFeatureStore()
    store.write(REGISTRY.item.layouts[0], ["i1", "i2"], np.array([[1.0], [5.0]], np.float32), now_ms())
    producer = FeedbackProducer("events-test", lambda: sink) if sink is not None else None
    loaded = LoadedModels(None, None, None, None, "cpu")
    trust = FeedbackConfig(trust=FeedbackTrustConfig(allow_unsolicited=allow_unsolicited))
    return TestClient(create_app(ServingConfig(feedback=trust), REGISTRY, store, loaded, producer))


def test_rank_sends_its_top_k_as_impressions_with_the_request_id() -> None:
    sink = FakeSink()
    with client(sink) as c:
        out = c.post(
            "/v1/rank", json={"user_id": "u1", "candidates": ["i1", "i2"], "k": 2, "session_id": "s1"}
        ).json()
        c.post("/v1/rank", json={"user_id": "u1", "candidates": ["i1"], "k": 1, "log_impressions": False})
        wait_for(lambda: len(sink.records) == 2)
        health = c.get("/health").json()
        metrics = c.get("/metrics").text
    events = [d.event for d in decoded(sink)]
    assert [i["item_id"] for i in out["items"]] == ["i2", "i1"]  # popularity: no model
    rid = out["request_id"]
    assert [(e["event_id"], e["item_id"], e["position"], e["session_id"]) for e in events] == [
        (f"{rid}:1", "i2", 1, "s1"),
        (f"{rid}:2", "i1", 2, "s1"),
    ]
    assert health["feedback"] == {"connected": True, "sent": 2, "dropped": 0, "failed": 0, "buffered": 0}
    assert 'headwater_feedback_events{result="sent"} 2.0' in metrics


def test_feedback_click_is_produced_with_the_ranking_session_and_position() -> None:
    sink = FakeSink()
    with client(sink) as c:
        ranked = c.post(
            "/v1/rank",
            json={"user_id": "u1", "candidates": ["i1", "i2"], "k": 2},
            headers={"X-Request-Id": "r42"},
        )
        assert ranked.json()["items"][0]["item_id"] == "i2"
        before = now_ms()
        response = c.post(
            "/v1/feedback",
            json={"user_id": "u1", "item_id": "i2", "event_type": "click", "request_id": "r42", "position": 1,
                  "category": "music"},
        )  # fmt: skip
        wait_for(lambda: len(sink.records) == 3)  # the ranking's 2 impressions, the click
    assert response.status_code == 202
    body = response.json()
    assert body["queued"] is True
    (event,) = [d.event for d in decoded(sink) if d.event["event_type"] == "click"]
    assert event["event_id"] == body["event_id"]
    assert (event["event_type"], event["item_id"], event["session_id"], event["position"]) == (
        "click",
        "i2",
        "r42",
        1,
    )
    assert event["category"] == "music"
    assert before <= event["event_time"] <= now_ms()


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"user_id": "u1", "item_id": "i1", "event_type": "dwell"}, "dwell_ms: required for a dwell event"),
        ({"user_id": "u1", "item_id": "i1", "event_type": "view"}, "event_type: must be 'click', 'like'"),
        ({"user_id": "u1", "item_id": "i1", "event_type": "click", "price": 3.0}, "price: only a purchase"),
        (
            {"user_id": "u1", "item_id": "i1", "event_type": "click", "position": 2},
            "position: needs the request_id",
        ),
        ({"user_id": "", "item_id": "i1", "event_type": "click"}, "user_id: must be at least 1 characters"),
        (
            {"user_id": "u1", "item_id": "i1", "event_type": "click", "event_time_ms": 1},
            "event_time_ms: 1 is",
        ),
        (
            {"user_id": "u1", "item_id": "i1", "event_type": "click", "extra": 1},
            "extra: is not a known field",
        ),
    ],
)
def test_invalid_feedback_is_422_with_a_message(body: dict[str, Any], message: str) -> None:
    sink = FakeSink()
    with client(sink) as c:
        response = c.post("/v1/feedback", json=body)
    assert response.status_code == 422, response.text
    assert message in response.json()["detail"]
    assert sink.records == []


def test_kafka_down_rank_and_feedback_still_answer() -> None:
    def down() -> EventSink:
        raise KafkaTimeoutError()

    producer = FeedbackProducer("t", down, max_buffer=2, reconnect_s=0.05)
    store = InMemoryFeatureStore()
    store.write(REGISTRY.item.layouts[0], ["i1", "i2"], np.array([[1.0], [5.0]], np.float32), now_ms())
    loaded = LoadedModels(None, None, None, None, "cpu")
    with TestClient(create_app(ServingConfig(), REGISTRY, store, loaded, producer)) as c:
        ranked = c.post("/v1/rank", json={"user_id": "u1", "candidates": ["i1", "i2"], "k": 2})
        fb = c.post("/v1/feedback", json={"user_id": "u1", "item_id": "i1", "event_type": "like"})
        health = c.get("/health").json()
    assert ranked.status_code == 200
    assert fb.status_code == 202
    assert fb.json()["queued"] is False  # the buffer (2 events) holds the answer's 2 impressions
    assert health["feedback"]["connected"] is False
    assert health["feedback"]["dropped"] == 1
