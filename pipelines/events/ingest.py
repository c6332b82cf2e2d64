"""``headwater events produce --source NAME --from FILE``: load a user's rows into a source's topic.

Each row is read (:mod:`~headwater.pipelines.events.readers`), coerced and validated against the
source (:mod:`~headwater.pipelines.events.rows`), and either sent to the source's topic (keyed by
its declared key, with the ``schema-fp`` and ``produce-ts`` headers) or rejected with its line and
reason: to a JSON Lines reject file, or to the dead-letter topic. A bad row never stops the run.

Time shift (``--time-shift``): ``to-now`` moves the file's times so its newest event is now,
``from-now`` so its oldest is now, a signed duration (``+3650d``, ``-2h``) moves them by that much.
The ``to-now``/``from-now`` forms read the file twice (the first pass reads only the event time).
Pacing: as fast as possible, ``--rate R`` rows per second, or ``--pace recorded``: each row is sent
when its event time, counted from the file's first, has elapsed (``--speed`` times faster); with
``from-now`` that replays the file as live, each event arriving at its (shifted) event time.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Literal, Protocol

from headwater.pipelines.events.codec import DeadLetter, EventCodec, Reason
from headwater.pipelines.events.readers import FileRow, RowReader
from headwater.pipelines.events.rows import CheckedRow, RowChecker, RowError
from headwater.pipelines.events.sending import RunStats, Sender
from headwater.registry.durations import DurationError, parse_duration
from headwater.registry.errors import HeadwaterError
from headwater.registry.plans import PlanSource

if TYPE_CHECKING:
    from kafka import KafkaProducer

Pace = Literal["rate", "recorded"]
SHIFT_TO_NOW = "to-now"
SHIFT_FROM_NOW = "from-now"


class IngestError(HeadwaterError, ValueError):
    """The run cannot start (bad option, or a file with no usable event time); says what to change."""


@dataclass(frozen=True, slots=True)
class Reject:
    """A row of a user's file that was not taken: where it is in the file, the field at fault and why.

    One type for every path that reads a user's file (``events produce --from`` and ``events
    import``): ``reason`` says why (a message, or a reason code followed by ``detail``).
    """

    line: int
    field: str | None
    reason: str
    row: Any = None
    """The row's values as read (None when the row did not parse; then ``raw`` holds its text)."""
    raw: str | None = None
    detail: str | None = None
    """What exactly was wrong, when ``reason`` is a code."""
    code: str | None = None
    """The dead-letter reason, when it is not the default of the path (``invalid_id``: the id policy)."""

    def as_dict(self) -> dict[str, Any]:
        """Return the JSON form written to the reject file."""
        out: dict[str, Any] = {"line": self.line, "field": self.field, "reason": self.reason}
        if self.detail is not None:
            out["detail"] = self.detail
        if self.code is not None:
            out["code"] = self.code
        if self.row is not None:
            out["row"] = self.row
        if self.raw is not None:
            out["raw"] = self.raw
        return out

    def json(self) -> str:
        """One JSON line (values JSON cannot hold, such as Parquet dates, written as text)."""
        return json.dumps(self.as_dict(), ensure_ascii=False, default=str)


class RejectSink(Protocol):
    """Where rejected rows go."""

    where: str
    """A human-readable name of the place (a path, or ``topic NAME``)."""
    failed: int
    """Rejects that could not be kept (a dead letter the broker did not acknowledge)."""

    def write(self, reject: Reject) -> None:
        """Keep one reject."""

    def close(self) -> None:
        """Flush and release."""


class RejectFile:
    """Rejects as JSON Lines: ``{"line", "field", "reason", "row" | "raw"}``, one per rejected row.

    The file is truncated when the run starts, so it always describes the last run (empty: no rejects).
    """

    def __init__(self, path: Path) -> None:
        """Create (or truncate) ``path``.

        Raises:
            IngestError: the file cannot be written.
        """
        self.where = str(path)
        self.failed = 0
        try:
            self._file: IO[str] = path.open("w", encoding="utf-8", errors="surrogateescape")
        except OSError as exc:
            reason = exc.strerror or exc
            msg = f"cannot write the reject file {path} ({reason}); choose another with --reject-file"
            raise IngestError(msg) from exc

    def write(self, reject: Reject) -> None:
        """Append one reject line."""
        self._file.write(reject.json() + "\n")

    def close(self) -> None:
        """Close the file."""
        self._file.close()


class RejectTopic:
    """Rejects as dead letters on the DLQ topic: the row's JSON as the value, reason and file/line in headers.

    ``dlq-source-topic`` is the source's topic and ``dlq-source-partition`` is -1 (the row never
    reached it); ``dlq-source-offset`` is the row's line, and the ``source-file`` / ``source-line``
    headers say where it came from.
    """

    def __init__(self, kafka: KafkaProducer, dlq_topic: str, source_topic: str, path: Path) -> None:
        """Send to ``dlq_topic`` through ``kafka`` (flushed by the run, not closed here)."""
        self.where = f"topic {dlq_topic}"
        self.failed = 0
        self._kafka = kafka
        self._dlq = dlq_topic
        self._topic = source_topic
        self._path = str(path)

    def write(self, reject: Reject) -> None:
        """Send one dead letter."""
        if reject.row is not None:
            value = json.dumps(reject.row, ensure_ascii=False, default=str).encode("utf-8", "surrogateescape")
        else:
            value = (reject.raw or "").encode("utf-8", "surrogateescape")
        reason = Reason.CORRUPT_PAYLOAD if reject.row is None else Reason(reject.code or Reason.INVALID_FIELD)
        detail = f"{self._path}:{reject.line}: {reject.field + ': ' if reject.field else ''}{reject.reason}"
        letter = DeadLetter(
            value=value,
            key=None,
            reason=reason.value,
            detail=detail,
            source_topic=self._topic,
            source_partition=-1,
            source_offset=reject.line,
            failed_at_ms=time.time_ns() // 1_000_000,
            original_headers=[
                ("source-file", self._path.encode("utf-8", "surrogateescape")),
                ("source-line", str(reject.line).encode("ascii")),
            ],
        )
        future = self._kafka.send(self._dlq, value=letter.value, key=None, headers=letter.kafka_headers())
        future.add_errback(self._lost)

    def _lost(self, _exc: BaseException) -> None:
        self.failed += 1

    def close(self) -> None:
        """Nothing to release (the run flushes the producer)."""


@dataclass(frozen=True)
class FileOptions:
    """How to read and pace one file."""

    time_shift: str | None = None
    """``to-now``, ``from-now``, or a signed duration (``+3650d``, ``-2h``); None keeps the file's times."""
    rate: float = 0.0
    """Rows per second; 0 sends as fast as possible (also the cap under recorded pacing)."""
    pace: Pace = "rate"
    speed: float = 1.0
    """With recorded pacing: how many times faster than recorded."""
    max_rows: int | None = None
    """Stop after this many rows read."""

    def __post_init__(self) -> None:
        """Reject options that contradict each other, naming the fix."""
        if self.rate < 0 or self.speed <= 0:
            msg = f"--rate must be >= 0 and --speed > 0; got {self.rate} and {self.speed}"
            raise IngestError(msg)
        if self.time_shift is not None:
            shift_delta_ms(self.time_shift)  # fail before reading anything


def shift_delta_ms(text: str) -> int | None:
    """Return the shift of a signed duration in ms, or None for ``to-now``/``from-now`` (they need the file).

    Raises:
        IngestError: neither form.
    """
    raw = text.strip()
    if raw in (SHIFT_TO_NOW, SHIFT_FROM_NOW):
        return None
    sign = -1 if raw.startswith("-") else 1
    try:
        return sign * parse_duration(raw.lstrip("+-")).millis
    except DurationError as exc:
        msg = (
            f"--time-shift {text!r}: expected {SHIFT_TO_NOW}, {SHIFT_FROM_NOW} or a signed duration "
            f"such as +3650d or -2h ({exc})"
        )
        raise IngestError(msg) from None


def event_time_span(reader: RowReader, checker: RowChecker) -> tuple[int, int]:
    """Return the oldest and newest event time of the file's rows, in UTC ms (a first pass over the file).

    Raises:
        IngestError: no row has an event time that converts.
    """
    low: int | None = None
    high: int | None = None
    for row in reader.column(checker.source.event_time):
        ms = checker.event_time_ms(row.values) if row.error is None else None
        if ms is not None:
            low = ms if low is None or ms < low else low
            high = ms if high is None or ms > high else high
    if low is None or high is None:
        msg = (
            f"{reader.path}: no row has a readable event time in field {checker.source.event_time!r} "
            f"(source {checker.source.name!r}); --time-shift {SHIFT_TO_NOW}/{SHIFT_FROM_NOW} need one"
        )
        raise IngestError(msg)
    return low, high


def resolve_shift(
    text: str | None, reader: RowReader, checker: RowChecker, now_ms: int
) -> tuple[int, int | None]:
    """Return the shift in ms for ``--time-shift text``, and the file's oldest event time when it was read."""
    if text is None:
        return 0, None
    fixed = shift_delta_ms(text)
    if fixed is not None:
        return fixed, None
    low, high = event_time_span(reader, checker)
    return (now_ms - high if text.strip() == SHIFT_TO_NOW else now_ms - low), low


def check_row(checker: RowChecker, row: FileRow) -> CheckedRow | Reject:
    """Check one file row; a :class:`~headwater.pipelines.events.rows.CheckedRow` or a :class:`Reject`."""
    if row.error is not None:
        return Reject(row.line, None, row.error, None, row.raw)
    try:
        result = checker.check(row.values)
    except Exception as exc:
        reason = f"unexpected {type(exc).__name__}: {exc} (a bug in headwater: report it with this row)"
        return Reject(row.line, None, reason, row.values)
    if isinstance(result, RowError):
        return Reject(row.line, result.field, result.reason, row.values, code=result.code)
    return result


def produce_file(
    kafka: KafkaProducer,
    source: PlanSource,
    reader: RowReader,
    rejects: RejectSink,
    options: FileOptions | None = None,
    *,
    progress: Callable[[RunStats], None] | None = None,
    on_reject: Callable[[Reject], None] | None = None,
    now_ms: int | None = None,
    topic: str | None = None,
) -> RunStats:
    """Send every good row of ``reader`` to ``source.topic`` (or ``topic``) and every bad one to ``rejects``.

    ``kafka`` is flushed, not closed. ``on_reject`` sees each reject too (the CLI prints the first
    few). ``now_ms`` fixes "now" for the ``to-now``/``from-now`` shifts (tests).

    Raises:
        IngestError: ``--time-shift to-now|from-now`` and no row with an event time.
        FileFormatError: the file's structure breaks mid-way (rows before it were sent).
    """
    options = options or FileOptions()
    codec = EventCodec(source)
    checker = RowChecker(source, codec, text_cells=reader.text_cells)
    now = now_ms if now_ms is not None else time.time_ns() // 1_000_000
    checker.shift_ms, oldest = resolve_shift(options.time_shift, reader, checker, now)
    stats = RunStats()
    sender = Sender(kafka, topic or source.topic, codec, stats, progress)
    anchor_ms = None if oldest is None else oldest + checker.shift_ms
    limit = options.max_rows
    for row in reader:
        if limit is not None and stats.read >= limit:
            break
        stats.read += 1
        result = check_row(checker, row)
        if isinstance(result, Reject):
            stats.rejected += 1
            rejects.write(result)
            if on_reject is not None:
                on_reject(result)
            sender.tick(reader.done)
            continue
        if options.pace == "recorded":
            anchor_ms = result.event_time_ms if anchor_ms is None else anchor_ms
            sender.wait_until(sender.started + (result.event_time_ms - anchor_ms) / 1000.0 / options.speed)
        if options.rate > 0:
            sender.wait_until(sender.started + stats.sent / options.rate)
        sender.send(result.value, result.key, result.event_time_ms)
        sender.tick(reader.done)
    stats = sender.finish(reader.done)  # the flush also delivers the dead letters of the rejects
    stats.failed += rejects.failed
    stats.ignored_columns = sorted(checker.ignored_columns)
    return stats
