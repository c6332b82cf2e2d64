"""A deterministic stream of realistic behaviour events, with a configurable share of bad ones.

The generator runs a simulated clock: each emission advances it by an exponential gap whose
rate follows a diurnal curve, ``rate * (1 + A * cos(2 pi (hour - peak) / 24))`` (mean ``rate``).
Events belong to sessions; about ``rate * session_gap_s`` sessions are open at once and the
stream interleaves them, so a session's events are spread over seconds of event time. A
session is a few pages; a page is an optional search, then a ranked slate of impressions, then
clicks (depending on position and on the user's taste, see ``world.py``), each click followed
by a dwell and maybe a like, share or purchase.

On top of that stream, each emission is independently, with the configured shares:
malformed (bytes that do not decode, or an event that breaks a source rule), a duplicate (a recent event
repeated with the same ``event_id``), late (event time minutes behind the clock) or out of
order (event time a few seconds behind the clock).

The generator knows each impression's true click probability. With ``record_truth=True`` it keeps
one :class:`TruthRow` per emitted impression in :attr:`EventGenerator.truth` (a side channel: the
events, and every random draw, are the same with or without it), so an evaluator can score a
holdout with the oracle: the ceiling of any ranker trained on the stream.

For a given :class:`GeneratorConfig` the stream is the same on every run. The catalog and the
users depend only on ``seed``; the ids of events and sessions also depend on ``start_ms``, so
two live runs started at different times never repeat an ``event_id``.
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, fields

from headwater.pipelines.events.codec import HEADER_SCHEMA_FP, DecodeError, EventCodec, Reason
from headwater.pipelines.events.schema import DEVICES, BehaviorEvent, Device, EventType
from headwater.pipelines.events.world import (
    DEVICE_WEIGHTS,
    MAX_CATEGORIES,
    Users,
    affinity_factor,
    build_catalog,
    build_slate,
    position_bias,
    query_for,
)

DEFAULT_START_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z
MAX_OPEN_SESSIONS = 5_000
MALFORMED_KINDS = ("garbage", "truncated", "invalid_field", "unknown_fingerprint", "missing_fingerprint")
_FOLLOW_UPS: tuple[tuple[EventType, float], ...] = (("like", 0.15), ("share", 0.04), ("purchase", 0.03))
"""What may follow a click, with its base probability (scaled by the user's affinity)."""
_SHARES = ("late_share", "out_of_order_share", "duplicate_share", "malformed_share", "search_share")


@dataclass(frozen=True)
class GeneratorConfig:
    """Everything that shapes the stream; the same config always gives the same stream."""

    seed: int = 7
    start_ms: int = DEFAULT_START_MS
    """Simulated clock at the first event (UTC ms). The producer sets it to the wall clock."""
    rate: float = 1_000.0
    """Mean events per second of simulated time."""
    diurnal_amplitude: float = 0.5
    diurnal_peak_hour: float = 20.0
    users: int = 5_000
    items: int = 2_000
    categories: int = 12
    zipf_s: float = 1.1
    preference_concentration: float = 0.3
    drift_per_session: float = 0.1
    drift_step: float = 0.3
    session_gap_s: float = 1.0
    session_pages_mean: float = 3.0
    slate_size: int = 10
    search_share: float = 0.15
    base_ctr: float = 0.12
    position_decay: float = 0.8
    late_share: float = 0.01
    late_min_ms: int = 120_000
    late_max_ms: int = 900_000
    out_of_order_share: float = 0.02
    out_of_order_max_ms: int = 5_000
    duplicate_share: float = 0.01
    malformed_share: float = 0.005
    even_gaps: bool = False
    """Space emissions by exactly 1 / rate (the diurnal curve still bends the rate) instead of
    exponential gaps: a backfill of N events then ends where :func:`base_rate_for` says, instead of
    about 1/sqrt(N) of its span early or late (into the future)."""

    def __post_init__(self) -> None:
        """Reject values outside their domain, naming the field, the range and the value."""
        for name in _SHARES:
            _check(name, getattr(self, name), 0.0, 1.0)
        _check("late_share + out_of_order_share", self.late_share + self.out_of_order_share, 0.0, 1.0)
        _check("duplicate_share + malformed_share", self.duplicate_share + self.malformed_share, 0.0, 1.0)
        _check("categories", self.categories, 1, MAX_CATEGORIES)
        _check("diurnal_amplitude", self.diurnal_amplitude, 0.0, 0.95)
        for name in ("rate", "zipf_s", "preference_concentration", "session_gap_s", "base_ctr"):
            _check(name, getattr(self, name), 1e-9, math.inf)
        for name in ("users", "items", "slate_size", "late_min_ms", "out_of_order_max_ms"):
            _check(name, getattr(self, name), 1, math.inf)
        _check("session_pages_mean", self.session_pages_mean, 1.0, math.inf)
        _check("late_max_ms", self.late_max_ms, self.late_min_ms, math.inf)
        _check("drift_per_session", self.drift_per_session, 0.0, 1.0)
        _check("drift_step", self.drift_step, 0.0, 1.0)

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        """Names of the settings (for CLIs and error messages)."""
        return tuple(f.name for f in fields(cls))


def base_rate_for(config: GeneratorConfig, events: int, start_ms: int, end_ms: int) -> float:
    """Return the ``rate`` at which ``events`` emissions of the diurnal curve fill ``[start_ms, end_ms]``.

    The curve is ``rate * (1 + A cos(2 pi (hour - peak) / 24))``; its integral over the span is
    ``rate * (span + A * 86400 / (2 pi) * (sin(phase_end) - sin(phase_start)))`` seconds.
    """
    span_s = (end_ms - start_ms) / 1000.0
    if span_s <= 0 or events < 1:
        msg = f"base_rate_for: needs a positive span and events >= 1; got {span_s} s and {events}"
        raise ValueError(msg)

    def phase(ms: int) -> float:
        return 2.0 * math.pi * ((ms / 3_600_000.0) % 24.0 - config.diurnal_peak_hour) / 24.0

    bend = (
        config.diurnal_amplitude
        * 86_400.0
        / (2.0 * math.pi)
        * (math.sin(phase(end_ms)) - math.sin(phase(start_ms)))
    )
    return events / (span_s + bend)


def _check(name: str, value: float, low: float, high: float) -> None:
    if not low <= value <= high:
        msg = f"GeneratorConfig.{name}: expected a value in [{low}, {high}], found {value}"
        raise ValueError(msg)


@dataclass(frozen=True, slots=True)
class MalformedPayload:
    """Bytes and headers a consumer must reject, and the reason the codec gives for them."""

    value: bytes
    headers: tuple[tuple[str, bytes], ...]
    """Headers to send instead of the codec's ``schema-fp`` (``produce-ts`` is still added)."""
    kind: str
    reason: Reason


@dataclass(slots=True)
class Emission:
    """One record for the producer: an event, or a malformed payload (then ``event`` is None)."""

    sim_time_ms: int
    """The simulated clock at emission; pace sends by this, not by the (maybe late) event time."""
    event: BehaviorEvent | None
    duplicate: bool = False
    late: bool = False
    out_of_order: bool = False
    malformed: MalformedPayload | None = None


@dataclass(frozen=True, slots=True)
class TruthRow:
    """What the generator knew about one emitted impression (``EventGenerator(record_truth=True)``).

    ``(user_id, item_id, event_time)`` is the key a training-set row carries; ``p_click`` is the
    probability the click model drew the click with (position bias included), ``relevance`` the
    same without the position factor (``affinity_factor x quality``): the part a ranker that does
    not see the position can learn.
    """

    event_id: str
    user_id: str
    item_id: str
    session_id: str
    position: int
    event_time: int
    p_click: float
    relevance: float


class _Session:
    __slots__ = ("device", "pages_left", "pending", "session_id", "user")

    def __init__(self, user: int, session_id: str, device: Device, pages: int) -> None:
        self.user = user
        self.session_id = session_id
        self.device = device
        self.pages_left = pages
        self.pending: deque[BehaviorEvent] = deque()


class EventGenerator(Iterator[Emission]):
    """An endless iterator of :class:`Emission`, deterministic for its config."""

    def __init__(
        self,
        config: GeneratorConfig | None = None,
        codec: EventCodec | None = None,
        *,
        record_truth: bool = False,
    ) -> None:
        """Build the world from ``config.seed`` and start the clock at ``config.start_ms``.

        ``record_truth`` keeps a :class:`TruthRow` per emitted impression in :attr:`truth`.
        """
        self.config = cfg = config if config is not None else GeneratorConfig()
        self.truth: list[TruthRow] | None = [] if record_truth else None
        self._truth_pending: dict[int, tuple[float, float]] = {}
        """(p_click, relevance) of queued impressions, by ``id()`` of their event dict (alive when queued)."""
        self.codec = codec if codec is not None else EventCodec()
        world_rng = random.Random(cfg.seed)
        self.catalog = build_catalog(world_rng, cfg.items, cfg.categories, cfg.zipf_s)
        self.users = Users(world_rng, cfg.users, cfg.categories, cfg.preference_concentration)
        self._rng = random.Random(f"{cfg.seed}:{cfg.start_ms}")
        self._clock_ms = float(cfg.start_ms)
        self._burst: int | None = None
        self._sessions: list[_Session] = []
        self._recent: deque[BehaviorEvent] = deque(maxlen=1_000)
        self._target_sessions = self._sessions_for(self.rate_at(self._clock_ms))
        self._warm_up()

    def __next__(self) -> Emission:
        """Return the next emission; the stream never ends."""
        cfg, rng = self.config, self._rng
        now = self._advance_clock()
        draw = rng.random()
        if draw < cfg.malformed_share:
            return Emission(now, None, malformed=self._malformed(now))
        if draw < cfg.malformed_share + cfg.duplicate_share and self._recent:
            return Emission(now, self._recent[rng.randrange(len(self._recent))].copy(), duplicate=True)
        event = self._next_event(now)
        truth = self._truth_pending.pop(id(event), None) if self._truth_pending else None
        self._recent.append(event)
        draw = rng.random()
        if draw < cfg.late_share:
            event["event_time"] = now - rng.randint(cfg.late_min_ms, cfg.late_max_ms)
            emission = Emission(now, event, late=True)
        elif draw < cfg.late_share + cfg.out_of_order_share:
            event["event_time"] = now - rng.randint(1, cfg.out_of_order_max_ms)
            emission = Emission(now, event, out_of_order=True)
        else:
            emission = Emission(now, event)
        if truth is not None and self.truth is not None:
            self.truth.append(_truth_row(event, *truth))
        return emission

    def take(self, n: int) -> list[Emission]:
        """Return the next ``n`` emissions."""
        return [next(self) for _ in range(n)]

    def rate_at(self, time_ms: float) -> float:
        """Events per second of the diurnal curve at ``time_ms``."""
        cfg = self.config
        hour = (time_ms / 3_600_000.0) % 24.0
        phase = 2.0 * math.pi * (hour - cfg.diurnal_peak_hour) / 24.0
        return cfg.rate * (1.0 + cfg.diurnal_amplitude * math.cos(phase))

    def _warm_up(self) -> None:
        """Open the steady-state number of sessions, each part-way through its first page.

        Without this, a stream would start with thousands of fresh sessions showing their first
        slate and no clicks for its first seconds. Each warm session has already shown its slate
        and some of what followed, so an early dwell may follow a click that was not emitted.
        """
        rng = self._rng
        for _ in range(self._target_sessions):
            session = self._open_session()
            self._add_page(session)
            pending = session.pending
            for _ in range(rng.randrange(len(pending))):
                self._truth_pending.pop(id(pending.popleft()), None)
            while pending and pending[0]["event_type"] in ("search", "impression"):
                self._truth_pending.pop(id(pending.popleft()), None)
            self._sessions.append(session)

    def _sessions_for(self, rate: float) -> int:
        """Sessions open at once for ``rate``: a session's events come ``session_gap_s`` apart.

        Capped at :data:`MAX_OPEN_SESSIONS` (so warming up stays cheap): above
        ``MAX_OPEN_SESSIONS / session_gap_s`` events/s, a session's events come closer together.
        """
        return max(1, min(MAX_OPEN_SESSIONS, int(rate * self.config.session_gap_s)))

    def _advance_clock(self) -> int:
        rate = self.rate_at(self._clock_ms)
        self._target_sessions = self._sessions_for(rate)
        gap_s = 1.0 / rate if self.config.even_gaps else self._rng.expovariate(rate)
        self._clock_ms += gap_s * 1000.0
        return int(self._clock_ms)

    def _next_event(self, now: int) -> BehaviorEvent:
        """Pop the next event of some open session, stamped with a fresh id and ``now``.

        A slate is rendered at once: after a search or an impression, the same session goes on
        while its next event is an impression, so a slate's impressions are consecutive.
        """
        rng, sessions = self._rng, self._sessions
        while True:
            index = self._burst
            if index is None:
                if len(sessions) < self._target_sessions:
                    sessions.append(self._open_session())
                    index = len(sessions) - 1
                else:
                    index = int(rng.random() * len(sessions))
            session = sessions[index]
            if not session.pending and session.pages_left > 0:
                self._add_page(session)
            pending = session.pending
            if not pending:
                self._burst = None
                sessions[index] = sessions[-1]
                sessions.pop()
                continue
            event = pending.popleft()
            self._burst = index if pending and pending[0]["event_type"] == "impression" else None
            if not pending and session.pages_left == 0:
                sessions[index] = sessions[-1]
                sessions.pop()
            hexed = f"{rng.getrandbits(128):032x}"
            event["event_id"] = f"{hexed[:8]}-{hexed[8:12]}-{hexed[12:16]}-{hexed[16:20]}-{hexed[20:]}"
            event["event_time"] = now
            return event

    def _open_session(self) -> _Session:
        cfg, rng, users = self.config, self._rng, self.users
        user = users.sample(rng)
        if rng.random() < cfg.drift_per_session:
            users.drift(rng, user, cfg.drift_step)
        device = users.device[user] if rng.random() < 0.85 else rng.choices(DEVICES, DEVICE_WEIGHTS)[0]
        pages = 1 + int(rng.expovariate(1.0 / cfg.session_pages_mean) if cfg.session_pages_mean > 1 else 0)
        return _Session(user, f"s-{rng.getrandbits(64):016x}", device, pages)

    def _add_page(self, session: _Session) -> None:
        """Queue one page: maybe a search, a slate of impressions, then clicks and what follows."""
        cfg, rng, catalog, users = self.config, self._rng, self.catalog, self.users
        session.pages_left -= 1
        user, names = session.user, catalog.category_names
        searched: int | None = None
        if rng.random() < cfg.search_share:
            searched = users.preferred_category(rng, user)
            session.pending.append(self._template(session, "search", None, query=query_for(rng, searched)))
            session.pending[-1]["category"] = names[searched]
        slate = build_slate(rng, catalog, users, user, cfg.slate_size, searched)
        shown = []
        for position, item in enumerate(slate, start=1):
            session.pending.append(self._template(session, "impression", item, position=position))
            shown.append(session.pending[-1])
        for position, item in enumerate(slate, start=1):
            factor = affinity_factor(users.affinity(user, catalog.category[item]))
            relevance = factor * catalog.quality[item]
            p_click = min(0.95, cfg.base_ctr * position_bias(position, cfg.position_decay) * relevance)
            if self.truth is not None:
                self._truth_pending[id(shown[position - 1])] = (p_click, relevance)
            if rng.random() < p_click:
                self._queue_click(session, item, position, factor)

    def _queue_click(self, session: _Session, item: int, position: int, factor: float) -> None:
        rng, pending = self._rng, session.pending
        pending.append(self._template(session, "click", item, position=position))
        dwell_ms = int(4_000 * factor * math.exp(rng.gauss(0.0, 0.8)))
        pending.append(self._template(session, "dwell", item, dwell_ms=dwell_ms))
        for kind, base in _FOLLOW_UPS:
            if rng.random() < base * factor:
                pending.append(self._template(session, kind, item))

    def _template(
        self,
        session: _Session,
        kind: EventType,
        item: int | None,
        position: int | None = None,
        dwell_ms: int | None = None,
        query: str | None = None,
    ) -> BehaviorEvent:
        catalog = self.catalog
        with_price = item is not None and kind in ("impression", "click", "purchase")
        return {
            "event_id": "",
            "user_id": self.users.user_ids[session.user],
            "item_id": catalog.item_ids[item] if item is not None else None,
            "event_type": kind,
            "event_time": 0,
            "session_id": session.session_id,
            "category": catalog.category_names[catalog.category[item]] if item is not None else None,
            "price": catalog.price[item] if with_price and item is not None else None,
            "dwell_ms": dwell_ms,
            "query": query,
            "position": position,
            "device": session.device,
        }

    def _malformed(self, now: int) -> MalformedPayload:
        """Build a payload the codec rejects; its reason is what the codec actually says."""
        rng, codec = self._rng, self.codec
        kind = MALFORMED_KINDS[rng.randrange(len(MALFORMED_KINDS))]
        user, item = self.users.sample(rng), self.catalog.sample(rng)
        stray = _Session(user, f"s-{rng.getrandbits(64):016x}", self.users.device[user], 0)
        event = self._template(stray, "impression", item, position=1)
        event["event_id"], event["event_time"] = f"{rng.getrandbits(128):032x}", now
        fp = codec.fingerprint_header
        headers: tuple[tuple[str, bytes], ...] = ((HEADER_SCHEMA_FP, fp),)
        if kind == "invalid_field":
            _break_a_field(rng, event)
        value = codec.encode(event)
        if kind == "garbage":
            value = rng.randbytes(rng.randint(1, 48))
        elif kind == "truncated":
            value = value[: rng.randint(1, len(value) - 1)]
        elif kind == "unknown_fingerprint":
            headers = ((HEADER_SCHEMA_FP, f"{rng.getrandbits(64) | 1 << 63:016x}".encode()),)
        elif kind == "missing_fingerprint":
            headers = ()
        for _ in range(8):  # random bytes may, rarely, decode: draw again
            result = codec.decode(value, headers)
            if isinstance(result, DecodeError):
                return MalformedPayload(value, headers, kind, result.reason)
            value = rng.randbytes(rng.randint(1, 48))
        return MalformedPayload(b"", headers, kind, Reason.EMPTY_PAYLOAD)


def _truth_row(event: BehaviorEvent, p_click: float, relevance: float) -> TruthRow:
    return TruthRow(
        event_id=event["event_id"],
        user_id=event["user_id"],
        item_id=event["item_id"] or "",
        session_id=event["session_id"],
        position=event["position"] or 0,
        event_time=event["event_time"],
        p_click=p_click,
        relevance=relevance,
    )


def _break_a_field(rng: random.Random, event: BehaviorEvent) -> None:
    """Make ``event`` valid Avro but break one check of ``EventCodec.validate`` (a rule, the id length)."""
    choice = rng.randrange(5)
    if choice == 0:
        event["event_type"], event["dwell_ms"] = "dwell", -rng.randint(1, 10_000)
    elif choice == 1:
        event["event_type"], event["item_id"] = "click", None
    elif choice == 2:
        event["position"] = -rng.randint(0, 5)
    elif choice == 3:
        event["price"] = -round(rng.uniform(0.01, 100.0), 2)
    else:
        event["event_id"] = ""
