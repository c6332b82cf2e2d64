"""Limits at the edge on a real server process (issue 32 item 5): slow clients, sizes, concurrency, errors.

The server is uvicorn with ``headwater serve``'s options and the gRPC edge, over an in-memory store
(``edge_limits_server.py``, started on free ports): no Kafka or Redis needed.

- a client that sends its headers and then trickles the body gets 408 and a closed connection
  within ``body_timeout_s`` + a margin, and a normal request is served meanwhile;
- one that never finishes its headers is disconnected after ``header_timeout_s``;
- past ``max_connections`` connections a request is answered 503;
- a gRPC message over ``max_body_bytes`` is RESOURCE_EXHAUSTED; more than 2,000 candidates
  INVALID_ARGUMENT;
- a bug's answer, REST or gRPC, names a request id and holds no exception text.
"""

from __future__ import annotations

import importlib.util
import json
import socket
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest

from headwater.client.proto.headwater.v1 import ranking_pb2 as pb

HERE = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location("edge_limits_server", HERE / "edge_limits_server.py")
assert _spec is not None
assert _spec.loader is not None
edge_server = sys.modules.setdefault("edge_limits_server", importlib.util.module_from_spec(_spec))
_spec.loader.exec_module(edge_server)
SECRET = "hunter2"
BODY_TIMEOUT_S = 1.0
HEADER_TIMEOUT_S = 1.0
MAX_CONNECTIONS = 6
LIMIT = 16 * 1024
CONFIG = {
    "editorial_items": ["i2"],
    "item_cache_ttl_s": 0.0,
    "io_threads": 2,
    "max_body_bytes": LIMIT,
    "feedback": {"enabled": False},
    "edge": {
        "body_timeout_s": BODY_TIMEOUT_S,
        "header_timeout_s": HEADER_TIMEOUT_S,
        "max_connections": MAX_CONNECTIONS,
        "keep_alive_s": 30.0,
    },
}
BODY: dict[str, Any] = {"user_id": "u1", "candidates": ["i0", "i1", "i2"], "k": 2, "log_impressions": False}
MARGIN_S = 1.5
"""Past the configured timeout, how long the answer may take to arrive (2 loaded cores)."""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    with edge_server.running(tmp_path_factory.mktemp("edge"), CONFIG) as running:
        yield running


def _open(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.settimeout(10)
    return sock


def _read_until_closed(sock: socket.socket) -> bytes:
    """Read until the server closes the connection; what it sent."""
    got = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except (ConnectionResetError, TimeoutError):
            return got
        if not chunk:
            return got
        got += chunk


def _headers(length: int) -> bytes:
    return (
        b"POST /v1/rank HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {length}\r\n\r\n".encode()
    )


def test_a_trickled_body_gets_408_and_a_closed_connection_while_others_are_served(
    server: dict[str, Any],
) -> None:
    body = json.dumps(BODY).encode()
    sock = _open(server["port"])
    stop = threading.Event()
    sent_at = time.monotonic()
    sock.sendall(_headers(len(body)))

    def trickle() -> None:  # one byte every 0.2 s: the body would take len(body) / 5 s
        for byte in body[:-1]:
            if stop.wait(0.2):
                return
            try:
                sock.sendall(bytes([byte]))
            except OSError:
                return

    sender = threading.Thread(target=trickle, daemon=True)
    sender.start()
    normal = httpx.post(f"{server['url']}/v1/rank", json=BODY, timeout=5)  # served meanwhile
    got = _read_until_closed(sock)
    took = time.monotonic() - sent_at
    stop.set()
    sock.close()
    assert normal.status_code == 200, normal.text
    assert normal.json()["fallback"] == "editorial"
    assert got.startswith(b"HTTP/1.1 408 "), got[:200]
    assert b"did not arrive within 1 s" in got
    assert BODY_TIMEOUT_S <= took < BODY_TIMEOUT_S + MARGIN_S, took


def test_a_connection_that_never_finishes_its_headers_is_closed(server: dict[str, Any]) -> None:
    sock = _open(server["port"])
    began = time.monotonic()
    sock.sendall(b"POST /v1/rank HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # and never the blank line
    got = _read_until_closed(sock)
    took = time.monotonic() - began
    sock.close()
    assert got == b""
    assert HEADER_TIMEOUT_S <= took < HEADER_TIMEOUT_S + MARGIN_S, took
    idle = _open(server["port"])  # a connection that sends nothing at all
    began = time.monotonic()
    assert _read_until_closed(idle) == b""
    assert time.monotonic() - began < HEADER_TIMEOUT_S + MARGIN_S
    idle.close()


def test_past_max_connections_a_request_is_answered_503(server: dict[str, Any]) -> None:
    held = [_open(server["port"]) for _ in range(MAX_CONNECTIONS)]
    try:
        time.sleep(0.2)  # the server has accepted them
        with httpx.Client() as c:
            over = c.post(f"{server['url']}/v1/rank", json=BODY, timeout=5)
        assert over.status_code == 503, over.text
    finally:
        for sock in held:
            sock.close()
    time.sleep(HEADER_TIMEOUT_S)  # the held ones are closed: served again
    again = httpx.post(f"{server['url']}/v1/rank", json=BODY, timeout=5)
    assert again.status_code == 200, again.text


def _rank(target: str, request: pb.RankRequest, metadata: tuple[tuple[str, str], ...] = ()) -> Any:
    with grpc.insecure_channel(target, options=[("grpc.max_send_message_length", 4 * LIMIT)]) as channel:
        call = channel.unary_unary(
            "/headwater.v1.Ranking/Rank",
            request_serializer=pb.RankRequest.SerializeToString,
            response_deserializer=pb.RankResponse.FromString,
        )
        return call(request, timeout=10, metadata=metadata)


def test_a_grpc_message_over_the_limit_is_resource_exhausted(server: dict[str, Any]) -> None:
    big = pb.RankRequest(user_id="u1", candidates=[f"item-{i:06d}-" + "x" * 20 for i in range(1000)], k=2)
    assert big.ByteSize() > LIMIT
    with pytest.raises(grpc.RpcError) as caught:
        _rank(server["grpc"], big)
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, caught.value.details()
    small = _rank(server["grpc"], pb.RankRequest(**BODY))
    assert [i.item_id for i in small.items] == ["i2", "i0"]


def test_more_candidates_than_a_ranking_takes_are_refused_over_grpc(server: dict[str, Any]) -> None:
    many = pb.RankRequest(user_id="u1", candidates=[str(i) for i in range(2001)], k=2)
    assert many.ByteSize() < LIMIT
    with pytest.raises(grpc.RpcError) as caught:
        _rank(server["grpc"], many)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.details() == "invalid request: candidates: must hold at most 2000 entries; got 2001"


def test_a_bugs_answer_names_a_request_id_and_no_exception_text(server: dict[str, Any]) -> None:
    boom: dict[str, Any] = {**BODY, "user_id": "boom"}
    rest = httpx.post(f"{server['url']}/v1/rank", json=boom, headers={"X-Request-Id": "req-42"}, timeout=5)
    assert rest.status_code == 503
    assert rest.json() == {"detail": "internal error, request id req-42; retry", "errors": []}
    anonymous = httpx.post(f"{server['url']}/v1/recommend", json={"user_id": "boom", "k": 2}, timeout=5)
    assert anonymous.status_code == 503
    detail = anonymous.json()["detail"]
    assert detail.startswith("internal error, request id ")
    assert len(detail.split()[4].rstrip(";")) == 32
    with pytest.raises(grpc.RpcError) as caught:
        _rank(server["grpc"], pb.RankRequest(**boom), (("x-request-id", "req-43"),))
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    assert caught.value.details() == "internal error, request id req-43; retry"
    for text in (rest.text, anonymous.text, caught.value.details() or ""):
        assert SECRET not in text
        assert "RuntimeError" not in text
    log = server["log"].read_text()
    assert "request id req-42" in log
    assert "request id req-43" in log
    assert SECRET in log


def test_the_client_names_its_call_and_the_service_answers_with_that_id(server: dict[str, Any]) -> None:
    from headwater.client.ranking import RankingClient

    with RankingClient(server["url"], timeout_s=5.0) as rest:
        named = rest.rank("u1", ["i0", "i1", "i2"], k=2, request_id="client-call-1", log_impressions=False)
        fresh = rest.rank("u1", ["i0", "i1", "i2"], k=2, log_impressions=False)
    with RankingClient(server["grpc"], protocol="grpc", timeout_s=5.0) as over_grpc:
        by_grpc = over_grpc.rank(
            "u1", ["i0", "i1", "i2"], k=2, request_id="client-call-2", log_impressions=False
        )
    assert named.source == fresh.source == by_grpc.source == "service"
    assert named.answer is not None
    assert named.answer["request_id"] == "client-call-1"
    assert by_grpc.answer is not None
    assert by_grpc.answer["request_id"] == "client-call-2"
    assert fresh.answer is not None
    assert len(fresh.answer["request_id"]) == 32
    assert named.item_ids == by_grpc.item_ids == ["i2", "i0"]
