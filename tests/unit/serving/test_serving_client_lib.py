"""`RankingClient` against an ``httpx.MockTransport``: timeouts, retries, Retry-After, the breaker.

A fake clock stands in for time: the mock "takes" N ms by moving it, sleeps are recorded, not slept.
"""

from __future__ import annotations

import json
import random
import threading
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from headwater.client.ranking import (
    Backoff,
    BreakerConfig,
    RankingClient,
    RankingRequestError,
    RankingUnavailable,
    _retry_after,
)

URL = "http://ranker.test"
CANDIDATES = ["i1", "i2", "i3", "i4", "i5"]


class Clock:
    """A clock the test moves; ``sleep`` moves it too and records each wait."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def ranked(body: dict[str, Any]) -> dict[str, Any]:
    """The service's answer shape: the first k candidates in reverse order, scored."""
    top = list(reversed(body["candidates"]))[: body["k"]]
    return {
        "items": [{"item_id": i, "score": 1.0 - n / 10} for n, i in enumerate(top)],
        "model_version": "m1",
    }


Step = Callable[[httpx.Request], httpx.Response]


def service(clock: Clock, steps: list[Step | float | int], seen: list[httpx.Request]) -> httpx.MockTransport:
    """Answer call n with ``steps[n]``: a float = a good answer taking that many ms, an int = that status."""

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        step = steps[min(len(seen), len(steps)) - 1]
        if callable(step):
            return step(request)
        if isinstance(step, int):
            return httpx.Response(step, json={"detail": f"status {step}", "errors": []})
        clock.now += step / 1000.0
        return httpx.Response(200, json=ranked(json.loads(request.content)))

    return httpx.MockTransport(handle)


def make(steps: list[Step | float | int], **kwargs: Any) -> tuple[RankingClient, Clock, list[httpx.Request]]:
    clock, seen = Clock(), []  # type: ignore[var-annotated]
    kwargs.setdefault("rng", random.Random(7))
    kwargs.setdefault("breaker", BreakerConfig(failures=3, slow_ms=100.0, cool_down_s=5.0))
    client = RankingClient(
        URL, transport=service(clock, steps, seen), clock=clock, sleep=clock.sleep, **kwargs
    )
    return client, clock, seen


def timeout(request: httpx.Request) -> httpx.Response:
    raise httpx.ReadTimeout("read timed out", request=request)


def refused(request: httpx.Request) -> httpx.Response:
    raise httpx.ConnectError("connection refused", request=request)


def test_a_good_answer_comes_from_the_service_with_its_timeout() -> None:
    client, _, seen = make([20.0], timeout_s=0.25)
    result = client.rank("u1", CANDIDATES, k=2)
    assert result.item_ids == ["i5", "i4"]
    assert [item.score for item in result.items] == [1.0, 0.9]
    assert (result.source, result.attempts, result.breaker) == ("service", 1, "closed")
    assert result.reason == "answered in 20 ms"
    assert result.answer is not None
    assert result.answer["model_version"] == "m1"
    assert seen[0].extensions["timeout"] == {"connect": 0.25, "read": 0.25, "write": 0.25, "pool": 0.25}
    assert json.loads(seen[0].content) == {"user_id": "u1", "candidates": CANDIDATES, "k": 2}


def test_the_timeout_of_one_call_overrides_the_clients_and_options_are_sent() -> None:
    client, _, seen = make([20.0], timeout_s=1.0)
    client.rank("u1", CANDIDATES, k=1, timeout_s=0.05, priority="high", log_impressions=False)
    assert seen[0].extensions["timeout"]["read"] == 0.05
    assert json.loads(seen[0].content)["priority"] == "high"
    assert json.loads(seen[0].content)["log_impressions"] is False


def test_timeouts_are_retried_with_full_jitter_from_a_seeded_rng() -> None:
    client, clock, seen = make([timeout, refused, 10.0], retries=2, backoff=Backoff(base_s=0.1, cap_s=1.0))
    result = client.rank("u1", CANDIDATES, k=1)
    assert result.source == "service"
    assert result.attempts == 3
    assert len(seen) == 3
    rng = random.Random(7)
    assert clock.sleeps == [rng.uniform(0.0, 0.1), rng.uniform(0.0, 0.2)]
    assert "after 3 attempts" in result.reason
    assert "ConnectError" in result.reason


def test_the_backoff_is_capped() -> None:
    rng = random.Random(1)
    waits = [Backoff(base_s=0.1, cap_s=0.3).delay(n, rng) for n in range(50)]
    assert all(0.0 <= w <= 0.3 for w in waits)
    assert max(waits[5:]) > 0.2  # past the cap's retry, the whole [0, cap] range is drawn


@pytest.mark.parametrize("status", [500, 502, 503, 504, 429])
def test_5xx_and_429_are_retried(status: int) -> None:
    client, _, seen = make([status, 10.0], retries=3)
    result = client.rank("u1", CANDIDATES, k=1)
    assert result.source == "service"
    assert len(seen) == 2
    assert f"answered {status}" in result.reason


def test_retry_after_is_honoured_instead_of_the_jitter() -> None:
    def busy(request: httpx.Request) -> httpx.Response:
        return httpx.Response(429, json={"detail": "queue full"}, headers={"Retry-After": "0.7"})

    client, clock, seen = make([busy, busy, 10.0], retries=2)
    assert client.rank("u1", CANDIDATES, k=1).source == "service"
    assert clock.sleeps == [0.7, 0.7]
    assert len(seen) == 3


def test_a_retry_after_over_the_limit_ends_the_retries() -> None:
    def busy(request: httpx.Request) -> httpx.Response:
        return httpx.Response(503, json={"detail": "down"}, headers={"Retry-After": "60"})

    client, clock, seen = make([busy], retries=3, fallback=["i3"])
    result = client.rank("u1", CANDIDATES, k=1)
    assert len(seen) == 1
    assert clock.sleeps == []
    assert result.source == "fallback"
    assert result.item_ids == ["i3"]
    assert "Retry-After 60 s is over 10 s" in result.reason


@pytest.mark.parametrize("status", [400, 404, 413, 422])
def test_other_4xx_are_never_retried(status: int) -> None:
    client, clock, seen = make([status], retries=3, fallback=["i1"])
    with pytest.raises(RankingRequestError, match=f"answered {status}: status {status}") as caught:
        client.rank("u1", CANDIDATES, k=1)
    assert caught.value.status == status
    assert len(seen) == 1
    assert clock.sleeps == []
    assert client.breaker.state == "closed"


def test_the_breaker_opens_after_three_slow_answers_and_serves_the_last_good_result() -> None:
    client, _, seen = make([150.0, 150.0, 150.0, 10.0], fallback=["i1", "i2"])
    answers = [client.rank("u1", CANDIDATES, k=3) for _ in range(3)]
    assert [a.source for a in answers] == ["service"] * 3  # slow answers are still answers
    assert [a.breaker for a in answers] == ["closed", "closed", "open"]
    assert "slow: over 100 ms" in answers[0].reason

    result = client.rank("u1", CANDIDATES, k=3, unavailable={"i4"})
    assert len(seen) == 3  # not called while open
    assert result.source == "cache"
    assert result.attempts == 0
    # i4 dropped, order of the last good result kept, one topped up from popularity.
    assert result.item_ids == ["i5", "i3", "i1"]
    assert [item.score for item in result.items] == [1.0, 0.8, None]
    assert "circuit open after 3 consecutive slow or failed answers" in result.reason
    assert "answer took 150 ms > 100 ms" in result.reason
    assert "2 of the last good result" in result.reason
    assert "1 from popularity" in result.reason


def test_an_open_breaker_without_a_last_good_result_answers_from_popularity() -> None:
    client, _, _ = make([refused], retries=0, fallback=lambda: ["i9", "i4", "i2", "i1"])
    for _ in range(3):
        client.rank("u1", CANDIDATES, k=2)
    result = client.rank("u2", CANDIDATES, k=2, unavailable={"i4"})
    assert result.source == "fallback"
    assert result.item_ids == ["i2", "i1"]
    assert "no last good result for the user" in result.reason
    assert "ConnectError" in result.reason


def test_without_a_fallback_list_there_is_nothing_to_answer_from() -> None:
    client, _, _ = make([timeout], retries=1)
    with pytest.raises(RankingUnavailable, match="timed out after 1 s"):
        client.rank("u1", CANDIDATES, k=2)


def test_retries_stop_once_the_breaker_opens() -> None:
    client, clock, seen = make([refused], retries=5, fallback=["i1"])
    result = client.rank("u1", CANDIDATES, k=1)
    assert len(seen) == 3
    assert result.attempts == 3
    assert len(clock.sleeps) == 2  # no wait after the attempt that opened it
    assert result.breaker == "open"
    assert "circuit open" in result.reason


def test_half_open_probe_closes_on_a_good_answer_and_reopens_on_a_bad_one() -> None:
    client, clock, seen = make([150.0, 150.0, 150.0, timeout, 20.0, 20.0], retries=3, fallback=["i1"])
    for _ in range(3):
        client.rank("u1", CANDIDATES, k=1)
    assert client.breaker.state == "open"
    clock.now += 5.0
    assert client.breaker.state in ("half_open",)  # a fresh read (mypy keeps the narrowed "open")
    probe = client.rank("u1", CANDIDATES, k=1)
    assert len(seen) == 4
    assert probe.attempts == 1
    assert probe.source == "cache"
    assert probe.breaker == "open"
    assert "timed out" in probe.reason
    assert "next probe in 5.0 s" in probe.reason
    clock.now += 5.0
    good = client.rank("u1", CANDIDATES, k=1)
    assert (good.source, good.breaker, len(seen)) == ("service", "closed", 5)
    assert client.rank("u1", CANDIDATES, k=1).source == "service"


def test_a_good_answer_resets_the_count_of_bad_ones() -> None:
    client, _, _ = make([150.0, 150.0, 20.0, 150.0, 150.0, 20.0])
    assert [client.rank("u1", CANDIDATES, k=1).breaker for _ in range(6)] == ["closed"] * 6


def test_the_slow_threshold_and_count_are_configurable() -> None:
    client, _, _ = make([60.0], breaker=BreakerConfig(failures=2, slow_ms=50.0), fallback=["i1"])
    assert [client.rank("u1", CANDIDATES, k=1).breaker for _ in range(2)] == ["closed", "open"]


def test_only_one_probe_goes_out_at_a_time() -> None:
    clock = Clock()
    inside, release = threading.Event(), threading.Event()
    calls: list[int] = []

    def handle(request: httpx.Request) -> httpx.Response:
        calls.append(1)
        if len(calls) > 1:  # the probe: held until the other call has been answered
            inside.set()
            release.wait(10)
            return httpx.Response(200, json=ranked(json.loads(request.content)))
        raise httpx.ConnectError("refused", request=request)

    client = RankingClient(
        URL,
        transport=httpx.MockTransport(handle),
        breaker=BreakerConfig(failures=1, cool_down_s=1.0),
        retries=0,
        fallback=["i1"],
        clock=clock,
        sleep=clock.sleep,
    )
    client.rank("u1", CANDIDATES, k=1)
    clock.now += 1.0
    results = []
    probe = threading.Thread(target=lambda: results.append(client.rank("u1", CANDIDATES, k=1)))
    probe.start()
    assert inside.wait(10)
    other = client.rank("u2", CANDIDATES, k=1)
    release.set()
    probe.join(10)
    assert other.source == "fallback"
    assert other.attempts == 0
    assert len(calls) == 2
    assert results[0].source == "service"
    assert results[0].breaker == "closed"


def test_an_unreadable_200_is_a_failure() -> None:
    def garbage(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=b"not json")

    client, _, seen = make([garbage], retries=1, fallback=["i2"])
    result = client.rank("u1", CANDIDATES, k=1)
    assert len(seen) == 2
    assert result.source == "fallback"
    assert "unreadable body" in result.reason


def test_all_candidates_unavailable_is_the_callers_error() -> None:
    client, _, seen = make([10.0])
    with pytest.raises(RankingRequestError, match="all 2 are marked unavailable"):
        client.rank("u1", ["i1", "i2"], unavailable=["i1", "i2"])
    assert seen == []


def test_the_last_good_results_are_bounded_per_user() -> None:
    client, _, _ = make([10.0, 10.0, refused], cache_users=1, retries=0, fallback=["i1"])
    client.rank("u1", CANDIDATES, k=1)
    client.rank("u2", CANDIDATES, k=1)
    assert client.rank("u1", CANDIDATES, k=1).source == "fallback"  # u1 was evicted by u2


def test_retry_after_reads_seconds_and_http_dates() -> None:
    assert _retry_after("2") == 2.0
    assert _retry_after("-3") == 0.0
    assert _retry_after(None) is None
    assert _retry_after("soon") is None
    assert _retry_after("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0  # in the past: retry now


def test_the_client_package_imports_neither_torch_nor_fastapi() -> None:
    import subprocess
    import sys

    code = (
        "import sys, headwater.client, headwater.cli.client;"
        "print(sorted(m for m in ('torch', 'fastapi', 'numpy', 'uvicorn') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert out.strip() == "[]"
