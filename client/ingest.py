"""Push events of any source to ``headwater ingest serve``: batching, retries that count once, flush.

:class:`IngestClient` sends ``POST /v1/sources/{source}/events`` (a JSON array) in batches of
``batch_size``. A batch is retried with exponential backoff and full jitter (a ``Retry-After``
replaces the wait) when the service is unreachable, times out, answers 429 (its buffer is full) or
503; on an answer with results only the events the broker did not acknowledge are sent again.
Every retry carries the same event ids: the client gives an event without one (the source's
``event_id`` field, read once from ``GET /v1/sources/{source}``) a random id before the first
attempt, so however often a batch is resent, every tier counts each event once.

Rejected events (wrong field, a rule broken) are not retried: :meth:`IngestClient.flush` returns
them with the field and reason. A request refused whole (unknown source, a body too large, no
credential) raises :class:`IngestRequestError`; retries used up raise :class:`IngestUnavailable`.
"""

from __future__ import annotations

import json
import random
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from headwater.client.ranking import Backoff
from headwater.client.tls import ClientTls, grpc_channel, verify

RETRYABLE = frozenset({408, 429, 502, 503, 504})
_AUTO = "auto"


class IngestError(Exception):
    """A push that did not complete; the message says why and what to do."""


class IngestRequestError(IngestError):
    """The service refused the request whole (4xx other than 408/429): retrying would not help."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(f"{status}: {detail}")
        self.status = status
        self.detail = detail


class IngestUnavailable(IngestError):
    """The service stayed unreachable, full or failing for every attempt."""


@dataclass(frozen=True)
class PushedEvent:
    """The outcome of one event: ``accepted``, or ``rejected`` with the field at fault and the reason."""

    event: Mapping[str, Any]
    status: str
    field: str | None = None
    reason: str | None = None
    code: str | None = None


@dataclass
class PushStats:
    """Counts over the client's life: events accepted and rejected, requests and retries sent."""

    accepted: int = 0
    rejected: int = 0
    requests: int = 0
    retries: int = 0


class IngestClient:
    """Batch, send and retry events of one source (see the module).

    Args:
        url: the push API, e.g. ``http://127.0.0.1:8090``.
        source: the headwater source the events belong to.
        batch_size: events per request (:meth:`add` sends when a batch is full).
        timeout_s: the limit of one request, acknowledgements included.
        max_attempts: attempts per batch before :class:`IngestUnavailable`.
        backoff: the waits between attempts.
        event_id_field: the field holding the event id; ``"auto"`` asks the service once (REST
            only), None gives no ids (the events carry theirs, or the source has none: a resent
            event may then count twice).
        headers: sent with every request (``Authorization`` for the ``ingest`` role).
        http: an ``httpx.Client`` to use (tests, shared pools); default: one of the client's own.
        sleep: how to wait (tests pass a fake).
        seed: of the backoff's jitter.
        protocol: ``rest`` (``url`` is ``http://host:port``) or ``grpc`` (``url`` is ``host:port`` of
            ``ingest serve --grpc-port``: one client stream per attempt, ``message_events`` per message).
        tls: the service's CA and the client certificate for mTLS (:class:`~headwater.client.tls.ClientTls`);
            REST then takes an ``https://`` url.
    """

    def __init__(
        self,
        url: str,
        source: str,
        *,
        batch_size: int = 500,
        timeout_s: float = 10.0,
        max_attempts: int = 6,
        backoff: Backoff | None = None,
        event_id_field: str | None = _AUTO,
        headers: Mapping[str, str] | None = None,
        http: httpx.Client | None = None,
        sleep: Callable[[float], None] = time.sleep,
        seed: int | None = None,
        protocol: str = "rest",
        message_events: int = 500,
        tls: ClientTls | None = None,
    ) -> None:
        """Prepare; nothing is sent until :meth:`add`, :meth:`send` or :meth:`flush`."""
        if batch_size < 1 or max_attempts < 1:
            msg = f"batch_size and max_attempts must be at least 1; got {batch_size} and {max_attempts}"
            raise ValueError(msg)
        self.url = url.rstrip("/")
        self.source = source
        self.batch_size = batch_size
        self.max_attempts = max_attempts
        self.backoff = backoff or Backoff(base_s=0.1, cap_s=5.0, max_retry_after_s=30.0)
        self.stats = PushStats()
        self._own_http = http is None
        self._http = http or httpx.Client(timeout=timeout_s, verify=verify(tls))
        self._headers = {"content-type": "application/json", **(headers or {})}
        self._id_field = event_id_field
        self._id_known = event_id_field != _AUTO
        self._pending: list[dict[str, Any]] = []
        self._sleep = sleep
        self._rng = random.Random(seed)
        if protocol not in ("rest", "grpc"):
            msg = f"protocol {protocol!r}: use 'rest' (url http://host:port) or 'grpc' (url host:port)"
            raise ValueError(msg)
        self._grpc: _GrpcIngest | None = None
        if protocol == "grpc":
            if event_id_field == _AUTO:
                msg = (
                    "with protocol 'grpc' name the source's event id field (event_id_field='payment_id'), "
                    "or None when the events carry their ids already or the source has none"
                )
                raise ValueError(msg)
            metadata = [(k.lower(), v) for k, v in (headers or {}).items()]
            self._grpc = _GrpcIngest(self.url, timeout_s, message_events, metadata, tls)

    def __enter__(self) -> IngestClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def event_id_field(self) -> str | None:
        """The source's event id field (asked of the service on first use when ``"auto"``)."""
        if not self._id_known:
            reply = self._http.get(f"{self.url}/v1/sources/{self.source}", headers=self._headers)
            if reply.status_code != 200:
                raise IngestRequestError(reply.status_code, _detail(reply))
            self._id_field = reply.json().get("event_id")
            self._id_known = True
        return self._id_field

    def add(self, event: Mapping[str, Any]) -> list[PushedEvent]:
        """Queue one event; when the batch is full, send it and return its outcomes (else ``[]``)."""
        self._pending.append(self._with_id(event))
        if len(self._pending) >= self.batch_size:
            return self.flush()
        return []

    def send(self, events: Iterable[Mapping[str, Any]]) -> list[PushedEvent]:
        """Send ``events`` (after any queued by :meth:`add`) in batches; every outcome, in order."""
        outcomes: list[PushedEvent] = []
        for event in events:
            outcomes.extend(self.add(event))
        outcomes.extend(self.flush())
        return outcomes

    def flush(self) -> list[PushedEvent]:
        """Send what :meth:`add` queued; the outcome of each event.

        Raises:
            IngestRequestError: the service refused the request whole.
            IngestUnavailable: no attempt was answered with the events acknowledged.
        """
        batch, self._pending = self._pending, []
        return self._push(batch) if batch else []

    def close(self) -> None:
        """Flush what is queued and close the HTTP client (if it is the client's own)."""
        try:
            self.flush()
        finally:
            if self._own_http:
                self._http.close()
            if self._grpc is not None:
                self._grpc.close()

    def _with_id(self, event: Mapping[str, Any]) -> dict[str, Any]:
        copy = dict(event)
        field = self.event_id_field
        if field is not None and copy.get(field) in (None, ""):
            copy[field] = uuid.uuid4().hex  # chosen once: every retry of the event carries it
        return copy

    def _push(self, batch: list[dict[str, Any]]) -> list[PushedEvent]:
        """Send one batch until every event is accepted or rejected (see the module)."""
        outcomes: dict[int, PushedEvent] = {}
        waiting = list(range(len(batch)))
        last = "no attempt"
        for attempt in range(self.max_attempts):
            if attempt:
                self.stats.retries += 1
            retry_after: float | None = None
            reply = self._call([batch[i] for i in waiting])
            if isinstance(reply, str):  # unreachable, reset, timed out: nothing known, resend all
                last = reply
            else:
                self.stats.requests += 1
                results = reply.body.get("results") if isinstance(reply.body, dict) else None
                if isinstance(results, list) and len(results) == len(waiting):
                    waiting = self._record(batch, waiting, results, outcomes)
                    if not waiting:
                        break
                    last = f"{len(waiting)} event(s) not acknowledged by the broker"
                elif reply.status in RETRYABLE:
                    last = f"{reply.status}: {reply.detail}"
                else:
                    raise IngestRequestError(reply.status, reply.detail)
                retry_after = reply.retry_after_s
            if attempt + 1 < self.max_attempts:
                if retry_after is not None and retry_after > self.backoff.max_retry_after_s:
                    break
                self._sleep(
                    retry_after if retry_after is not None else self.backoff.delay(attempt, self._rng)
                )
        if waiting:
            msg = (
                f"{len(waiting)} of {len(batch)} event(s) of source {self.source!r} not written after "
                f"{self.max_attempts} attempt(s) to {self.url} (last: {last}); resend them (their ids "
                "make a resend count once)"
            )
            raise IngestUnavailable(msg)
        return [outcomes[i] for i in range(len(batch))]

    def _call(self, events: list[dict[str, Any]]) -> _Reply | str:
        """Send one attempt over the client's protocol; its reply, or why there was none."""
        if self._grpc is not None:
            return self._grpc.call(self.source, events)
        try:
            reply = self._http.post(
                f"{self.url}/v1/sources/{self.source}/events", json=events, headers=self._headers
            )
        except httpx.HTTPError as exc:
            return f"{type(exc).__name__}: {exc}"
        return _Reply(reply.status_code, _json(reply), _detail(reply), _retry_after(reply))

    def _record(
        self,
        batch: list[dict[str, Any]],
        waiting: list[int],
        results: list[Any],
        outcomes: dict[int, PushedEvent],
    ) -> list[int]:
        """Keep the answered outcomes; return the positions still to send (the failed ones)."""
        again: list[int] = []
        for position, result in zip(waiting, results, strict=True):
            status = result.get("status") if isinstance(result, dict) else None
            if status == "accepted":
                outcomes[position] = PushedEvent(batch[position], "accepted")
                self.stats.accepted += 1
            elif status == "rejected":
                outcomes[position] = PushedEvent(
                    batch[position], "rejected", result.get("field"), result.get("reason"), result.get("code")
                )
                self.stats.rejected += 1
            else:
                again.append(position)
        return again


@dataclass(frozen=True)
class _Reply:
    """One attempt's answer in REST's terms, whichever protocol carried it."""

    status: int
    body: Any
    detail: str
    retry_after_s: float | None


_GRPC_STATUS = {
    "INVALID_ARGUMENT": 400,
    "UNAUTHENTICATED": 401,
    "PERMISSION_DENIED": 403,
    "NOT_FOUND": 404,
    "RESOURCE_EXHAUSTED": 429,
}
"""gRPC's codes -> REST's statuses (as ``headwater.serving.ingest.grpc_adapter`` maps them)."""


class _GrpcIngest:
    """``headwater.v1.Ingest/Ingest``: one stream per attempt, batches of ``message_events`` JSON arrays."""

    def __init__(
        self,
        target: str,
        timeout_s: float,
        message_events: int,
        metadata: list[tuple[str, str]],
        tls: ClientTls | None = None,
    ) -> None:
        import grpc

        from headwater.client.proto.headwater.v1 import ingest_pb2, ingest_pb2_grpc

        self._grpc = grpc
        self._pb = ingest_pb2
        self._channel = grpc_channel(target, tls)
        self._stub = ingest_pb2_grpc.IngestStub(self._channel)  # type: ignore[no-untyped-call]
        self._timeout_s = timeout_s
        self._message_events = message_events
        self._metadata = metadata

    def call(self, source: str, events: list[dict[str, Any]]) -> _Reply | str:
        """Stream ``events``; the reply with one result per event (accepted ones filled in), or why none."""
        step = self._message_events
        messages = (
            self._pb.IngestBatch(source=source, body=json.dumps(events[i : i + step]).encode())
            for i in range(0, len(events), step)
        )
        grpc = self._grpc
        try:
            answer = self._stub.Ingest(messages, timeout=self._timeout_s, metadata=self._metadata)
        except grpc.RpcError as exc:
            code = exc.code()
            if code.name not in _GRPC_STATUS:
                return f"gRPC {code.name}: {exc.details()}"
            trailing = dict(exc.trailing_metadata() or ())
            wait = trailing.get("retry-after-ms")
            retry_after = int(wait) / 1000 if isinstance(wait, str) and wait.isdigit() else None
            return _Reply(_GRPC_STATUS[code.name], None, exc.details(), retry_after)
        results: list[dict[str, Any]] = [{"status": "accepted"} for _ in events]
        for r in answer.results:
            results[r.index] = {
                "status": r.status,
                "field": r.field or None,
                "reason": r.reason,
                "code": r.code,
            }
        return _Reply(503 if answer.failed else 200, {"results": results}, "", None)

    def close(self) -> None:
        """Close the channel."""
        self._channel.close()


def _json(reply: httpx.Response) -> Any:
    try:
        return reply.json()
    except ValueError:
        return None


def _detail(reply: httpx.Response) -> str:
    body = _json(reply)
    detail = body.get("detail") if isinstance(body, dict) else None
    if isinstance(detail, str):
        return detail
    return reply.text[:200] or reply.reason_phrase


def _retry_after(reply: httpx.Response) -> float | None:
    raw = reply.headers.get("retry-after")
    try:
        return float(raw) if raw is not None else None
    except ValueError:
        return None
