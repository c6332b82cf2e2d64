"""bench/loadgen.py against a tiny real HTTP/1.1 server: what open-loop load sees that a closed loop hides.

The server runs on its own event loop in a thread (a free loopback port) and answers one request at a
time (a lock: one event loop's worth of capacity), in a fixed service time, once stalling for 300 ms.
Assertions are on counts and on the stall's arithmetic, with bounds generous enough that this noisy
machine's speed does not decide them.
"""

from __future__ import annotations

import asyncio
import importlib.util
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

_PATH = Path(__file__).resolve().parents[3] / "bench/loadgen.py"
_spec = importlib.util.spec_from_file_location("bench_loadgen", _PATH)
assert _spec is not None
assert _spec.loader is not None
loadgen = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = loadgen  # dataclasses look their module up there
_spec.loader.exec_module(loadgen)

BODY = loadgen.encode("/v1/recommend", b'{"user_id":"u1","k":20}')
STALL_S = 0.3
LAG = 250.0
"""The dispatch-lag bound of the tests whose subject is not the generator (this machine is shared)."""


class Server:
    """A one-at-a-time HTTP/1.1 keep-alive server; ``status(i)`` chooses the i-th answer's status."""

    def __init__(
        self, service_s: float, stall_at: int | None = None, status: Callable[[int], int] = lambda i: 200
    ) -> None:
        self.service_s = service_s
        self.stall_at = stall_at
        self.status = status
        self.requests = 0
        self.by_status: dict[int, int] = {}
        self.stall: tuple[float, float] | None = None  # time.monotonic(), the clock of loop.time()
        self.port = 0
        self._ready = threading.Event()
        self._loop = asyncio.new_event_loop()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length")
                )
                await reader.readexactly(length)
                async with self._lock:  # one request at a time, as one busy event loop serves
                    i = self.requests
                    self.requests += 1
                    if i == self.stall_at:
                        began = time.monotonic()
                        await asyncio.sleep(STALL_S)
                        self.stall = (began, time.monotonic())
                    else:
                        await asyncio.sleep(self.service_s)
                status = self.status(i)
                self.by_status[status] = self.by_status.get(status, 0) + 1
                writer.write(f"HTTP/1.1 {status} X\r\nContent-Length: 2\r\n\r\n{{}}".encode())
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._lock = asyncio.Lock()
        server = self._loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", 0))
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()
        server.close()
        handlers = asyncio.all_tasks(self._loop)
        for task in handlers:
            task.cancel()
        self._loop.run_until_complete(asyncio.gather(*handlers, return_exceptions=True))
        self._loop.run_until_complete(server.wait_closed())
        self._loop.close()

    @contextmanager
    def running(self) -> Iterator[Server]:
        thread = threading.Thread(target=self._run, daemon=True)
        thread.start()
        assert self._ready.wait(10)
        try:
            yield self
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            thread.join(10)


def test_open_loop_sees_the_requests_queued_behind_a_stall_and_a_closed_loop_hides_them() -> None:
    with Server(service_s=0.001, stall_at=100).running() as server:
        result = asyncio.run(
            loadgen.open_loop(server.port, [BODY], rate=100.0, seconds=3.0, lag_bound_ms=LAG)
        )
    assert server.stall is not None
    began, ended = server.stall
    lat = result.latencies_s()
    intended = result.intended[result.measured()]
    during = (intended >= began) & (intended < ended)
    # Every request that was due while the server stalled waited for the stall's end at least.
    assert during.sum() >= 20  # ~30 arrivals in 300 ms at 100/s
    assert np.all(lat[during] >= (ended - intended[during]) - 0.002)
    summary = result.summary()
    assert summary["max_ms"] >= 290.0
    assert summary["p99_ms"] >= 250.0  # >= 20 of ~300 requests waited >= 100 ms: the tail is theirs
    assert np.count_nonzero(lat >= 0.1) >= 15
    assert summary["late"] == 0
    assert summary["errors"] == {}

    with Server(service_s=0.001, stall_at=200).running() as server:
        closed = asyncio.run(loadgen.closed_loop(server.port, [BODY], connections=4, seconds=3.0))
    assert server.stall is not None
    # Closed loop: only the (at most 4) requests in flight saw the stall; the ones users would have
    # sent meanwhile were never sent, so the stall is below its p99.
    assert closed.summary()["max_ms"] >= 290.0
    assert np.count_nonzero(closed.latencies_s >= 0.1) <= 4
    assert len(closed.latencies_s) >= 500
    assert closed.summary()["p99_ms"] < 100.0


def test_achieved_rate_matches_the_offered_rate_on_a_fast_server() -> None:
    with Server(service_s=0.001).running() as server:
        result = asyncio.run(
            loadgen.open_loop(
                server.port, [BODY], rate=200.0, seconds=2.0, warmup=0.5, arrivals="poisson", lag_bound_ms=LAG
            )
        )
    s = result.summary()
    assert s["offered_rps"] == 200.0
    assert 0.8 * 200 <= s["requests"] <= 1.2 * 200 * 2.0  # Poisson: about 400 arrivals in 2 s
    assert abs(s["achieved_rps"] * 2.0 - s["requests"]) <= 0.1 * s["requests"]
    assert s["late"] == 0
    assert s["errors"] == {}
    assert s["generator_behind"] is None
    assert s["generator_cpu_ms_per_request"] is not None
    assert s["generator_cpu_ms_per_request"] > 0
    assert server.requests == result.answers_total == len(result.intended)


def test_poisson_arrivals_are_seeded() -> None:
    a = loadgen.arrival_offsets(50.0, 4.0, "poisson", seed=3)
    b = loadgen.arrival_offsets(50.0, 4.0, "poisson", seed=3)
    assert np.array_equal(a, b)
    assert 120 <= len(a) <= 280
    assert np.all(np.diff(a) > 0)
    assert np.array_equal(loadgen.arrival_offsets(4.0, 1.0), [0.0, 0.25, 0.5, 0.75])


def test_sweep_stops_at_the_first_saturated_rate() -> None:
    # 20 ms a request, one at a time: at most 50 answers a second.
    with Server(service_s=0.02).running() as server:

        async def at(rate: float) -> Any:
            return await loadgen.open_loop(
                server.port, [BODY], rate=rate, seconds=1.5, drain=0.5, lag_bound_ms=LAG
            )

        probed: list[float] = []

        def probe() -> Callable[[Any], dict[str, float]]:
            def finish(result: Any) -> dict[str, float]:
                probed.append(result.offered_rps)
                return {"probe": 1.0}

            return finish

        curve = asyncio.run(loadgen.sweep([10.0, 100.0, 200.0], at, p99_bound_ms=5000.0, probe=probe))
    points = curve["points"]
    assert [p["offered_rps"] for p in points] == [10.0, 100.0]  # 200 never run
    assert probed == [10.0, 100.0]
    assert all(p["probe"] == 1.0 for p in points)
    assert points[0]["saturated"] is None
    assert points[1]["saturated"] is not None
    assert "achieved" in points[1]["saturated"]
    assert points[1]["achieved_rps"] <= 60.0
    assert curve["saturated_at"] == 100.0
    assert curve["generator_behind_at"] is None
    # The backlog shows as latency and as late requests, not as a lower offered rate.
    assert points[1]["late"] > 0
    assert points[1]["p99_ms"] >= 500.0
    assert "late" in loadgen.table(curve)


def test_a_p99_over_the_bound_saturates_too() -> None:
    with Server(service_s=0.001, stall_at=10).running() as server:

        async def at(rate: float) -> Any:
            return await loadgen.open_loop(server.port, [BODY], rate=rate, seconds=1.0, lag_bound_ms=LAG)

        curve = asyncio.run(loadgen.sweep([100.0, 200.0], at, p99_bound_ms=100.0))
    assert len(curve["points"]) == 1
    assert "p99" in curve["points"][0]["saturated"]
    assert curve["saturated_at"] == 100.0


def test_error_answers_are_counted_by_status() -> None:
    def status(i: int) -> int:
        return 500 if i % 4 == 0 else 429 if i % 4 == 1 else 200

    with Server(service_s=0.001, status=status).running() as server:
        result = asyncio.run(loadgen.open_loop(server.port, [BODY], rate=100.0, seconds=1.0))
    s = result.summary()
    assert s["requests"] == 100
    assert s["errors"] == {"429": server.by_status[429], "500": server.by_status[500]}
    assert s["errors"] == {"429": 25, "500": 25}
    assert s["late"] == 0
    assert s["achieved_rps"] <= 52.0  # only the 200s count as achieved


def test_a_refused_connection_is_an_error_not_a_hang() -> None:
    with Server(service_s=0.001).running() as server:
        port = server.port
    result = asyncio.run(loadgen.open_loop(port, [BODY], rate=50.0, seconds=0.5, drain=0.5))
    s = result.summary()
    assert s["errors"] == {"connection": s["requests"]}
    assert s["achieved_rps"] == 0.0
    assert s["late"] == 0


def test_a_generator_that_cannot_keep_up_says_so() -> None:
    # The generator's own loop blocked 50 ms at a time (as a saturated Python loop is): its dispatch lag
    # shows it, and the sweep stops there instead of drawing the generator's limit as the server's curve.
    async def blocked(rate: float) -> Any:
        async def hog() -> None:
            while True:
                time.sleep(0.05)
                await asyncio.sleep(0.01)

        task = asyncio.create_task(hog())
        try:
            return await loadgen.open_loop(server.port, [BODY], rate=rate, seconds=1.0, lag_bound_ms=20.0)
        finally:
            task.cancel()

    with Server(service_s=0.001).running() as server:
        curve = asyncio.run(loadgen.sweep([50.0, 100.0], blocked))
    assert len(curve["points"]) == 1
    point = curve["points"][0]
    assert point["generator_lag_p99_ms"] >= 30.0
    assert "dispatch lag" in point["generator_behind"]
    assert curve["generator_behind_at"] == 50.0
    assert curve["saturated_at"] is None  # the server kept up; the generator did not


@given(st.text(max_size=40))
def test_parse_rates_gives_increasing_positive_rates_or_a_message(text: str) -> None:
    try:
        rates = loadgen.parse_rates(text)
    except ValueError as e:
        message = str(e)
    else:
        assert rates
        assert all(r > 0 for r in rates)
        assert rates == sorted(set(rates))
        return
    assert message.startswith("--rates: ")


@pytest.mark.parametrize(
    ("text", "expected"), [("20,40,80", [20.0, 40.0, 80.0]), ("5", [5.0]), (" 1.5, 3", [1.5, 3.0])]
)
def test_parse_rates_reads_a_comma_list(text: str, expected: list[float]) -> None:
    assert loadgen.parse_rates(text) == expected


@pytest.mark.parametrize("text", ["", "a", "0", "-5", "nan", "inf", "40,20", "20,20"])
def test_parse_rates_rejects_with_the_entry_named(text: str) -> None:
    with pytest.raises(ValueError, match="--rates"):
        loadgen.parse_rates(text)
