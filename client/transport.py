"""How :class:`~headwater.client.ranking.RankingClient` reaches the service: REST or gRPC, one shape of reply.

Both transports answer a :class:`Reply` in HTTP terms (status, JSON-shaped body, detail, retry
after), or raise :class:`NoAnswer` (timed out, refused, unreachable), so the client's retries and
breaker do not care which protocol carried the call. gRPC status codes map as the service maps
them (``headwater.serving.grpc_server``): INVALID_ARGUMENT is 422, RESOURCE_EXHAUSTED 429 (its
``retry-after-ms`` trailing metadata is the wait), DEADLINE_EXCEEDED and UNAVAILABLE no answer,
UNAUTHENTICATED 401, PERMISSION_DENIED 403, anything else a 5xx. A ``token`` (an API key or a JWT)
goes as ``Authorization: Bearer <token>`` (gRPC: ``authorization`` metadata) on every call. ``tls``
(:class:`~headwater.client.tls.ClientTls`): the CA the service's certificate is checked against and
the client certificate for mTLS; REST then needs an ``https://`` URL, gRPC a TLS channel is used.
"""

from __future__ import annotations

import email.utils
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

import httpx

from headwater.client.tls import ClientTls, grpc_channel, verify

RANK_METHOD = "/headwater.v1.Ranking/Rank"
REQUEST_ID_HEADER = "X-Request-Id"
"""The header (gRPC metadata ``x-request-id``) naming one logical call, the same on each of its attempts."""


class NoAnswer(Exception):
    """The service did not answer this attempt; ``str(exc)`` says why (timed out, refused, ...)."""


@dataclass(frozen=True)
class Reply:
    """One answer in HTTP terms: ``body`` is the JSON answer of a 200 (None if unreadable)."""

    status: int
    body: dict[str, Any] | None
    detail: str
    retry_after_s: float | None = None


class Transport(Protocol):
    """Carries one rank call: ``body`` is the REST request body; ``timeout_s`` bounds the whole call.

    ``request_id`` is the logical call's id, sent on every attempt (``X-Request-Id``): the service
    answers with it and logs the impressions of a retried call once.
    """

    def call(self, body: dict[str, Any], timeout_s: float, request_id: str | None = None) -> Reply:
        """Send ``body``; return the reply or raise :class:`NoAnswer`."""
        ...

    def close(self) -> None:
        """Release connections."""
        ...


def bearer(token: str | None) -> dict[str, str]:
    """Return the ``Authorization`` header of ``token`` (none for None)."""
    return {"Authorization": f"Bearer {token}"} if token else {}


class RestTransport:
    """``POST {base_url}/v1/rank`` with httpx (``http``: an ``httpx.MockTransport`` in tests)."""

    def __init__(
        self,
        base_url: str,
        http: httpx.BaseTransport | None = None,
        token: str | None = None,
        tls: ClientTls | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._http = httpx.Client(
            base_url=self.base_url, transport=http, headers=bearer(token), verify=verify(tls)
        )

    def call(self, body: dict[str, Any], timeout_s: float, request_id: str | None = None) -> Reply:
        """POST the body as JSON; the reply, or :class:`NoAnswer` on a timeout or connection failure."""
        headers = {REQUEST_ID_HEADER: request_id} if request_id is not None else None
        try:
            response = self._http.post("/v1/rank", json=body, timeout=timeout_s, headers=headers)
        except httpx.TimeoutException as exc:
            msg = f"timed out after {timeout_s:g} s ({type(exc).__name__})"
            raise NoAnswer(msg) from exc
        except httpx.HTTPError as exc:
            msg = f"no answer from {self.base_url} ({type(exc).__name__}: {exc})"
            raise NoAnswer(msg) from exc
        status = response.status_code
        if status != 200:
            return Reply(status, None, _detail(response), retry_after(response.headers.get("retry-after")))
        try:
            answer = response.json()
        except ValueError as exc:
            return Reply(200, None, f"{type(exc).__name__}: {exc}")
        if not isinstance(answer, dict):
            return Reply(200, None, f"a JSON {type(answer).__name__}, not an object")
        return Reply(200, answer, "")

    def close(self) -> None:
        """Close the HTTP connections."""
        self._http.close()


class GrpcTransport:
    """``headwater.v1.Ranking/Rank`` on ``target`` (``host:port``; a ``grpc://`` prefix is dropped)."""

    def __init__(self, target: str, token: str | None = None, tls: ClientTls | None = None) -> None:
        import grpc

        from headwater.client.proto.headwater.v1 import ranking_pb2 as pb

        self.target = target.removeprefix("grpc://").rstrip("/")
        self._grpc, self._pb = grpc, pb
        self._auth = tuple((k.lower(), v) for k, v in bearer(token).items())
        self._channel = grpc_channel(self.target, tls)
        self._rank = self._channel.unary_unary(
            RANK_METHOD,
            request_serializer=pb.RankRequest.SerializeToString,
            response_deserializer=pb.RankResponse.FromString,
        )

    def call(self, body: dict[str, Any], timeout_s: float, request_id: str | None = None) -> Reply:
        """Call Rank with the body's fields; the reply in HTTP terms, or :class:`NoAnswer`."""
        grpc = self._grpc
        try:
            request = self._pb.RankRequest(**body)
        except (TypeError, ValueError) as exc:  # a field the message does not have, or of another type
            return Reply(422, None, f"not a headwater.v1.RankRequest: {exc}")
        try:
            metadata = self._auth + (
                ((REQUEST_ID_HEADER.lower(), request_id),) if request_id is not None else ()
            )
            answer = self._rank(request, timeout=timeout_s, metadata=metadata or None)
        except grpc.RpcError as exc:
            code, details = exc.code(), exc.details() or ""
            if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                msg = f"timed out after {timeout_s:g} s (DEADLINE_EXCEEDED)"
                raise NoAnswer(msg) from exc
            if code == grpc.StatusCode.UNAVAILABLE:
                msg = f"no answer from {self.target} (UNAVAILABLE: {details})"
                raise NoAnswer(msg) from exc
            if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
                return Reply(429, None, details, _trailing_retry_after(exc))
            if code == grpc.StatusCode.INVALID_ARGUMENT:
                return Reply(422, None, details)
            if code == grpc.StatusCode.UNAUTHENTICATED:
                return Reply(401, None, details)
            if code == grpc.StatusCode.PERMISSION_DENIED:
                return Reply(403, None, details)
            return Reply(500, None, f"{code.name}: {details}")
        return Reply(200, answer_fields(answer), "")

    def close(self) -> None:
        """Close the channel."""
        self._channel.close()


def answer_fields(message: Any) -> dict[str, Any]:
    """Return a ``headwater.v1.RankResponse`` in the REST answer's shape (absent optional: None)."""

    def optional(owner: Any, name: str) -> Any:
        return getattr(owner, name) if owner.HasField(name) else None

    ages = message.feature_ages_s
    return {
        "items": [{"item_id": i.item_id, "score": i.score} for i in message.items],
        "model_version": optional(message, "model_version"),
        "fallback": optional(message, "fallback"),
        "fallback_reason": optional(message, "fallback_reason"),
        "feature_ages_s": {name: optional(ages, name) for name in ("user", "items_p50", "items_max")},
        "latency_ms": message.latency_ms,
        "request_id": message.request_id,
        "user_feature_event_ms": dict(message.user_feature_event_ms),
    }


def _trailing_retry_after(exc: Any) -> float | None:
    """``retry-after-ms`` (else ``retry-after``) of a failed call's trailing metadata, in seconds."""
    found = dict(exc.trailing_metadata() or ())
    if "retry-after-ms" in found:
        value = retry_after(str(found["retry-after-ms"]))
        return None if value is None else value / 1000.0
    return retry_after(found.get("retry-after"))


def _detail(response: httpx.Response) -> str:
    """Return the service's ``detail`` message, else the start of the body."""
    try:
        return str(response.json()["detail"])[:500]
    except (ValueError, KeyError, TypeError):
        return response.text[:500]


def retry_after(value: str | None) -> float | None:
    """Read a ``Retry-After`` value in seconds (seconds or an HTTP date); None if absent or unreadable."""
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - datetime.now(UTC)).total_seconds())
