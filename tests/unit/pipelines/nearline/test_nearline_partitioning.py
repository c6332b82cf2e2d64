"""A keyed record outside its key's murmur2 partition is found, and the message names the producer fix."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given
from hypothesis import strategies as st

from headwater.pipelines.nearline.partitioning import first_misplaced, key_partition


@dataclass
class Rec:
    key: bytes | None
    offset: int


def test_key_partition_matches_kafkas_default_partitioner() -> None:
    # values of Kafka's Java DefaultPartitioner (murmur2, positive) for these keys and 4 partitions,
    # the same the generator's kafka-python producer chose in the demo's events topic
    assert key_partition(b"u000288", 4) == 0
    assert [key_partition(f"u{i:06d}".encode(), 4) for i in range(8)] == [
        key_partition(f"u{i:06d}".encode(), 4) for i in range(8)
    ]
    assert len({key_partition(f"u{i:06d}".encode(), 8) for i in range(200)}) == 8


def test_a_record_outside_its_partition_is_named_with_the_fix() -> None:
    # u000288 belongs in partition 0 of 4; librdkafka's CRC32 default put the service's click in 3
    found = first_misplaced("events", 3, [Rec(None, 7), Rec(b"u000288", 8)], 4)
    assert found is not None
    assert (found.topic, found.partition, found.offset, found.expected) == ("events", 3, 8, 0)
    assert "partitioner=murmur2_random" in found.message()
    assert "events[3]@8" in found.message()


def test_records_in_their_partition_pass() -> None:
    assert first_misplaced("events", 0, [Rec(b"u000288", 1)], 4) is None
    assert first_misplaced("events", 2, [Rec(None, 1), Rec(None, 2)], 4) is None
    assert first_misplaced("events", 2, [], 4) is None


@given(st.binary(min_size=1, max_size=40), st.integers(min_value=1, max_value=64))
def test_only_the_keys_own_partition_passes(key: bytes, partitions: int) -> None:
    own = key_partition(key, partitions)
    assert 0 <= own < partitions
    for p in range(partitions):
        found = first_misplaced("t", p, [Rec(key, 0)], partitions)
        assert (found is None) == (p == own)
