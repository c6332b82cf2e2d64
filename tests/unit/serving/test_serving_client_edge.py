"""`RankingClient` in incidents (issue 32 item 3): one request id per call, 429 is not a breaker failure.

- every attempt of one call carries the same ``X-Request-Id`` (gRPC: ``x-request-id``), two calls
  two ids, and a caller's own id is sent as given: the service logs a retried call's impressions once;
- a class over its quota (429) does not open the breaker for the others, and a 429 probe does not
  keep the breaker half-open for ever.
"""

from __future__ import annotations

import json
import random
from typing import Any

import httpx

from headwater.client.ranking import BreakerConfig, RankingClient
from headwater.client.transport import Reply

URL = "http://ranker.test"
CANDIDATES = ["i1", "i2", "i3"]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def _ranked(body: dict[str, Any], request_id: str) -> dict[str, Any]:
    return {
        "items": [{"item_id": i, "score": 0.5} for i in body["candidates"][: body["k"]]],
        "request_id": request_id,
    }


def test_every_attempt_of_a_call_sends_the_same_request_id() -> None:
    seen: list[httpx.Request] = []

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if len(seen) in (1, 2, 4):  # the first call's first two attempts fail, the second's first
            return httpx.Response(503, json={"detail": "down", "errors": []})
        return httpx.Response(200, json=_ranked(json.loads(request.content), request.headers["x-request-id"]))

    clock = Clock()
    client = RankingClient(
        URL,
        retries=2,
        transport=httpx.MockTransport(handle),
        clock=clock,
        sleep=clock.sleep,
        rng=random.Random(3),
    )
    first = client.rank("u1", CANDIDATES, k=2)
    second = client.rank("u1", CANDIDATES, k=2)
    mine = client.rank("u1", CANDIDATES, k=2, request_id="order-7")
    ids = [r.headers["x-request-id"] for r in seen]
    assert first.attempts == 3
    assert second.attempts == 2
    assert ids[0] == ids[1] == ids[2] == first.answer["request_id"]  # type: ignore[index]
    assert ids[3] == ids[4] == second.answer["request_id"]  # type: ignore[index]
    assert ids[0] != ids[3]
    assert len(ids[0]) == 32
    assert ids[5] == "order-7" == mine.answer["request_id"]  # type: ignore[index]


class Refusing:
    """A transport (the client's own interface): 429 for class ``new``, an answer for the others."""

    def __init__(self) -> None:
        self.calls: list[tuple[str | None, str | None]] = []

    def call(self, body: dict[str, Any], timeout_s: float, request_id: str | None = None) -> Reply:
        self.calls.append((body.get("user_class"), request_id))
        if body.get("user_class") == "new":
            return Reply(429, None, "class 'new' is over its quota", 0.2)
        return Reply(200, _ranked(body, request_id or ""), "")

    def close(self) -> None:
        return None


def test_a_class_over_its_quota_does_not_open_the_breaker_for_the_others() -> None:
    clock, transport = Clock(), Refusing()
    client = RankingClient(
        URL,
        retries=2,
        breaker=BreakerConfig(failures=2, slow_ms=100.0, cool_down_s=5.0),
        fallback=["i3"],
        transport=transport,
        clock=clock,
        sleep=clock.sleep,
    )
    throttled = [client.rank("u1", CANDIDATES, k=1, user_class="new") for _ in range(4)]
    assert [r.source for r in throttled] == ["fallback"] * 4
    assert all(r.attempts == 3 for r in throttled)  # each retried after its Retry-After
    assert clock.sleeps == [0.2] * 8
    assert "answered 429: class 'new' is over its quota" in throttled[0].reason
    assert client.breaker.state == "closed"  # 12 refusals, not one failure
    vip = client.rank("u2", CANDIDATES, k=1, user_class="vip")
    assert vip.source == "service"
    assert vip.attempts == 1
    assert vip.breaker == "closed"
    assert [c for c, _ in transport.calls] == ["new"] * 12 + ["vip"]
    assert len({rid for _, rid in transport.calls}) == 5  # one id per call, whatever the retries


def test_a_429_probe_frees_the_probe_slot() -> None:
    clock = Clock()
    answers = iter([503, 503, 429, 200])
    seen: list[httpx.Request] = []

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        status = next(answers)
        if status == 200:
            return httpx.Response(200, json=_ranked(json.loads(request.content), "x"))
        return httpx.Response(status, json={"detail": f"status {status}", "errors": []})

    client = RankingClient(
        URL,
        retries=0,
        breaker=BreakerConfig(failures=2, slow_ms=100.0, cool_down_s=5.0),
        fallback=["i3"],
        transport=httpx.MockTransport(handle),
        clock=clock,
        sleep=clock.sleep,
    )
    assert [client.rank("u1", CANDIDATES, k=1).source for _ in range(2)] == ["fallback"] * 2
    assert client.breaker.state == "open"
    clock.now += 5.0
    assert client.rank("u1", CANDIDATES, k=1).attempts == 1  # the probe, answered 429
    good = client.rank("u1", CANDIDATES, k=1)  # the next call may probe again at once
    assert good.source == "service"
    assert good.breaker == "closed"
    assert len(seen) == 4
