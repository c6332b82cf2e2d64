"""The service's Kafka producers put a key in the partition every other producer of the source uses.

The nearline tier keeps an entity's state in the task of its key's partition, so a click the service
posts must land where the generator's (and any Java or kafka-python producer's) events of that user
land: murmur2 of the key. librdkafka's default partitioner is CRC32-based; with it a service click
went to another partition and that task wrote a one-click value over the user's real one (the
demo's nearline consistency check: clicks_24h online 1, offline 5).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from kafka import KafkaConsumer, TopicPartition
from kafka.admin import KafkaAdminClient, NewTopic
from kafka.partitioner.default import murmur2

from headwater.serving.feedback import kafka_sink_factory

PARTITIONS = 8


@pytest.fixture
def topic(kafka_bootstrap: str) -> Iterator[str]:
    name = f"hwtest-partitions-{uuid.uuid4().hex[:8]}"
    admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap, request_timeout_ms=10_000)
    admin.create_topics([NewTopic(name, PARTITIONS, 1)])
    yield name
    admin.delete_topics([name])
    admin.close()


def java_partition(key: bytes) -> int:
    """The partition Kafka's Java client (and kafka-python) gives a keyed record."""
    return (murmur2(key) & 0x7FFFFFFF) % PARTITIONS


@pytest.mark.parametrize("client", ["confluent", "kafka-python"])
def test_each_key_lands_in_its_murmur2_partition(kafka_bootstrap: str, topic: str, client: str) -> None:
    keys = [f"u{i:06d}".encode() for i in range(200)]
    sink = kafka_sink_factory(kafka_bootstrap, 5, client=client)()
    for key in keys:
        sink.send(topic, value=b"v-" + key, key=key, headers=[])
    sink.flush(30)
    sink.close(10)

    consumer = KafkaConsumer(
        bootstrap_servers=kafka_bootstrap, enable_auto_commit=False, consumer_timeout_ms=10_000
    )
    parts = [TopicPartition(topic, p) for p in range(PARTITIONS)]
    consumer.assign(parts)
    consumer.seek_to_beginning(*parts)
    landed: dict[bytes, int] = {}
    for record in consumer:
        landed[record.key] = record.partition
        if len(landed) == len(keys):
            break
    consumer.close()

    assert landed == {key: java_partition(key) for key in keys}
    assert len(set(landed.values())) == PARTITIONS  # the keys spread: the check compares real choices
