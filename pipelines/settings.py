"""Where the services are: the one object every component asks for Kafka and Redis addresses.

The addresses, the dead-letter topic and the topics' partition count come from
:func:`headwater.registry.config.resolve` (``HEADWATER_KAFKA_BOOTSTRAP`` / ``HEADWATER_REDIS_URL``,
or ``HEADWATER_HOST`` with the port overrides the ``infra/`` scripts honour, ``HEADWATER_DLQ_TOPIC``,
``HEADWATER_PARTITIONS``; else the feature repo's headwater.yaml; else loopback), so the CLI, the
tiers, the tests and the benchmarks all reach the same services.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from headwater.registry.config import DEFAULT_DLQ_TOPIC, resolve
from headwater.registry.security import KafkaSecurity

EVENTS_TOPIC = "events"
DLQ_TOPIC = DEFAULT_DLQ_TOPIC


@dataclass(frozen=True)
class Settings:
    """Addresses and topic layout of the local platform."""

    kafka_bootstrap: str
    redis_url: str
    events_topic: str = EVENTS_TOPIC
    dlq_topic: str = DLQ_TOPIC
    partitions: int = 4
    redis_eviction: str = "refuse"
    """``redis.eviction``: whether a writing tier accepts an evicting Redis (:mod:`.store.connect`)."""
    kafka_security: KafkaSecurity = field(default_factory=KafkaSecurity)
    """``kafka.security``: every Kafka client's TLS and SASL settings (:mod:`.kafka` applies them)."""
    kafka_security_where: str = "default"
    """Where ``kafka.security`` was read (``headwater.yaml:7``), for the messages about its secrets."""
    repair_interval_s: float = 120.0
    """``nearline.repair.interval_s``: seconds between two nearline repair passes (0: none)."""
    repair_max_keys: int = 2000
    """``nearline.repair.max_keys``: keys a repair pass checks per step (:mod:`.nearline.repair`)."""

    @classmethod
    def from_env(cls) -> Settings:
        """Resolve the settings: ``HEADWATER_*`` variables, else headwater.yaml, else loopback.

        Raises:
            headwater.registry.config.ConfigError: the headwater.yaml in use is invalid.
        """
        found = resolve()
        return cls(
            kafka_bootstrap=found.kafka_bootstrap,
            redis_url=found.redis_url,
            events_topic=os.environ.get("HEADWATER_EVENTS_TOPIC", EVENTS_TOPIC),
            dlq_topic=found.dlq_topic,
            partitions=found.partitions,
            redis_eviction=found.redis_eviction,
            repair_interval_s=found.nearline_repair.interval_s,
            repair_max_keys=found.nearline_repair.max_keys,
            kafka_security=found.kafka_security,
            kafka_security_where=found.origins.get("kafka.security", "default"),
        )
