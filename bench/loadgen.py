"""An open-loop HTTP/1.1 load generator: a fixed arrival rate, latency from the intended send time.

A closed loop (N connections, each sending its next request when the last answer arrives) slows down
with the server: while the server stalls, the requests that users would have sent are never sent, and
the few that were in flight are the only ones that see the stall. Its p99 understates what users see
("coordinated omission"). This generator does not wait for the server:

1. The arrival times are fixed before the run: a constant interval ``1/rate`` or, with
   ``arrivals="poisson"``, exponential gaps drawn from a seeded ``random.Random`` (the same run is the
   same schedule).
2. A dispatcher wakes at each arrival time and queues every request that is due (after a late wake-up,
   all the overdue ones at once, each keeping its own intended time).
3. Keep-alive connections take requests from that queue in order. A request that finds no idle
   connection waits in the queue while a new connection is opened for it, up to ``max_connections``;
   past that bound it waits for the first connection to come free (the server's backlog then shows as
   latency, as it would for users; it is not hidden by sending less).
4. Latency is the answer's arrival minus the request's *intended* send time. The run schedules
   ``warmup + seconds`` of arrivals, measures those intended in the last ``seconds`` and then waits up
   to ``drain`` seconds for answers. A request still unsent or unanswered then is *late*: counted and
   reported (``late``, split into ``unsent`` and ``no_answer``), and it enters the percentiles with the
   latency it had reached at the end of the drain, a lower bound, so a stuck server cannot flatter p99.
5. The generator reports itself: its CPU per request (``time.thread_time`` of the loop's thread, so a
   writer thread or an in-process test server beside it is not counted) and its dispatch lag (how late
   the dispatcher woke after each intended time). When that lag's p99 passes ``lag_bound_ms`` or the
   loop's thread is busy more than 90% of the run, ``generator_behind`` is set and the figures are the
   generator's limit, not the server's.

``sweep`` runs a list of offered rates in turn and stops after the first point that is saturated
(achieved < 0.9 x offered, or p99 > ``p99_bound_ms``) or where the generator fell behind.
``closed_loop`` is the closed-loop measurement, kept for comparison (what ``bench_serve.level`` does).
"""

from __future__ import annotations

import asyncio
import collections
import math
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

Floats = npt.NDArray[np.float64]
Ints = npt.NDArray[np.int64]

CONNECTION_ERROR = -1
"""The status recorded for a request whose connection failed (refused, reset, closed mid-answer)."""
SATURATION_SHARE = 0.9
"""A point is saturated when the achieved rate falls below this share of the offered rate."""
BUSY_SHARE = 0.9
"""The generator is behind when its thread was on the CPU more than this share of the run."""


def encode(path: str, body: bytes, host: str = "127.0.0.1") -> bytes:
    """One pre-encoded HTTP/1.1 POST of a JSON body (encoded once, sent many times)."""
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


def parse_rates(text: str) -> list[float]:
    """``"20,40,80"`` as offered rates (requests a second): positive, finite, increasing.

    Raises ValueError naming the bad entry, for the command line to print.
    """
    rates: list[float] = []
    for raw in text.split(","):
        try:
            rate = float(raw)
        except ValueError:
            raise ValueError(f"--rates: {raw.strip()!r} is not a number; give e.g. 20,40,80") from None
        if not math.isfinite(rate) or rate <= 0:
            raise ValueError(f"--rates: {raw.strip()!r} must be a positive number of requests a second")
        if rates and rate <= rates[-1]:
            raise ValueError(f"--rates: {raw.strip()!r} follows {rates[-1]:g}; give increasing rates")
        rates.append(rate)
    return rates


def arrival_offsets(rate: float, seconds: float, arrivals: str = "constant", seed: int = 0) -> Floats:
    """Intended send times (seconds from the start) of a ``seconds``-long run at ``rate`` a second."""
    if arrivals == "constant":
        return np.arange(int(rate * seconds)) / rate
    if arrivals == "poisson":
        rng = random.Random(seed)
        out: list[float] = []
        t = rng.expovariate(rate)
        while t < seconds:
            out.append(t)
            t += rng.expovariate(rate)
        return np.asarray(out, dtype=np.float64)
    raise ValueError(f"arrivals: {arrivals!r} is neither 'constant' nor 'poisson'")


async def _exchange(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: bytes
) -> tuple[int, bytes]:
    """Send one request on a keep-alive connection and read its answer: (status, body)."""
    writer.write(request)
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line[:15].lower() == b"content-length:":
            length = int(line[15:])
    body = await reader.readexactly(length) if length else b""
    return int(head[9:12]), body


def _percentiles(lat_ms: Floats) -> dict[str, float | None]:
    """p50/p90/p99/p99.9/max of latencies in ms (None for an empty run)."""
    if not len(lat_ms):
        return {"p50_ms": None, "p90_ms": None, "p99_ms": None, "p999_ms": None, "max_ms": None}
    p50, p90, p99, p999 = np.percentile(lat_ms, [50, 90, 99, 99.9])
    return {
        "p50_ms": round(float(p50), 2),
        "p90_ms": round(float(p90), 2),
        "p99_ms": round(float(p99), 2),
        "p999_ms": round(float(p999), 2),
        "max_ms": round(float(lat_ms.max()), 2),
    }


@dataclass
class LoadResult:
    """One open-loop run at one offered rate. Times are ``loop.time()`` seconds (monotonic)."""

    offered_rps: float
    seconds: float
    intended: Floats
    """Each request's intended send time."""
    sent: Floats
    """When it was written (NaN: never sent)."""
    answered: Floats
    """When its answer arrived (NaN: none by the end of the drain)."""
    status: Ints
    """Its HTTP status (0: no answer; ``CONNECTION_ERROR``: its connection failed)."""
    dispatched: Floats
    """When the dispatcher queued it (its lag behind ``intended`` is the generator's own)."""
    window: tuple[float, float]
    """The measured window: requests intended in [start, end) are measured."""
    drained_at: float
    generator_cpu_s: float
    wall_s: float
    connections: int
    lag_bound_ms: float
    answers_total: int
    """Answers (any status) over the whole run, warm-up included: the server's work in the run."""

    def measured(self) -> npt.NDArray[np.bool_]:
        """Mask of the requests intended inside the measured window."""
        start, end = self.window
        return (self.intended >= start) & (self.intended < end)

    def latencies_s(self) -> Floats:
        """Latency from the intended send time of each measured request; a late one's lower bound."""
        m = self.measured()
        answered = self.answered[m]
        done: Floats = np.where(np.isnan(answered), self.drained_at, answered)
        return done - self.intended[m]

    def summary(self) -> dict[str, Any]:
        """Return the figures of this run (JSON-ready): rates, percentiles, errors, lateness, generator."""
        m = self.measured()
        start, end = self.window
        in_window = (self.answered >= start) & (self.answered < end)
        ok = int(np.count_nonzero(in_window & (self.status == 200)))
        answered = int(np.count_nonzero(in_window & (self.status != 0)))
        errors = collections.Counter(
            "connection" if s == CONNECTION_ERROR else str(s) for s in self.status[m] if s not in (0, 200)
        )
        open_ = m & np.isnan(self.answered)
        unsent = int(np.count_nonzero(open_ & np.isnan(self.sent)))
        no_answer = int(np.count_nonzero(open_ & ~np.isnan(self.sent)))
        dispatched = np.where(np.isnan(self.dispatched), self.drained_at, self.dispatched)  # never queued
        lag_ms = (dispatched[m] - self.intended[m]) * 1000.0
        send_lag_ms = (self.sent[m] - self.intended[m]) * 1000.0
        send_lag_ms = send_lag_ms[~np.isnan(send_lag_ms)]
        sent_total = int(np.count_nonzero(~np.isnan(self.sent)))
        dispatch_p99 = round(float(np.percentile(lag_ms, 99)), 2) if len(lag_ms) else None
        busy = self.generator_cpu_s / self.wall_s if self.wall_s > 0 else 0.0
        behind = []
        if dispatch_p99 is not None and dispatch_p99 > self.lag_bound_ms:
            behind.append(f"dispatch lag p99 {dispatch_p99} ms > {self.lag_bound_ms:g} ms")
        if busy > BUSY_SHARE:
            behind.append(f"its thread was on the CPU {busy:.0%} of the run")
        return {
            "offered_rps": round(self.offered_rps, 2),
            "achieved_rps": round(ok / self.seconds, 2),
            "answered_rps": round(answered / self.seconds, 2),
            "requests": int(np.count_nonzero(m)),
            **_percentiles(self.latencies_s() * 1000.0),
            "errors": dict(sorted(errors.items())),
            "late": unsent + no_answer,
            "unsent": unsent,
            "no_answer": no_answer,
            "send_lag_p99_ms": round(float(np.percentile(send_lag_ms, 99)), 2) if len(send_lag_ms) else None,
            "generator_lag_p99_ms": dispatch_p99,
            "generator_cpu_ms_per_request": round(self.generator_cpu_s * 1000.0 / sent_total, 3)
            if sent_total
            else None,
            "generator_busy_share": round(busy, 3),
            "generator_behind": "; ".join(behind) or None,
            "connections": self.connections,
        }


@dataclass
class _Run:
    """The state one open-loop run shares between its dispatcher and its connections."""

    host: str
    port: int
    bodies: Sequence[bytes]
    intended: Floats
    max_connections: int
    sent: Floats = field(init=False)
    answered: Floats = field(init=False)
    status: Ints = field(init=False)
    dispatched: Floats = field(init=False)
    queue: asyncio.Queue[int] = field(default_factory=asyncio.Queue)
    idle: int = 0
    opened: int = 0
    answers: int = 0

    def __post_init__(self) -> None:
        n = len(self.intended)
        self.sent = np.full(n, np.nan)
        self.answered = np.full(n, np.nan)
        self.dispatched = np.full(n, np.nan)
        self.status = np.zeros(n, dtype=np.int64)

    async def connection(self) -> None:
        """One keep-alive connection: take the next queued request, send it, record its answer."""
        loop = asyncio.get_running_loop()
        reader: asyncio.StreamReader | None = None
        writer: asyncio.StreamWriter | None = None
        try:
            while True:
                i = await self.queue.get()
                self.idle -= 1
                try:
                    if writer is None or reader is None:
                        reader, writer = await asyncio.open_connection(self.host, self.port)
                    self.sent[i] = loop.time()
                    status, _ = await _exchange(reader, writer, self.bodies[i % len(self.bodies)])
                except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError):
                    status = CONNECTION_ERROR  # this request failed; the next one opens a fresh connection
                    if writer is not None:
                        writer.close()
                    reader = writer = None
                self.answered[i] = loop.time()
                self.status[i] = status
                self.answers += 1
                self.idle += 1
        finally:
            if writer is not None:
                writer.close()

    async def dispatch(self, start: float) -> None:
        """Queue each request at its intended time; open a connection when none is idle (bounded)."""
        loop = asyncio.get_running_loop()
        tasks: list[asyncio.Task[None]] = []
        i, n = 0, len(self.intended)
        try:
            while i < n:
                # Sleep even when already late (0 s): the connections must run while it catches up.
                await asyncio.sleep(max(0.0, start + self.intended[i] - loop.time()))
                now = loop.time()
                while i < n and start + self.intended[i] <= now:  # every request due by now
                    self.dispatched[i] = now
                    self.queue.put_nowait(i)
                    i += 1
                    if self.queue.qsize() > self.idle and self.opened < self.max_connections:
                        self.opened += 1
                        self.idle += 1  # counted idle from now: it takes a queued request once open
                        tasks.append(asyncio.create_task(self.connection()))
            await asyncio.Event().wait()  # until cancelled at the end of the drain
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await asyncio.sleep(0)  # one turn of the loop: the closed transports let go of their sockets


async def open_loop(
    port: int,
    bodies: Sequence[bytes],
    rate: float,
    seconds: float,
    *,
    warmup: float = 0.0,
    drain: float = 2.0,
    arrivals: str = "constant",
    seed: int = 0,
    max_connections: int = 64,
    lag_bound_ms: float = 10.0,
    host: str = "127.0.0.1",
) -> LoadResult:
    """Offer ``rate`` requests a second for ``warmup + seconds``, measure the last ``seconds``.

    ``bodies`` are whole pre-encoded requests (``encode``), sent in turn. The run ends when every
    request is answered or ``drain`` seconds after the last intended send, whichever comes first.
    """
    if rate <= 0 or seconds <= 0 or warmup < 0 or drain < 0 or max_connections < 1 or not bodies:
        raise ValueError(
            f"open_loop: rate {rate}, seconds {seconds}, warmup {warmup}, drain {drain}, max_connections"
            f" {max_connections}, {len(bodies)} bodies: give positive rate, seconds, connections and bodies"
        )
    loop = asyncio.get_running_loop()
    offsets = arrival_offsets(rate, warmup + seconds, arrivals, seed)
    run = _Run(host, port, bodies, offsets, max_connections)
    start = loop.time() + 0.05  # a little ahead, so the first arrivals are not already late
    cpu0, wall0 = time.thread_time(), time.perf_counter()
    dispatcher = asyncio.create_task(run.dispatch(start))
    deadline = start + warmup + seconds + drain
    while loop.time() < deadline and run.answers < len(offsets):
        await asyncio.sleep(min(0.05, max(0.0, deadline - loop.time())))
    drained_at = loop.time()
    dispatcher.cancel()
    await asyncio.gather(dispatcher, return_exceptions=True)
    cpu, wall = time.thread_time() - cpu0, time.perf_counter() - wall0
    return LoadResult(
        offered_rps=rate,
        seconds=seconds,
        intended=offsets + start,
        sent=run.sent,
        answered=run.answered,
        status=run.status,
        dispatched=run.dispatched,
        window=(start + warmup, start + warmup + seconds),
        drained_at=drained_at,
        generator_cpu_s=cpu,
        wall_s=wall,
        connections=run.opened,
        lag_bound_ms=lag_bound_ms,
        answers_total=run.answers,
    )


Probe = Callable[[], Callable[[LoadResult], dict[str, Any]]]
"""Called before each point; what it returns is called with the point's result and adds fields to it
(``bench_recommend`` puts the server's CPU per request there)."""


async def sweep(
    rates: Sequence[float],
    run_at: Callable[[float], Awaitable[LoadResult]],
    *,
    p99_bound_ms: float = 1000.0,
    probe: Probe | None = None,
) -> dict[str, Any]:
    """Run ``run_at(rate)`` for each rate in turn until the first saturated point; return the curve.

    A point is saturated when its achieved rate is below 0.9 x offered or its p99 is over
    ``p99_bound_ms``; the sweep also stops where the generator fell behind (the points past it would
    measure the generator). Returns ``{"points": [...], "saturated_at": rate | None,
    "generator_behind_at": rate | None, "p99_bound_ms": ...}``; each point is ``LoadResult.summary()``
    plus ``saturated`` (the reason, or None) and the probe's fields.
    """
    points: list[dict[str, Any]] = []
    saturated_at: float | None = None
    behind_at: float | None = None
    for rate in rates:
        finish = probe() if probe is not None else None
        result = await run_at(rate)
        point = result.summary()
        if finish is not None:
            point.update(finish(result))
        reasons = []
        if point["achieved_rps"] < SATURATION_SHARE * rate:
            reasons.append(f"achieved {point['achieved_rps']} < {SATURATION_SHARE:g} x {rate:g}")
        if point["p99_ms"] is not None and point["p99_ms"] > p99_bound_ms:
            reasons.append(f"p99 {point['p99_ms']} ms > {p99_bound_ms:g} ms")
        point["saturated"] = "; ".join(reasons) or None
        points.append(point)
        saturated_at = rate if reasons else None
        behind_at = rate if point["generator_behind"] else None
        if reasons or point["generator_behind"]:
            break
    return {
        "points": points,
        "saturated_at": saturated_at,
        "generator_behind_at": behind_at,
        "p99_bound_ms": p99_bound_ms,
    }


@dataclass
class ClosedLoopResult:
    """A closed-loop run: latency from the actual send (what a closed loop can see)."""

    latencies_s: Floats
    seconds: float

    def summary(self) -> dict[str, Any]:
        """Return the requests, rate and percentiles (JSON-ready)."""
        return {
            "requests": len(self.latencies_s),
            "rps": round(len(self.latencies_s) / self.seconds, 2),
            **_percentiles(self.latencies_s * 1000.0),
        }


async def closed_loop(
    port: int, bodies: Sequence[bytes], connections: int, seconds: float, host: str = "127.0.0.1"
) -> ClosedLoopResult:
    """Run ``connections`` keep-alive connections, each sending its next request when its answer arrives."""
    loop = asyncio.get_running_loop()
    until = loop.time() + seconds
    latencies: list[float] = []

    async def one(offset: int) -> None:
        reader, writer = await asyncio.open_connection(host, port)
        i = offset
        try:
            while loop.time() < until:
                sent = loop.time()
                await _exchange(reader, writer, bodies[i % len(bodies)])
                latencies.append(loop.time() - sent)
                i += 1
        finally:
            writer.close()

    started = loop.time()
    await asyncio.gather(*[one(c * 7) for c in range(connections)])
    return ClosedLoopResult(np.asarray(latencies), loop.time() - started)


def table(curve: dict[str, Any], extra: Sequence[tuple[str, str]] = ()) -> str:
    """Render the curve as a Markdown table: offered, achieved, p50, p99, max, errors, late, the generator."""
    cols = [("offered/s", "offered_rps"), ("achieved/s", "achieved_rps"), ("p50 ms", "p50_ms"),
            ("p99 ms", "p99_ms"), ("max ms", "max_ms"), *extra,
            ("gen CPU ms/req", "generator_cpu_ms_per_request"), ("gen lag p99 ms", "generator_lag_p99_ms"),
            ("errors", "errors"), ("late", "late"), ("saturated", "saturated")]  # fmt: skip
    lines = ["| " + " | ".join(c for c, _ in cols) + " |", "|" + " --- |" * len(cols)]
    for p in curve["points"]:
        cells = [str(p.get(k) if p.get(k) not in ({}, None) else "-") for _, k in cols]
        if p.get("generator_behind"):  # said in the row itself: this point measured the generator too
            cells[-1] = f"{p['saturated'] or 'no'}; generator behind: {p['generator_behind']}"
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
