"""Admission by user class at the service's edge: per-class token buckets and a priority gate.

Every ``rank`` call (REST or gRPC) passes here before the engine:

1. **Class.** The caller's credential names its class (:class:`~headwater.serving.auth.Identity`,
   from the API key's entry or the token's claim); the caller's own ``X-User-Class`` header (gRPC:
   ``x-user-class``) and body ``user_class`` are ignored, except the header of a trusted gateway
   (a credential with the ``gateway`` role), which wins over the gateway's own class. Only with
   ``auth: none`` is the caller's claim taken: the header, else the body. A class the config does
   not list, or none, is the config's ``default_class`` (``regular``).
2. **Quota.** A credential with its own quota takes a token from its own bucket first (always, even
   with admission off); then each class has one token bucket (``rate_per_s`` tokens a second,
   ``burst`` of them at most). A request takes a token or is refused with :class:`Throttled`, which
   says how many seconds until the next token (REST: 429 + ``Retry-After``; gRPC:
   RESOURCE_EXHAUSTED with ``retry-after`` in the trailing metadata).
3. **Priority.** The class sets the batcher priority (vip ``high``, regular ``normal``, new ``low``); a
   request may ask for a lower one, never a higher one (with admission off too).
4. **Gate.** At most ``max_in_flight`` requests rank at once; the others wait at the gate and are let
   in by priority, then by arrival. Under load, VIP requests therefore overtake the others before
   they reach the store reads and the batcher, not only inside the batcher's queues.

With admission off (the default) the class buckets and the gate are skipped: every request is
admitted (past its credential's own quota) at its class's priority or lower, and counted by class in
``headwater_admission_requests_total``. Feedback posts take tokens from the same buckets.
"""

from __future__ import annotations

import asyncio
import functools
import heapq
import itertools
import math
import threading
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge

from headwater.registry.errors import HeadwaterError
from headwater.serving.batcher import PRIORITIES
from headwater.serving.config import AdmissionConfig, CredentialQuota

if TYPE_CHECKING:
    from headwater.serving.auth import Identity

CLASS_HEADER = "x-user-class"
"""The header (REST) and metadata key (gRPC) naming the caller's user class."""
MAX_CLASS_LENGTH = 64
CREDENTIAL_BUCKETS = 10_000
"""Credentials whose own buckets are kept (least recently used forgotten past it: a full bucket again)."""


class Throttled(HeadwaterError):
    """The class is over its quota; a token comes back in ``retry_after_s`` seconds."""

    def __init__(
        self, user_class: str, rate_per_s: float, retry_after_s: float, credential: str | None = None
    ) -> None:
        self.user_class = user_class
        self.rate_per_s = rate_per_s
        self.retry_after_s = retry_after_s
        self.credential = credential
        """The credential over its own quota (None: the class is over the class's)."""
        who = f"credential {credential!r}" if credential is not None else f"user class {user_class!r}"
        super().__init__(
            f"{who} is over its quota of {rate_per_s:g} requests/s; retry after {retry_after_s:.3f} s"
        )

    @property
    def retry_after_header(self) -> str:
        """``Retry-After`` in whole seconds (HTTP's delta-seconds), rounded up, at least 1."""
        return str(max(1, math.ceil(self.retry_after_s)))


class TokenBucket:
    """``rate`` tokens a second up to ``capacity``; thread-safe (gRPC and REST share it)."""

    def __init__(self, rate: float, capacity: float, clock: Callable[[], float] = time.monotonic) -> None:
        if rate <= 0 or capacity < 1:
            msg = f"a token bucket needs rate > 0 and capacity >= 1; got {rate}, {capacity}"
            raise ValueError(msg)
        self.rate, self.capacity = rate, capacity
        self._clock = clock
        self._tokens = capacity
        self._at = clock()
        self._lock = threading.Lock()

    def take(self) -> float:
        """Take one token: 0.0 if there was one, else the seconds until there is one (nothing taken)."""
        with self._lock:
            now = self._clock()
            self._tokens = min(self.capacity, self._tokens + (now - self._at) * self.rate)
            self._at = now
            if self._tokens >= 1.0:
                self._tokens -= 1.0
                return 0.0
            return (1.0 - self._tokens) / self.rate


@dataclass(frozen=True)
class Admitted:
    """A request let in: its class and the priority it ranks at."""

    user_class: str
    priority: str


class PriorityGate:
    """At most ``limit`` holders at once; waiters go in by priority (``PRIORITIES`` order), then arrival.

    Lives on one event loop (the service's). A released slot passes straight to the best waiter,
    so a later VIP request overtakes earlier regular ones that are still waiting.
    """

    def __init__(self, limit: int) -> None:
        if limit < 1:
            msg = f"the gate's limit must be >= 1; got {limit}"
            raise ValueError(msg)
        self.limit = limit
        self._busy = 0
        self._waiting: list[tuple[int, int, asyncio.Future[None]]] = []
        self._order = itertools.count()
        self._rank = {p: i for i, p in enumerate(PRIORITIES)}

    @property
    def busy(self) -> int:
        """Holders now."""
        return self._busy

    def waiting(self, priority: str) -> int:
        """Waiters of one priority now."""
        rank = self._rank[priority]
        return sum(1 for r, _, f in self._waiting if r == rank and not f.done())

    async def acquire(self, priority: str) -> None:
        """Wait for a slot; a cancelled waiter leaves the queue (or hands on a slot it was just given)."""
        if self._busy < self.limit and not self._waiting:
            self._busy += 1
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiting, (self._rank[priority], next(self._order), future))
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self.release()  # the slot arrived with the cancellation: pass it on
            raise

    def release(self) -> None:
        """Give the slot to the best live waiter, else free it."""
        while self._waiting:
            _, _, future = heapq.heappop(self._waiting)
            if not future.done():
                future.set_result(None)
                return
        self._busy -= 1

    @asynccontextmanager
    async def slot(self, priority: str) -> AsyncIterator[None]:
        """Hold a slot for the body of the ``async with``."""
        await self.acquire(priority)
        try:
            yield
        finally:
            self.release()


class Admission:
    """The edge's admission: classify, take a class token, pick the priority, hold a gate slot."""

    def __init__(
        self,
        config: AdmissionConfig,
        registry: CollectorRegistry | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.buckets = {
            name: TokenBucket(quota.rate_per_s, quota.capacity, clock)
            for name, quota in config.classes.items()
        }
        self.gate = PriorityGate(config.max_in_flight)
        self._clock = clock
        self._credentials: OrderedDict[str, TokenBucket] = OrderedDict()
        self._credentials_lock = threading.Lock()
        registry = registry if registry is not None else CollectorRegistry()
        self.requests = Counter(
            "headwater_admission_requests",
            "Requests at the edge (rank, recommend, feedback; REST and gRPC) by user class and result.",
            ["user_class", "result"],
            registry=registry,
        )
        self.waiting = Gauge(
            "headwater_admission_waiting",
            "Requests waiting at the in-flight gate, by priority.",
            ["priority"],
            registry=registry,
        )
        for name in config.classes:  # every class shows in /metrics from the start, at 0
            for result in ("admitted", "throttled"):
                self.requests.labels(name, result)
        for priority in PRIORITIES:
            self.waiting.labels(priority).set_function(functools.partial(_waiting, self.gate, priority))

    def classify(self, header: str | None, body: str | None, identity: Identity | None = None) -> str:
        """Return the request's class (module docstring, step 1); a class not listed is the default."""
        source = "caller" if identity is None else identity.class_source
        claims = {
            "caller": (header, body),
            "gateway": (header, identity.user_class if identity is not None else None),
            "credential": (identity.user_class if identity is not None else None,),
        }[source]
        for claimed in claims:
            if claimed is not None and claimed.strip().lower() in self.config.classes:
                return claimed.strip().lower()
        return self.config.default_class

    def admit(
        self, header: str | None, body: str | None, asked: str | None, identity: Identity | None = None
    ) -> Admitted:
        """Admit one request or raise :class:`Throttled`; ``asked``: the priority the request set, if any.

        ``identity``: the caller's credential (None: ``auth: none``, the caller's claim is its class).
        """
        user_class = self.classify(header, body, identity)
        quota = self.config.classes[user_class]
        if identity is not None and identity.quota is not None:
            wait = self._credential_bucket(identity.subject, identity.quota).take()
            if wait > 0.0:
                self.requests.labels(user_class, "throttled").inc()
                raise Throttled(user_class, identity.quota.rate_per_s, wait, identity.subject)
        if self.config.enabled:
            wait = self.buckets[user_class].take()
            if wait > 0.0:
                self.requests.labels(user_class, "throttled").inc()
                raise Throttled(user_class, quota.rate_per_s, wait)
        self.requests.labels(user_class, "admitted").inc()
        priority: str = quota.priority
        if asked is not None and PRIORITIES.index(asked) > PRIORITIES.index(priority):
            priority = asked  # lower than the class's: allowed
        return Admitted(user_class, priority)

    def _credential_bucket(self, subject: str, quota: CredentialQuota) -> TokenBucket:
        """Return the credential's own bucket; a new one when its quota changed (a rotated key file)."""
        with self._credentials_lock:
            bucket = self._credentials.get(subject)
            if bucket is None or (bucket.rate, bucket.capacity) != (quota.rate_per_s, quota.capacity):
                bucket = TokenBucket(quota.rate_per_s, quota.capacity, self._clock)
                self._credentials[subject] = bucket
                while len(self._credentials) > CREDENTIAL_BUCKETS:
                    self._credentials.popitem(last=False)
            self._credentials.move_to_end(subject)
            return bucket

    @asynccontextmanager
    async def slot(self, admitted: Admitted) -> AsyncIterator[None]:
        """Hold a gate slot while the request ranks (no gate with admission off)."""
        if not self.config.enabled:
            yield
            return
        async with self.gate.slot(admitted.priority):
            yield


def _waiting(gate: PriorityGate, priority: str) -> float:
    return float(gate.waiting(priority))
