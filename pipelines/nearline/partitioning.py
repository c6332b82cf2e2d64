"""Check that a source is partitioned as the nearline tier needs: each key in murmur2(key) % partitions.

The nearline tier keeps an entity's window state in the task of the partition its key lives in.
That holds only when every producer of the source puts a key in the partition Kafka's own
clients choose (murmur2 of the key bytes: the Java client, kafka-python, librdkafka with
``partitioner=murmur2_random``). librdkafka's default partitioner (CRC32) does not: a record it
placed elsewhere is folded by another task, which then writes its partial value over the
entity's real one (a topic partitioned by one other rule throughout would be consistent, but the
service's clicks and the repartition topics use murmur2). Nothing can repair that downstream, so
the worker checks one keyed record a batch (a few microseconds) and says which producer setting
to change.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kafka.partitioner.default import murmur2


def key_partition(key: bytes, partitions: int) -> int:
    """Return the partition Kafka's default partitioner gives ``key`` among ``partitions``."""
    hashed: int = murmur2(key)
    return (hashed & 0x7FFFFFFF) % partitions


@dataclass(frozen=True)
class Misplaced:
    """A keyed record found outside its key's partition."""

    topic: str
    partition: int
    offset: int
    key: bytes
    expected: int

    def message(self) -> str:
        """Return the log line: what was found, what it breaks, and the producer setting that fixes it."""
        return (
            f"{self.topic}[{self.partition}]@{self.offset}: key {self.key[:64]!r} belongs in partition "
            f"{self.expected} by Kafka's default partitioner (murmur2). headwater's own producers (the "
            "service's impressions and clicks) use murmur2: where a key's records sit in two partitions, "
            "two nearline tasks fold them and each writes its part as the whole value. Produce this topic "
            "with Kafka's default partitioner (librdkafka / confluent-kafka: partitioner=murmur2_random)"
        )


def first_misplaced(topic: str, partition: int, records: Sequence[Any], partitions: int) -> Misplaced | None:
    """Check the first keyed record of a batch; return it when it sits outside its key's partition."""
    for rec in records:
        key = rec.key
        if key is None:
            continue
        expected = key_partition(key, partitions)
        if expected != partition:
            return Misplaced(topic, partition, rec.offset, key, expected)
        return None
    return None
