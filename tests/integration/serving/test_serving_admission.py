"""Admission by user class against a real `headwater serve --admission --grpc-port` (real Redis).

A burst per class, sent at once from threads: every VIP request inside its quota (50 tokens) is
answered 200, while the `new` class (5 tokens) gets 429s whose Retry-After is valid: whole seconds,
the JSON's exact wait under one token's time (0.2 s), and a request sent after that wait is
admitted. gRPC refuses the same class with RESOURCE_EXHAUSTED and the wait in its trailing
metadata. The per-class counters in /metrics equal what the clients saw. Values only, no timing.
"""

from __future__ import annotations

import importlib.util
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest

from headwater.client.proto.headwater.v1 import ranking_pb2 as pb
from headwater.client.transport import RANK_METHOD

_spec = importlib.util.spec_from_file_location("edge_service", Path(__file__).with_name("edge_service.py"))
assert _spec is not None
assert _spec.loader is not None
edge = sys.modules.setdefault("edge_service", importlib.util.module_from_spec(_spec))
_spec.loader.exec_module(edge)

pytestmark = pytest.mark.integration
VIP_BURST = 40
"""Inside the VIP bucket of 50: all admitted however slowly the burst goes out."""
NEW_BURST = 60
"""Over the new bucket of 5 (plus 5/s): some refused unless the burst took 11 s to send."""


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[Any]:
    tmp = tmp_path_factory.mktemp("admission")
    with edge.running_service(tmp, redis_url, "--admission", grpc=True) as service:
        yield service


def _burst(
    url: str, n: int, *, header: str | None = None, body_class: str | None = None
) -> list[httpx.Response]:
    body: dict[str, Any] = {"user_id": "u000001", "candidates": ["i000001", "i000002", "i000003"], "k": 2,
                            "log_impressions": False}  # fmt: skip
    if body_class is not None:
        body["user_class"] = body_class
    headers = {"X-User-Class": header} if header is not None else {}
    with httpx.Client(timeout=60) as client, ThreadPoolExecutor(16) as pool:
        return list(pool.map(lambda _: client.post(f"{url}/v1/rank", json=body, headers=headers), range(n)))


def test_vip_is_answered_within_its_quota_while_new_is_throttled(served: Any) -> None:
    url = served.url
    vip = _burst(url, VIP_BURST, header="vip")
    new = _burst(url, NEW_BURST, body_class="new")

    assert [r.status_code for r in vip] == [200] * VIP_BURST
    codes = [r.status_code for r in new]
    assert set(codes) == {200, 429}
    assert codes.count(200) >= 5  # the bucket's burst at least
    for refused in (r for r in new if r.status_code == 429):
        answer = refused.json()
        assert refused.headers["Retry-After"] == "1"  # whole seconds, rounded up
        assert answer["user_class"] == "new"
        assert 0.0 < answer["retry_after_s"] <= 0.2
        assert "'new' is over its quota of 5 requests/s" in answer["detail"]

    # The wait it gave is enough: after it, the class is admitted again.
    time.sleep(max(r.json()["retry_after_s"] for r in new if r.status_code == 429))
    again = _burst(url, 1, body_class="new")
    assert again[0].status_code == 200

    # The header wins over the body; an unknown class is regular.
    assert _burst(url, 1, header="vip", body_class="new")[0].status_code == 200
    assert _burst(url, 1, header="gold")[0].status_code == 200

    counted = {
        (c, r): edge.metric(url, "headwater_admission_requests_total", result=r, user_class=c)
        for c in ("vip", "new", "regular")
        for r in ("admitted", "throttled")
    }
    assert counted == {
        ("vip", "admitted"): VIP_BURST + 1,
        ("vip", "throttled"): 0,
        ("new", "admitted"): codes.count(200) + 1,
        ("new", "throttled"): codes.count(429),
        ("regular", "admitted"): 1,
        ("regular", "throttled"): 0,
    }
    assert edge.metric(url, "headwater_rejected_total", reason="throttled") == codes.count(429)


def test_grpc_refuses_a_class_over_quota_with_resource_exhausted_and_the_wait(served: Any) -> None:
    request = pb.RankRequest(user_id="u000001", candidates=["i000001", "i000002"], k=1, log_impressions=False)
    with grpc.insecure_channel(served.grpc_target) as channel:
        rank = channel.unary_unary(
            RANK_METHOD,
            request_serializer=pb.RankRequest.SerializeToString,
            response_deserializer=pb.RankResponse.FromString,
        )

        def call(_: int) -> Any:
            try:
                rank(request, timeout=30, metadata=(("x-user-class", "new"),))
            except grpc.RpcError as exc:
                return exc
            return grpc.StatusCode.OK

        with ThreadPoolExecutor(16) as pool:
            outcomes = list(pool.map(call, range(NEW_BURST)))
    refused = [o for o in outcomes if not isinstance(o, grpc.StatusCode)]
    assert refused, f"{NEW_BURST} calls of the new class at once were all admitted"
    for exc in refused:
        assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "'new' is over its quota of 5 requests/s" in exc.details()
        trailing = dict(exc.trailing_metadata())
        assert trailing["retry-after"] == "1"
        assert 1 <= int(trailing["retry-after-ms"]) <= 200
