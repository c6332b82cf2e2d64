"""Kafka topics of the platform, and a broker health check that proves a real round trip.

``headwater topics create`` makes the topic of every source of the applied plan and the dead-letter
topic, with the configured partition count (``make services-up`` runs it before anything is applied:
the example repo's sources stand in for the plan then); ``headwater topics health`` produces one
record and reads it back, which is what ``infra/kafka.sh`` waits for: an open port is not a working
broker.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterable

from kafka import TopicPartition
from kafka.admin import NewTopic
from kafka.errors import KafkaError, TopicAlreadyExistsError

from headwater.pipelines import kafka as kafka_clients
from headwater.pipelines.settings import Settings
from headwater.registry.plans import PlanSource

HEALTH_TOPIC = "__headwater_health"

# Dead letters are kept longer than events: they are evidence to investigate, not traffic.
DLQ_RETENTION_MS = str(30 * 24 * 3600 * 1000)


def replication_factor() -> int:
    """Return the replication factor of new topics: ``HEADWATER_KAFKA_REPLICATION``, else 1 (one broker).

    The cluster profile's 3 brokers (infra/cluster.sh) take 3; its brokers' min.insync.replicas 2
    then lets one broker be down without a write with acks=all failing.
    """
    return int(os.environ.get("HEADWATER_KAFKA_REPLICATION", "1"))


def ensure_topics(
    settings: Settings, topics: dict[str, dict[str, str]], partitions: int, replication: int | None = None
) -> list[str]:
    """Create the topics that do not exist yet; return the names that were created.

    Existing topics are left as they are (their partition count is never changed here: that
    would move keys between partitions and break per-user ordering). ``replication`` defaults to
    :func:`replication_factor`.
    """
    factor = replication or replication_factor()
    admin = kafka_clients.admin(settings.kafka_bootstrap, client_id="headwater-admin")
    try:
        existing = set(admin.list_topics())
        missing = [
            NewTopic(name=name, num_partitions=partitions, replication_factor=factor, topic_configs=configs)
            for name, configs in topics.items()
            if name not in existing
        ]
        created: list[str] = []
        for topic in missing:
            try:
                admin.create_topics([topic])
                created.append(topic.name)
            except TopicAlreadyExistsError:
                pass  # created concurrently by another process: the outcome we wanted
        return created
    finally:
        admin.close()


def platform_topics(
    settings: Settings, sources: Iterable[PlanSource] | None = None
) -> dict[str, dict[str, str]]:
    """Return the topics a deployment needs, with their configs: each source's, then the dead letters.

    Without ``sources``, the configured events topic stands for them (``HEADWATER_EVENTS_TOPIC``).
    """
    names = [s.topic for s in sources] if sources is not None else [settings.events_topic]
    topics: dict[str, dict[str, str]] = {name: {} for name in names}
    topics[settings.dlq_topic] = {"retention.ms": DLQ_RETENTION_MS}
    return topics


def round_trip(settings: Settings, timeout_s: float) -> float:
    """Produce one record to the health topic and consume it back; return the seconds it took.

    Raises:
        KafkaError: the broker did not accept or return the record within ``timeout_s``.
    """
    started = time.monotonic()
    ensure_topics(settings, {HEALTH_TOPIC: {"retention.ms": "3600000"}}, partitions=1)
    token = uuid.uuid4().hex.encode()
    producer = kafka_clients.producer(settings.kafka_bootstrap, acks="all")
    try:
        meta = producer.send(HEALTH_TOPIC, token).get(timeout=timeout_s)
    finally:
        producer.close(timeout=timeout_s)
    consumer = kafka_clients.consumer(settings.kafka_bootstrap, enable_auto_commit=False)
    try:
        partition = TopicPartition(HEALTH_TOPIC, meta.partition)
        consumer.assign([partition])
        consumer.seek(partition, meta.offset)
        deadline = started + timeout_s
        while time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=200).values():
                if any(record.value == token for record in records):
                    return time.monotonic() - started
    finally:
        consumer.close()
    msg = f"record produced to {HEALTH_TOPIC} was not consumed back within {timeout_s} s"
    raise KafkaError(msg)
