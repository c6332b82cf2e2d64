"""Back-off for writers that outlive an outage: the nearline supervisor, materialize, the landing.

One policy (:class:`Backoff`: exponential, capped, the upper half jittered so that writers failing
together do not retry in step) and one loop (:func:`retry_call`) for batch jobs that should wait
for Redis or Kafka to come back instead of dying, up to a limit after which the error is raised.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

log = logging.getLogger("headwater.retry")
T = TypeVar("T")


@dataclass(frozen=True)
class Backoff:
    """Exponential back-off: ``initial_s * factor**n`` capped at ``max_s``, the upper half jittered."""

    initial_s: float = 0.5
    factor: float = 2.0
    max_s: float = 30.0
    reset_after_s: float = 60.0
    """A supervised worker that ran this long before failing restarts after ``initial_s`` again."""

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        """Seconds to wait before retry number ``attempt`` (0-based) of a failing streak."""
        step = min(self.max_s, self.initial_s * self.factor ** min(attempt, 64))
        return step / 2 + (rng or random).uniform(0.0, step / 2)


def retry_call(
    fn: Callable[[], T],
    retry_on: tuple[type[BaseException], ...],
    what: str,
    backoff: Backoff | None = None,
    give_up_after_s: float = 300.0,
    on_retry: Callable[[BaseException, float], None] | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """Call ``fn`` until it returns; retry after ``retry_on`` errors with back-off.

    Only for idempotent calls (a failed attempt may have done part of its work). ``on_retry`` gets
    each error and the wait before the next attempt. After ``give_up_after_s`` of failing attempts,
    the last error is raised, with a note saying what was retried and for how long.
    """
    policy = backoff or Backoff()
    started = time.monotonic()
    attempt = 0
    while True:
        try:
            return fn()
        except retry_on as exc:
            waited = time.monotonic() - started
            if waited >= give_up_after_s:
                exc.add_note(f"{what}: gave up after {attempt + 1} attempts in {waited:.0f} s")
                raise
            wait_s = min(policy.delay(attempt), max(0.0, give_up_after_s - waited))
            (log.warning if attempt == 0 else log.info)(
                "%s failed (%s: %s); attempt %d in %.1f s", what, type(exc).__name__, exc, attempt + 2, wait_s
            )
            if on_retry is not None:
                on_retry(exc, wait_s)
            attempt += 1
            sleep(wait_s)
