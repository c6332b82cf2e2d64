"""The loop back to Kafka: served impressions and posted feedback become behaviour events.

A request never waits for Kafka. :meth:`FeedbackProducer.offer` puts events, or one answer's
:class:`~headwater.serving.impressions.Impressions` as one unit, into a bounded in-process buffer
and returns at once; when the buffer is full the events are dropped and counted. One sender thread
does the rest:

1. Connect a ``KafkaProducer`` (retrying every ``reconnect_s`` while Kafka is down; events keep
   buffering, then dropping).
2. Take the buffered events, encode each with the pipeline's codec (Avro value, ``schema-fp`` and
   ``produce-ts`` headers, key = user id: exactly what the generator's producer writes). An answer's
   impressions are built and validated here, off the request path, and encoded from one template
   (:class:`~headwater.serving.impressions.AnswerEncoder`: the same bytes, one record per item).
3. Hand them to the Kafka client, which batches them (``linger_ms``); an answer's records go in one
   ``send_many`` call. The delivery callbacks count ``sent`` and ``failed``.

Counters (``sent``, ``dropped``, ``failed``, ``invalid``, buffered) are read by ``/metrics``.

Idempotent feedback (:class:`IdempotencyKeys`, :func:`receive_feedback`). A client sends an
idempotency key with a post (the ``Idempotency-Key`` header or the ``idempotency_key`` field) and
repeats it on every retry of that post. The contract:

- The event id comes from the key and the user id alone: ``fb-`` + 32 hex digits of
  SHA-256(user id, key), the same on every replica and after a restart. Impression ids are
  ``<32 hex digits>:<position>`` and feedback ids ``fb-<32 hex digits>``: neither can be the other
  (``-`` is not hex, and ``:`` is never in a feedback id). A client never chooses an id itself.
- The event time is the client's ``event_time_ms`` if it stamps one, else the receipt time of the
  first post of the key on this replica, remembered for ``IDEMPOTENCY_TTL_S`` (at most
  ``IDEMPOTENCY_MAX_KEYS`` keys, the oldest forgotten first). A retry on the same replica within
  that time therefore produces the same event, byte for byte, and sends it again (the first may
  not have reached Kafka); every tier counts an event id once. A retry that may reach another
  replica must carry the first attempt's ``event_time_ms``: without it that replica stamps its own
  receipt time, so the retry has the same id but another time (nearline and offline still count it
  once; the realtime tier recognises a duplicate within its entity and window slice, so it may
  count it twice if the two times fall in different slices).
- A key reused for a different feedback (another item, type, stamp...) is refused (422, field
  ``idempotency_key``) while this replica remembers the key.
- A post without a key is a new event each time (fresh id, time of the post).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import logging
import os
import queue
import re
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from headwater.pipelines import kafka as kafka_clients
from headwater.pipelines.events.codec import EncodeError, EventCodec
from headwater.pipelines.events.schema import BehaviorEvent, Device, EventType
from headwater.registry.errors import HeadwaterError
from headwater.serving.impressions import AnswerEncoder, Impressions
from headwater.serving.schemas import (
    IDEMPOTENCY_KEY_PATTERN,
    MAX_FEEDBACK_AGE_S,
    MAX_FEEDBACK_SKEW_S,
    FeedbackRequest,
)
from headwater.serving.store import now_ms

logger = logging.getLogger(__name__)
_LIBRDKAFKA_LOG = logging.getLogger(__name__ + ".librdkafka")
"""librdkafka's own log (a line per failed connect, many a second while Kafka is down): critical only
unless configured. :class:`FeedbackProducer` logs an unreachable Kafka and failed deliveries itself."""
if _LIBRDKAFKA_LOG.level == logging.NOTSET:
    _LIBRDKAFKA_LOG.setLevel(logging.CRITICAL)
_STOP = object()


class EventSink(Protocol):
    """What the sender thread needs from a Kafka producer (``kafka.KafkaProducer`` has it)."""

    def send(self, topic: str, *, value: bytes, key: bytes | None, headers: list[tuple[str, bytes]]) -> Any:
        """Queue one record; return a future with ``add_callback``/``add_errback``."""
        ...

    def send_many(
        self,
        topic: str,
        *,
        values: Sequence[bytes],
        key: bytes | None,
        headers: list[tuple[str, bytes]],
        on_sent: Callable[[Any], None],
        on_failed: Callable[[BaseException], None],
    ) -> int:
        """Queue one record per value, all with ``key`` and ``headers``, in order; return how many queued.

        The rest could not be queued (the client refused them). ``on_sent`` or ``on_failed`` runs
        once per queued record when its delivery is known.
        """
        ...

    def poll(self) -> None:
        """Run the delivery callbacks of what was acknowledged since the last call (without waiting)."""
        ...

    def flush(self, timeout: float | None = None) -> None:
        """Wait for queued records to be delivered."""
        ...

    def close(self, timeout: float | None = None) -> None:
        """Release the connections."""
        ...


SinkFactory = Callable[[], EventSink]


def kafka_sink_factory(bootstrap: str, linger_ms: int, client: str | None = None) -> SinkFactory:
    """Return a factory of Kafka producers that give up quickly when the broker is down.

    ``client``: ``confluent`` (librdkafka, :class:`ConfluentSink`: the default when
    ``confluent-kafka`` is installed) or ``kafka-python``; the environment variable
    ``HEADWATER_FEEDBACK_CLIENT`` chooses when ``client`` is None. librdkafka batches and
    compresses in C: 3-4x less CPU per impression than kafka-python (``bench/bench_impressions.py``).
    """
    chosen = (
        client
        or os.environ.get("HEADWATER_FEEDBACK_CLIENT")
        or ("confluent" if importlib.util.find_spec("confluent_kafka") is not None else "kafka-python")
    )
    if chosen == "confluent":
        return lambda: ConfluentSink(bootstrap, linger_ms)
    if chosen != "kafka-python":
        msg = f"feedback Kafka client {chosen!r}: use 'confluent' or 'kafka-python'"
        raise ValueError(msg)
    return python_kafka_sink_factory(bootstrap, linger_ms)


class _Delivery:
    """The future :meth:`ConfluentSink.send` returns: callbacks run from the sink's ``poll``."""

    __slots__ = ("_callbacks", "_errbacks")

    def __init__(self) -> None:
        self._callbacks: list[Callable[[Any], None]] = []
        self._errbacks: list[Callable[[BaseException], None]] = []

    def add_callback(self, fn: Callable[[Any], None]) -> None:
        self._callbacks.append(fn)

    def add_errback(self, fn: Callable[[BaseException], None]) -> None:
        self._errbacks.append(fn)

    def done(self, err: Any, msg: Any) -> None:
        if err is None:
            for fn in self._callbacks:
                fn(msg)
        else:
            exc = ConnectionError(str(err))
            for eb in self._errbacks:
                eb(exc)


class ConfluentSink:
    """An :class:`EventSink` over ``confluent_kafka.Producer`` (librdkafka), same settings as kafka-python's.

    Errors reach :class:`FeedbackProducer` as ``OSError`` (``ConnectionError``), as kafka-python's
    socket errors do: an unreachable broker at connect (a metadata request within 1 s), a full
    local queue that a 1 s poll did not drain. Delivery callbacks run in the sender thread, from
    :meth:`poll` (called after each batch) and :meth:`flush`.
    """

    def __init__(self, bootstrap: str, linger_ms: int) -> None:
        from confluent_kafka import KafkaException

        self._producer = kafka_clients.confluent_producer(
            bootstrap,
            **{
                "client.id": "headwater-serving-feedback",
                "acks": 1,
                "enable.idempotence": False,  # acks=1: an impression lost in a broker failover is acceptable
                "linger.ms": linger_ms,
                # the partition of a key as Kafka's Java client and kafka-python choose it (murmur2),
                # not librdkafka's default CRC32: the nearline tier keeps an entity's state in the
                # task of its key's partition, so the service's clicks must land beside the rest
                "partitioner": "murmur2_random",
                "compression.type": "zstd",
                "message.timeout.ms": 30_000,
                "request.timeout.ms": 5_000,
                "socket.connection.setup.timeout.ms": 1_000,
                "queue.buffering.max.messages": 200_000,
                "allow.auto.create.topics": False,
                "logger": _LIBRDKAFKA_LOG,
            },
        )
        try:
            self._producer.list_topics(timeout=1.0)
        except KafkaException as exc:
            self._producer.purge()  # nothing queued; close() would otherwise wait on the broker
            self._producer.close()  # or its threads keep reconnecting (and logging) after this attempt
            raise ConnectionError(f"Kafka at {bootstrap} unreachable: {exc}") from None
        self._sends = 0

    def send(self, topic: str, *, value: bytes, key: bytes | None, headers: list[tuple[str, bytes]]) -> Any:
        """Queue one record in librdkafka; return its :class:`_Delivery`."""
        delivery = _Delivery()
        pairs: list[tuple[str, str | bytes | None]] = list(headers)
        for attempt in range(2):
            try:
                self._producer.produce(topic, value, key, on_delivery=delivery.done, headers=pairs)
                break
            except BufferError:  # librdkafka's queue is full: let it send, then try once more
                if attempt:
                    msg = "the Kafka client's queue stayed full for 1 s"
                    raise ConnectionError(msg) from None
                self._producer.poll(1.0)
        self._sends += 1
        if self._sends % 1000 == 0:
            self._producer.poll(0)
        return delivery

    def send_many(
        self,
        topic: str,
        *,
        values: Sequence[bytes],
        key: bytes | None,
        headers: list[tuple[str, bytes]],
        on_sent: Callable[[Any], None],
        on_failed: Callable[[BaseException], None],
    ) -> int:
        """Queue the records in librdkafka with one delivery handle and one header list (see EventSink)."""
        delivery = _Delivery()
        delivery.add_callback(on_sent)
        delivery.add_errback(on_failed)
        pairs: list[tuple[str, str | bytes | None]] = list(headers)
        produce, done = self._producer.produce, delivery.done
        queued = 0
        for value in values:
            try:
                produce(topic, value, key, on_delivery=done, headers=pairs)
            except BufferError:  # librdkafka's queue is full: let it send, then try once more
                self._producer.poll(1.0)
                try:
                    produce(topic, value, key, on_delivery=done, headers=pairs)
                except BufferError:
                    break
            queued += 1
        before, self._sends = self._sends, self._sends + queued
        if before // 1000 != self._sends // 1000:
            self._producer.poll(0)
        return queued

    def poll(self) -> None:
        """Run the delivery callbacks of what was acknowledged since the last call."""
        self._producer.poll(0)

    def flush(self, timeout: float | None = None) -> None:
        """Wait (at most ``timeout`` s) for every queued record to be acknowledged."""
        self._producer.flush(-1 if timeout is None else timeout)

    def close(self, timeout: float | None = None) -> None:
        """Flush what is left, then stop the client's threads."""
        self.flush(timeout)
        self._producer.purge()
        self._producer.close()


def python_kafka_sink_factory(bootstrap: str, linger_ms: int) -> SinkFactory:
    """Return a factory of kafka-python ``KafkaProducer``s that give up quickly when the broker is down."""

    def connect() -> EventSink:
        producer = kafka_clients.producer(
            bootstrap,
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
        return PythonKafkaSink(producer)

    return connect


class PythonKafkaSink:
    """An :class:`EventSink` over kafka-python's ``KafkaProducer`` (its callbacks run on its own thread)."""

    def __init__(self, producer: Any) -> None:
        self._producer = producer

    def send(self, topic: str, *, value: bytes, key: bytes | None, headers: list[tuple[str, bytes]]) -> Any:
        """Queue one record; the future has ``add_callback``/``add_errback``."""
        return self._producer.send(topic, value=value, key=key, headers=headers)

    def send_many(
        self,
        topic: str,
        *,
        values: Sequence[bytes],
        key: bytes | None,
        headers: list[tuple[str, bytes]],
        on_sent: Callable[[Any], None],
        on_failed: Callable[[BaseException], None],
    ) -> int:
        """Queue the records one by one (kafka-python has no batch call); see EventSink."""
        from kafka.errors import KafkaError

        queued = 0
        for value in values:
            try:
                future = self._producer.send(topic, value=value, key=key, headers=headers)
            except (KafkaError, OSError):
                break
            future.add_callback(on_sent)
            future.add_errback(on_failed)
            queued += 1
        return queued

    def poll(self) -> None:
        """Nothing to do: kafka-python's I/O thread runs the delivery callbacks."""

    def flush(self, timeout: float | None = None) -> None:
        """Wait (at most ``timeout`` s) for every queued record to be acknowledged."""
        self._producer.flush(timeout)

    def close(self, timeout: float | None = None) -> None:
        """Flush what is left and close the connections."""
        self._producer.close(timeout)


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
        self.max_buffer = max_buffer
        # Unbounded queue, bounded by events: an answer's impressions take one slot and count as many.
        self._buffer: queue.Queue[object] = queue.Queue()
        self._buffered = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._sink: EventSink | None = None
        self.counters = FeedbackCounters()
        self.connected = False
        self._failures = 0
        self._flush_s = 15.0

    @property
    def buffered(self) -> int:
        """Events waiting in the buffer."""
        return self._buffered

    def start(self) -> None:
        """Start the sender thread (idempotent)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="headwater-feedback", daemon=True)
            self._thread.start()

    def stop(self, timeout_s: float = 30.0) -> None:
        """Send what is buffered and wait for Kafka's acknowledgements, then stop the thread.

        Nothing buffered is lost on a shutdown while Kafka answers: the thread sends the whole
        buffer and flushes the client before it ends; ``timeout_s`` bounds the wait (at ~30 us an
        event, a full buffer of 50,000 takes ~2 s) for a broker that stopped answering.
        """
        if self._thread is None:
            return
        self._flush_s = max(timeout_s / 2.0, 1.0)
        self._stop.set()
        self._buffer.put_nowait(_STOP)
        self._thread.join(timeout_s)
        self._thread = None

    def offer(self, events: Sequence[BehaviorEvent] | Impressions) -> int:
        """Buffer ``events`` without waiting; return how many were accepted (the rest are dropped).

        An answer's :class:`Impressions` is taken whole or dropped whole (one buffer slot, as many
        events as items); its events are built and validated by the sender thread.
        """
        if isinstance(events, Impressions):
            n = len(events)
            with self._lock:
                if self._buffered + n > self.max_buffer:
                    self.counters.dropped += n
                    return 0
                self._buffered += n
            self._buffer.put_nowait(events)
            return n
        with self._lock:
            accepted = max(0, min(len(events), self.max_buffer - self._buffered))
            self._buffered += accepted
            self.counters.dropped += len(events) - accepted
        for event in events[:accepted]:
            self._buffer.put_nowait(event)
        return accepted

    def _run(self) -> None:
        codec = EventCodec()
        encoder = AnswerEncoder(codec)
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
            for item in batch:
                if isinstance(item, Impressions):
                    self._send_answer(sink, encoder, item)
                else:
                    self._send(sink, codec, item)
            sink.poll()
        if self._sink is not None:
            from kafka.errors import KafkaError

            try:
                self._sink.flush(timeout=self._flush_s)
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
            if item is not _STOP:
                dropped += len(item) if isinstance(item, Impressions) else 1
        with self._lock:
            self.counters.dropped += dropped
            self._buffered -= dropped

    def _take(self, most: int) -> list[BehaviorEvent | Impressions]:
        """Take at most ``most`` events (an answer counts its items) buffered, waiting 0.2 s for one."""
        out: list[BehaviorEvent | Impressions] = []
        taken = 0
        try:
            item = self._buffer.get(timeout=0.2)
        except queue.Empty:
            return out
        while True:
            if item is not _STOP:
                out.append(item)  # type: ignore[arg-type]  # only events, answers and the sentinel go in
                taken += len(item) if isinstance(item, Impressions) else 1
            if taken >= most:
                break
            try:
                item = self._buffer.get_nowait()
            except queue.Empty:
                break
        with self._lock:
            self._buffered -= taken
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

    def _send_answer(self, sink: EventSink, encoder: AnswerEncoder, answer: Impressions) -> None:
        """Validate, encode and queue one answer's impressions: one record per item, one call."""
        from kafka.errors import KafkaError

        codec = encoder.codec
        events = answer.events()
        problem = first_invalid(codec, events)
        try:
            if problem is not None:
                raise EncodeError(problem)
            values = encoder.encode(events)
        except EncodeError as exc:
            with self._lock:
                self.counters.invalid += len(events)
            logger.error("feedback: the %d impressions of an answer not sent: %s", len(events), exc)
            return
        try:
            queued = sink.send_many(
                self.topic, values=values, key=codec.key(events[0]), headers=codec.headers(),
                on_sent=self._on_sent, on_failed=self._on_failed,
            )  # fmt: skip
        except (KafkaError, OSError) as exc:
            queued = 0
            logger.warning("feedback producer: send failed (%s)", exc)
        if queued < len(values):
            with self._lock:
                self.counters.failed += len(values) - queued
            logger.warning(
                "feedback producer: %d of %d records not queued", len(values) - queued, len(values)
            )

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
    session and position joins its impression in a training set's labels. Validated here (raises
    ValueError); the service offers :func:`impressions` instead, validated by the sender thread.
    """
    events = impressions(request_id, user_id, items, session_id, device, at_ms).events()
    problem = first_invalid(_validator(), events)
    if problem is not None:
        raise ValueError(problem)
    return events


def first_invalid(codec: EventCodec, events: Sequence[BehaviorEvent]) -> str | None:
    """Return why the first of ``events`` that ``codec`` rejects is not a valid event (None: all valid)."""
    for event in events:
        problem = codec.validate(event)
        if problem is not None:
            return f"event {event['event_id']!r} is not a valid behaviour event: {problem}"
    return None


def impressions(
    request_id: str,
    user_id: str,
    items: Sequence[str],
    session_id: str | None = None,
    device: Device = "web",
    at_ms: int | None = None,
    arm: str | None = None,
) -> Impressions:
    """Return one answer's impressions as one unit for :meth:`FeedbackProducer.offer`.

    The same records as :func:`impression_events` (with ``arm`` on each when given); the sender
    thread builds and validates them.
    """
    at = now_ms() if at_ms is None else at_ms
    return Impressions(request_id, user_id, tuple(items), at, session_id, device, arm)


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


IDEMPOTENCY_TTL_S = 600.0
"""How long a replica remembers a key's first receipt (longer than any client's retry schedule)."""
IDEMPOTENCY_MAX_KEYS = 100_000
"""Keys remembered at most (about 25 MB); past it the oldest are forgotten first."""
FEEDBACK_ID = re.compile(r"^fb-[0-9a-f]{32}$")
"""Every feedback event id (a fresh one or one derived from a key)."""
IMPRESSION_ID = re.compile(r"^[0-9a-f]{32}:[0-9]+$")
"""Every impression event id (``<request id>:<position>``)."""
_KEY = re.compile(IDEMPOTENCY_KEY_PATTERN)
HEADER, KEY_FIELD, TIME_FIELD, BODY = "Idempotency-Key", "idempotency_key", "event_time_ms", "body"
"""The fields a refusal names."""


class FeedbackRefused(HeadwaterError, ValueError):
    """A feedback post that cannot be accepted; ``field`` names the offending field."""

    status = 422
    """The HTTP status of the refusal (a subclass may answer another)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


def new_feedback_id() -> str:
    """Return a fresh feedback event id (``fb-`` + 32 hex digits), for a post without a key."""
    return f"fb-{new_request_id()}"


def feedback_event_id(user_id: str, key: str) -> str:
    """Return the event id of ``user_id``'s feedback with idempotency key ``key`` (same on every replica).

    The user id is part of it (length-prefixed, so no two pairs give the same input): two users'
    clients that happen to pick the same key do not share an id.
    """
    digest = hashlib.sha256(f"{len(user_id)}:{user_id}{key}".encode()).hexdigest()
    return f"fb-{digest[:32]}"


def idempotency_key(body_key: str | None, header_key: str | None) -> str | None:
    """Return the post's key (the field or the header; both must then agree), or None.

    Raises:
        FeedbackRefused: the header is not a key (1 to 128 printable ASCII characters, no
            space), or the header and the field differ.
    """
    if header_key is not None and not _KEY.fullmatch(header_key):
        msg = (
            f"must be 1 to 128 printable ASCII characters without spaces; got {len(header_key)} "
            "characters (use a UUID)"
        )
        raise FeedbackRefused(HEADER, msg)
    if body_key is not None and header_key is not None and body_key != header_key:
        msg = f"differs from the Idempotency-Key header ({header_key!r}); send one key, or the same in both"
        raise FeedbackRefused(KEY_FIELD, msg)
    return body_key if body_key is not None else header_key


@dataclass(frozen=True)
class FirstReceipt:
    """What a replica remembers of a key: the request's fingerprint and the event it produced."""

    fingerprint: str
    event_id: str
    event_time_ms: int
    expires_at: float


@dataclass(frozen=True)
class Receipt:
    """The event of an accepted feedback post."""

    event: BehaviorEvent
    replayed: bool
    """This replica had already accepted the key: the same event again."""
    send: bool
    """Send it to Kafka: false only for a replay whose event is older than the tiers accept (the
    first post was sent when it was fresh; sending it now would only make a ``late`` dead letter)."""


class IdempotencyKeys:
    """A bounded map of (user id, key) -> first receipt, each kept ``ttl_s`` (monotonic clock)."""

    def __init__(
        self,
        ttl_s: float = IDEMPOTENCY_TTL_S,
        max_keys: int = IDEMPOTENCY_MAX_KEYS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """Remember at most ``max_keys`` keys for ``ttl_s`` seconds each."""
        self.ttl_s = ttl_s
        self.max_keys = max_keys
        self._clock = clock
        self._seen: OrderedDict[tuple[str, str], FirstReceipt] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        """Keys remembered now (expired ones included until the next call drops them)."""
        return len(self._seen)

    def first(self, user_id: str, key: str) -> FirstReceipt | None:
        """Return the first receipt of ``key`` for ``user_id`` if remembered."""
        with self._lock:
            self._expire(self._clock())
            return self._seen.get((user_id, key))

    def remember(self, user_id: str, key: str, fingerprint: str, event_id: str, event_time_ms: int) -> None:
        """Remember a key's first receipt (a key already remembered keeps its first one)."""
        with self._lock:
            now = self._clock()
            self._expire(now)
            if (user_id, key) in self._seen:
                return
            self._seen[(user_id, key)] = FirstReceipt(fingerprint, event_id, event_time_ms, now + self.ttl_s)
            while len(self._seen) > self.max_keys:
                self._seen.popitem(last=False)

    def _expire(self, now: float) -> None:
        # One TTL for all: insertion order is expiry order, so expired keys are at the front.
        while self._seen:
            oldest = next(iter(self._seen.values()))
            if oldest.expires_at > now:
                break
            self._seen.popitem(last=False)


def _fingerprint(body: FeedbackRequest) -> str:
    """Everything of the post but its key: a retry has the same, another feedback does not."""
    data = body.model_dump(exclude={"idempotency_key"})
    return hashlib.sha256(repr(sorted(data.items())).encode()).hexdigest()


@dataclass(frozen=True)
class Checked:
    """A feedback post that passed :func:`check_feedback`; :meth:`accept` remembers its key."""

    receipt: Receipt
    keys: IdempotencyKeys
    user_id: str
    key: str | None
    fingerprint: str

    def accept(self) -> Receipt:
        """Remember the post's key (a first post with one) and return its receipt."""
        event = self.receipt.event
        if self.key is not None and not self.receipt.replayed:
            at = event["event_time"]
            self.keys.remember(self.user_id, self.key, self.fingerprint, event["event_id"], at)
        return self.receipt


def receive_feedback(
    body: FeedbackRequest, header_key: str | None, keys: IdempotencyKeys, now: int
) -> Receipt:
    """Return the event of a feedback post (see the module docstring for the idempotency contract).

    :func:`check_feedback` then :meth:`Checked.accept`; a caller with a check of its own between
    the two (the service's :class:`~headwater.serving.served.FeedbackGate`) calls them itself, so a
    post it refuses leaves no key behind.

    Raises:
        FeedbackRefused: a bad key, a key reused for another feedback, an event time out of bounds.
    """
    return check_feedback(body, header_key, keys, now).accept()


def check_feedback(body: FeedbackRequest, header_key: str | None, keys: IdempotencyKeys, now: int) -> Checked:
    """Return the event a feedback post makes, checked, with its key not yet remembered.

    Raises:
        FeedbackRefused: a bad key, a key reused for another feedback, an event time out of bounds.
    """
    key = idempotency_key(body.idempotency_key, header_key)
    fingerprint = _fingerprint(body) if key is not None else ""
    first = keys.first(body.user_id, key) if key is not None else None
    if first is not None and first.fingerprint != fingerprint:
        msg = (
            "was used for another feedback of this user (another item, type, time or field); a retry "
            "must repeat the first post exactly, a new feedback needs a new key"
        )
        raise FeedbackRefused(KEY_FIELD, msg)
    if first is not None:
        at, event_id = first.event_time_ms, first.event_id
    else:
        at = body.event_time_ms if body.event_time_ms is not None else now
        problem = feedback_time_problem(at, now)
        if problem is not None:
            raise FeedbackRefused(TIME_FIELD, problem)
        event_id = feedback_event_id(body.user_id, key) if key is not None else new_feedback_id()
    session = body.session_id or body.request_id or f"fb-{body.user_id}"
    try:
        event = feedback_event(
            event_id, body.user_id, body.item_id, body.event_type, at, session, body.device,
            position=body.position, category=body.category, price=body.price, dwell_ms=body.dwell_ms,
        )  # fmt: skip
    except ValueError as exc:
        raise FeedbackRefused(BODY, str(exc)) from None
    fresh = at >= now - MAX_FEEDBACK_AGE_S * 1000
    receipt = Receipt(event, replayed=first is not None, send=first is None or fresh)
    return Checked(receipt, keys, body.user_id, key, fingerprint)


def feedback_time_problem(at_ms: int, now: int) -> str | None:
    """Return what is wrong with a feedback event time (no field prefix), or None.

    The tiers dead-letter late events, so an old time is refused here, where the client hears it.
    """
    if at_ms < now - MAX_FEEDBACK_AGE_S * 1000:
        return (
            f"{at_ms} is {(now - at_ms) / 1000:.1f} s old; at most {MAX_FEEDBACK_AGE_S:g} s"
            " (omit it to use the time of the post)"
        )
    if at_ms > now + MAX_FEEDBACK_SKEW_S * 1000:
        return (
            f"{at_ms} is {(at_ms - now) / 1000:.1f} s in the future; at most"
            f" {MAX_FEEDBACK_SKEW_S:g} s (check the client's clock)"
        )
    return None
