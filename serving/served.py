"""Feedback you can trust: a click or purchase is accepted only for an item the service showed that user.

Two checks stand between ``POST /v1/feedback`` and Kafka (:class:`FeedbackGate`, run before the
event is built, so a refused post sends nothing, counts no click and moves no popularity):

1. **Served.** Every item a ``/v1/rank`` or ``/v1/recommend`` answer returned to a user (with
   ``log_impressions``) is remembered in :class:`ServedLedger` as (user, request id, item, time)
   for ``ttl_s``. Feedback for (user, item) is accepted when the ledger holds that item for that
   user and, when the post names a ``request_id``, for that request. A caller allowed unsolicited
   events (a role, or ``feedback.trust.allow_unsolicited`` for a deployment whose every caller is
   trusted) skips this check: an order system posts purchases of items it never ranked.
2. **In the catalog.** Whoever posts it, an event's item must exist: an item is in the catalog
   while any item view holds a key for it (the retrieval index's definition,
   :mod:`headwater.serving.retrieval.refresh`). Without this a fake click on a made-up id would
   create the id's keys in the item views through the tiers, and the next index refresh would put
   it in every user's ``/v1/recommend``. ``/v1/rank`` takes the caller's candidates, so "served"
   alone does not prove an item exists. A ranking already read every candidate's item rows: the
   items it found are recorded as *known* with the serve, and their feedback needs no read. Any
   other item (unsolicited, or served without its rows: a store outage's fallback answer) is asked
   of :class:`ItemCatalog`: the index refresher's mirror (no I/O), else the store (one read of the
   item's keys, on the I/O pool).

Refusals are :class:`FeedbackUntrusted`: 409, field ``item_id``, the message starting with the
reason, ``item-not-served``, ``item-unknown`` or ``catalog-unavailable`` (the store could not
answer: retry; never a 5xx, as every feedback refusal). The ledger is per process: behind a load
balancer, a user's ranking and feedback calls must reach the same replica (sticky by user id), else
feedback for an item served by another replica is refused; ``docs/operations/feedback-trust.md``
says why and what it costs.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from headwater.pipelines.store import ViewLayout
from headwater.serving.feedback import FeedbackRefused
from headwater.serving.fetch import RequestFeatures
from headwater.serving.item_mirror import ItemMirror
from headwater.serving.store import FeatureReader, FeatureReadError, ReadPool

NOT_SERVED = "item-not-served"
"""The reason of a post for an item the ledger does not hold for that user (and request)."""
UNKNOWN_ITEM = "item-unknown"
"""The reason of a post for an item no item view holds a key for."""
CATALOG_UNAVAILABLE = "catalog-unavailable"
"""The reason of a post refused because the store could not say whether the item exists."""


class FeedbackTrustConfig(BaseModel):
    """The served ledger's bounds and who may post unsolicited feedback (``feedback.trust``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ttl_s: float = Field(default=3600.0, gt=0.0, le=7 * 86_400.0)
    """How long a served item accepts feedback (a purchase an hour after the ranking is accepted)."""
    per_user: int = Field(default=1000, ge=1, le=1_000_000)
    """Served (request, item) pairs remembered per user; past it the user's oldest are forgotten."""
    max_entries: int = Field(default=500_000, ge=1, le=100_000_000)
    """Served pairs remembered in all (about 400 B each: 500,000 is about 200 MB); past it the
    least recently served users' oldest pairs are forgotten first."""
    allow_unsolicited: bool = False
    """Accept feedback for items never served to the user from every caller (a deployment whose
    callers are all trusted; the catalog check still applies). Otherwise only a caller whose
    identity allows unsolicited events skips the served check."""


class FeedbackUntrusted(FeedbackRefused):
    """Feedback refused by :class:`FeedbackGate`; ``reason`` is one of the module's reason codes."""

    status = 409

    def __init__(self, reason: str, message: str) -> None:
        super().__init__("item_id", f"{reason}: {message}")
        self.reason = reason


_NEVER = float("-inf")


class _User:
    """One user's served pairs, oldest first, and per item its pairs held and newest serve times."""

    __slots__ = ("entries", "items", "last")

    def __init__(self) -> None:
        # (request id, item) -> (serve time, known: the ranking found the item's rows)
        self.entries: OrderedDict[tuple[str, str], tuple[float, bool]] = OrderedDict()
        # item -> [pairs held, newest serve time, newest serve time that knew it]
        self.items: dict[str, list[float]] = {}
        self.last = 0.0


@dataclass(frozen=True)
class Served:
    """What the ledger holds of an item served to a user: whether a serve found it in the catalog."""

    known: bool


class ServedLedger:
    """The (user, request id, item) triples served in the last ``ttl_s``, bounded (module docstring).

    Bounds: at most ``per_user`` pairs per user and ``max_entries`` in all, so memory does not grow
    with the number of distinct users (each user held has at least one pair). Past ``per_user`` the
    user's oldest pair is forgotten; past ``max_entries`` the oldest pair of the user served least
    recently is. Both count in :attr:`evicted` (a pair forgotten before its time refuses feedback
    that should have been accepted: raise the bound). Thread-safe (one lock).
    """

    def __init__(
        self,
        ttl_s: float,
        per_user: int,
        max_entries: int,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.ttl_s = ttl_s
        self.per_user = per_user
        self.max_entries = max_entries
        self._clock = clock or time.monotonic
        self._users: OrderedDict[str, _User] = OrderedDict()  # least recently served first
        self._size = 0
        self._lock = threading.Lock()
        self.evicted = 0
        """Pairs forgotten before ``ttl_s`` because a bound was reached."""

    @classmethod
    def of(cls, config: FeedbackTrustConfig, clock: Callable[[], float] | None = None) -> ServedLedger:
        """Return a ledger with ``config``'s bounds."""
        return cls(config.ttl_s, config.per_user, config.max_entries, clock)

    def __len__(self) -> int:
        """Return how many (user, request, item) triples are held (expired ones until the next call)."""
        return self._size

    @property
    def users(self) -> int:
        """Users with at least one pair held."""
        return len(self._users)

    def serve(self, user_id: str, request_id: str, items: Iterable[str], known: Collection[str] = ()) -> None:
        """Remember that the answer ``request_id`` showed ``items`` to ``user_id`` now.

        ``known``: those of ``items`` whose rows the answer found in an item view (in the catalog).
        """
        items = list(items)
        if not items:
            return
        with self._lock:
            now = self._clock()
            self._expire(now)
            user = self._users.get(user_id)
            if user is None:
                user = self._users[user_id] = _User()
            else:
                self._users.move_to_end(user_id)
            user.last = now
            for item in items:
                key = (request_id, item)
                found = item in known
                held = user.items.get(item)
                if key in user.entries:  # a retry of the answer: the same pair, served again now
                    user.entries.move_to_end(key)
                    found = found or user.entries[key][1]
                else:
                    self._size += 1
                if held is None:
                    held = user.items[item] = [0, now, _NEVER]
                held[0] += key not in user.entries
                held[1] = now
                if found:
                    held[2] = now
                user.entries[key] = (now, found)
            while len(user.entries) > self.per_user:
                self._drop_oldest(user)
                self.evicted += 1
            while self._size > self.max_entries:
                first_id, first = next(iter(self._users.items()))
                self._drop_oldest(first)
                self.evicted += 1
                if not first.entries:
                    del self._users[first_id]

    def served(self, user_id: str, item_id: str, request_id: str | None = None) -> Served | None:
        """Return ``item_id``'s serve to ``user_id`` in the last ``ttl_s``, or None: not served.

        With a ``request_id``, only a serve in that answer counts.
        """
        with self._lock:
            at = self._clock()
            user = self._users.get(user_id)
            if user is None:
                return None
            if request_id is not None:
                pair = user.entries.get((request_id, item_id))
                if pair is None or at - pair[0] >= self.ttl_s:
                    return None
                return Served(pair[1])
            held = user.items.get(item_id)
            if held is None or at - held[1] >= self.ttl_s:
                return None
            return Served(at - held[2] < self.ttl_s)

    def _drop_oldest(self, user: _User) -> None:
        (_, item), _ = user.entries.popitem(last=False)
        held = user.items[item]
        held[0] -= 1
        if held[0] == 0:  # pairs are in time order, so while any is held the newest time is held
            del user.items[item]
        self._size -= 1

    def _expire(self, now: float) -> None:
        # Users in order of their last serve: every pair of a user whose last serve expired has too.
        users = self._users
        while users:
            first_id, first = next(iter(users.items()))
            if now - first.last < self.ttl_s:
                break
            self._size -= len(first.entries)
            del users[first_id]


class ItemCatalog:
    """Whether an item exists: any item view holds a key for it (the mirror's copy, else the store)."""

    def __init__(
        self,
        reader: FeatureReader,
        layouts: Sequence[ViewLayout],
        io: ReadPool | None = None,
        mirror: ItemMirror | None = None,
    ) -> None:
        self.reader = reader
        self.layouts = tuple(layouts)
        self.io = io
        self.mirror = mirror

    def holds(self, item_id: str) -> bool:
        """Return whether any item view holds ``item_id`` (blocking: one store read unless mirrored).

        Raises:
            FeatureReadError: the store could not answer.
        """
        if self.mirror is not None and self.mirror.holds(item_id):
            return True
        if not self.layouts:
            return False
        rows = self.reader.read_many([(layout, [item_id]) for layout in self.layouts])
        return any(bool(r.found[0]) for r in rows)

    async def contains(self, item_id: str) -> bool:
        """:meth:`holds`, run on the I/O pool (the mirror's answer without a thread hop)."""
        if self.mirror is not None and self.mirror.holds(item_id):
            return True
        if self.io is None:
            return self.holds(item_id)
        return await asyncio.wrap_future(self.io.submit(self.holds, item_id))


class FeedbackGate:
    """The two checks of a feedback post (module docstring): served to the user, and in the catalog."""

    def __init__(self, ledger: ServedLedger, catalog: ItemCatalog, allow_unsolicited: bool = False) -> None:
        self.ledger = ledger
        self.catalog = catalog
        self.allow_unsolicited = allow_unsolicited
        self.refused: dict[str, int] = {NOT_SERVED: 0, UNKNOWN_ITEM: 0, CATALOG_UNAVAILABLE: 0}
        """Posts refused since start, by reason."""

    def served(
        self, user_id: str, request_id: str, items: Sequence[str], known: Collection[str] = ()
    ) -> None:
        """Record an answer's items as shown to ``user_id`` (the rank and recommend paths call this).

        ``known``: those of ``items`` the answer found rows of in an item view (:meth:`ServedLedger.serve`).
        """
        if items:
            self.ledger.serve(user_id, request_id, items, known)

    async def check(
        self, user_id: str, item_id: str, request_id: str | None, unsolicited_allowed: bool = False
    ) -> None:
        """Return if ``user_id``'s feedback on ``item_id`` may be sent; else raise :class:`FeedbackUntrusted`.

        ``unsolicited_allowed``: the caller's identity allows events for items it was not served
        (``allow_unsolicited`` in the config allows every caller); the catalog check applies anyway.
        """
        served = self.ledger.served(user_id, item_id, request_id)
        if served is None and not (unsolicited_allowed or self.allow_unsolicited):
            self.refused[NOT_SERVED] += 1
            which = f" in request {request_id!r}" if request_id is not None else ""
            msg = (
                f"item {item_id!r} was not served to user {user_id!r}{which} by this service in the last"
                f" {self.ledger.ttl_s:g} s; post feedback only for items of a /v1/rank or /v1/recommend"
                " answer to that user (with its request_id), or as a caller allowed unsolicited events"
            )
            raise FeedbackUntrusted(NOT_SERVED, msg)
        if served is not None and served.known:
            return
        try:
            known = await self.catalog.contains(item_id)
        except FeatureReadError as exc:
            self.refused[CATALOG_UNAVAILABLE] += 1
            msg = f"the online store could not say whether item {item_id!r} exists ({exc}); retry"
            raise FeedbackUntrusted(CATALOG_UNAVAILABLE, msg) from None
        if not known:
            self.refused[UNKNOWN_ITEM] += 1
            msg = (
                f"item {item_id!r} is in no item view (not in the catalog); feedback cannot add items,"
                " load the item's features first"
            )
            raise FeedbackUntrusted(UNKNOWN_ITEM, msg)


def found_items(candidates: Sequence[str], features: RequestFeatures | None) -> set[str]:
    """Return the candidates a ranking found rows of in an item view (none without its features)."""
    if features is None or len(features.items_found) != len(candidates):
        return set()
    return {item for item, found in zip(candidates, features.items_found.tolist(), strict=True) if found}


def catalog_prefix(
    shown: Sequence[str], candidates: Sequence[str], features: RequestFeatures | None
) -> list[str]:
    """Return the answer's items before the first one its ranking found in no item view.

    Impressions of those are not logged: an item view that counts impressions would otherwise give
    a caller's made-up candidate a key, and so a place in the catalog. The ranking puts candidates
    without item rows after every candidate with them, so the cut keeps every position of the
    others. Without features (a fallback answer) nothing is known to be missing: all are kept.
    """
    if features is None or len(features.items_found) != len(candidates):
        return list(shown)
    missing = set(candidates) - found_items(candidates, features)
    for position, item in enumerate(shown):
        if item in missing:
            return list(shown[:position])
    return list(shown)
