"""Fencing of zombie nearline workers: a transactional producer per partition task, a Redis owner epoch.

A worker that lost its partitions without knowing it (a GC or SIGSTOP pause longer than the session
timeout, a network partition) may wake up in the middle of a batch. Without a fence it would append
its stale panes and meta record to the compacted changelog after the new owner's (a later restore
would read them back) and overwrite the new owner's values in Redis. Two fences, one per system:

**Kafka: one transactional producer per partition task** (kafka-python >= 2.1 has KIP-98
transactions and KIP-447 group metadata). Its ``transactional.id`` is stable per task,
``<changelog topic>.p<N>`` (the changelog topic names the group, the source and, for stage B, the
join key), so whoever owns the partition uses the same id. The new owner's ``init_transactions``,
run when the partition is assigned and BEFORE its restore, aborts the previous owner's open
transaction and bumps the producer epoch: from then on every send or commit of the zombie fails
with ``ProducerFencedError``. Each poll batch of a task is ONE transaction: its dead letters, the
events and watermark markers it forwards to repartition topics, every changelog record (panes,
dedup ids, outbox, meta) and the source offset (``send_offsets_to_transaction`` with the consumer's
group metadata, so the group coordinator also refuses a stale generation). Readers of these topics
(restore, backfill, stage B, ``headwater events tail``) read ``read_committed``: a batch is all there
or not at all, so dead letters are exactly once (issue 16 item 4) and the write-ahead ordering of
the meta record is no longer needed. Kafka Streams' ``exactly_once`` (v1) has the same shape: one
producer per task for the same reason (a per-worker transactional id would leave a zombie's open
transaction blocking every ``read_committed`` reader until the transaction timeout).

**Redis: an owner epoch per (view, task)**. The new owner claims
``<ns>:fence:{<view>}:<changelog>.p<N>`` for every view of the task before publishing anything: the
claim sets it one above whatever holds it (``OnlineStore.claim_fence``: max(held + 1, the group's
generation)), so it is greater than every earlier owner's even when the group's generations restarted
at 1 (the group deleted, or its metadata expired; the fence once took the generation as it came and
then refused every write for 7 days). Every online write of the task carries (owner, epoch) and
``write.lua`` refuses the whole call when the fence holds a greater epoch (same hash tag as the view's
keys, so it works on Redis Cluster). A zombie that committed its last transaction and paused before
its online writes is refused there (``FencedError``): the value at that boundary stays the new
owner's, including late events folded since. A fence lost with Redis data is claimed again from the
generation by the next owner, and re-taken by the next write (max wins).

A fenced worker raises :class:`NearlineFencedError`; the supervisor counts it (``errors_fenced``) and
starts a fresh worker, which rejoins the group and restores whatever it is assigned.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from kafka import TopicPartition
from kafka.errors import KafkaError

from headwater.pipelines import kafka as kafka_clients
from headwater.registry.errors import HeadwaterError

log = logging.getLogger("headwater.nearline")

TRANSACTION_TIMEOUT_MS = 300_000
"""How long the broker lets a transaction stay open (a backfill forwards a partition's history in
one); a dead owner's open transaction is aborted sooner, by the next owner's ``init_transactions``."""


class NearlineFencedError(HeadwaterError, RuntimeError):
    """A newer owner took a partition of this worker: its transaction or online write was refused."""


def transactional_id(changelog: str, partition: int) -> str:
    """Return the stable transactional id of the task of ``partition`` whose changelog is ``changelog``."""
    return f"{changelog}.p{partition}"


def fenced(exc: BaseException) -> bool:
    """Return whether ``exc`` (or its cause) says a newer owner fenced this producer or member."""
    from kafka.errors import (
        CommitFailedError,
        IllegalGenerationError,
        InvalidProducerEpochError,
        ProducerFencedError,
        UnknownMemberIdError,
    )

    from headwater.pipelines.store.store import FencedError

    kinds = (
        ProducerFencedError,
        InvalidProducerEpochError,
        CommitFailedError,
        IllegalGenerationError,
        UnknownMemberIdError,
        FencedError,
        NearlineFencedError,
    )
    cur: BaseException | None = exc
    for _ in range(20):
        if cur is None:
            return False
        if isinstance(cur, kinds):
            return True
        cur = cur.__cause__ or cur.__context__
    return False


class TaskProducer:
    """The transactional producer of one partition task: one transaction per batch (module docstring)."""

    def __init__(self, bootstrap: str, txn_id: str, compression: str | None) -> None:
        """Create the producer and fence every previous owner (``init_transactions``)."""
        self.txn_id = txn_id
        self.producer = kafka_clients.producer(
            bootstrap,
            transactional_id=txn_id,
            transaction_timeout_ms=TRANSACTION_TIMEOUT_MS,
            acks="all",
            linger_ms=5,
            batch_size=512 * 1024,
            max_request_size=8 * 1024 * 1024,
            compression_type=compression,
        )
        self.open = False
        try:
            self.producer.init_transactions()
        except BaseException:
            self.producer.close(timeout=0)
            raise

    def send(self, topic: str, **kwargs: Any) -> Any:
        """Send one record inside this batch's transaction (begun on the first send)."""
        if not self.open:
            self.producer.begin_transaction()
            self.open = True
        return self.producer.send(topic, **kwargs)

    def commit(self, offsets: Mapping[TopicPartition, Any], group_metadata: Any) -> None:
        """Commit the batch: its records and the consumed ``offsets`` of the group, atomically.

        Raises:
            NearlineFencedError: a newer owner of this task (or a newer group generation) fenced it.
        """
        if not self.open:
            if not offsets:
                return
            self.producer.begin_transaction()
            self.open = True
        try:
            if offsets:
                self.producer.send_offsets_to_transaction(dict(offsets), group_metadata)
            self.producer.commit_transaction()
        except KafkaError as exc:
            self._after_failure()
            if fenced(exc):
                msg = f"transaction {self.txn_id} was fenced: a newer owner has this partition ({exc!r})"
                raise NearlineFencedError(msg) from exc
            raise
        finally:
            self.open = False

    def abort(self) -> None:
        """Abort the open transaction, if any (its records are never read by ``read_committed`` readers)."""
        if self.open:
            self._after_failure()
        self.open = False

    def _after_failure(self) -> None:
        try:
            self.producer.abort_transaction()
        except Exception as exc:  # fenced or broker gone: the next owner's init aborts it anyway
            log.info("aborting transaction %s: %s", self.txn_id, exc)

    def flush(self) -> None:
        """Wait for the records in flight."""
        self.producer.flush()

    def partitions_for(self, topic: str) -> set[int]:
        """Return the partitions of ``topic``."""
        return set(self.producer.partitions_for(topic))

    def close(self) -> None:
        """Abort what is open and close the producer."""
        self.abort()
        self.producer.close(timeout=5)
