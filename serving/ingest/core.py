"""The protocol-neutral core of the push API: a batch of rows in, one answer per event out.

:meth:`IngestService.accept` checks each row exactly as ``headwater events produce --from`` does
(:class:`~headwater.pipelines.events.rows.RowChecker` and the source's
:class:`~headwater.pipelines.events.codec.EventCodec`: coercion to the current schema, event-time
bounds, the id policy, the source's rules), sends the good ones to the source's topic keyed by the
source's key (the sink partitions with murmur2, as the producer does), and answers per event:

- ``accepted``: the broker acknowledged it (acks=all, idempotent producer);
- ``rejected``: with the field at fault and the reason (also sent to the DLQ when configured);
- ``failed``: the broker did not acknowledge it in time (retry the batch).

Exactly once across retries: the tiers drop a repeated event id (the nearline dedup set, the
realtime job's, the offline tier's merge on the id), so a client that resends a batch with the same
ids (:class:`headwater.client.ingest.IngestClient` does) has each event counted once, whatever the
transport did with the first attempt. A source without an ``event_id`` has no such guarantee: the
answer says ``dedup: false``.

The steps of one batch (:meth:`IngestService.accept`):

1. Authorise (the optional ``authorize`` hook; ``ingest`` role once serving/auth.py provides one).
2. Find the source and refuse a batch larger than ``max_batch`` or than the sink's free room (429:
   nothing of it was sent, the client retries after ``retry_after_s``).
3. Check every row; queue each good one, each reject to the DLQ if configured.
4. Wait (up to ``ack_timeout_s``) for the broker's acknowledgement of every queued event.
"""

from __future__ import annotations

import functools
import json
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from headwater.pipelines.events.codec import DeadLetter, EventCodec, Reason
from headwater.pipelines.events.ingest import Reject, check_row
from headwater.pipelines.events.readers import FileRow
from headwater.pipelines.events.rows import RowChecker
from headwater.registry.errors import HeadwaterError
from headwater.registry.plans import PlanSource

Status = Literal["accepted", "rejected", "failed"]
Headers = Mapping[str, str]
OnDone = Callable[[BaseException | None], None]
Authorize = Callable[[Headers], None]
Reload = Callable[[], Mapping[str, "PlanSource"] | None]
"""Return the sources when the applied plan changed since the last call, else None."""
"""The auth hook: raises :class:`NotAuthorized` (401/403) for a caller without the ``ingest`` role."""

DEFAULT_MAX_BATCH = 10_000
DEFAULT_ACK_TIMEOUT_S = 30.0


class IngestRefused(HeadwaterError):
    """A whole request refused; ``status`` is its HTTP status and ``retry_after_s`` the wait (429/503)."""

    status = 400
    retry_after_s: float | None = None


class BadBody(IngestRefused, ValueError):
    """The body is not a batch of events (not JSON, not an array, an undecodable Avro datum ...)."""

    status = 400


class UnknownSource(IngestRefused, LookupError):
    """No source of that name in the applied plan."""

    status = 404


class BatchTooLarge(IngestRefused, ValueError):
    """More events in one request than ``max_batch``."""

    status = 413


class UnsupportedMedia(IngestRefused, ValueError):
    """A ``Content-Type`` the API does not read."""

    status = 415


class NotAuthorized(IngestRefused, PermissionError):
    """The caller has no credential (401) or lacks the ``ingest`` role (403)."""

    def __init__(self, message: str, status: int = 401) -> None:
        super().__init__(message)
        self.status = status


class BufferFull(IngestRefused, RuntimeError):
    """The producer's buffer has no room for the batch: nothing was sent, retry after ``retry_after_s``."""

    status = 429

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class IngestSink(Protocol):
    """Where checked events go: a Kafka producer (:class:`~headwater.serving.ingest.sink.KafkaIngestSink`)."""

    def send(
        self, topic: str, value: bytes, key: bytes | None, headers: list[tuple[str, bytes]], on_done: OnDone
    ) -> None:
        """Queue one record; ``on_done(None)`` once the broker acknowledged it, ``on_done(error)`` if not.

        ``on_done`` may run in another thread (the producer's), or at once (the record was refused).
        """
        ...

    def room(self) -> int:
        """How many more records can be queued now without blocking."""
        ...

    def close(self, timeout_s: float) -> None:
        """Deliver what is queued (up to ``timeout_s``) and release the connections."""
        ...


@dataclass(frozen=True, slots=True)
class EventResult:
    """The answer for one event of a batch: its position, status and, unless accepted, why."""

    index: int
    status: Status
    field: str | None = None
    reason: str | None = None
    code: str | None = None
    """The dead-letter reason of a reject (``invalid_field``, ``invalid_id``, ``corrupt_payload``)."""

    def as_dict(self) -> dict[str, Any]:
        """Return the JSON form (no null keys for an accepted event)."""
        out: dict[str, Any] = {"index": self.index, "status": self.status}
        if self.status != "accepted":
            out.update(field=self.field, reason=self.reason, code=self.code)
        return out


@dataclass
class IngestAnswer:
    """The answer of one batch: one :class:`EventResult` per event, in order, and its counts."""

    source: str
    results: list[EventResult]
    dedup: bool
    """The source declares an ``event_id``: a resent event is counted once by every tier."""
    accepted: int = 0
    rejected: int = 0
    failed: int = 0

    def __post_init__(self) -> None:
        """Count the statuses."""
        for r in self.results:
            if r.status == "accepted":
                self.accepted += 1
            elif r.status == "rejected":
                self.rejected += 1
            else:
                self.failed += 1

    @property
    def status(self) -> int:
        """The HTTP status: 200 all accepted, 503 any broker failure (retry), 422 any reject."""
        if self.failed:
            return 503
        return 422 if self.rejected else 200

    def as_dict(self) -> dict[str, Any]:
        """Return the JSON body of the answer."""
        return {
            "source": self.source,
            "accepted": self.accepted,
            "rejected": self.rejected,
            "failed": self.failed,
            "dedup": self.dedup,
            "results": [r.as_dict() for r in self.results],
        }


@dataclass
class IngestStats:
    """Counts since the service started (``GET /health`` shows them)."""

    batches: int = 0
    accepted: int = 0
    rejected: int = 0
    failed: int = 0
    refused_full: int = 0
    dead_letters: int = 0
    dead_letters_lost: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def as_dict(self) -> dict[str, int]:
        """Return the counts."""
        with self.lock:
            return {k: v for k, v in vars(self).items() if k != "lock"}


@dataclass
class Submission:
    """A batch checked and queued (:meth:`IngestService.submit`), its acknowledgements still to come."""

    source: PlanSource
    results: list[EventResult | None]
    """The rejects so far, by index; None where the acknowledgement is pending."""
    acks: Acks
    deadline: float
    """Monotonic time after which an unacknowledged event is answered ``failed``."""


class IngestService:
    """Check, key and send pushed events of any applied source; one answer per event (see the module).

    Args:
        sources: the applied plan's sources, by name.
        sink: where good events (and dead letters) go.
        dlq_topic: send rejects there as dead letters (reason ``invalid_field``/``invalid_id``/
            ``corrupt_payload``, ``dlq-source-partition`` -1, the event's index as its offset); None
            answers them only.
        authorize: called with the request's headers before anything else (the ``ingest`` role).
        max_batch: the most events of one request.
        ack_timeout_s: how long a batch waits for the broker's acknowledgements.
        retry_after_s: the wait a 429 asks for.
        reload: asked at most every ``reload_s`` for the sources of a newly applied plan (a new
            schema version, a new rule or source is then checked without a restart).

    Thread-safe: each thread checks with its own codecs (a codec reuses a buffer).
    """

    def __init__(
        self,
        sources: Mapping[str, PlanSource],
        sink: IngestSink,
        *,
        dlq_topic: str | None = None,
        authorize: Authorize | None = None,
        max_batch: int = DEFAULT_MAX_BATCH,
        ack_timeout_s: float = DEFAULT_ACK_TIMEOUT_S,
        retry_after_s: float = 1.0,
        reload: Reload | None = None,
        reload_s: float = 2.0,
    ) -> None:
        """Bind the sources and the sink; nothing is sent yet."""
        self.sources = dict(sources)
        self.sink = sink
        self.dlq_topic = dlq_topic
        self.authorize = authorize
        self.max_batch = max_batch
        self.ack_timeout_s = ack_timeout_s
        self.retry_after_s = retry_after_s
        self.stats = IngestStats()
        self._local = threading.local()
        self._reload = reload
        self._reload_s = reload_s
        self._next_reload = time.monotonic() + reload_s
        self._reload_lock = threading.Lock()

    def _reloaded(self) -> None:
        """Swap in the sources of a newly applied plan (one thread asks; the others go on)."""
        if self._reload is None or time.monotonic() < self._next_reload:
            return
        if not self._reload_lock.acquire(blocking=False):
            return
        try:
            self._next_reload = time.monotonic() + self._reload_s
            fresh = self._reload()
            if fresh is not None:
                self.sources = dict(fresh)  # one reference swap: a request sees the old or the new plan
        finally:
            self._reload_lock.release()

    def source(self, name: str) -> PlanSource:
        """Return the source ``name``.

        Raises:
            UnknownSource: not in the applied plan (the message lists those there).
        """
        self._reloaded()
        found = self.sources.get(name)
        if found is None:
            known = ", ".join(sorted(self.sources)) or "none"
            shown = name if len(name) <= 64 else name[:61] + "..."
            msg = (
                f"source {shown!r} is not in the applied plan (sources: {known}); declare it in "
                "sources.yaml, and run `headwater apply` (the push API reads a new plan within seconds)"
            )
            raise UnknownSource(msg)
        return found

    def codec(self, name: str) -> EventCodec:
        """Return this thread's codec of source ``name`` (to decode an Avro body).

        Raises:
            UnknownSource: no such source.
        """
        return self._checker(self.source(name)).codec

    def describe(self, name: str) -> dict[str, Any]:
        """Return what a client needs to push to source ``name``: topic, key, event id, schema, fields.

        Raises:
            UnknownSource: no such source.
        """
        source = self.source(name)
        return {
            "name": source.name,
            "topic": source.topic,
            "key": source.key,
            "event_id": source.event_id,
            "event_time": source.event_time,
            "fingerprint": source.current.fingerprint,
            "schema": json.loads(source.current.json_text),
            "fields": [{"name": f.name, "kind": f.kind, "nullable": f.nullable} for f in source.fields],
        }

    def check_access(self, headers: Headers) -> None:
        """Run the auth hook (no hook: every caller may push).

        Raises:
            NotAuthorized: the hook refused the caller.
        """
        if self.authorize is not None:
            self.authorize(headers)

    def accept(self, source_name: str, rows: Sequence[Any], headers: Headers | None = None) -> IngestAnswer:
        """Check, send and acknowledge one batch of rows (objects with the source's fields).

        A row may be a :class:`~headwater.pipelines.events.readers.FileRow` carrying a parse error
        (a JSON Lines line that is not JSON): it is rejected with that reason.

        Raises:
            NotAuthorized: the auth hook refused the caller.
            UnknownSource: no such source.
            BatchTooLarge: more than ``max_batch`` rows.
            BufferFull: the sink has no room for the batch (nothing was sent).
        """
        self.check_access(headers or {})  # Step 1
        return self.finish(self.submit(source_name, rows))

    def submit(self, source_name: str, rows: Sequence[Any]) -> Submission:
        """Check and queue a batch (steps 2 and 3 of :meth:`accept`, no auth); :meth:`finish` waits for acks.

        A stream (gRPC) submits each batch as it arrives and finishes them later, so checking the
        next batch overlaps the broker's acknowledgement of this one.
        """
        # Step 2: the source, the batch's size, the sink's room
        source = self.source(source_name)
        if len(rows) > self.max_batch:
            msg = f"{len(rows):,} events in one request; send at most {self.max_batch:,} per request"
            raise BatchTooLarge(msg)
        if self.sink.room() < len(rows):
            with self.stats.lock:
                self.stats.refused_full += 1
            msg = f"the producer's buffer is full; retry after {self.retry_after_s:g} s"
            raise BufferFull(msg, self.retry_after_s)
        # Step 3: check and queue each row
        checker = self._checker(source)
        headers_now = checker.codec.headers()
        acks = Acks()
        submission = Submission(source, [None] * len(rows), acks, time.monotonic() + self.ack_timeout_s)
        for index, row in enumerate(rows):
            file_row = row if isinstance(row, FileRow) else FileRow(index, row)
            checked = check_row(checker, file_row)
            if isinstance(checked, Reject):
                code = str(
                    checked.code or (Reason.CORRUPT_PAYLOAD if checked.row is None else Reason.INVALID_FIELD)
                )
                submission.results[index] = EventResult(
                    index, "rejected", checked.field, checked.reason, code
                )
                self._dead_letter(source, index, checked, code)
                continue
            self.sink.send(source.topic, checked.value, checked.key, headers_now, acks.expect(index))
        acks.sealed()
        return submission

    def finish(self, submission: Submission) -> IngestAnswer:
        """Wait (step 4 of :meth:`accept`, until the submission's deadline) for its acknowledgements."""
        results = submission.results
        acks = submission.acks
        acks.wait(max(0.0, submission.deadline - time.monotonic()))
        late = "the broker did not acknowledge it in time; retry"
        with acks.lock:  # a callback after the deadline changes nothing now
            for index in acks.indexes:
                if index not in acks.answered:
                    results[index] = EventResult(index, "failed", None, late, "timeout")
                elif (error := acks.answered[index]) is not None:
                    reason = f"not written: {error}; retry"
                    results[index] = EventResult(index, "failed", None, reason, "delivery_failed")
                else:
                    results[index] = EventResult(index, "accepted")
        source = submission.source
        answer = IngestAnswer(source.name, [r for r in results if r is not None], source.event_id is not None)
        with self.stats.lock:
            self.stats.batches += 1
            self.stats.accepted += answer.accepted
            self.stats.rejected += answer.rejected
            self.stats.failed += answer.failed
        return answer

    def close(self, timeout_s: float = 10.0) -> None:
        """Deliver what is queued and release the sink."""
        self.sink.close(timeout_s)

    def _checker(self, source: PlanSource) -> RowChecker:
        """Return this thread's checker of ``source`` (a codec is not thread-safe)."""
        checkers: dict[str, RowChecker] | None = getattr(self._local, "checkers", None)
        if checkers is None:
            checkers = self._local.checkers = {}
        checker = checkers.get(source.name)
        if checker is None or checker.source is not source:  # first use, or a newly applied plan
            checker = checkers[source.name] = RowChecker(source, EventCodec(source))
        return checker

    def _dead_letter(self, source: PlanSource, index: int, reject: Reject, code: str) -> None:
        if self.dlq_topic is None:
            return
        if reject.row is not None:
            value = json.dumps(reject.row, ensure_ascii=False, default=str).encode("utf-8", "surrogateescape")
        else:
            value = (reject.raw or "").encode("utf-8", "surrogateescape")
        where = f"{reject.field}: " if reject.field else ""
        letter = DeadLetter(
            value=value,
            key=None,
            reason=code,
            detail=f"push API, source {source.name}, event {index}: {where}{reject.reason}",
            source_topic=source.topic,
            source_partition=-1,
            source_offset=index,
            failed_at_ms=time.time_ns() // 1_000_000,
            original_headers=[("source-api", b"/v1/sources/" + source.name.encode("utf-8") + b"/events")],
        )
        self.sink.send(self.dlq_topic, value, None, letter.kafka_headers(), self._dead_letter_done)

    def _dead_letter_done(self, error: BaseException | None) -> None:
        with self.stats.lock:
            if error is None:
                self.stats.dead_letters += 1
            else:
                self.stats.dead_letters_lost += 1


class Acks:
    """The acknowledgements of one batch: one callback per record, one wait for them all.

    Cheaper than a ``Future`` per record (each holds a condition): a lock-guarded count and one event.
    """

    def __init__(self) -> None:
        self.indexes: list[int] = []
        self.answered: dict[int, BaseException | None] = {}
        """Index -> None (acknowledged) or the error, for every record the producer answered."""
        self.lock = threading.Lock()
        self._left = 1  # the seal: the batch is complete only after sealed()
        self._all = threading.Event()

    def expect(self, index: int) -> OnDone:
        """Return the callback of the record at ``index``."""
        self.indexes.append(index)
        with self.lock:
            self._left += 1
        return functools.partial(self._done, index)

    def sealed(self) -> None:
        """No more records: the wait ends when the ones expected are done."""
        self._done(None, None)

    def _done(self, index: int | None, error: BaseException | None) -> None:
        with self.lock:
            if index is not None:
                self.answered[index] = error
            self._left -= 1
            if self._left == 0:
                self._all.set()

    def wait(self, timeout_s: float) -> bool:
        """Wait until every expected record is done; False if ``timeout_s`` passed first."""
        return self._all.wait(timeout_s)
