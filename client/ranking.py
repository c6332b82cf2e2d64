"""A Python client of the ranking service (REST ``POST /v1/rank`` or gRPC ``Rank``) that degrades on its own.

:class:`RankingClient` calls the service (``protocol="rest"``, or ``"grpc"`` at the service's
``--grpc-port``: :mod:`headwater.client.transport`) with a timeout per attempt, retries connection errors,
timeouts, 429 and 5xx with exponential backoff and full jitter (a ``Retry-After`` is honoured), and
never retries another 4xx (the request itself is wrong: :class:`RankingRequestError`). Every attempt
of one call carries the call's request id (``X-Request-Id``, minted once per call), so the service
logs a retried call's impressions once, not once per attempt. A circuit breaker counts consecutive
bad attempts (slower than ``slow_ms``, 5xx, no answer); a 429 is not one (the service answered: one
user class over its quota says nothing of the others, and the wait is its Retry-After). At
``failures`` bad attempts it opens and the client answers without calling: from the user's last
good result (items the caller marks unavailable dropped, order kept, topped up from the popularity
list), or from the caller's popularity list when there is none. After ``cool_down_s`` one call
probes the service; a good answer closes the breaker. Every :class:`RankResult` says where it came
from and why.

Typical use::

    with RankingClient("http://127.0.0.1:8080", fallback=popular_items) as client:
        result = client.rank("u000042", candidates, k=10, unavailable={"i000007"})
        result.item_ids, result.source, result.reason
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from itertools import chain
from typing import Any, Literal

import httpx

from headwater.client.tls import ClientTls
from headwater.client.transport import GrpcTransport, NoAnswer, Reply, RestTransport, Transport, retry_after

Source = Literal["service", "cache", "fallback"]
BreakerState = Literal["closed", "open", "half_open"]
Fallback = Sequence[str] | Callable[[], Sequence[str]]
Protocol = Literal["rest", "grpc"]


class RankingError(Exception):
    """Base of the errors this client raises."""


class RankingRequestError(RankingError):
    """The service refused the request with a 4xx other than 429: the request is wrong, never retried."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(f"/v1/rank answered {status}: {detail}")
        self.status = status
        self.detail = detail


class RankingUnavailable(RankingError):
    """No answer from the service, no last good result for the user and no fallback list to answer from."""


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff with full jitter: retry ``n`` (from 0) waits ``uniform(0, min(cap, base * 2**n))``.

    A ``Retry-After`` header replaces the jittered wait; one over ``max_retry_after_s`` ends the
    retries (the caller gets a degraded answer now rather than after a long wait).
    """

    base_s: float = 0.05
    cap_s: float = 2.0
    max_retry_after_s: float = 10.0

    def delay(self, retry: int, rng: random.Random) -> float:
        """Return the wait before retry number ``retry`` (0 for the first retry)."""
        return rng.uniform(0.0, min(self.cap_s, self.base_s * 2**retry))


@dataclass(frozen=True)
class BreakerConfig:
    """Open after ``failures`` consecutive attempts slower than ``slow_ms`` or failed; then probe."""

    failures: int = 3
    slow_ms: float = 100.0
    cool_down_s: float = 5.0


class CircuitBreaker:
    """Closed -> open after N consecutive bad attempts -> half-open (one probe) after the cool-down.

    A good answer (fast enough, not failed) closes it from any state; a bad probe opens it again for
    another cool-down. Only one probe is in flight at a time: other calls meanwhile are refused.
    """

    def __init__(self, config: BreakerConfig, clock: Callable[[], float]) -> None:
        self.config = config
        self._clock = clock
        self._lock = threading.Lock()
        self._state: BreakerState = "closed"
        self._bad = 0
        self._opened_at = 0.0
        self._probing = False
        self.last_bad = ""
        """Why the last bad attempt was bad (the reason given while open)."""

    @property
    def state(self) -> BreakerState:
        """The current state; an open breaker past its cool-down reads ``half_open``."""
        with self._lock:
            if self._state == "open" and self._clock() - self._opened_at >= self.config.cool_down_s:
                return "half_open"
            return self._state

    def acquire(self) -> tuple[bool, bool]:
        """May an attempt go to the service now, and is it the probe? ``(allowed, probe)``."""
        with self._lock:
            if self._state == "closed":
                return True, False
            if self._probing or self._clock() - self._opened_at < self.config.cool_down_s:
                return False, False
            self._state, self._probing = "half_open", True
            return True, True

    def record(self, good: bool, why: str, probe: bool) -> None:
        """Count one attempt's outcome (``why``: what was wrong with a bad one)."""
        with self._lock:
            if probe:
                self._probing = False
            if good:
                self._state, self._bad = "closed", 0
                return
            self.last_bad = why
            self._bad += 1
            if probe or (self._state == "closed" and self._bad >= self.config.failures):
                self._state, self._opened_at = "open", self._clock()

    def release(self, probe: bool) -> None:
        """End an attempt that tells nothing of the service's health (a 429): not counted; frees the probe."""
        if probe:
            with self._lock:
                self._probing = False

    def why_open(self) -> str:
        """Say why an attempt was refused (for the answer's ``reason``)."""
        with self._lock:
            left = max(0.0, self.config.cool_down_s - (self._clock() - self._opened_at))
            return (
                f"circuit open after {self._bad} consecutive slow or failed answers (last: {self.last_bad});"
                f" next probe in {left:.1f} s"
            )


@dataclass(frozen=True)
class RankedItem:
    """One item of an answer; ``score`` is None for an item the service did not score (a top-up)."""

    item_id: str
    score: float | None


@dataclass(frozen=True)
class RankResult:
    """An answer: the items, best first, where they came from and why."""

    items: tuple[RankedItem, ...]
    source: Source
    """``service``: answered now; ``cache``: from the user's last good result; ``fallback``: popularity."""
    reason: str
    attempts: int
    """Calls made to the service for this answer (0 when the breaker was open)."""
    latency_ms: float
    """Client-side time of the whole call, retries and waits included."""
    breaker: BreakerState
    """The breaker's state after this call."""
    answer: Mapping[str, Any] | None = None
    """The service's JSON answer (model_version, fallback, request_id, ...) when ``source`` is ``service``."""

    @property
    def item_ids(self) -> list[str]:
        """The item ids, best first."""
        return [item.item_id for item in self.items]


@dataclass(frozen=True)
class _LastGood:
    items: tuple[RankedItem, ...]
    at: float


class _Attempt:
    """The outcome of one HTTP attempt: an answer, a refusal, or a retryable failure with its reason."""

    def __init__(self, why: str, retry_after: float | None = None) -> None:
        self.why = why
        self.retry_after = retry_after


class RankingClient:
    """A thread-safe client of the rank call with timeouts, retries and a circuit breaker.

    ``base_url``: ``http://host:port`` for REST; ``host:port`` (or ``grpc://host:port``) with
    ``protocol="grpc"``. ``token``: the credential sent on every call (an API key or a JWT, as
    ``Authorization: Bearer``); a 401 or 403 is a :class:`RankingRequestError`, never retried.
    ``tls``: the service's CA and the client certificate for mTLS (:class:`~headwater.client.tls.ClientTls`).
    ``fallback``: the popularity list (or a function returning it) used to top up a degraded
    answer and to answer when the user has no last good result. ``transport``, ``clock``, ``sleep``
    and ``rng`` are for tests (an ``httpx.MockTransport`` or any
    :class:`~headwater.client.transport.Transport`, a fake clock, a recorded sleep, a seeded rng).
    """

    def __init__(
        self,
        base_url: str,
        *,
        timeout_s: float = 1.0,
        retries: int = 2,
        backoff: Backoff | None = None,
        breaker: BreakerConfig | None = None,
        fallback: Fallback | None = None,
        cache_users: int = 10_000,
        protocol: Protocol = "rest",
        token: str | None = None,
        tls: ClientTls | None = None,
        transport: httpx.BaseTransport | Transport | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        rng: random.Random | None = None,
    ) -> None:
        if retries < 0 or timeout_s <= 0 or cache_users < 1:
            got = f"{retries}, {timeout_s}, {cache_users}"
            msg = f"retries must be >= 0, timeout_s > 0 and cache_users >= 1; got {got}"
            raise ValueError(msg)
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self.retries = retries
        self.backoff = backoff or Backoff()
        self.breaker = CircuitBreaker(breaker or BreakerConfig(), clock)
        self.fallback = fallback
        self._cache: OrderedDict[str, _LastGood] = OrderedDict()
        self._cache_users = cache_users
        self._lock = threading.Lock()
        self._clock, self._sleep = clock, sleep
        self._rng = rng or random.Random()
        self.protocol = protocol
        self._transport: Transport
        if transport is not None and not isinstance(transport, httpx.BaseTransport):
            self._transport = transport
        elif protocol == "grpc":
            self._transport = GrpcTransport(self.base_url, token, tls)
        elif protocol == "rest":
            self._transport = RestTransport(self.base_url, transport, token, tls)
        else:
            msg = f"protocol must be 'rest' or 'grpc'; got {protocol!r}"
            raise ValueError(msg)

    def rank(
        self,
        user_id: str,
        candidates: Sequence[str],
        k: int = 10,
        *,
        unavailable: Collection[str] = (),
        timeout_s: float | None = None,
        fallback: Fallback | None = None,
        request_id: str | None = None,
        **options: Any,
    ) -> RankResult:
        """Rank ``candidates`` for ``user_id``; the best ``k`` of those not in ``unavailable``.

        ``timeout_s`` overrides the client's timeout for each attempt of this call; ``fallback``
        overrides its popularity list; ``request_id`` names this call (1-64 of ``A-Z a-z 0-9 . _ -``;
        default a fresh one), sent on each of its attempts; ``options`` are further ``RankRequest``
        fields (priority, deadline_ms, session_id, device, log_impressions, user_class). Raises
        :class:`RankingRequestError` on a 4xx other than 429 and :class:`RankingUnavailable` when
        there is nothing to answer from.
        """
        gone = set(unavailable)
        items = [c for c in candidates if c not in gone]
        if not items:
            msg = f"no candidates left for user {user_id!r}: all {len(candidates)} are marked unavailable"
            raise RankingRequestError(422, msg)
        k = min(k, len(items))
        body = {"user_id": user_id, "candidates": items, "k": k, **options}
        timeout = self.timeout_s if timeout_s is None else timeout_s
        call_id = request_id or uuid.uuid4().hex  # once per logical call: every retry sends the same
        start = self._clock()
        attempts, why = 0, ""
        for retry in range(self.retries + 1):
            allowed, probe = self.breaker.acquire()
            if not allowed:
                why = self.breaker.why_open()
                break
            attempts += 1
            outcome = self._attempt(body, timeout, probe, call_id)
            if isinstance(outcome, RankResult):
                self._remember(user_id, outcome.items)
                took = (self._clock() - start) * 1000.0
                note = "" if attempts == 1 else f" after {attempts} attempts (before: {why})"
                reason = outcome.reason + note
                return RankResult(
                    outcome.items, "service", reason, attempts, took, self.breaker.state, outcome.answer
                )
            why = outcome.why
            if probe:  # a probe is one attempt; it failed, so the breaker is open again
                why = f"the probe {why}; {self.breaker.why_open()}"
                break
            if retry == self.retries:
                break
            if self.breaker.state != "closed":  # this attempt opened it: no point waiting to be refused
                why = f"{why}; {self.breaker.why_open()}"
                break
            wait = outcome.retry_after
            if wait is not None and wait > self.backoff.max_retry_after_s:
                why += f"; Retry-After {wait:g} s is over {self.backoff.max_retry_after_s:g} s, not retried"
                break
            self._sleep(self.backoff.delay(retry, self._rng) if wait is None else wait)
        return self._degraded(user_id, items, k, why, attempts, start, fallback)

    def _attempt(
        self, body: dict[str, Any], timeout: float, probe: bool, request_id: str
    ) -> RankResult | _Attempt:
        slow_ms = self.breaker.config.slow_ms
        began = self._clock()
        try:
            reply: Reply = self._transport.call(body, timeout, request_id)
        except NoAnswer as exc:
            self.breaker.record(False, str(exc), probe)
            return _Attempt(str(exc))
        except BaseException:
            self.breaker.record(False, "the call was interrupted", probe)  # never leave a probe in flight
            raise
        took = (self._clock() - began) * 1000.0
        status = reply.status
        if status == 429:  # retried after Retry-After, but not a failure: the service is up and said so
            self.breaker.release(probe)
            return _Attempt(f"answered 429: {reply.detail}", reply.retry_after_s)
        if status >= 500:
            why = f"answered {status}: {reply.detail}"
            self.breaker.record(False, why, probe)
            return _Attempt(why, reply.retry_after_s)
        if status != 200:
            self.breaker.record(took <= slow_ms, f"answered {status} in {took:.0f} ms", probe)
            raise RankingRequestError(status, reply.detail)
        answer = reply.body
        try:
            if answer is None:
                items: tuple[RankedItem, ...] | None = None
                problem = reply.detail
            else:
                items = tuple(RankedItem(str(i["item_id"]), float(i["score"])) for i in answer["items"])
        except (ValueError, KeyError, TypeError) as exc:
            items, problem = None, f"{type(exc).__name__}: {exc}"
        if items is None or answer is None:
            why = f"answered 200 with an unreadable body ({problem})"
            self.breaker.record(False, why, probe)
            return _Attempt(why)
        slow = took > slow_ms
        self.breaker.record(not slow, f"answer took {took:.0f} ms > {slow_ms:g} ms", probe)
        reason = f"answered in {took:.0f} ms" + (f" (slow: over {slow_ms:g} ms)" if slow else "")
        return RankResult(items, "service", reason, 1, took, self.breaker.state, answer)

    def _remember(self, user_id: str, items: tuple[RankedItem, ...]) -> None:
        with self._lock:
            self._cache[user_id] = _LastGood(items, self._clock())
            self._cache.move_to_end(user_id)
            while len(self._cache) > self._cache_users:
                self._cache.popitem(last=False)

    def _degraded(
        self,
        user_id: str,
        candidates: list[str],
        k: int,
        why: str,
        attempts: int,
        start: float,
        fallback: Fallback | None,
    ) -> RankResult:
        """Answer from the last good result (available candidates only), topped up from popularity."""
        with self._lock:
            last = self._cache.get(user_id)
        chosen = fallback if fallback is not None else self.fallback
        popular = chosen() if callable(chosen) else chosen
        if last is None and popular is None:
            msg = f"ranking for user {user_id!r} unavailable: {why}; no last good result and no fallback list"
            raise RankingUnavailable(msg)
        allowed = set(candidates)
        items = [item for item in (last.items if last else ()) if item.item_id in allowed][:k]
        cached = len(items)
        seen = {item.item_id for item in items}
        # Popular items first, then the caller's order: an answer always has k items.
        for item_id in chain(popular or (), candidates):
            if len(items) >= k:
                break
            if item_id in allowed and item_id not in seen:
                items.append(RankedItem(item_id, None))
                seen.add(item_id)
        if last is None:
            origin = "no last good result for the user"
        else:
            origin = f"{cached} of the last good result ({self._clock() - last.at:.1f} s old)"
        reason = (
            f"{why}; {origin}, {len(items) - cached} from {'popularity' if popular else 'the candidates'}"
        )
        took = (self._clock() - start) * 1000.0
        source: Source = "cache" if cached else "fallback"
        return RankResult(tuple(items), source, reason, attempts, took, self.breaker.state)

    def close(self) -> None:
        """Close the connections (HTTP or the gRPC channel)."""
        self._transport.close()

    def __enter__(self) -> RankingClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


_retry_after = retry_after  # the name the unit tests knew
