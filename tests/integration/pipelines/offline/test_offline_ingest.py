"""Pushed payments under a retry storm, offline tier: bronze lands every record, the views count each once.

The push API's REST app runs in process over the real Kafka sink; 200 payments 100 ms apart are
pushed three times over with the same ids. Landing (exactly once per Kafka record) puts all 600
records in bronze, each once by its Kafka position; the events an offline view aggregates
(:func:`~headwater.pipelines.offline.compute.view_events`) hold each payment once, on time (the
repeats are within the source's allowed lateness, so it is the event-id dedup that drops them).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from kafka import KafkaAdminClient

from headwater.client import IngestClient
from headwater.pipelines.offline.compute import view_events
from headwater.pipelines.offline.landing import Lander, LandingConfig
from headwater.pipelines.offline.testing import T0, payment, payments, view
from headwater.pipelines.settings import Settings
from headwater.pipelines.topics import ensure_topics
from headwater.serving.ingest.core import IngestService
from headwater.serving.ingest.rest import ingest_app
from headwater.serving.ingest.sink import KafkaIngestSink

pytestmark = pytest.mark.integration


@pytest.fixture
def topics(kafka_bootstrap: str) -> Iterator[tuple[str, str]]:
    name = f"offline-push-{uuid.uuid4().hex[:8]}"
    ensure_topics(Settings.from_env(), {name: {}, f"{name}.dlq": {}}, partitions=2)
    yield name, f"{name}.dlq"
    admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    admin.delete_topics([name, f"{name}.dlq"])
    admin.close()


def test_pushed_storm_lands_every_record_and_counts_each_payment_once(
    spark: Any, kafka_bootstrap: str, topics: tuple[str, str], tmp_path: Path
) -> None:
    topic, dlq = topics
    source = payments().model_copy(update={"topic": topic})
    service = IngestService({"payments": source}, KafkaIngestSink(kafka_bootstrap, [topic]))
    sent = [payment(i, f"a{i % 7}", T0 + i * 100, amount=float(i)) for i in range(200)]
    try:
        http = TestClient(ingest_app(service))
        with IngestClient("http://testserver", "payments", http=http, batch_size=64) as push:
            for _ in range(3):  # the storm: the same payments again, same ids
                assert {e.status for e in push.send(sent)} == {"accepted"}
    finally:
        service.close()

    config = LandingConfig(kafka_bootstrap, source, dlq, tmp_path / "bronze" / "payments")
    stats = Lander(spark, config).run()
    assert (stats.records, stats.landed, stats.late, stats.malformed) == (600, 600, 0, 0)
    bronze = spark.read.format("delta").load(str(config.table))
    rows = bronze.select("kafka_partition", "kafka_offset", "payment_id").collect()
    assert len({(r[0], r[1]) for r in rows}) == 600  # every record once by its Kafka position
    assert sorted(r[2] for r in rows) == sorted([p["payment_id"] for p in sent] * 3)

    spend = view("account_spend", "account", "account_id", [], source="payments")
    counted = view_events(bronze, spend, source).select("payment_id", "amount").collect()
    assert sorted((r[0], r[1]) for r in counted) == sorted((p["payment_id"], p["amount"]) for p in sent)
