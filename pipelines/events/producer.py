"""Send generated behaviour events to Kafka at a target rate: key = the source's key, value = Avro, headers.

The producer paces itself by the generator's simulated clock, which runs at ``rate`` events
per second from the wall-clock start. ``rate = 0`` sends as fast as one process can (the
generator's clock then runs at :data:`MAX_MODE_SIM_RATE`, which only sets how sessions
interleave). Either way, an event's time is rebased on the wall clock when it is sent, keeping
the generator's intended lag for late and out-of-order events; a duplicate keeps the time of
the event it repeats. So event time matches the ``produce-ts`` header even when the producer
cannot keep up with ``rate``.

History mode (``history_s``) is for backfills and demos of the offline tier: the simulated clock
starts ``history_s`` before now and spreads ``max_events`` evenly over that span (even gaps along
the diurnal curve, so the last event is just before now, never after); events are
sent as fast as possible and keep their simulated (past) event times, so the last one is near
the wall clock and a streaming tier that reads them afterwards sees an ordinary ordered stream.
"""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any, Literal

from headwater.pipelines import kafka as kafka_clients
from headwater.pipelines.events.codec import HEADER_PRODUCE_TS, EventCodec
from headwater.pipelines.events.generator import EventGenerator, GeneratorConfig, base_rate_for
from headwater.registry.errors import HeadwaterError

if TYPE_CHECKING:
    from kafka import KafkaProducer

Compression = Literal["none", "gzip", "zstd", "lz4"]
_COMPRESSION_MODULES = {"zstd": "zstandard", "lz4": "lz4"}
Acks = Literal["0", "1", "all"]
MAX_MODE_SIM_RATE = 5_000.0
PROGRESS_EVERY_S = 1.0


class ProduceError(HeadwaterError, RuntimeError):
    """The broker or topic cannot be used; the message says which and what to do."""


@dataclass(frozen=True)
class ProducerSettings:
    """Where and how to send.

    Defaults were chosen with ``bench/bench_producer.py`` (kafka-python is the bottleneck):
    zstd and lz4 both cost less CPU per event than no compression (fewer bytes through
    kafka-python's Python send path); zstd needs no extra package. ``linger_ms`` 0 costs the
    most, 5-50 are alike. ``acks`` ``all`` (idempotent) is the durable default; ``1`` was not
    cheaper.
    """

    bootstrap: str
    topic: str
    rate: float = 1_000.0
    duration_s: float = 10.0
    max_events: int | None = None
    linger_ms: int = 20
    batch_size: int = 256 * 1024
    compression: Compression = "zstd"
    acks: Acks = "all"
    connect_timeout_s: float = 10.0
    history_s: float | None = None
    """Backfill mode: event times span the ``history_s`` seconds before now (needs ``max_events``)."""

    def __post_init__(self) -> None:
        """Reject a history without an event budget (its simulated rate would be undefined)."""
        if self.history_s is not None and (self.history_s <= 0 or not self.max_events):
            msg = "history mode needs a positive history and --max-events (events spread over the history)"
            raise ValueError(msg)

    def client_options(self) -> dict[str, Any]:
        """Return the options for :func:`headwater.pipelines.kafka.producer` (all but the bootstrap)."""
        durable = self.acks == "all"
        return {
            "client_id": "headwater-events-producer",
            "acks": "all" if durable else int(self.acks),
            "enable_idempotence": durable,
            "linger_ms": self.linger_ms,
            "batch_size": self.batch_size,
            "allow_auto_create_topics": False,
            "metrics_enabled": False,
            "compression_type": None if self.compression == "none" else self.compression,
            "max_block_ms": int(self.connect_timeout_s * 1000),
            "bootstrap_timeout_ms": int(self.connect_timeout_s * 1000),
        }

    def kafka_config(self) -> dict[str, Any]:
        """Keyword arguments for ``kafka.KafkaProducer``: the bootstrap and :meth:`client_options`.

        For the benchmarks (``bench/``), which build their producer themselves; headwater's own code
        builds it with :func:`headwater.pipelines.kafka.producer`.
        """
        return {"bootstrap_servers": self.bootstrap, **self.client_options()}


@dataclass
class ProduceStats:
    """Counts of one run. ``sent`` counts every record handed to Kafka, malformed ones included."""

    sent: int = 0
    malformed: int = 0
    duplicates: int = 0
    late: int = 0
    out_of_order: int = 0
    failed: int = 0
    """Records the broker did not acknowledge (known after the final flush)."""
    elapsed_s: float = 0.0
    cpu_s: float = 0.0
    """CPU time of this process (all threads) while sending and flushing."""

    @property
    def rate(self) -> float:
        """Records per second over the run."""
        return self.sent / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def as_dict(self) -> dict[str, float | int]:
        """Return the counts and the rate, for JSON output."""
        return {**asdict(self), "rate": round(self.rate, 1)}


def open_producer(settings: ProducerSettings, also: tuple[str, ...] = ()) -> KafkaProducer:
    """Connect a tuned ``KafkaProducer`` and check that ``settings.topic`` (and the ``also`` topics) exist.

    Raises:
        ProduceError: no broker at ``settings.bootstrap``, or a topic does not exist.
    """
    from kafka.errors import KafkaTimeoutError

    module = _COMPRESSION_MODULES.get(settings.compression)
    if module is not None and importlib.util.find_spec(module) is None:
        msg = (
            f"compression {settings.compression!r} needs the Python package {module!r}: pip install {module}"
        )
        raise ProduceError(msg)
    try:
        producer = kafka_clients.producer(settings.bootstrap, **settings.client_options())
    except KafkaTimeoutError:
        msg = (
            f"no Kafka broker answers at {settings.bootstrap} within {settings.connect_timeout_s:g}s; "
            "start it with `make services-up` "
            "or point HEADWATER_KAFKA_BOOTSTRAP at yours"
        )
        raise ProduceError(msg) from None
    for topic in (settings.topic, *also):
        try:
            producer.partitions_for(topic)
        except KafkaTimeoutError:
            producer.close(timeout=1)
            msg = (
                f"topic {topic!r} not found on {settings.bootstrap} within "
                f"{settings.connect_timeout_s:g}s; create it with `headwater topics create` "
                "(done by `make services-up`; after `headwater apply` for a new source)"
            )
            raise ProduceError(msg) from None
    return producer


def produce(
    settings: ProducerSettings,
    config: GeneratorConfig | None = None,
    progress: Callable[[ProduceStats], None] | None = None,
    producer: KafkaProducer | None = None,
    codec: EventCodec | None = None,
) -> ProduceStats:
    """Generate behaviour events and send them for ``settings.duration_s`` seconds (or ``max_events``).

    ``config`` defaults to a :class:`GeneratorConfig` whose clock starts now and runs at
    ``settings.rate``; pass one to choose the seed and the shares of bad events (its
    ``start_ms`` and ``rate`` are replaced so that event times track the wall clock).
    ``progress`` is called about once a second and at the end. A given ``producer`` is
    flushed but not closed. ``codec`` is the behaviour source's (default: the example repo's);
    records are keyed by its declared key.
    """
    now_ms = time.time_ns() // 1_000_000
    config = config or GeneratorConfig()
    if settings.history_s is not None and settings.max_events:
        # evenly spaced, at the base rate whose diurnal curve fits one event more than the budget into
        # the span: the last event lands about one gap before now, never in the future
        start_ms = now_ms - int(settings.history_s * 1000)
        sim_rate = base_rate_for(config, settings.max_events + 1, start_ms, now_ms)
        config = replace(config, start_ms=start_ms, rate=sim_rate, even_gaps=True)
    else:
        sim_rate = settings.rate if settings.rate > 0 else MAX_MODE_SIM_RATE
        config = replace(config, start_ms=now_ms, rate=sim_rate)
    codec = codec or EventCodec()
    generator = EventGenerator(config, codec)
    own = producer is None
    kafka = open_producer(settings) if producer is None else producer
    stats = ProduceStats()
    try:
        cpu_started = time.process_time()
        started = _send_loop(kafka, settings, generator, codec, stats, progress)
        kafka.flush(timeout=60)
        stats.elapsed_s = time.monotonic() - started
        stats.cpu_s = time.process_time() - cpu_started
    finally:
        if own:
            kafka.close(timeout=10)
    if progress is not None:
        progress(stats)
    return stats


def _send_loop(
    kafka: KafkaProducer,
    settings: ProducerSettings,
    generator: EventGenerator,
    codec: EventCodec,
    stats: ProduceStats,
    progress: Callable[[ProduceStats], None] | None,
) -> float:
    """Send until the duration or the event budget is spent, sleeping when ahead of schedule.

    Returns the monotonic start time, so the caller can include the final flush in the rate.
    """
    history = settings.history_s is not None
    topic, paced = settings.topic, settings.rate > 0 and not history
    limit = settings.max_events if settings.max_events is not None else -1
    sim_start = generator.config.start_ms
    fp_header = codec.headers()[0]

    def on_error(_exc: BaseException) -> None:
        stats.failed += 1

    started = time.monotonic()
    deadline = started + (float("inf") if history else settings.duration_s)
    next_report = started + PROGRESS_EVERY_S
    for emission in generator:
        now = time.monotonic()
        if paced:
            due = started + (emission.sim_time_ms - sim_start) / 1000.0
            if due > now + 0.001:
                time.sleep(due - now)
                now = time.monotonic()
        if now >= deadline or stats.sent == limit:
            break
        wall_ms = time.time_ns() // 1_000_000
        produce_ts = (HEADER_PRODUCE_TS, str(wall_ms).encode("ascii"))
        event, bad = emission.event, emission.malformed
        if event is not None:
            if not (emission.duplicate or history):  # rebase on the wall clock, in place: duplicates copy it
                event["event_time"] += wall_ms - emission.sim_time_ms
            value = codec.encode(event)
            future = kafka.send(topic, value=value, key=codec.key(event), headers=[fp_header, produce_ts])
            stats.duplicates += emission.duplicate
            stats.late += emission.late
            stats.out_of_order += emission.out_of_order
        elif bad is not None:
            future = kafka.send(topic, value=bad.value, headers=[*bad.headers, produce_ts])
            stats.malformed += 1
        else:
            continue
        future.add_errback(on_error)
        stats.sent += 1
        if now >= next_report:
            stats.elapsed_s = now - started
            next_report = now + PROGRESS_EVERY_S
            if progress is not None:
                progress(stats)
    return started
