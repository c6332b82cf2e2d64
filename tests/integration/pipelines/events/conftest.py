"""Fixtures of the events integration tests: topics of their own on the real broker."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator

import pytest
from kafka import KafkaAdminClient
from kafka.admin import NewTopic


@pytest.fixture
def new_topic(kafka_bootstrap: str) -> Iterator[Callable[[int], str]]:
    """Create uniquely named topics for one test and delete them afterwards."""
    admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap, client_id="test-events-admin")
    created: list[str] = []

    def make(partitions: int) -> str:
        name = f"test.events.{uuid.uuid4().hex[:12]}"
        admin.create_topics([NewTopic(name=name, num_partitions=partitions, replication_factor=1)])
        created.append(name)
        deadline = time.monotonic() + 15
        while name not in admin.list_topics():
            assert time.monotonic() < deadline, f"topic {name} did not appear"
            time.sleep(0.1)
        return name

    yield make
    if created:
        admin.delete_topics(created)
    admin.close()
