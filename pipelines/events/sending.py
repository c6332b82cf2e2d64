"""What every produce run of a source shares: its counts, the progress clock and the send call.

Used by the file loader (:mod:`headwater.pipelines.events.ingest`) and the schema-driven generator
(:mod:`headwater.pipelines.events.synthetic`); the behaviour generator keeps its own loop
(:mod:`headwater.pipelines.events.producer`), tuned for its malformed and late records.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from headwater.pipelines.events.codec import EventCodec

if TYPE_CHECKING:
    from kafka import KafkaProducer

PROGRESS_EVERY_S = 1.0


@dataclass
class RunStats:
    """Counts of one run: rows read (or generated), sent, rejected, and not acknowledged by the broker."""

    read: int = 0
    sent: int = 0
    rejected: int = 0
    failed: int = 0
    """Records the broker did not acknowledge (known after the final flush)."""
    elapsed_s: float = 0.0
    done: float | None = None
    """Share of the input read so far (None when unknown, or for a generated stream)."""
    first_event_ms: int | None = None
    """Smallest event time sent (after any time shift), UTC ms."""
    last_event_ms: int | None = None
    """Largest event time sent (after any time shift), UTC ms."""
    ignored_columns: list[str] = field(default_factory=list)
    """Columns of the input that the source's schema does not have (they are not sent)."""

    @property
    def rate(self) -> float:
        """Rows read per second over the run."""
        return self.read / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        """Return the counts, the rate and the event-time span, for JSON output."""
        return {
            "read": self.read,
            "sent": self.sent,
            "rejected": self.rejected,
            "failed": self.failed,
            "elapsed_s": round(self.elapsed_s, 3),
            "rate": round(self.rate, 1),
            "first_event_ms": self.first_event_ms,
            "last_event_ms": self.last_event_ms,
            "ignored_columns": self.ignored_columns,
        }


class Sender:
    """Send encoded events of one source to its topic, count them, and report progress about once a second."""

    def __init__(
        self,
        kafka: KafkaProducer,
        topic: str,
        codec: EventCodec,
        stats: RunStats,
        progress: Callable[[RunStats], None] | None,
    ) -> None:
        """Start the run's clock now."""
        self.kafka = kafka
        self.topic = topic
        self.codec = codec
        self.stats = stats
        self.progress = progress
        self.started = time.monotonic()
        self._next_report = self.started + PROGRESS_EVERY_S

    def _failed(self, _exc: BaseException) -> None:
        self.stats.failed += 1

    def send(self, value: bytes, key: bytes | None, event_time_ms: int) -> None:
        """Send one record with the ``schema-fp`` and ``produce-ts`` headers (produce time = now)."""
        headers = self.codec.headers(time.time_ns() // 1_000_000)
        future = self.kafka.send(self.topic, value=value, key=key, headers=headers)
        future.add_errback(self._failed)
        stats = self.stats
        stats.sent += 1
        if stats.first_event_ms is None or event_time_ms < stats.first_event_ms:
            stats.first_event_ms = event_time_ms
        if stats.last_event_ms is None or event_time_ms > stats.last_event_ms:
            stats.last_event_ms = event_time_ms

    def wait_until(self, due: float) -> None:
        """Sleep until the monotonic time ``due`` (reporting progress while waiting long)."""
        while True:
            now = time.monotonic()
            if due <= now + 0.001:
                return
            time.sleep(min(due - now, PROGRESS_EVERY_S))
            self.tick()

    def tick(self, done: float | None = None) -> None:
        """Report progress when a second has passed since the last report."""
        if done is not None:
            self.stats.done = done
        now = time.monotonic()
        if now >= self._next_report:
            self._next_report = now + PROGRESS_EVERY_S
            self.stats.elapsed_s = now - self.started
            if self.progress is not None:
                self.progress(self.stats)

    def finish(self, done: float | None = None) -> RunStats:
        """Flush, stop the clock and report the final counts."""
        self.kafka.flush(timeout=60)
        self.stats.elapsed_s = time.monotonic() - self.started
        if done is not None:
            self.stats.done = done
        if self.progress is not None:
            self.progress(self.stats)
        return self.stats
