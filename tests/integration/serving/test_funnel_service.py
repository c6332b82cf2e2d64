"""/v1/recommend against real Redis and Kafka: the example registry, models trained on a synthetic world.

The service is what ``headwater serve`` builds (``build_funnel`` + ``create_app``): the two-tower
index built from the item vectors in Redis, the DCN, the re-ranker, the recent-items memory in
Redis, the impressions to a Kafka topic of the test's own. The answers' values are asserted:
seen items absent from the next answer, pins at their positions, at most M per category, every
stage reported with consistent candidate counts, the impressions in Kafka and in Redis.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import redis
from kafka import KafkaConsumer, TopicPartition
from kafka.admin import KafkaAdminClient, NewTopic

from headwater.pipelines.events.codec import DecodedEvent, EventCodec
from headwater.ranking.features import BoundRegistry, registry_from_repo
from headwater.ranking.reranker import RerankOptions, save_reranker, train_reranker
from headwater.ranking.synthetic import make_world, training_set, write_world
from headwater.ranking.train import TrainOptions, train_and_save
from headwater.serving.app import create_app
from headwater.serving.config import FeedbackConfig, ServingConfig
from headwater.serving.feedback import FeedbackProducer, kafka_sink_factory
from headwater.serving.funnel.build import build_funnel
from headwater.serving.funnel.config import FunnelConfig
from headwater.serving.funnel.recent import RedisRecentItems
from headwater.serving.retrieval import TowerOptions, save_towers, train_two_tower
from headwater.serving.runtime import load_models
from headwater.serving.served import FeedbackTrustConfig
from headwater.serving.store import OnlineStoreReader, now_ms

FUNNEL = FunnelConfig(retrieve_n=300, rank_keep=100, rerank_top=50, max_per_category=2, pins={"i000007": 2})
# The click below is a trusted caller's (an item of the catalog the user was not necessarily shown).
TRUSTED = FeedbackConfig(trust=FeedbackTrustConfig(allow_unsolicited=True))
CONFIG = ServingConfig(item_cache_ttl_s=0.0, default_deadline_ms=2000.0, funnel=FUNNEL, feedback=TRUSTED)
REGISTRY: BoundRegistry = registry_from_repo(
    Path(__file__).resolve().parents[3] / "features", CONFIG.popularity
)
CATEGORIES = 6


@pytest.fixture
def topic(kafka_bootstrap: str) -> Iterator[str]:
    name = f"hwtest-funnel-{uuid.uuid4().hex[:8]}"
    admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap, request_timeout_ms=10_000)
    admin.create_topics([NewTopic(name, 1, 1)])
    yield name
    admin.delete_topics([name])
    admin.close()


@pytest.fixture
def namespace(redis_url: str) -> Iterator[str]:
    name = f"hwtest-funnel-{uuid.uuid4().hex[:8]}"
    yield name
    client = redis.Redis.from_url(redis_url)
    keys = list(client.scan_iter(match=f"{name}:*", count=1000))
    if keys:
        client.delete(*keys)
    client.close()


def wait_for(predicate: Any, timeout_s: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def _calls(app: Any, steps: list[Any]) -> list[Any]:
    """Run ``steps`` in order inside the app's lifespan: (path, body) posts, a GET path, or a callable."""

    async def main() -> list[Any]:
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://test", timeout=60) as client:
                out: list[Any] = []
                for step in steps:
                    if callable(step):
                        out.append(await asyncio.to_thread(step))
                    elif isinstance(step, str):
                        out.append(await client.get(step))
                    else:
                        out.append(await client.post(step[0], json=step[1]))
                return out

    return asyncio.run(main())


def test_recommend_end_to_end(
    redis_url: str, kafka_bootstrap: str, topic: str, namespace: str, tmp_path: Path
) -> None:
    world = make_world(REGISTRY, users=60, items=1_500, seed=15)
    ts = training_set(REGISTRY, world, slates=1_500, seed=15)
    train_and_save(ts, tmp_path, TrainOptions(epochs=1, linear_iterations=10, device="cpu"))
    save_towers(tmp_path, train_two_tower(ts, TowerOptions(epochs=2, threads=1)), ts)
    reranker, metrics = train_reranker(
        ts, np.full(len(ts), 0.2, np.float32), RerankOptions(epochs=1, threads=1)
    )
    save_reranker(tmp_path, reranker, ts, metrics, 20)

    reader = OnlineStoreReader.from_url(redis_url, namespace=namespace, timeout_s=2.0)
    write_world(reader, REGISTRY, world, now_ms())
    category = {item: f"c{j % CATEGORIES}" for j, item in enumerate(world.item_ids)}
    seeding = RedisRecentItems(reader.store.client, namespace, FUNNEL)
    assert seeding.put_categories(category) == 1_500
    loaded = load_models(tmp_path, REGISTRY, "cpu")
    parts = build_funnel(FUNNEL, REGISTRY, reader.store, tmp_path, loaded)
    assert parts.retriever is not None
    assert parts.reranker is not None
    producer = FeedbackProducer(topic, kafka_sink_factory(kafka_bootstrap, 5), reconnect_s=0.2)
    app = create_app(CONFIG, REGISTRY, reader, loaded, producer, funnel=parts)
    client = redis.Redis.from_url(redis_url)
    user = world.user_ids[0]
    seen_key = parts.recent.key("seen", user)  # type: ignore[attr-defined]
    click_key = parts.recent.key("clicks", user)  # type: ignore[attr-defined]
    ask = ("/v1/recommend", {"user_id": user, "k": 10, "session_id": "s1"})

    first, _, _, second, metrics_page = _calls(app, [
        ask,
        ("/v1/feedback", {"user_id": user, "item_id": world.item_ids[3], "event_type": "click"}),
        lambda: wait_for(lambda: client.zcard(seen_key) == 10 and client.zcard(click_key) == 1),
        ask,
        "/metrics",
    ])  # fmt: skip
    assert first.status_code == 200, first.text
    assert second.status_code == 200, second.text
    a, b = first.json(), second.json()
    for answer in (a, b):
        items = [x["item_id"] for x in answer["items"]]
        assert len(items) == 10
        assert len(set(items)) == 10
        assert items[1] == "i000007"  # the pin
        cats = [category[i] for i in items if i != "i000007"]
        assert max(cats.count(c) for c in set(cats)) <= 2  # diversity held (pins exempt)
        assert all(x["category"] == category[x["item_id"]] for x in answer["items"])
        stages = {s["stage"]: s for s in answer["stages"]}
        assert list(stages) == ["retrieve", "seen", "rank", "rerank", "rules"]
        assert [stages[s]["fallback"] for s in ("retrieve", "seen", "rank", "rerank")] == [None] * 4
        assert stages["seen"]["candidates"] == 300
        assert stages["rank"]["candidates"] == 100
        assert stages["rerank"]["candidates"] == 50
        assert stages["rules"]["candidates"] == 10
        assert sum(s["ms"] for s in answer["stages"]) <= answer["latency_ms"]
        assert answer["model_version"] == loaded.neural_artifact.version  # type: ignore[union-attr]
        assert answer["reranker_version"] == parts.reranker.version
        assert answer["retrieval_version"].endswith(".1")
    first_items = [x["item_id"] for x in a["items"]]
    second_items = [x["item_id"] for x in b["items"]]
    # What the first answer showed is gone from the second (the pin excepted: the editors place it).
    assert set(first_items).isdisjoint(second_items[:1] + second_items[2:])
    assert a["stages"][0]["candidates"] == 300
    assert b["stages"][0]["candidates"] == 310  # asked for n + the 10 seen
    # The impressions: in Redis (the seen set, within the window) and in Kafka (the tiers' input).
    seen = {m.decode() for m in client.zrange(seen_key, 0, -1)}
    assert seen == set(first_items) | set(second_items)
    assert 0 < client.pttl(seen_key) <= FUNNEL.seen_window_s * 1000
    got = _read(kafka_bootstrap, topic, 21)
    shown = [(d.event["event_type"], d.event["item_id"], d.event["position"]) for d in got]
    expected = [("impression", item, pos + 1) for pos, item in enumerate(first_items)]
    assert shown[:10] == expected
    assert shown[10] == ("click", world.item_ids[3], None)
    assert shown[11:] == [("impression", item, pos + 1) for pos, item in enumerate(second_items)]
    # /metrics: a histogram per stage, two requests each.
    page = metrics_page.text
    for stage in ("retrieve", "seen", "rank", "rerank", "rules"):
        assert f'headwater_funnel_stage_seconds_count{{stage="{stage}"}} 2.0' in page
    assert 'headwater_funnel_stage_candidates_sum{stage="rules"} 20.0' in page
    client.close()
    reader.close()


def _read(bootstrap: str, topic: str, expected: int) -> list[DecodedEvent]:
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, consumer_timeout_ms=20_000
    )
    consumer.assign([TopicPartition(topic, 0)])
    consumer.seek_to_beginning()
    codec = EventCodec()
    out = []
    for record in consumer:
        got = codec.decode(record.value, record.headers)
        assert isinstance(got, DecodedEvent), got
        out.append(got)
        if len(out) >= expected:
            break
    consumer.close()
    return out
