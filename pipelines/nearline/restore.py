"""Restore a partition's store from the compacted changelog, incrementally where possible.

The store (local folder, or a copy of its last RocksDB checkpoint) remembers the changelog
offset it reflects (``c``); only the changelog after it is replayed. When the changelog no
longer holds that tail (its log start moved past it), the store is wiped and rebuilt from the
whole changelog.
"""

from __future__ import annotations

import functools
import logging

from kafka import TopicPartition

from headwater.pipelines import kafka as kafka_clients
from headwater.pipelines.nearline.state import PartitionStore
from headwater.pipelines.nearline.task import PartitionTask
from headwater.pipelines.settings import Settings

CHUNK = 50_000
log = logging.getLogger("headwater.nearline")


def restore_partition(
    settings: Settings, changelog: str, partition: int, store: PartitionStore, task: PartitionTask
) -> int:
    """Bring ``store`` up to the changelog's end, load it into ``task``; return records replayed."""
    tp = TopicPartition(changelog, partition)
    consumer = kafka_clients.consumer(
        settings.kafka_bootstrap,
        enable_auto_commit=False,
        max_partition_fetch_bytes=16 * 1024 * 1024,
        fetch_max_bytes=64 * 1024 * 1024,
        check_crcs=check_crcs(),
        isolation_level="read_committed",  # only committed batches (fence.py); end = last stable offset
    )
    replayed = 0
    try:
        consumer.assign([tp])
        start = consumer.beginning_offsets([tp])[tp]
        end = consumer.end_offsets([tp])[tp]
        pos = store.changelog_position()
        if pos + 1 < start:
            store.wipe()
            pos = -1
        if pos + 1 < end:
            consumer.seek(tp, max(pos + 1, start))
            pending: list[tuple[bytes, bytes | None]] = []
            last = pos
            # by position, not by record offset: transaction markers and aborted records take offsets
            # that no record read_committed returns
            while consumer.position(tp) < end:
                # A short poll: after a killed owner, the tail is an aborted transaction (and its
                # marker) that returns no record but moves the position; a 1 s poll here cost a
                # second a partition inside the rebalance callback, past the session timeout.
                for rec in consumer.poll(timeout_ms=100).get(tp, []):
                    pending.append((rec.key, rec.value))
                    last = rec.offset
                if len(pending) >= CHUNK or (consumer.position(tp) >= end and pending):
                    store.apply_changelog(pending, last)
                    replayed += len(pending)
                    pending = []
    finally:
        consumer.close()
    task.load(store.load())
    return replayed


def check_crcs(wanted: bool | None = None) -> bool:
    """Return whether a consumer should verify record CRCs (None: only with the C ``crc32c`` module)."""
    return _have_crc32c() if wanted is None else wanted


@functools.cache
def _have_crc32c() -> bool:
    try:
        import crc32c  # noqa: F401  (kafka-python uses it when importable)
    except ImportError:
        log.warning(
            "the C crc32c module is not installed: consuming without record CRC checks "
            "(kafka-python's pure-Python CRC-32C costs about 30 us of CPU per record; `pip install crc32c`)"
        )
        return False
    return True
