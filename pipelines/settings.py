"""Where the services are: one place that reads the environment.

Every component (CLI, pipelines, tests, benchmarks) asks this module for the Kafka and Redis
addresses, so the port overrides honoured by the `infra/` scripts (``HEADWATER_KAFKA_PORT``,
``HEADWATER_REDIS_PORT``) reach all of them the same way.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

EVENTS_TOPIC = "events"
DLQ_TOPIC = "events.dlq"


@dataclass(frozen=True)
class Settings:
    """Addresses and topic layout of the local platform."""

    kafka_bootstrap: str
    redis_url: str
    events_topic: str = EVENTS_TOPIC
    dlq_topic: str = DLQ_TOPIC
    partitions: int = 4

    @classmethod
    def from_env(cls) -> Settings:
        """Read the settings from ``HEADWATER_*`` variables, defaulting to loopback."""
        host = os.environ.get("HEADWATER_HOST", "127.0.0.1")
        kafka_port = os.environ.get("HEADWATER_KAFKA_PORT", "9092")
        redis_port = os.environ.get("HEADWATER_REDIS_PORT", "6379")
        return cls(
            kafka_bootstrap=os.environ.get("HEADWATER_KAFKA_BOOTSTRAP", f"{host}:{kafka_port}"),
            redis_url=os.environ.get("HEADWATER_REDIS_URL", f"redis://{host}:{redis_port}/0"),
            events_topic=os.environ.get("HEADWATER_EVENTS_TOPIC", EVENTS_TOPIC),
            dlq_topic=os.environ.get("HEADWATER_DLQ_TOPIC", DLQ_TOPIC),
            partitions=int(os.environ.get("HEADWATER_PARTITIONS", "4")),
        )
