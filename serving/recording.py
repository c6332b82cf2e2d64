"""Record a sample of ranking requests with their answers and timing, to rotating JSON Lines files or a topic.

The service never waits for the disk: :meth:`Recorder.offer` samples the request (``sample_rate``)
and puts one line into a bounded buffer; a full buffer drops the line (counted). One writer thread
appends the lines to ``path``; when the next line would take the file over ``max_bytes`` it
rotates (``path`` -> ``path.1`` -> ... -> ``path.<max_files>``, the oldest deleted), so the
recording never holds more than ``max_bytes x (max_files + 1)`` bytes.

One line per recorded request (:data:`RECORD_VERSION` 1)::

    {"v": 1, "at_ms": 1767225600123, "request": {...the body as sent...}, "status": 200,
     "latency_ms": 4.21, "answer": {"items": ["i7", "i3"], "model_version": "3f2a...",
     "fallback": null, "fallback_reason": null, "arm": "ranker-v2/control"}}

``at_ms`` is when the request arrived (UTC ms): ``headwater replay`` sends the lines again at
the same pacing. ``request`` holds the fields the client set, so a replay sends the same body.
:func:`read_records` reads such files back and names the file and line of anything else.

With ``topic`` set, the same records also go to Kafka (one JSON record each, keyed by user id; the
writer thread sends them, so the service never waits for Kafka either), and ``file: false`` keeps
the topic only; :func:`read_topic_records` reads a topic back, naming partition and offset of a
record that is not one. A topic is what several replicas can record into together.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import queue
import random
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from prometheus_client import CollectorRegistry, Gauge
from pydantic import BaseModel, ConfigDict, Field, model_validator

from headwater.pipelines import kafka as kafka_clients
from headwater.registry.errors import HeadwaterError

logger = logging.getLogger(__name__)
RECORD_VERSION = 1
MAX_LINE_BYTES = 4 * 1024 * 1024
"""A longer line is not a record (a request body is at most 512 KiB by default)."""
_STOP = object()


class RecordingConfig(BaseModel):
    """Which requests are recorded and how much disk the recording may take."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = False
    path: Path | None = None
    """The JSON Lines file; None: ``recordings/requests.jsonl`` in the state folder."""
    sample_rate: float = Field(default=0.01, ge=0.0, le=1.0)
    """Share of the ranking requests recorded (1.0: all)."""
    max_bytes: int = Field(default=64 * 1024 * 1024, ge=4096)
    """Size at which the file rotates."""
    max_files: int = Field(default=3, ge=0, le=100)
    """Rotated files kept beside the current one (``path.1`` is the newest)."""
    max_buffer: int = Field(default=10_000, ge=1)
    """Lines waiting for the writer; when full, new ones are dropped (and counted)."""
    topic: str | None = Field(default=None, pattern=r"^[A-Za-z0-9._-]{1,249}$")
    """Kafka topic the records go to as well (created when missing); None: the file only."""
    file: bool = True
    """Write the JSON Lines file; false (with a ``topic``): the topic only."""

    @model_validator(mode="after")
    def _somewhere(self) -> RecordingConfig:
        if not self.file and self.topic is None:
            msg = "file: false needs a topic: the recording would go nowhere"
            raise ValueError(msg)
        return self


@dataclass
class RecorderCounters:
    """Requests by outcome since start."""

    recorded: int = 0
    dropped: int = 0
    """Sampled but not written: the buffer was full."""
    failed: int = 0
    """The write failed (disk full, permissions; logged)."""
    rotations: int = 0


class Recorder:
    """Samples requests into a bounded buffer; a thread writes them to rotating files."""

    def __init__(
        self,
        config: RecordingConfig,
        path: Path,
        seed: int | None = None,
        connect: Callable[[], Any] | None = None,
    ) -> None:
        """Record to ``path`` (the config's, resolved by the caller) as ``config`` says.

        ``connect``: returns the Kafka producer (kafka-python's) of ``config.topic``; called by the
        writer thread at the first record, and again after a failed send.
        """
        self.config = config
        self.path = path
        self._connect = connect if config.topic is not None else None
        self.counters = RecorderCounters()
        self._rng = random.Random(seed)
        self._buffer: queue.Queue[object] = queue.Queue(maxsize=config.max_buffer)
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def register_metrics(self, registry: CollectorRegistry) -> None:
        """Report the counters as ``headwater_recorded_requests{result}`` in ``registry`` (read at scrape)."""
        gauge = Gauge(
            "headwater_recorded_requests",
            "Ranking requests sampled for recording since start, by result (recorded, dropped, failed).",
            ["result"],
            registry=registry,
        )
        c = self.counters
        gauge.labels("recorded").set_function(lambda: float(c.recorded))
        gauge.labels("dropped").set_function(lambda: float(c.dropped))
        gauge.labels("failed").set_function(lambda: float(c.failed))

    async def start(self) -> None:
        """Start the writer thread (the app's lifespan calls it)."""
        self.start_thread()

    async def stop(self) -> None:
        """Write what is buffered and stop the thread."""
        self.stop_thread()

    def start_thread(self) -> None:
        """Create the folder and start the writer (idempotent)."""
        if self._thread is None:
            if self.config.file:
                self.path.parent.mkdir(parents=True, exist_ok=True)
            self._thread = threading.Thread(target=self._run, name="headwater-recorder", daemon=True)
            self._thread.start()

    def stop_thread(self, timeout_s: float = 5.0) -> None:
        """Flush the buffer to disk (within ``timeout_s``) and stop."""
        if self._thread is None:
            return
        self._buffer.put(_STOP)
        self._thread.join(timeout_s)
        self._thread = None

    def sampled(self) -> bool:
        """Return whether the next request is recorded (draws from the sampler)."""
        rate = self.config.sample_rate
        return rate >= 1.0 or (rate > 0.0 and self._rng.random() < rate)

    def offer(
        self,
        at_ms: int,
        request: Mapping[str, Any],
        status: int,
        latency_ms: float,
        answer: Mapping[str, Any] | None,
    ) -> None:
        """Buffer one record (the caller sampled it with :meth:`sampled`); never blocks."""
        kept = None
        if answer is not None:
            kept = {
                "items": [x["item_id"] for x in answer.get("items", ())],
                **{k: answer.get(k) for k in ("model_version", "fallback", "fallback_reason", "arm")},
            }
        record = {
            "v": RECORD_VERSION,
            "at_ms": at_ms,
            "request": dict(request),
            "status": status,
            "latency_ms": round(latency_ms, 3),
            "answer": kept,
        }
        try:
            self._buffer.put_nowait(record)
        except queue.Full:
            with self._lock:
                self.counters.dropped += 1

    def _run(self) -> None:
        sink = _FileSink(self) if self.config.file else None
        producer = None
        try:
            while True:
                item = self._buffer.get()
                if item is _STOP:
                    break
                line = orjson.dumps(item) + b"\n"
                ok = sink.write(line) if sink is not None else True
                if self._connect is not None:
                    sent, producer = self._send(producer, line, item)
                    ok = ok and sent
                with self._lock:
                    if ok:
                        self.counters.recorded += 1
                    else:
                        self.counters.failed += 1
        finally:
            if sink is not None:
                sink.close()
            if producer is not None:
                with contextlib.suppress(Exception):
                    producer.flush(timeout=2.0)
                    producer.close(timeout=2.0)

    def _send(self, producer: Any, line: bytes, item: Any) -> tuple[bool, Any]:
        """Send one record to the topic; return whether it was handed to the producer, and the producer."""
        from kafka.errors import KafkaError

        try:
            producer = producer or (self._connect() if self._connect is not None else None)
            key = str(item["request"].get("user_id", "")).encode()
            producer.send(self.config.topic, value=line[:-1], key=key)
        except (KafkaError, OSError) as exc:
            logger.warning("recording to topic %s: not sent (%s); the request is not recorded there",
                           self.config.topic, exc)  # fmt: skip
            return False, None
        return True, producer

    def _rotate(self) -> None:
        """Shift ``path.i`` to ``path.i+1`` (dropping the last) and ``path`` to ``path.1``."""
        keep = self.config.max_files
        if keep == 0:
            self.path.unlink(missing_ok=True)
        else:
            oldest = self.path.with_name(f"{self.path.name}.{keep}")
            oldest.unlink(missing_ok=True)
            for i in range(keep - 1, 0, -1):
                older = self.path.with_name(f"{self.path.name}.{i}")
                if older.exists():
                    older.rename(self.path.with_name(f"{self.path.name}.{i + 1}"))
            self.path.rename(self.path.with_name(f"{self.path.name}.1"))
        with self._lock:
            self.counters.rotations += 1


class _FileSink:
    """The recorder's rotating file: appends whole lines, rotates before one would pass ``max_bytes``."""

    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder
        self.out: Any = None
        self.size = 0

    def write(self, line: bytes) -> bool:
        """Append ``line``; return False (logged) when the disk refused it."""
        rec = self.recorder
        try:
            if self.out is None:
                self.out = rec.path.open("ab")
                self.size = self.out.tell()
            if self.size and self.size + len(line) > rec.config.max_bytes:
                self.out.close()
                rec._rotate()
                self.out = rec.path.open("ab")
                self.size = 0
            self.out.write(line)
            self.size += len(line)
            if rec._buffer.empty():
                self.out.flush()  # a reader (or a crash) sees whole lines
        except OSError as exc:
            logger.warning("recording %s: write failed (%s); the request is not recorded", rec.path, exc)
            self.close()
            return False
        return True

    def close(self) -> None:
        """Close the file (the next write reopens it)."""
        if self.out is not None:
            with contextlib.suppress(OSError):
                self.out.close()
        self.out = None


def recording_path(config: RecordingConfig, state_dir: Path) -> Path:
    """Return where ``config`` records: its ``path``, else ``recordings/requests.jsonl`` in ``state_dir``."""
    return config.path if config.path is not None else state_dir / "recordings" / "requests.jsonl"


# --- reading a recording back -------------------------------------------------------------------


class RecordFileError(HeadwaterError, ValueError):
    """A recording that cannot be read; the message names the file and the line."""


@dataclass(frozen=True)
class Recorded:
    """One recorded request: when it came, the body sent, and the answer's status and ranked ids."""

    at_ms: int
    request: dict[str, Any]
    status: int
    latency_ms: float | None
    items: list[str] | None
    """The ranked item ids of the recorded answer (None: no answer was recorded)."""
    fallback: str | None
    """``<fallback> (<reason>)`` of the recorded answer, None when the DCN answered."""
    source: str
    """``file:line`` of the record."""


def read_records(paths: Sequence[Path]) -> list[Recorded]:
    """Read recordings (JSON Lines, as :class:`Recorder` writes) sorted by arrival time.

    Blank lines are skipped. Raises:
        RecordFileError: a file cannot be read, or a line is not a record; names file and line.
    """
    out: list[Recorded] = []
    for path in paths:
        out.extend(_read_file(path))
    out.sort(key=lambda r: r.at_ms)
    return out


def _read_file(path: Path) -> Iterator[Recorded]:
    try:
        handle = path.open("rb")
    except OSError as exc:
        msg = f"recording {path}: cannot be read ({exc.strerror or exc}); pass a file `serve` recorded"
        raise RecordFileError(msg) from exc
    with handle:
        number = 0
        while True:
            try:
                raw = handle.readline(MAX_LINE_BYTES + 1)
            except OSError as exc:
                msg = f"recording {path}, line {number + 1}: cannot be read ({exc})"
                raise RecordFileError(msg) from exc
            if not raw:
                return
            number += 1
            where = f"{path}:{number}"
            if len(raw) > MAX_LINE_BYTES:
                msg = f"{where}: a line of over {MAX_LINE_BYTES} bytes is not a record"
                raise RecordFileError(msg)
            if not raw.strip():
                continue
            yield _parse_line(raw, where)


def _parse_line(raw: bytes, where: str) -> Recorded:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        msg = f"{where}: not UTF-8 text (byte {exc.start}); a recording is JSON Lines"
        raise RecordFileError(msg) from exc
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:
        msg = f"{where}: not a JSON line ({str(exc)[:120]}); was the file cut while being written?"
        raise RecordFileError(msg) from exc
    if not isinstance(data, dict):
        msg = f"{where}: expected a JSON object (a record), found {type(data).__name__}"
        raise RecordFileError(msg)
    if data.get("v") != RECORD_VERSION:
        msg = (
            f"{where}: record version {str(data.get('v'))[:20]!r}; this reader reads version {RECORD_VERSION}"
        )
        raise RecordFileError(msg)
    at = data.get("at_ms")
    if not isinstance(at, int) or isinstance(at, bool) or not 0 <= at < 2**53:
        msg = f"{where}: at_ms must be UTC milliseconds (a non-negative integer), found {str(at)[:40]!r}"
        raise RecordFileError(msg)
    request = data.get("request")
    if not isinstance(request, dict) or not isinstance(request.get("user_id"), str):
        msg = f"{where}: request must be the ranking request's JSON object, with a user_id"
        raise RecordFileError(msg)
    status = data.get("status", 200)
    if not isinstance(status, int) or isinstance(status, bool) or not 100 <= status <= 599:
        msg = f"{where}: status must be an HTTP status (100..599), found {str(status)[:40]!r}"
        raise RecordFileError(msg)
    latency = data.get("latency_ms")
    if latency is not None and (
        not isinstance(latency, int | float) or isinstance(latency, bool) or not math.isfinite(latency)
    ):
        msg = f"{where}: latency_ms must be a number, found {str(latency)[:40]!r}"
        raise RecordFileError(msg)
    answer = data.get("answer")
    items: list[str] | None = None
    fallback = None
    if answer is not None:
        if not isinstance(answer, dict):
            msg = f"{where}: answer must be an object or null, found {type(answer).__name__}"
            raise RecordFileError(msg)
        items = answer.get("items")
        if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
            msg = f"{where}: answer.items must be the list of ranked item ids"
            raise RecordFileError(msg)
        fallback = answer.get("fallback")
        if fallback is not None and not isinstance(fallback, str):
            msg = f"{where}: answer.fallback must be a string or null"
            raise RecordFileError(msg)
        if fallback is not None:
            fallback = f"{fallback} ({answer.get('fallback_reason') or 'unknown'})"
    return Recorded(at, request, status, None if latency is None else float(latency), items, fallback, where)


def read_topic_records(bootstrap: str, topic: str, timeout_s: float = 10.0) -> list[Recorded]:
    """Read every record of ``topic`` (as :class:`Recorder` sends them) from its start to its current end.

    Raises:
        RecordFileError: the topic does not exist, Kafka stops answering, or a record is not one
            (the message names the topic, partition and offset).
    """
    from kafka import TopicPartition

    consumer = kafka_clients.consumer(bootstrap, enable_auto_commit=False, client_id="headwater-replay")
    try:
        partitions = sorted(consumer.partitions_for_topic(topic) or ())
        if not partitions:
            msg = (
                f"topic {topic!r} does not exist at {bootstrap}; serve with `recording: {{topic: ...}}` first"
            )
            raise RecordFileError(msg)
        parts = [TopicPartition(topic, p) for p in partitions]
        end = consumer.end_offsets(parts)
        left = {tp for tp in parts if end[tp] > 0}
        consumer.assign(parts)
        consumer.seek_to_beginning(*parts)
        out: list[Recorded] = []
        while left:
            left = {tp for tp in left if consumer.position(tp) < end[tp]}
            if not left:
                break
            polled = consumer.poll(timeout_ms=int(timeout_s * 1000))
            if not polled:
                msg = f"topic {topic!r}: Kafka at {bootstrap} sent nothing for {timeout_s:g} s before its end"
                raise RecordFileError(msg)
            for tp, records in polled.items():
                for r in records:
                    if r.offset < end[tp] and (r.value or b"").strip():
                        out.append(_parse_line(r.value, f"{topic}[{tp.partition}]@{r.offset}"))
    finally:
        consumer.close()
    out.sort(key=lambda r: r.at_ms)
    return out
