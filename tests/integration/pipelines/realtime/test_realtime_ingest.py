"""The realtime job on payments pushed through the push API, under a client retry storm: each counts once.

The push API's REST app runs in process over the real Kafka sink (librdkafka, acks=all, murmur2)
with the realtime plan's sources, payments on this test's topic. The scripted payments of
``test_realtime_sources.py`` are pushed three times over (the same ids each time, as a client that
never saw its answers would resend them); the realtime job's ``account_payments_realtime`` then
equals the reference over the payments sent once.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis
from fastapi.testclient import TestClient
from kafka import KafkaAdminClient
from kafka.admin import NewTopic

from headwater.client import IngestClient
from headwater.registry.plans import TierPlan
from headwater.serving.ingest.core import IngestService
from headwater.serving.ingest.rest import ingest_app
from headwater.serving.ingest.sink import KafkaIngestSink

from .conftest import JobProcess, Names, expected_vectors, read_store, wait_for
from .test_realtime_sources import B_PAY, as_reference, payment, script

pytestmark = pytest.mark.integration


@pytest.fixture
def pay_topic(kafka_bootstrap: str) -> Any:
    topic = f"test.rt.push.{uuid.uuid4().hex[:8]}"
    admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    admin.create_topics([NewTopic(topic, 1, 1)])
    yield topic
    admin.delete_topics([topic])
    admin.close()


def test_pushed_payments_count_once_under_a_retry_storm(
    plan: tuple[TierPlan, Path],
    names: Names,
    pay_topic: str,
    kafka_bootstrap: str,
    redis_url: str,
    tmp_path: Path,
) -> None:
    tier_plan, state = plan
    sources = {s.name: s for s in tier_plan.sources}
    sources["payments"] = sources["payments"].model_copy(update={"topic": pay_topic})
    service = IngestService(sources, KafkaIngestSink(kafka_bootstrap, [pay_topic]))
    http = TestClient(ingest_app(service))
    log = tmp_path / "job.log"
    job = JobProcess(state, names, tmp_path / "checkpoints", log, sources={"payments": pay_topic})
    client = redis.Redis.from_url(redis_url)
    try:
        good = script()
        with IngestClient("http://testserver", "payments", http=http, event_id_field="payment_id") as push:
            for _ in range(3):  # the storm: every batch again, same ids
                assert {e.status for e in push.send(good)} == {"accepted"}
            movers = [
                payment(13, "zz", "authorized", 25_000, 1.0),
                payment(14, "zz", "authorized", 26_500, 1.0),
            ]
            assert {e.status for e in push.send(movers)} == {"accepted"}

        def published(entity: str, b_ms: int) -> bool:
            _, res = read_store(redis_url, names.namespace, tier_plan, "account_payments_realtime", [entity])
            return bool(res.found[0]) and int(res.event_time_ms[0]) >= b_ms

        wait_for(lambda: published("zz", B_PAY), 300, "payments at T0+26 s", log)
        ids = ["a1", "a2"]
        _, res = read_store(redis_url, names.namespace, tier_plan, "account_payments_realtime", ids)
        assert res.found.all()
        accepted = [as_reference(p) for p in good]
        ref, want = expected_vectors(
            tier_plan, "account_payments_realtime", accepted, ids, client, names.namespace, B_PAY
        )
        np.testing.assert_allclose(res.values, want, rtol=1e-6, equal_nan=True)
        # the values of the payments sent once (test_realtime_sources.py's), not three times over
        assert ref["a1"]["attempts_1m"] == 5.0
        assert ref["a1"]["captured_amount_5m"] == 10.0 + 5.5 + 12.25
        assert ref["a2"]["max_amount_5m"] == 30.0
    finally:
        job.kill()
        service.close()
        client.close()
