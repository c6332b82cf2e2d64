"""The ranking service over gRPC (``headwater.v1.Ranking``), in the same process as the REST app.

:class:`GrpcEdge` is the gRPC adapter of the service core
(:class:`~headwater.serving.core.RankingService`): a ``grpc.aio`` server on its own port, on the
event loop the core runs on, that decodes protobuf into the core's typed requests, calls the very
methods the REST adapter calls (``rank``, ``recommend``: the same admission, engine, fallback chain,
impressions and metrics) and encodes their answers. A service without the funnel answers
``Recommend`` UNIMPLEMENTED, as REST's 404. The edge is one of the core's ``servers``, so it starts
after the engine and stops before it (``headwater serve --grpc-port``).

Errors are status codes with the REST message:

=============================================  ==================================================
REST                                           gRPC
=============================================  ==================================================
422 / 400 (invalid request, undecodable body)  INVALID_ARGUMENT, the same field-by-field message
429 over the class's quota or a full queue     RESOURCE_EXHAUSTED; trailing metadata ``retry-after``
                                               (whole seconds, as HTTP's) and ``retry-after-ms``
404 recommend on a service without the funnel  UNIMPLEMENTED
503 (a bug's net)                              UNAVAILABLE ("internal error, request id X; retry",
                                               the detail in the log), never UNKNOWN or INTERNAL
413 (over ``max_body_bytes``)                  RESOURCE_EXHAUSTED (grpc's own message-size check)
401 no, an invalid or an expired credential    UNAUTHENTICATED ("invalid or expired credential")
403 a credential without the ``rank`` role     PERMISSION_DENIED
=============================================  ==================================================

The credential is the ``authorization`` metadata (``Bearer <API key or JWT>``), checked first
(:mod:`headwater.serving.auth`); ``x-user-class`` is honoured only from a trusted gateway's
credential (or with ``auth: none``).

Limits (the serving config's ``max_body_bytes`` and ``edge``): a message received or sent is at
most ``max_body_bytes``, REST's body limit; at most ``edge.grpc_max_rpcs`` calls run at once (more
are RESOURCE_EXHAUSTED), ``edge.grpc_max_streams`` on one connection, and
``edge.grpc_max_connections`` connections. A request with more candidates than a ranking takes is
refused before they are copied out of the message. The ``x-request-id`` metadata is REST's
``X-Request-Id``: the caller's id of the logical request, whose impressions are logged once.

TLS: the serving config's ``tls:`` section binds the port with ``add_secure_port``
(:func:`headwater.serving.tls.bind_grpc`; client certificates required when it names a client CA).

The request is decoded here, not by grpc (no ``request_deserializer``), so bytes that are not a
``RankRequest`` are INVALID_ARGUMENT with protobuf's reason rather than grpc's INTERNAL.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Mapping
from typing import Any, TypeVar

import grpc
from google.protobuf.message import DecodeError, Message
from pydantic import BaseModel, ValidationError

from headwater.client.proto.headwater.v1 import ranking_pb2 as pb
from headwater.serving.admission import CLASS_HEADER, Throttled
from headwater.serving.auth import AuthError, Forbidden, Identity
from headwater.serving.batcher import QueueFullError
from headwater.serving.config import EdgeConfig, Role
from headwater.serving.core import FunnelOff, RankingService
from headwater.serving.edge import internal_error
from headwater.serving.feedback import new_request_id
from headwater.serving.impressions import REQUEST_ID_HEADER, InvalidRequestId, checked_request_id
from headwater.serving.schemas import (
    MAX_CANDIDATES,
    OPTION_FIELDS,
    RankAnswer,
    RankRequest,
    RecommendAnswer,
    RecommendRequest,
    known_fields,
    readable_errors,
)
from headwater.serving.tls import bind_grpc

logger = logging.getLogger(__name__)
SERVICE = "headwater.v1.Ranking"
_ID_KEY = REQUEST_ID_HEADER.lower()
GRPC_IDLE_MS = 300_000
M = TypeVar("M", bound=Message)
B = TypeVar("B", bound=BaseModel)
A = TypeVar("A")


class GrpcEdge:
    """A ``grpc.aio`` server of ``headwater.v1.Ranking`` on ``host:port`` over a service core."""

    def __init__(self, service: RankingService, host: str, port: int) -> None:
        self._service = service
        self.address = f"{host}:{port}"
        self._server: grpc.aio.Server | None = None
        self.port = port
        """The bound port (the chosen one when ``port`` is 0), known after :meth:`start`."""

    @classmethod
    def for_service(cls, service: RankingService, host: str, port: int) -> GrpcEdge:
        """Return the edge of ``service``, added to its servers (it starts and stops with the service)."""
        edge = cls(service, host, port)
        service.servers.append(edge)
        return edge

    @classmethod
    def for_app(cls, app: Any, host: str, port: int) -> GrpcEdge:
        """Return the edge of the core of a ``create_app`` app (``app.state.service``)."""
        return cls.for_service(app.state.service, host, port)

    async def start(self) -> None:
        """Bind and start; raises OSError naming the address when it cannot be bound."""
        config = self._service.parts.config
        server = grpc.aio.server(
            options=server_options(config.max_body_bytes, config.edge),
            maximum_concurrent_rpcs=config.edge.grpc_max_rpcs,
        )
        handler = grpc.unary_unary_rpc_method_handler(
            self._serve, request_deserializer=None, response_serializer=pb.RankResponse.SerializeToString
        )
        recommend = grpc.unary_unary_rpc_method_handler(
            self._serve_recommend,
            request_deserializer=None,
            response_serializer=pb.RecommendResponse.SerializeToString,
        )
        handlers = {"Rank": handler, "Recommend": recommend}
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
        # The serving config's `tls:` section: TLS (mTLS with a client CA) on this port as on REST's.
        bound = bind_grpc(server, self.address, config.tls)
        self.port = bound
        await server.start()
        self._server = server
        where = self.address.rsplit(":", 1)[0] + f":{bound}"
        logger.info("gRPC %s on %s (%s)", SERVICE, where, "plaintext" if config.tls is None else "TLS")

    async def stop(self, grace_s: float = 1.0) -> None:
        """Stop taking calls; calls in flight get ``grace_s`` to finish."""
        if self._server is not None:
            await self._server.stop(grace_s)
            self._server = None

    async def _serve(self, raw: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> pb.RankResponse:
        identity = await self._authenticate(context, "rank")
        request_id = await self._request_id(context)
        message = await self._decode(pb.RankRequest, raw, context)
        if len(message.candidates) > MAX_CANDIDATES:  # refused before the ids are copied into a list
            self._service.count_invalid()
            detail = (
                f"invalid request: candidates: must hold at most {MAX_CANDIDATES} entries;"
                f" got {len(message.candidates)}"
            )
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, detail)
        body = await self._validate(RankRequest, to_fields(message), context)
        call = self._service.rank(body, _metadata(context, CLASS_HEADER), request_id, identity)
        return to_message(await self._answer(call, context, "Rank", request_id))

    async def _serve_recommend(
        self, raw: bytes, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.RecommendResponse:
        identity = await self._authenticate(context, "rank")
        request_id = await self._request_id(context)
        message = await self._decode(pb.RecommendRequest, raw, context)
        fields: dict[str, Any] = {"user_id": message.user_id, "k": message.k}
        fields.update({n: getattr(message, n) for n in OPTION_FIELDS if message.HasField(n)})
        body = await self._validate(RecommendRequest, fields, context)
        call = self._service.recommend(body, _metadata(context, CLASS_HEADER), request_id, identity)
        return recommend_message(await self._answer(call, context, "Recommend", request_id))

    async def _authenticate(self, context: grpc.aio.ServicerContext[Any, Any], role: Role) -> Identity:
        """Return the caller's identity, or abort UNAUTHENTICATED / PERMISSION_DENIED (REST's 401 / 403)."""
        metadata: dict[str, str] = {}
        for name, value in context.invocation_metadata() or ():
            if isinstance(value, str):  # binary (-bin) metadata carries no credential
                metadata.setdefault(name, value)
        try:
            return self._service.parts.auth.authenticate(metadata, role)
        except AuthError as exc:
            code = (
                grpc.StatusCode.PERMISSION_DENIED
                if isinstance(exc, Forbidden)
                else grpc.StatusCode.UNAUTHENTICATED
            )
            await context.abort(code, str(exc))
            raise  # abort raises; this line only tells the type checker

    async def _request_id(self, context: grpc.aio.ServicerContext[Any, Any]) -> str | None:
        """Return the caller's ``x-request-id`` (None: none), or abort INVALID_ARGUMENT if it is not valid."""
        try:
            return checked_request_id(_metadata(context, _ID_KEY))
        except InvalidRequestId as exc:
            self._service.count_invalid()
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"invalid request: {exc}")
            raise  # abort raises; this line only tells the type checker

    async def _decode(self, kind: type[M], raw: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> M:
        """Parse ``raw`` as ``kind``, or abort INVALID_ARGUMENT naming the message type."""
        try:
            message: M = kind.FromString(raw)
            return message
        except DecodeError as exc:
            self._service.count_invalid()
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"not a {kind.DESCRIPTOR.full_name}: {exc}")
            raise  # abort raises; this line only tells the type checker

    async def _validate(
        self, model: type[B], fields: dict[str, Any], context: grpc.aio.ServicerContext[Any, Any]
    ) -> B:
        """Validate ``fields`` as the core's request model, or abort INVALID_ARGUMENT with REST's messages."""
        try:
            return model.model_validate(fields)
        except ValidationError as exc:
            self._service.count_invalid()
            errors = readable_errors(exc.errors(), known_fields(model))
            detail = "invalid request: " + "; ".join(f"{e['field']}: {e['message']}" for e in errors)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, detail)
            raise  # abort raises; this line only tells the type checker

    async def _answer(
        self,
        call: Awaitable[A],
        context: grpc.aio.ServicerContext[Any, Any],
        method: str,
        request_id: str | None,
    ) -> A:
        """Await the core's ``call`` and return its answer, or abort with its refusal as the table maps it.

        A failure the core did not expect is UNAVAILABLE with ``internal error, request id X``: the
        trace is logged under that id (the caller's, else a fresh one), never sent.
        """
        try:
            return await call
        except Throttled as exc:
            await _exhausted(context, str(exc), exc.retry_after_s)
        except QueueFullError as exc:
            await _exhausted(context, str(exc), float(exc.retry_after_s))
        except FunnelOff as exc:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, str(exc))
        except Exception:  # the net under a bug
            request_id = request_id or new_request_id()
            logger.exception("unhandled error serving gRPC %s (request id %s)", method, request_id)
            await context.abort(grpc.StatusCode.UNAVAILABLE, internal_error(request_id))
        unreachable = "context.abort raises"
        raise AssertionError(unreachable)


def server_options(max_message_bytes: int, edge: EdgeConfig) -> list[tuple[str, int]]:
    """Return the ``grpc.aio.server`` channel options of the limits (message size, streams, connections)."""
    return [
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_concurrent_streams", edge.grpc_max_streams),
        ("grpc.max_allowed_incoming_connections", edge.grpc_max_connections),
        # An idle connection holds one of grpc_max_connections: closed after 5 minutes (GOAWAY; a
        # client's channel reconnects on its next call).
        ("grpc.max_connection_idle_ms", GRPC_IDLE_MS),
    ]


def recommend_message(answer: RecommendAnswer) -> pb.RecommendResponse:
    """Return the gRPC answer of the core's recommend answer."""
    out = pb.RecommendResponse(
        items=[pb.RecommendedItem(**_present(i)) for i in answer["items"]],
        stages=[pb.FunnelStage(**_present(s)) for s in answer["stages"]],
        fallback=answer["fallback"],
        latency_ms=answer["latency_ms"],
        request_id=answer["request_id"],
    )
    for name in ("model_version", "reranker_version", "retrieval_version"):
        if answer[name] is not None:
            setattr(out, name, answer[name])
    return out


def to_fields(message: pb.RankRequest) -> dict[str, Any]:
    """Return the fields of the core's ``RankRequest`` in a gRPC request: optional ones only when present."""
    fields: dict[str, Any] = {
        "user_id": message.user_id,
        "candidates": list(message.candidates),
        "k": message.k,
    }
    for name in OPTION_FIELDS:
        if message.HasField(name):
            fields[name] = getattr(message, name)
    return fields


def to_message(answer: RankAnswer) -> pb.RankResponse:
    """Return the gRPC answer of the core's rank answer."""
    ages = answer["feature_ages_s"]
    out = pb.RankResponse(
        items=[pb.RankedItem(item_id=i["item_id"], score=i["score"]) for i in answer["items"]],
        feature_ages_s=pb.FeatureAges(**_present(ages)),
        latency_ms=answer["latency_ms"],
        request_id=answer["request_id"],
        user_feature_event_ms=answer["user_feature_event_ms"],
    )
    for name in ("model_version", "fallback", "fallback_reason"):
        if answer[name] is not None:
            setattr(out, name, answer[name])
    return out


def _present(fields: Mapping[str, Any]) -> dict[str, Any]:
    """Return ``fields`` less those that are None (absent in the message: its ``optional`` fields)."""
    return {k: v for k, v in fields.items() if v is not None}


def _metadata(context: grpc.aio.ServicerContext[Any, Any], key: str) -> str | None:
    for name, value in context.invocation_metadata() or ():
        if name == key:
            return value if isinstance(value, str) else value.decode("utf-8", "replace")
    return None


async def _exhausted(context: grpc.aio.ServicerContext[Any, Any], detail: str, retry_after_s: float) -> None:
    context.set_trailing_metadata(
        (
            ("retry-after", str(max(1, math.ceil(retry_after_s)))),
            ("retry-after-ms", str(max(1, math.ceil(retry_after_s * 1000.0)))),
        )
    )
    await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, detail)
