"""The push API's Kafka producer: librdkafka, acks=all and idempotent, keys partitioned with murmur2.

librdkafka (confluent-kafka) rather than kafka-python: it batches, compresses and tracks deliveries
in C, which is what lets one process take tens of thousands of events a second
(``bench/bench_ingest.py``). The settings that matter, and why:

- ``acks=all`` + ``enable.idempotence``: an acknowledged event is on every in-sync replica, and the
  client's own retries never duplicate or reorder it within a partition;
- ``partitioner=murmur2_random``: a key's partition as Kafka's Java client and kafka-python (``events
  produce``) choose it, not librdkafka's CRC32 default; the nearline tier keeps an entity's state in
  the task of its key's partition, so pushed events must land beside the produced ones;
- ``queue.buffering.max.messages``: the buffer whose room :meth:`KafkaIngestSink.room` reports; a batch
  that does not fit is answered 429 instead of blocking the request.

One thread polls the producer, which runs the delivery callbacks (the core's per-batch acks).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from headwater.pipelines import kafka as kafka_clients
from headwater.registry.errors import HeadwaterError
from headwater.serving.ingest.core import OnDone

DEFAULT_BUFFER = 200_000
"""Records the producer holds before a batch is refused with 429."""
_LIBRDKAFKA_LOG = logging.getLogger(__name__ + ".librdkafka")
_LIBRDKAFKA_LOG.setLevel(logging.CRITICAL)  # a line per failed connect, many a second while Kafka is down


class SinkError(HeadwaterError, ConnectionError):
    """Kafka cannot be reached or a topic is missing; the message says which and what to do."""


class _Delivered:
    """librdkafka's delivery callback ``(err, msg)`` -> the core's ``on_done(error | None)``."""

    __slots__ = ("on_done",)

    def __init__(self, on_done: OnDone) -> None:
        self.on_done = on_done

    def __call__(self, err: Any, _msg: Any) -> None:
        self.on_done(None if err is None else ConnectionError(str(err)))


class KafkaIngestSink:
    """An :class:`~headwater.serving.ingest.core.IngestSink` over a librdkafka producer (see the module)."""

    def __init__(
        self,
        bootstrap: str,
        topics: list[str],
        *,
        buffer: int = DEFAULT_BUFFER,
        linger_ms: int = 5,
        connect_timeout_s: float = 10.0,
    ) -> None:
        """Connect and check that every topic of ``topics`` exists.

        Raises:
            SinkError: no broker answers, or a topic does not exist.
        """
        from confluent_kafka import KafkaException

        self.buffer = buffer
        self._producer = kafka_clients.confluent_producer(
            bootstrap,
            **{
                "client.id": "headwater-ingest",
                "acks": "all",
                "enable.idempotence": True,
                "partitioner": "murmur2_random",
                "linger.ms": linger_ms,
                "compression.type": "zstd",
                "queue.buffering.max.messages": buffer,
                "message.timeout.ms": 30_000,
                "allow.auto.create.topics": False,
                "logger": _LIBRDKAFKA_LOG,
            },
        )
        try:
            metadata = self._producer.list_topics(timeout=connect_timeout_s)
        except KafkaException as exc:
            self._producer.purge()
            msg = (
                f"no Kafka broker answers at {bootstrap} within {connect_timeout_s:g}s ({exc}); start it "
                "with `make services-up` or point HEADWATER_KAFKA_BOOTSTRAP at yours"
            )
            raise SinkError(msg) from None
        missing = [t for t in topics if t not in metadata.topics]
        if missing:
            msg = (
                f"topic(s) {', '.join(missing)} not found on {bootstrap}; create them with "
                "`headwater topics create` (after `headwater apply` for a new source)"
            )
            raise SinkError(msg)
        self._stop = threading.Event()
        self._poller = threading.Thread(target=self._poll, name="headwater-ingest-poll", daemon=True)
        self._poller.start()

    def send(
        self, topic: str, value: bytes, key: bytes | None, headers: list[tuple[str, bytes]], on_done: OnDone
    ) -> None:
        """Queue one record; ``on_done`` runs in the poll thread on the broker's answer.

        A full local queue calls ``on_done`` at once with ``BufferError``: the core's room check makes it
        rare (two requests racing for the last room).
        """
        pairs: list[tuple[str, str | bytes | None]] = list(headers)
        try:
            self._producer.produce(topic, value, key, on_delivery=_Delivered(on_done), headers=pairs)
        except BufferError:
            on_done(BufferError("the producer's buffer is full"))

    def room(self) -> int:
        """Return how many records can still be queued (the buffer less what librdkafka holds)."""
        return self.buffer - len(self._producer)

    def _poll(self) -> None:
        while not self._stop.is_set():
            self._producer.poll(0.05)

    def close(self, timeout_s: float) -> None:
        """Deliver what is queued (up to ``timeout_s``), then stop polling."""
        self._producer.flush(timeout_s)
        self._stop.set()
        self._poller.join(timeout=1.0)


class MemorySink:
    """An in-memory :class:`~headwater.serving.ingest.core.IngestSink`: records kept, acknowledged at once.

    For tests and for measuring the API without a broker. ``room`` is what :meth:`room` reports (the
    429 path); a topic in ``failing`` fails every delivery to it (the 503 path).
    """

    def __init__(self, room: int = DEFAULT_BUFFER, failing: frozenset[str] = frozenset()) -> None:
        """Start empty."""
        self.records: list[tuple[str, bytes, bytes | None, list[tuple[str, bytes]]]] = []
        self.free = room
        self.failing = failing
        self.closed = False
        self._lock = threading.Lock()

    def send(
        self, topic: str, value: bytes, key: bytes | None, headers: list[tuple[str, bytes]], on_done: OnDone
    ) -> None:
        """Keep the record and call ``on_done`` at once (with an error for a topic in ``failing``)."""
        if topic in self.failing:
            on_done(ConnectionError(f"topic {topic} is failing (MemorySink)"))
            return
        with self._lock:
            self.records.append((topic, value, key, headers))
        on_done(None)

    def room(self) -> int:
        """Return the room set by the test."""
        return self.free

    def close(self, timeout_s: float) -> None:
        """Mark closed."""
        self.closed = True
