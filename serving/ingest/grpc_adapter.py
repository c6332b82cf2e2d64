"""The push API's gRPC adapter: ``headwater.v1.Ingest/Ingest``, a client stream of batches (ingest.proto).

Each :class:`IngestBatch` is read exactly as REST reads a body
(:func:`~headwater.serving.ingest.bodies.read_rows`), submitted to the core as it arrives
(:meth:`~headwater.serving.ingest.core.IngestService.submit`: checked and queued), and finished
(acknowledgements awaited) at most ``window`` batches later or at the end of the stream, so the
check of the next batch overlaps the broker's acknowledgement of this one. The one response has the
counts and every event not accepted, indexed by its position in the whole stream.

Refusals map as REST's statuses: 400/413/415 INVALID_ARGUMENT, 404 NOT_FOUND, 401 UNAUTHENTICATED,
403 PERMISSION_DENIED, 429 RESOURCE_EXHAUSTED with ``retry-after`` and ``retry-after-ms`` trailing
metadata (batches before it were sent: resend the stream, event ids make it count once).
A synchronous server on a thread pool: the work is CPU (checks, encoding) and waits on futures.
"""

from __future__ import annotations

import logging
import uuid
from collections import deque
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc

from headwater.client.proto.headwater.v1 import ingest_pb2 as pb
from headwater.client.proto.headwater.v1 import ingest_pb2_grpc as pb_grpc
from headwater.serving.config import TlsConfig
from headwater.serving.ingest.bodies import read_rows
from headwater.serving.ingest.core import IngestAnswer, IngestRefused, IngestService, Submission
from headwater.serving.tls import bind_grpc

logger = logging.getLogger(__name__)
STATUS_CODES = {
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.NOT_FOUND,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
}
"""REST's status -> gRPC's; any other 4xx is INVALID_ARGUMENT."""
DEFAULT_WINDOW = 8
"""Batches of a stream in flight (checked and queued, acknowledgements not yet awaited)."""
MAX_MESSAGE_BYTES = 16 * 1024 * 1024


class IngestServicer(pb_grpc.IngestServicer):
    """``Ingest/Ingest`` over one :class:`IngestService` (see the module)."""

    def __init__(self, service: IngestService, window: int = DEFAULT_WINDOW) -> None:
        self.service = service
        self.window = window

    def Ingest(
        self, request_iterator: Iterator[pb.IngestBatch], context: grpc.ServicerContext
    ) -> pb.IngestResponse:
        """Check, send and acknowledge every batch of the stream; one response at the end."""
        try:
            self.service.check_access({k: str(v) for k, v in context.invocation_metadata()})
            return self._stream(request_iterator)
        except IngestRefused as exc:
            code = STATUS_CODES.get(exc.status, grpc.StatusCode.INVALID_ARGUMENT)
            if exc.retry_after_s is not None:
                context.set_trailing_metadata(
                    (("retry-after", str(max(1, round(exc.retry_after_s)))),
                     ("retry-after-ms", str(int(exc.retry_after_s * 1000)))),
                )  # fmt: skip
            context.abort(code, str(exc))
        except Exception:
            request_id = uuid.uuid4().hex[:16]
            logger.exception("unhandled error in Ingest/Ingest (request id %s)", request_id)
            context.abort(grpc.StatusCode.UNAVAILABLE, f"internal error, request id {request_id}: retry")
        unreachable = "context.abort raises"
        raise AssertionError(unreachable)

    def _stream(self, batches: Iterator[pb.IngestBatch]) -> pb.IngestResponse:
        in_flight: deque[tuple[int, Submission]] = deque()
        answers: list[tuple[int, IngestAnswer]] = []
        offset = 0
        for batch in batches:
            name = batch.source
            codec = self.service.codec(name)
            rows = read_rows(batch.body, batch.content_type or None, codec, batch.schema_fp or None)
            in_flight.append((offset, self.service.submit(name, rows)))
            offset += len(rows)
            while len(in_flight) > self.window:
                start, submission = in_flight.popleft()
                answers.append((start, self.service.finish(submission)))
        while in_flight:
            start, submission = in_flight.popleft()
            answers.append((start, self.service.finish(submission)))
        return response(answers)


def response(answers: list[tuple[int, IngestAnswer]]) -> pb.IngestResponse:
    """Return the stream's response: summed counts and the results not accepted, at their stream positions."""
    out = pb.IngestResponse(dedup=all(a.dedup for _, a in answers))
    for start, answer in answers:
        out.accepted += answer.accepted
        out.rejected += answer.rejected
        out.failed += answer.failed
        for r in answer.results:
            if r.status != "accepted":
                out.results.add(
                    index=start + r.index,
                    status=r.status,
                    field=r.field or "",
                    reason=r.reason or "",
                    code=r.code or "",
                )
    return out


def grpc_server(
    service: IngestService, host: str, port: int, workers: int = 8, tls: TlsConfig | None = None
) -> Any:
    """Return a started ``grpc.Server`` of ``Ingest/Ingest`` on ``host:port`` (``stop(grace)`` stops it).

    ``tls``: serve TLS (mTLS when it names a client CA), as ``ingest serve --tls-cert`` asks.
    """
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="headwater-ingest-grpc"),
        options=[
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ],
    )
    pb_grpc.add_IngestServicer_to_server(IngestServicer(service), server)  # type: ignore[no-untyped-call]
    bind_grpc(server, f"{host}:{port}", tls)
    server.start()
    return server
