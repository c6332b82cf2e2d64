"""Keep one nearline worker running: after a failure, a fresh worker after a back-off, counted.

A worker fails when Redis or Kafka goes away (an online write, a changelog send, a restore in the
rebalance callback) or on a bug. It commits nothing of the batch it was in (the commit protocol in
``runner.py``), closes its stores and leaves the group; :func:`supervise_worker` then waits
(exponential back-off with jitter, capped) and starts a new worker in the same process, which
restores its partitions from their stores and resumes at their committed offsets: nothing is lost
or counted twice. The back-off starts again from the first step once a worker has run
``reset_after_s`` without failing.

Counters go into the worker's ``counters`` (hence its stats file): ``restarts`` and
``errors_<kind>`` for kind ``fenced`` (a newer owner took a partition: ``fence.py``), ``redis``,
``kafka``, ``commit`` (a step of the commit protocol), ``setup`` (opening a partition in the
rebalance callback) and ``other``. The counters of every
worker of the process add up (one dict, handed from worker to worker).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Protocol

from headwater.pipelines.retry import Backoff

log = logging.getLogger("headwater.nearline")
__all__ = ["ERROR_KINDS", "Backoff", "Worker", "error_kind", "supervise_worker"]

ERROR_KINDS = ("fenced", "redis", "kafka", "commit", "setup", "other")


class Worker(Protocol):
    """What the supervisor needs of a worker (``runner.NearlineWorker`` has it)."""

    counters: dict[str, float]

    def run(self, stop: threading.Event, idle_exit_s: float | None = None) -> None:
        """Poll and commit until ``stop`` is set or idle; raise on a failure (after closing)."""
        ...


def error_kind(exc: BaseException) -> str:
    """Return the counter kind of a worker failure (see the module docstring)."""
    from kafka.errors import KafkaError
    from redis.exceptions import RedisError

    from headwater.pipelines.nearline.fence import fenced
    from headwater.pipelines.nearline.runner import NearlineCommitError, NearlineSetupError

    if fenced(exc):
        return "fenced"
    if isinstance(exc, NearlineSetupError):
        return "setup"
    if isinstance(exc, NearlineCommitError):
        return "commit"
    for seen in _chain(exc):
        if isinstance(seen, RedisError):
            return "redis"
        if isinstance(seen, KafkaError):
            return "kafka"
    return "other"


def _chain(exc: BaseException) -> list[BaseException]:
    """Return the exception and its causes/contexts, outermost first (at most 20)."""
    out: list[BaseException] = []
    cur: BaseException | None = exc
    while cur is not None and len(out) < 20:
        out.append(cur)
        cur = cur.__cause__ or cur.__context__
    return out


def supervise_worker(
    make: Callable[[], Worker],
    stop: threading.Event,
    idle_exit_s: float | None = None,
    backoff: Backoff | None = None,
    counters: dict[str, float] | None = None,
) -> dict[str, float]:
    """Run workers made by ``make`` one after another until one returns (stopped or idle).

    A worker that raises ``Exception`` is counted and replaced after the back-off; ``stop``
    interrupts the wait. Returns the counters (``counters`` if given, filled in).
    """
    policy = backoff or Backoff()
    totals = counters if counters is not None else {}
    totals.setdefault("restarts", 0)
    for kind in ERROR_KINDS:
        totals.setdefault(f"errors_{kind}", 0)
    streak = 0
    while not stop.is_set():
        started = time.monotonic()
        try:
            worker = make()
            for name, value in worker.counters.items():
                totals.setdefault(name, value)
            worker.counters = totals  # one dict: the stats file shows the process's totals
            worker.run(stop, idle_exit_s=idle_exit_s)
            return totals
        except Exception as exc:
            kind = error_kind(exc)
            totals[f"errors_{kind}"] += 1
            if time.monotonic() - started >= policy.reset_after_s:
                streak = 0
            wait_s = policy.delay(streak)
            streak += 1
            totals["restarts"] += 1
            # the first failure of a streak with its trace; the repeats (an outage) in one line
            report = log.exception if streak == 1 else log.warning
            report(
                "nearline worker failed (%s: %s: %s); restart %d in %.1f s",
                kind,
                type(exc).__name__,
                exc,
                int(totals["restarts"]),
                wait_s,
            )
            stop.wait(wait_s)
    return totals
