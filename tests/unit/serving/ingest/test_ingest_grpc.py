"""The push API over gRPC (a client stream, an in-process server over the memory sink) and IngestClient."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import grpc
import orjson
import pytest

from headwater.client import IngestClient, IngestRequestError
from headwater.client.proto.headwater.v1 import ingest_pb2 as pb
from headwater.client.proto.headwater.v1 import ingest_pb2_grpc as pb_grpc
from headwater.pipelines.events.sources import example_sources
from headwater.serving.ingest.core import IngestService
from headwater.serving.ingest.grpc_adapter import grpc_server
from headwater.serving.ingest.sink import MemorySink

from .test_ingest_core import payment

SOURCES = {s.name: s for s in example_sources()}


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def served() -> Iterator[tuple[str, MemorySink, IngestService]]:
    sink = MemorySink()
    service = IngestService(SOURCES, sink, max_batch=100, retry_after_s=2.0)
    port = _port()
    server = grpc_server(service, "127.0.0.1", port, workers=2)
    yield f"127.0.0.1:{port}", sink, service
    server.stop(0)


def batch(rows: list[Any], source: str = "payments", **fields: Any) -> pb.IngestBatch:
    return pb.IngestBatch(source=source, body=orjson.dumps(rows), **fields)


def test_stream_of_batches_one_answer(served: tuple[str, MemorySink, IngestService]) -> None:
    target, sink, _ = served
    with grpc.insecure_channel(target) as channel:
        stub = pb_grpc.IngestStub(channel)  # type: ignore[no-untyped-call]
        lines = b"\n".join(orjson.dumps(payment(i)) for i in (4, 5))
        stream = [
            batch([payment(0), payment(1, amount=-1.0)]),
            batch([payment(2), payment(3)]),
            pb.IngestBatch(source="payments", body=lines, content_type="application/x-ndjson"),
        ]
        answer = stub.Ingest(iter(stream), timeout=10)
    assert (answer.accepted, answer.rejected, answer.failed, answer.dedup) == (5, 1, 0, True)
    assert [(r.index, r.status, r.field, r.code) for r in answer.results] == [
        (1, "rejected", "amount", "invalid_field")
    ]
    assert [r[2] for r in sink.records] == [b"a0", b"a2", b"a0", b"a1", b"a2"]


def test_refusals_map_to_grpc_codes(served: tuple[str, MemorySink, IngestService]) -> None:
    target, sink, _ = served
    with grpc.insecure_channel(target) as channel:
        stub = pb_grpc.IngestStub(channel)  # type: ignore[no-untyped-call]
        cases = [
            (batch([], source="nope"), grpc.StatusCode.NOT_FOUND, "not in the applied plan"),
            (pb.IngestBatch(source="payments", body=b"{"), grpc.StatusCode.INVALID_ARGUMENT, "not JSON"),
            (batch([payment(i) for i in range(101)]), grpc.StatusCode.INVALID_ARGUMENT, "at most 100"),
        ]
        for message, code, text in cases:
            with pytest.raises(grpc.RpcError) as caught:
                stub.Ingest(iter([message]), timeout=10)
            assert caught.value.code() == code
            assert text in caught.value.details()
        sink.free = 0
        with pytest.raises(grpc.RpcError) as full:
            stub.Ingest(iter([batch([payment(1)])]), timeout=10)
        assert full.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert dict(full.value.trailing_metadata())["retry-after-ms"] == "2000"


def test_client_over_grpc(served: tuple[str, MemorySink, IngestService]) -> None:
    target, sink, _ = served
    waits: list[float] = []
    sink.free = 0
    full_once = iter([0])

    def room() -> int:
        return next(full_once, 1000)

    sink.room = room  # type: ignore[method-assign]  # full for the first attempt only
    client = IngestClient(
        target, "payments", protocol="grpc", event_id_field=None, sleep=waits.append, message_events=2
    )
    out = client.send([payment(0), payment(1), payment(2, method="barter")])
    assert [e.status for e in out] == ["accepted", "accepted", "rejected"]
    assert out[2].field == "method"
    assert waits == [2.0]
    assert [r[2] for r in sink.records] == [b"a0", b"a1"]
    client.source = "nope"
    with pytest.raises(IngestRequestError) as caught:
        client.send([payment(0)])
    assert caught.value.status == 404
    client.close()
    with pytest.raises(ValueError, match="event_id_field"):
        IngestClient(target, "payments", protocol="grpc")
