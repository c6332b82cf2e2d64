"""A retried feedback post counts once in the realtime and the nearline tier (issue 16 item 7).

The ranking service (its app, a real Kafka producer) receives a click with an idempotency key, the
client retries it 1.3 s later without ``event_time_ms``, and posts a second click with another
key. Before the key, the retry got its own receipt time: the same event id one slice later, which
the realtime tier (duplicates recognised within an entity and slice) counted as a second click.
Now the retry is the same event, byte for byte: both tiers count two clicks, read from Redis
after the real job (Flink) and a real nearline worker consumed the topic. The offline tier
de-duplicates by event id whatever the time (``pipelines/offline``), so it is not run here.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib.util
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import redis
from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition

from headwater.pipelines.events.codec import DecodedEvent, EventCodec
from headwater.pipelines.settings import Settings
from headwater.pipelines.store import OnlineStore
from headwater.pipelines.windows import (
    RedisDictionary,
    compile_view,
    reference_values,
    to_vectors,
    view_layout,
)
from headwater.ranking.synthetic import small_registry
from headwater.registry.plans import TierPlan
from headwater.serving.app import create_app
from headwater.serving.config import FeedbackConfig, ServingConfig
from headwater.serving.feedback import FeedbackProducer, kafka_sink_factory
from headwater.serving.runtime import LoadedModels
from headwater.serving.served import FeedbackTrustConfig
from headwater.serving.store import InMemoryFeatureStore, now_ms

from .conftest import JobProcess, Names, expected_vectors, read_store, wait_for

_spec = importlib.util.spec_from_file_location(
    "nl_harness", Path(__file__).resolve().parents[1] / "nearline" / "harness.py"
)
assert _spec is not None
assert _spec.loader is not None
h = importlib.util.module_from_spec(_spec)
sys.modules["nl_harness"] = h
_spec.loader.exec_module(h)

USER = "u7"


class Service:
    """The ranking service's app with a real Kafka producer, called in process (ASGI)."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        producer = FeedbackProducer(topic, kafka_sink_factory(bootstrap, 5), reconnect_s=0.2)
        registry = small_registry({"u": ["a"]}, {"i": ["x"]}, "i.x")
        loaded = LoadedModels(None, None, None, None, "cpu")
        store = InMemoryFeatureStore()  # the catalog: feedback for an item in no item view is refused
        store.write(registry.item.layouts[0], ["i1", "i2", "i9"], np.ones((3, 1), np.float32), now_ms())
        # The purchases and clicks stand for a trusted order system's: items it was never served.
        trusted = FeedbackConfig(trust=FeedbackTrustConfig(allow_unsolicited=True))
        self.app = create_app(ServingConfig(feedback=trusted), registry, store, loaded, producer)

    def run(self, steps: Any) -> Any:
        """Run ``steps(post)`` inside the app's lifespan (its end flushes the producer)."""

        async def main() -> Any:
            async with self.app.router.lifespan_context(self.app):
                transport = httpx.ASGITransport(app=self.app)
                async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:

                    async def post(body: dict[str, Any], key: str | None = None) -> dict[str, Any]:
                        headers = {"Idempotency-Key": key} if key else {}
                        r = await client.post("/v1/feedback", json=body, headers=headers)
                        return {**r.json(), "status": r.status_code}

                    return await steps(post)

        return asyncio.run(main())


def _topic_events(bootstrap: str, topic: str, expected: int) -> list[tuple[bytes, DecodedEvent]]:
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, consumer_timeout_ms=15_000
    )
    consumer.assign([TopicPartition(topic, 0)])
    consumer.seek_to_beginning()
    codec, out = EventCodec(), []
    for record in consumer:
        got = codec.decode(record.value, record.headers)
        assert isinstance(got, DecodedEvent), got
        out.append((record.value, got))
        if len(out) >= expected:
            break
    consumer.close()
    return out


def test_a_retried_feedback_counts_once_in_the_realtime_and_nearline_tiers(
    plan: tuple[TierPlan, Path], names: Names, settings: Settings, kafka_bootstrap: str, redis_url: str,
    tmp_path: Path,
) -> None:  # fmt: skip
    tier_plan, state = plan
    log = tmp_path / "job.log"
    job = JobProcess(state, names, tmp_path / "checkpoints", log)
    nl = h.Env(settings=dataclasses.replace(settings, events_topic=names.topic, dlq_topic=names.dlq),
               tmp=tmp_path / "nearline", partitions=1)  # fmt: skip
    service = Service(kafka_bootstrap, names.topic)
    buy = {"user_id": USER, "item_id": "i1", "event_type": "purchase", "price": 10.0, "category": "c1"}
    key_a, key_b = uuid.uuid4().hex, uuid.uuid4().hex
    seen: dict[str, Any] = {}

    def rt_value() -> tuple[int, Any] | None:
        _, res = read_store(redis_url, names.namespace, tier_plan, "rt_all", [USER])
        return (int(res.event_time_ms[0]), res.values) if res.found[0] else None

    async def steps(post: Any) -> list[dict[str, Any]]:
        # Step 1: the job runs (it has published a warm-up click) before the posts.
        assert (await post({"user_id": "zz", "item_id": "i9", "event_type": "click"}))["status"] == 202
        await asyncio.to_thread(
            wait_for, lambda: read_store(redis_url, names.namespace, tier_plan, "rt_all", ["zz"])[1].found[0],
            240, "the realtime job's first value", log,
        )  # fmt: skip
        # Step 2: purchase A, its retry 1.3 s later (another slice: slide 1 s), purchase B.
        out = [await post(buy, key_a)]
        await asyncio.sleep(1.3)
        out.append(await post(buy, key_a))
        out.append(await post({**buy, "item_id": "i2", "price": 5.0, "idempotency_key": key_b}))
        # Step 3: the realtime value once the job's clock passed B (read at once: the windows slide on).
        after_b = out[2]["event_time_ms"] // 1000 * 1000 + 1000
        deadline = time.monotonic() + 60
        while (got := await asyncio.to_thread(rt_value)) is None or got[0] < after_b:
            assert time.monotonic() < deadline, f"no realtime value after B; job log: {log}"
            await asyncio.sleep(0.2)
        seen["rt"] = got
        # Step 4: a later click moves the nearline watermark (max event time - 5 s) past A and B.
        await asyncio.sleep(max(0.0, (out[0]["event_time_ms"] + 8_000) / 1000 - time.time()))
        out.append(await post({"user_id": "zz", "item_id": "i9", "event_type": "click"}))
        return out

    try:
        answers = service.run(steps)
        assert [a["status"] for a in answers] == [202] * 4, answers
        assert [a["replayed"] for a in answers] == [False, True, False, False]
        assert answers[1]["event_id"] == answers[0]["event_id"] != answers[2]["event_id"]
        assert answers[1]["event_time_ms"] == answers[0]["event_time_ms"]  # no event_time_ms posted
        records = _topic_events(kafka_bootstrap, names.topic, 5)
        assert records[1][0] == records[2][0]  # the retry reached Kafka as the same bytes
        mine = [d for _, d in records if d.event["user_id"] == USER]
        once = list({d.event["event_id"]: d for d in mine}.values())
        assert (len(mine), len(once)) == (3, 2)

        # Realtime: the value read at its boundary equals the reference over A and B, once each.
        boundary, values = seen["rt"]
        client = redis.Redis.from_url(redis_url)
        try:
            events = [d.event for d in once]
            ref, want = expected_vectors(
                tier_plan, "rt_all", events, [USER], client, names.namespace, boundary
            )
        finally:
            client.close()
        assert ref[USER]["price_sum_20s"] == 15.0  # was 25: the retry one slice later counted again
        np.testing.assert_allclose(values, want, rtol=1e-6, equal_nan=True)

        # Nearline: a worker over the same topic (slide 1 s), to the end of the topic.
        nl.tmp.mkdir()
        h.write_plan(nl.tmp, slide_s=1, topic=names.topic)
        assert nl.start(idle_exit_s=8).wait(timeout=120) == 0
        spec = compile_view(next(v for v in h.nearline_views(slide_s=1) if v.name == "nl_activity"))
        store = OnlineStore.from_url(redis_url, namespace=nl.namespace)
        try:
            got = store.read_batch(view_layout(spec), [USER])
            assert got.found[0]
            ref_nl = reference_values(
                spec, [h.window_event(h.BEHAVIOUR, d) for d in once], int(got.event_time_ms[0])
            )
            assert ref_nl[USER]["price_avg_30m"] == 7.5  # (10 + 5) / 2, not (10 + 10 + 5) / 3
            row = [list(ref_nl[USER].values())]
            want_nl = to_vectors(spec, row, RedisDictionary(store.client, namespace=nl.namespace).ids)
            np.testing.assert_allclose(got.values, want_nl, rtol=1e-6, atol=1e-6)
        finally:
            store.close()
    finally:
        job.kill()
        _cleanup_nearline(nl)


def _cleanup_nearline(nl: Any) -> None:
    """Delete the worker's internal topics and Redis keys (the ``names`` fixture owns the topics)."""
    admin = KafkaAdminClient(bootstrap_servers=nl.settings.kafka_bootstrap)
    try:
        mine = [t for t in admin.list_topics() if t.startswith(f"{nl.group}-")]
        if mine:
            admin.delete_topics(mine)
    finally:
        admin.close()
    client = redis.Redis.from_url(nl.settings.redis_url)
    try:
        for key in client.scan_iter(match=f"{nl.namespace}:*", count=1000):
            client.unlink(key)
    finally:
        client.close()
