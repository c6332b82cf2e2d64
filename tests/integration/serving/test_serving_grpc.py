"""gRPC beside REST against one real `headwater serve --grpc-port` (real Redis, no model: popularity).

The same request gets the same ranking over both protocols; what REST refuses with a 4xx is
INVALID_ARGUMENT over gRPC with the same message; no message, however odd its fields, gets UNKNOWN
or INTERNAL (hypothesis); the client library's gRPC transport answers as its REST one; the calls
show in the same /metrics.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from headwater.client import RankingClient
from headwater.client.proto.headwater.v1 import ranking_pb2 as pb
from headwater.client.transport import RANK_METHOD, answer_fields

_spec = importlib.util.spec_from_file_location("edge_service", Path(__file__).with_name("edge_service.py"))
assert _spec is not None
assert _spec.loader is not None
edge = sys.modules.setdefault("edge_service", importlib.util.module_from_spec(_spec))
_spec.loader.exec_module(edge)

pytestmark = pytest.mark.integration
SAME = ("items", "model_version", "fallback", "fallback_reason")
"""What must match between the protocols (latency, request id and ages are per call)."""


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[Any]:
    with edge.running_service(tmp_path_factory.mktemp("grpc"), redis_url, grpc=True) as service:
        yield service


@pytest.fixture(scope="module")
def rank(served: Any) -> Iterator[Any]:
    with grpc.insecure_channel(served.grpc_target) as channel:
        yield channel.unary_unary(
            RANK_METHOD,
            request_serializer=lambda raw: raw,  # bytes: the test sends messages and junk alike
            response_deserializer=pb.RankResponse.FromString,
        )


def _rest(served: Any, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{served.url}/v1/rank", json=body, timeout=30)


def _grpc(rank: Any, body: dict[str, Any]) -> tuple[grpc.StatusCode, Any]:
    try:
        return grpc.StatusCode.OK, answer_fields(rank(pb.RankRequest(**body).SerializeToString(), timeout=30))
    except grpc.RpcError as exc:
        return exc.code(), exc.details()


def test_the_same_request_gets_the_same_ranking_over_rest_and_grpc(served: Any, rank: Any) -> None:
    world = served.world
    before = edge.metric(served.url, "headwater_rank_latency_seconds_count", fallback="popularity")
    for n, user in enumerate(world.user_ids[:5]):
        candidates = world.item_ids[n * 7 : n * 7 + 40]
        body = {"user_id": user, "candidates": candidates, "k": 10, "log_impressions": False}
        over_rest = _rest(served, body)
        assert over_rest.status_code == 200, over_rest.text
        code, over_grpc = _grpc(rank, body)
        assert code == grpc.StatusCode.OK, over_grpc
        expected = {key: over_rest.json()[key] for key in SAME}
        assert {key: over_grpc[key] for key in SAME} == expected
        assert expected["fallback"] == "popularity"
        assert len(expected["items"]) == 10
    after = edge.metric(served.url, "headwater_rank_latency_seconds_count", fallback="popularity")
    assert after - before == 10  # both protocols' calls, in the same metrics
    # The client library's gRPC transport answers as its REST one.
    user, candidates = world.user_ids[0], world.item_ids[:30]
    with (
        RankingClient(served.url) as rest,
        RankingClient(served.grpc_target, protocol="grpc") as over_grpc_client,
    ):
        a = rest.rank(user, candidates, k=5, log_impressions=False)
        b = over_grpc_client.rank(user, candidates, k=5, log_impressions=False)
    assert (a.source, b.source) == ("service", "service"), (a.reason, b.reason)
    assert a.items == b.items
    assert b.answer is not None
    assert b.answer["fallback"] == "popularity"


BAD = [
    ({"user_id": "", "candidates": ["i1"], "k": 1}, "user_id"),
    ({"user_id": "u1", "candidates": [], "k": 1}, "candidates"),
    ({"user_id": "u1", "candidates": ["i1", "i1"], "k": 1}, "candidates"),
    ({"user_id": "u1", "candidates": ["i1"], "k": 0}, "k"),
    ({"user_id": "u1", "candidates": ["i1", "i2"], "k": 3}, "k"),
    ({"user_id": "u1", "candidates": [f"i{n}" for n in range(2001)], "k": 1}, "candidates"),
    ({"user_id": "u1", "candidates": ["i1"], "k": 1, "priority": "urgent"}, "priority"),
    ({"user_id": "u1", "candidates": ["i1"], "k": 1, "device": "tv"}, "device"),
    ({"user_id": "u1", "candidates": ["i1"], "k": 1, "deadline_ms": 0.0}, "deadline_ms"),
    ({"user_id": "u1", "candidates": ["i1"], "k": 1, "user_class": "x" * 65}, "user_class"),
]


@pytest.mark.parametrize(("body", "field"), BAD, ids=[f for _, f in BAD])
def test_what_rest_refuses_is_invalid_argument_with_the_same_message(
    served: Any, rank: Any, body: dict[str, Any], field: str
) -> None:
    over_rest = _rest(served, body)
    assert over_rest.status_code == 422, over_rest.text
    code, detail = _grpc(rank, body)
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert detail == over_rest.json()["detail"]
    assert f"{field}:" in detail


def test_bytes_that_are_not_a_rank_request_are_invalid_argument(rank: Any) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        rank(b"\x0a\xff\xff\xff", timeout=30)  # field 1, a length that runs past the end
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "not a headwater.v1.RankRequest" in (caught.value.details() or "")


ids = st.one_of(st.sampled_from(["i000001", "i000002", "i000003", "u000001"]), st.text(max_size=140))


@st.composite
def messages(draw: st.DrawFn) -> dict[str, Any]:
    body: dict[str, Any] = {
        "user_id": draw(ids),
        "candidates": draw(st.lists(ids, max_size=12)),
        "k": draw(st.integers(-(2**31), 2**31 - 1) | st.integers(0, 14)),
        "log_impressions": False,
    }
    optional = {
        "priority": st.sampled_from(["high", "normal", "low"]) | st.text(max_size=10),
        "deadline_ms": st.floats(allow_nan=True, allow_infinity=True) | st.floats(1.0, 500.0),
        "session_id": st.text(max_size=140),
        "device": st.sampled_from(["ios", "android", "web"]) | st.text(max_size=10),
        "user_class": st.sampled_from(["vip", "regular", "new"]) | st.text(max_size=70),
    }
    for name, values in optional.items():
        if draw(st.booleans()):
            body[name] = draw(values)
    return body


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=messages())
def test_no_message_gets_unknown_or_internal(rank: Any, body: dict[str, Any]) -> None:
    code, answer = _grpc(rank, body)
    assert code in (grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT), (code, answer)
    if code == grpc.StatusCode.OK:
        returned = [item["item_id"] for item in answer["items"]]
        assert len(returned) == body["k"]
        assert set(returned) <= set(body["candidates"])
    else:
        assert answer.startswith("invalid request: "), answer
