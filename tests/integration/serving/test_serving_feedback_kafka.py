"""The feedback loop against real Kafka: served impressions and posted clicks become behaviour events.

What lands is read back with a plain consumer and decoded with the pipelines' codec, exactly as the
tiers read it. A service pointed at a broker that is not there still answers 200/202.
"""

from __future__ import annotations

import asyncio
import socket
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from kafka import KafkaConsumer, TopicPartition
from kafka.admin import KafkaAdminClient, NewTopic

from headwater.pipelines.events.codec import DecodedEvent, EventCodec
from headwater.ranking.synthetic import small_registry
from headwater.serving.app import create_app
from headwater.serving.config import ServingConfig
from headwater.serving.feedback import FeedbackProducer, impression_events, kafka_sink_factory
from headwater.serving.runtime import LoadedModels
from headwater.serving.store import InMemoryFeatureStore, now_ms

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))

REGISTRY = small_registry({"u": ["a"]}, {"i": ["x"]}, "i.x")


@pytest.fixture
def topic(kafka_bootstrap: str) -> Iterator[str]:
    name = f"hwtest-feedback-{uuid.uuid4().hex[:8]}"
    admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap, request_timeout_ms=10_000)
    admin.create_topics([NewTopic(name, 1, 1)])
    yield name
    admin.delete_topics([name])
    admin.close()


def _app(bootstrap: str, topic: str) -> Any:
    store = InMemoryFeatureStore()
    store.write(
        REGISTRY.item.layouts[0], ["i1", "i2", "i3"], np.array([[3.0], [1.0], [2.0]], np.float32), now_ms()
    )
    producer = FeedbackProducer(topic, kafka_sink_factory(bootstrap, 5), reconnect_s=0.2)
    loaded = LoadedModels(None, None, None, None, "cpu")
    return create_app(ServingConfig(), REGISTRY, store, loaded, producer)


def _call(app: Any, calls: list[tuple[str, dict[str, Any]]]) -> list[httpx.Response]:
    """POST each call in order (``{rid}`` in a value is the first answer's request id), then GET /health."""

    async def main() -> list[httpx.Response]:
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
                out: list[httpx.Response] = []
                for path, body in calls:
                    if out:
                        rid = out[0].json()["request_id"]
                        body = {k: v.format(rid=rid) if isinstance(v, str) else v for k, v in body.items()}
                    out.append(await client.post(path, json=body))
                out.append(await client.get("/health"))
                return out

    return asyncio.run(main())


def _read(bootstrap: str, topic: str, expected: int) -> list[tuple[bytes, DecodedEvent]]:
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, consumer_timeout_ms=15_000
    )
    consumer.assign([TopicPartition(topic, 0)])
    consumer.seek_to_beginning()
    codec = EventCodec()
    out = []
    for record in consumer:
        got = codec.decode(record.value, record.headers)
        assert isinstance(got, DecodedEvent), got
        out.append((record.key, got))
        if len(out) >= expected:
            break
    consumer.close()
    return out


def test_impressions_and_a_click_reach_the_topic_as_behaviour_events(
    kafka_bootstrap: str, topic: str
) -> None:
    app = _app(kafka_bootstrap, topic)
    rank = {
        "user_id": "u7",
        "candidates": ["i1", "i2", "i3"],
        "k": 2,
        "session_id": "s7",
        "device": "android",
    }
    click = {"user_id": "u7", "item_id": "i3", "event_type": "click", "request_id": "{rid}", "position": 2,
             "session_id": "s7"}  # fmt: skip
    calls = [("/v1/rank", rank), ("/v1/rank", {**rank, "log_impressions": False}), ("/v1/feedback", click)]
    ranked, _, clicked, health = _call(app, calls)
    rid = ranked.json()["request_id"]
    assert clicked.status_code == 202
    got = _read(kafka_bootstrap, topic, 3)
    events = [(key, d.event["event_type"], d.event["item_id"], d.event["position"], d.event["session_id"])
              for key, d in got]  # fmt: skip
    assert events == [
        (b"u7", "impression", "i1", 1, "s7"),
        (b"u7", "impression", "i3", 2, "s7"),
        (b"u7", "click", "i3", 2, "s7"),
    ]
    assert got[0][1].event["event_id"] == f"{rid}:1"
    assert got[0][1].event["device"] == "android"
    assert got[2][1].event["event_id"] == clicked.json()["event_id"]
    assert health.json()["feedback"]["failed"] == 0


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_kafka_unreachable_the_service_still_answers() -> None:
    app = _app(f"127.0.0.1:{_closed_port()}", "nowhere")
    rank = {"user_id": "u7", "candidates": ["i1", "i2"], "k": 2}
    click = {"user_id": "u7", "item_id": "i1", "event_type": "click"}
    ranked, clicked, health = _call(app, [("/v1/rank", rank), ("/v1/feedback", click)])
    assert ranked.status_code == 200
    assert [x["item_id"] for x in ranked.json()["items"]] == ["i1", "i2"]
    assert clicked.status_code == 202
    assert health.json()["feedback"]["connected"] is False
    assert health.json()["feedback"]["sent"] == 0


@pytest.mark.parametrize("client", ["confluent", "kafka-python"])
def test_a_shutdown_with_impressions_in_the_buffer_sends_them_all(
    kafka_bootstrap: str, topic: str, client: str
) -> None:
    """The service stops (its lifespan ends) right after answers and a burst of impressions: none is lost."""
    store = InMemoryFeatureStore()
    store.write(
        REGISTRY.item.layouts[0], ["i1", "i2", "i3"], np.array([[3.0], [1.0], [2.0]], np.float32), now_ms()
    )
    producer = FeedbackProducer(topic, kafka_sink_factory(kafka_bootstrap, 5, client), reconnect_s=0.2)
    app = create_app(ServingConfig(), REGISTRY, store, LoadedModels(None, None, None, None, "cpu"), producer)
    burst = [impression_events(f"{n:032x}", f"u{n % 50}", ["i1", "i2", "i3"]) for n in range(4_000)]

    async def main() -> tuple[int, list[int]]:
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
                rank = {"user_id": "u7", "candidates": ["i1", "i2", "i3"], "k": 2}
                codes = [(await http.post("/v1/rank", json=rank)).status_code for _ in range(5)]
            for events in burst:  # as the routes do, faster than the sender thread takes them
                producer.offer(events)
            return producer.buffered, codes

    buffered, codes = asyncio.run(main())
    assert codes == [200] * 5
    assert buffered > 0  # the shutdown began with impressions still in the buffer
    expected = 5 * 2 + 4_000 * 3
    assert producer.counters.dropped == 0
    assert producer.counters.failed == 0
    consumer = KafkaConsumer(bootstrap_servers=kafka_bootstrap)
    tp = TopicPartition(topic, 0)
    assert consumer.end_offsets([tp])[tp] == expected
    consumer.close()
    got = _read(kafka_bootstrap, topic, expected)
    ids = {d.event["event_id"] for _, d in got}
    assert len(ids) == expected
    assert all(f"{n:032x}:3" in ids for n in range(4_000))
