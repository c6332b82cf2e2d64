"""The loop back to Kafka: served impressions and posted feedback become behaviour events.

A request never waits for Kafka. :meth:`FeedbackProducer.offer` puts events into a bounded
in-process buffer and returns at once; when the buffer is full the events are dropped and
counted. One sender thread does the rest:

1. Connect a ``KafkaProducer`` (retrying every ``reconnect_s`` while Kafka is down; events keep
   buffering, then dropping).
2. Take the buffered events, encode each with the pipeline's codec (Avro value, ``schema-fp`` and
   ``produce-ts`` headers, key = user id: exactly what the generator's producer writes).
3. Hand them to the Kafka client, which batches them (``linger_ms``); its delivery callbacks count
   ``sent`` and ``failed``.

Counters (``sent``, ``dropped``, ``failed``, ``invalid``, buffered) are read by ``/metrics``.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import queue
import threading
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from headwater.pipelines.events.codec import EncodeError, EventCodec
from headwater.pipelines.events.schema import BehaviorEvent, Device, EventType
from headwater.serving.store import now_ms

logger = logging.getLogger(__name__)
_STOP = object()


class EventSink(Protocol):
    """What the sender thread needs from a Kafka producer (``kafka.KafkaProducer`` has it)."""

    def send(self, topic: str, *, value: bytes, key: bytes | None, headers: list[tuple[str, bytes]]) -> Any:
        """Queue one record; return a future with ``add_callback``/``add_errback``."""
        ...

    def flush(self, timeout: float | None = None) -> None:
        """Wait for queued records to be delivered."""
        ...

    def close(self, timeout: float | None = None) -> None:
        """Release the connections."""
        ...


SinkFactory = Callable[[], EventSink]


def kafka_sink_factory(bootstrap: str, linger_ms: int) -> SinkFactory:
    """Return a factory of ``KafkaProducer``s that give up quickly when the broker is down."""

    def connect() -> EventSink:
        from kafka import KafkaProducer

        producer: EventSink = KafkaProducer(
            bootstrap_servers=bootstrap,
            client_id="headwater-serving-feedback",
            acks=1,
            enable_idempotence=False,  # acks=1: an impression lost in a broker failover is acceptable
            linger_ms=linger_ms,
            compression_type="zstd",
            max_block_ms=1000,
            bootstrap_timeout_ms=1000,
            request_timeout_ms=5000,
            delivery_timeout_ms=30_000,
            allow_auto_create_topics=False,
            metrics_enabled=False,
        )
        return producer

    return connect


@dataclass
class FeedbackCounters:
    """Events by outcome since start."""

    sent: int = 0
    dropped: int = 0
    """Refused because the buffer was full (Kafka slow or down)."""
    failed: int = 0
    """Handed to Kafka but not acknowledged (or not accepted by the client)."""
    invalid: int = 0
    """Not encodable with the event schema (a bug upstream; logged)."""


class FeedbackProducer:
    """Non-blocking, batched producer of behaviour events (see the module docstring for the steps)."""

    def __init__(
        self, topic: str, connect: SinkFactory, max_buffer: int = 50_000, reconnect_s: float = 2.0
    ) -> None:
        """Send to ``topic`` through sinks made by ``connect``; buffer at most ``max_buffer`` events."""
        self.topic = topic
        self._connect = connect
        self._reconnect_s = reconnect_s
        self._buffer: queue.Queue[object] = queue.Queue(maxsize=max_buffer)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._sink: EventSink | None = None
        self.counters = FeedbackCounters()
        self.connected = False
        self._failures = 0

    @property
    def buffered(self) -> int:
        """Events waiting in the buffer."""
        return self._buffer.qsize()

    def start(self) -> None:
        """Start the sender thread (idempotent)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="headwater-feedback", daemon=True)
            self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Send what is buffered (within ``timeout_s``), then stop the thread and close the sink."""
        if self._thread is None:
            return
        self._stop.set()
        with contextlib.suppress(queue.Full):  # a full buffer: the thread sees the stop flag anyway
            self._buffer.put_nowait(_STOP)
        self._thread.join(timeout_s)
        self._thread = None

    def offer(self, events: Sequence[BehaviorEvent]) -> int:
        """Buffer ``events`` without waiting; return how many were accepted (the rest are dropped)."""
        accepted = 0
        for event in events:
            try:
                self._buffer.put_nowait(event)
            except queue.Full:
                with self._lock:
                    self.counters.dropped += len(events) - accepted
                break
            accepted += 1
        return accepted

    def _run(self) -> None:
        codec = EventCodec()
        while not self._stop.is_set() or not self._buffer.empty():
            # Step 1
            sink = self._sink or self._open()
            if sink is None:
                if self._stop.is_set():
                    self._drop_buffered()
                    break
                continue
            # Step 2, 3
            batch = self._take(512)
            for event in batch:
                self._send(sink, codec, event)
        if self._sink is not None:
            from kafka.errors import KafkaError

            try:
                self._sink.flush(timeout=2.0)
                self._sink.close(timeout=2.0)
            except (KafkaError, OSError):
                logger.warning("feedback producer: closing the Kafka client failed", exc_info=True)

    def _open(self) -> EventSink | None:
        from kafka.errors import KafkaError

        try:
            self._sink = self._connect()
        except (KafkaError, OSError) as exc:
            log = logger.warning if self._failures == 0 else logger.debug
            self._failures += 1
            self.connected = False
            log("feedback producer: Kafka unreachable (%s); retrying every %g s", exc, self._reconnect_s)
            self._stop.wait(self._reconnect_s)
            return None
        self.connected = True
        self._failures = 0
        logger.info("feedback producer connected; sending to topic %r", self.topic)
        return self._sink

    def _drop_buffered(self) -> None:
        dropped = 0
        while True:
            try:
                item = self._buffer.get_nowait()
            except queue.Empty:
                break
            dropped += item is not _STOP
        with self._lock:
            self.counters.dropped += dropped

    def _take(self, most: int) -> list[BehaviorEvent]:
        out: list[BehaviorEvent] = []
        try:
            item = self._buffer.get(timeout=0.2)
        except queue.Empty:
            return out
        while True:
            if item is not _STOP:
                out.append(item)  # type: ignore[arg-type]  # only events and the sentinel go in
            if len(out) >= most:
                return out
            try:
                item = self._buffer.get_nowait()
            except queue.Empty:
                return out

    def _send(self, sink: EventSink, codec: EventCodec, event: BehaviorEvent) -> None:
        from kafka.errors import KafkaError

        try:
            value = codec.encode(event)
        except EncodeError as exc:
            with self._lock:
                self.counters.invalid += 1
            logger.error("feedback event not sent: %s", exc)
            return
        try:
            future = sink.send(self.topic, value=value, key=codec.key(event), headers=codec.headers())
        except (KafkaError, OSError) as exc:
            with self._lock:
                self.counters.failed += 1
            logger.warning("feedback producer: send failed (%s)", exc)
            return
        future.add_callback(self._on_sent)
        future.add_errback(self._on_failed)

    def _on_sent(self, _metadata: object) -> None:
        with self._lock:
            self.counters.sent += 1
        self.connected = True

    def _on_failed(self, exc: BaseException) -> None:
        with self._lock:
            self.counters.failed += 1
        logger.warning("feedback producer: delivery failed (%s)", exc)


def new_request_id() -> str:
    """Return a fresh request id (32 hex digits)."""
    return uuid.uuid4().hex


def impression_events(
    request_id: str,
    user_id: str,
    items: Sequence[str],
    session_id: str | None = None,
    device: Device = "web",
    at_ms: int | None = None,
) -> list[BehaviorEvent]:
    """One ``impression`` per served item, ``position`` 1..K, ``event_id`` = ``<request id>:<position>``.

    The session is ``session_id`` or, without one, the request id; a click posted with the same
    session and position joins its impression in a training set's labels.
    """
    at = now_ms() if at_ms is None else at_ms
    session = session_id or request_id
    return [
        feedback_event(f"{request_id}:{pos}", user_id, item, "impression", at, session, device, position=pos)
        for pos, item in enumerate(items, start=1)
    ]


def feedback_event(
    event_id: str,
    user_id: str,
    item_id: str,
    event_type: EventType,
    at_ms: int,
    session_id: str,
    device: Device,
    *,
    position: int | None = None,
    category: str | None = None,
    price: float | None = None,
    dwell_ms: int | None = None,
) -> BehaviorEvent:
    """Build one behaviour event (the Avro schema's record); raise ValueError when it is not valid."""
    event: BehaviorEvent = {
        "event_id": event_id,
        "user_id": user_id,
        "item_id": item_id,
        "event_type": event_type,
        "event_time": at_ms,
        "session_id": session_id,
        "category": category,
        "price": price,
        "dwell_ms": dwell_ms,
        "query": None,
        "position": position,
        "device": device,
    }
    problem = _validator().validate(event)
    if problem is not None:
        msg = f"event {event_id!r} is not a valid behaviour event: {problem}"
        raise ValueError(msg)
    return event


@functools.cache
def _validator() -> EventCodec:
    """Return the behaviour source's codec, used only to validate (its rules come from sources.yaml)."""
    return EventCodec()
