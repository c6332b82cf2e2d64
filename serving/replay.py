"""``headwater replay``: send recorded ranking requests again, at their pacing, and compare the answers.

Steps of one replay:

1. Read the recordings, files (:func:`~headwater.serving.recording.read_records`) or a topic
   (:func:`~headwater.serving.recording.read_topic_records`), sorted by arrival.
2. Send request ``i`` at ``start + (at_ms[i] - at_ms[0]) / speed``, without waiting for earlier
   answers (an open loop, as real traffic is), at most ``max_in_flight`` at once; a send that
   had to wait for a slot is counted as behind schedule.
3. For each answer: client-side latency, status (a non-2xx or a transport error is an error),
   fallback, and whether the ranked item ids differ from the recorded ones (same ids in the same
   order is unchanged; only pairs where both answers are 200s are compared).
4. Report latency p50/p95/p99, errors by kind, fallbacks by kind, and the changed share.

The replayed requests carry ``log_impressions: false`` unless asked otherwise, so a replay does
not feed impressions back into the training stream.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from headwater.serving.recording import Recorded

BEHIND_TOLERANCE_MS = 10.0
"""A send later than its due time by more than this counts as behind schedule."""

if TYPE_CHECKING:
    import httpx


@dataclass(frozen=True)
class Outcome:
    """What one replayed request got."""

    latency_ms: float
    status: int | None
    """None: no HTTP answer (the error says why)."""
    error: str | None
    fallback: str | None
    """``<fallback> (<reason>)``, or None when the DCN answered."""
    changed: bool | None
    """Whether the ranked ids differ from the recording; None when not comparable."""
    behind_ms: float


@dataclass
class ReplayReport:
    """The figures of one replay."""

    url: str
    speed: float
    requests: int
    recorded_span_s: float
    wall_s: float
    latency_ms: dict[str, float | None]
    errors: dict[str, int]
    fallbacks: dict[str, int]
    compared: int
    changed: int
    behind_schedule: int
    max_behind_ms: float
    recorded_fallbacks: dict[str, int] = field(default_factory=dict)
    recorded_server_latency_ms: dict[str, float | None] = field(default_factory=dict)
    """The service's own latency in the recording (``latency_ms``: from the engine, no network)."""

    @property
    def error_count(self) -> int:
        """Requests that got no 2xx answer."""
        return sum(self.errors.values())

    @property
    def changed_share(self) -> float | None:
        """Share of the compared answers whose ranked ids differ from the recording."""
        return self.changed / self.compared if self.compared else None

    def as_dict(self) -> dict[str, Any]:
        """Return the report as plain JSON data."""
        return {
            "url": self.url,
            "speed": self.speed,
            "requests": self.requests,
            "recorded_span_s": round(self.recorded_span_s, 3),
            "wall_s": round(self.wall_s, 3),
            "rate_per_s": round(self.requests / self.wall_s, 2) if self.wall_s > 0 else None,
            "latency_ms": self.latency_ms,
            "errors": self.errors,
            "error_count": self.error_count,
            "fallbacks": self.fallbacks,
            "recorded_fallbacks": self.recorded_fallbacks,
            "recorded_server_latency_ms": self.recorded_server_latency_ms,
            "compared": self.compared,
            "changed": self.changed,
            "changed_share": None if self.changed_share is None else round(self.changed_share, 6),
            "behind_schedule": self.behind_schedule,
            "max_behind_ms": round(self.max_behind_ms, 3),
        }

    def text(self) -> str:
        """Return the report as a few lines for a terminal."""
        lat, served = self.latency_ms, self.recorded_server_latency_ms
        share = self.changed_share
        changed = "n/a" if share is None else f"{share:.2%} ({self.changed} of {self.compared})"
        errors = ", ".join(f"{k} {v}" for k, v in sorted(self.errors.items())) or "none"
        fallbacks = ", ".join(f"{k} {v}" for k, v in sorted(self.fallbacks.items())) or "none"
        recorded = ", ".join(f"{k} {v}" for k, v in sorted(self.recorded_fallbacks.items())) or "none"
        return "\n".join(
            [
                f"replayed {self.requests} requests to {self.url} at {self.speed:g}x:"
                f" {self.wall_s:.1f} s for a recorded {self.recorded_span_s:.1f} s",
                f"latency ms: p50 {_ms(lat['p50'])}  p95 {_ms(lat['p95'])}  p99 {_ms(lat['p99'])}"
                f"  max {_ms(lat['max'])}",
                f"errors: {self.error_count} ({errors})",
                f"fallbacks: {fallbacks} (recorded: {recorded})",
                f"answers changed against the recording: {changed}",
                f"sent more than {BEHIND_TOLERANCE_MS:g} ms behind schedule: {self.behind_schedule}"
                f" (max {self.max_behind_ms:.1f} ms)",
                f"recorded server-side latency ms: p50 {_ms(served.get('p50'))}"
                f"  p99 {_ms(served.get('p99'))} (the service's own, without the network)",
            ]
        )


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def percentiles(values: Sequence[float]) -> dict[str, float | None]:
    """Return p50, p95, p99 and max of ``values`` (None each when empty)."""
    import numpy as np  # here: `headwater --help` does not pay for numpy

    if not values:
        return {"p50": None, "p95": None, "p99": None, "max": None}
    arr = np.asarray(values, dtype=np.float64)
    p50, p95, p99 = np.percentile(arr, [50, 95, 99])
    return {
        "p50": round(float(p50), 3),
        "p95": round(float(p95), 3),
        "p99": round(float(p99), 3),
        "max": round(float(arr.max()), 3),
    }


def summarise(
    records: Sequence[Recorded], outcomes: Sequence[Outcome], url: str, speed: float, wall_s: float
) -> ReplayReport:
    """Turn the outcomes of a replay into its report."""
    span = (records[-1].at_ms - records[0].at_ms) / 1000.0 if records else 0.0
    ok = [o for o in outcomes if o.error is None]
    errors = Counter(o.error for o in outcomes if o.error is not None)
    fallbacks = Counter(o.fallback or "none" for o in ok)
    recorded = Counter(r.fallback or "none" for r in records if r.items is not None)
    compared = [o.changed for o in outcomes if o.changed is not None]
    behind = [o.behind_ms for o in outcomes if o.behind_ms > BEHIND_TOLERANCE_MS]
    return ReplayReport(
        url=url,
        speed=speed,
        requests=len(outcomes),
        recorded_span_s=span,
        wall_s=wall_s,
        latency_ms=percentiles([o.latency_ms for o in ok]),
        errors=dict(errors),
        fallbacks=dict(fallbacks),
        compared=len(compared),
        changed=sum(compared),
        behind_schedule=len(behind),
        max_behind_ms=max(behind, default=0.0),
        recorded_fallbacks=dict(recorded),
        recorded_server_latency_ms=percentiles([r.latency_ms for r in records if r.latency_ms is not None]),
    )


async def replay(
    records: Sequence[Recorded],
    url: str,
    speed: float = 1.0,
    max_in_flight: int = 64,
    timeout_s: float = 10.0,
    log_impressions: bool = False,
) -> ReplayReport:
    """Send ``records`` to ``url`` (the service's base URL) at ``speed`` times their pacing."""
    import httpx

    endpoint = url.rstrip("/") + "/v1/rank"
    slots = asyncio.Semaphore(max_in_flight)
    limits = httpx.Limits(max_connections=max_in_flight, max_keepalive_connections=max_in_flight)
    outcomes: list[Outcome | None] = [None] * len(records)
    async with httpx.AsyncClient(timeout=timeout_s, limits=limits) as client:
        loop = asyncio.get_running_loop()
        start = loop.time()
        first = records[0].at_ms if records else 0
        tasks = []
        for i, record in enumerate(records):
            due = start + (record.at_ms - first) / 1000.0 / speed
            delay = due - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            await slots.acquire()
            behind = max(0.0, (loop.time() - due) * 1000.0)
            body = record.request if log_impressions else {**record.request, "log_impressions": False}
            tasks.append(
                asyncio.create_task(_send(client, endpoint, body, record, behind, slots, outcomes, i))
            )
        await asyncio.gather(*tasks)
        wall = loop.time() - start
    done = [o for o in outcomes if o is not None]
    return summarise(records, done, url, speed, wall)


async def _send(
    client: httpx.AsyncClient,
    endpoint: str,
    body: dict[str, Any],
    record: Recorded,
    behind_ms: float,
    slots: asyncio.Semaphore,
    outcomes: list[Outcome | None],
    index: int,
) -> None:
    import httpx

    started = time.perf_counter()
    try:
        response = await client.post(endpoint, json=body)
    except httpx.HTTPError as exc:
        latency = (time.perf_counter() - started) * 1000.0
        outcomes[index] = Outcome(latency, None, type(exc).__name__, None, None, behind_ms)
        return
    finally:
        slots.release()
    latency = (time.perf_counter() - started) * 1000.0
    if not response.is_success:
        outcomes[index] = Outcome(
            latency, response.status_code, f"http_{response.status_code}", None, None, behind_ms
        )
        return
    try:
        answer = response.json()
        items = [x["item_id"] for x in answer["items"]]
        fallback = answer.get("fallback")
        if fallback is not None:
            fallback = f"{fallback} ({answer.get('fallback_reason') or 'unknown'})"
    except (ValueError, KeyError, TypeError):
        outcomes[index] = Outcome(latency, response.status_code, "bad_answer", None, None, behind_ms)
        return
    changed = None
    if record.items is not None and 200 <= record.status < 300:
        changed = items != record.items
    outcomes[index] = Outcome(latency, response.status_code, None, fallback, changed, behind_ms)
