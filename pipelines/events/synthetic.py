"""Random valid events for any source, drawn from its schema: ``headwater events produce --source NAME``.

The behaviour source has its own realistic generator (:mod:`~headwater.pipelines.events.generator`);
every other source gets these: ids from small pools (so keys repeat and windows have something to
count), enums by symbol, numbers in ranges read off the source's rules where that is easy
(``amount >= 0``, ``x is null or (x >= 0 and x <= 1)``, ``f in (...)``, ``f = v``), some nulls in
nullable fields, the event time = now. Each event is checked with the source's codec; one that
breaks a rule the ranges did not capture is drawn again a few times, then counted as rejected.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from headwater.pipelines.events.codec import EventCodec
from headwater.pipelines.events.sending import RunStats, Sender
from headwater.registry.expr import And, Compare, Expr, InList, IsNull, Or, from_json
from headwater.registry.plans import PlanField, PlanSource

if TYPE_CHECKING:
    from kafka import KafkaProducer

KEY_POOL = 1_000
"""Distinct values of the source's key field."""
ID_POOL = 200
"""Distinct values of other ``*_id`` text fields."""
WORD_POOL = 5
"""Distinct values of other text fields."""
NULL_SHARE = 0.1
DRAWS = 5
"""Attempts at an event that passes the source's rules before it counts as rejected."""
OTHER_TIME_SPAN_MS = 86_400_000
"""Timestamps other than the event time lie up to this far before it."""


@dataclass
class Bounds:
    """What the rules say about one field's non-null values (conjuncts only)."""

    low: float | None = None
    high: float | None = None
    low_strict: bool = False
    high_strict: bool = False
    choices: list[Any] | None = None

    def narrow(self, op: str, value: Any) -> None:
        """Add the condition ``field op value``."""
        if op == "=":
            self.choices = [value]
        elif isinstance(value, bool) or not isinstance(value, int | float):
            return
        elif op in (">", ">=") and (self.low is None or value >= self.low):
            self.low, self.low_strict = float(value), op == ">"
        elif op in ("<", "<=") and (self.high is None or value <= self.high):
            self.high, self.high_strict = float(value), op == "<"


@dataclass
class RuleBounds:
    """Per field, the bounds that every rule of a source puts on its non-null values."""

    fields: dict[str, Bounds] = field(default_factory=dict)

    def of(self, name: str) -> Bounds:
        """Return the bounds of ``name`` (empty when no rule bounds it)."""
        return self.fields.setdefault(name, Bounds())

    def add(self, expr: Expr) -> None:
        """Read the easy shapes of one rule; anything else is left to validation."""
        if isinstance(expr, And):
            for arg in expr.args:
                self.add(arg)
        elif isinstance(expr, Compare):
            self.of(expr.field).narrow(expr.op, expr.value)
        elif isinstance(expr, InList) and not expr.negated:
            self.of(expr.field).choices = list(expr.values)
        elif isinstance(expr, Or) and len(expr.args) == 2:
            # "f is null or (conditions on f)": the conditions hold whenever f has a value
            nulls = [a for a in expr.args if isinstance(a, IsNull) and not a.negated]
            rest = [a for a in expr.args if a not in nulls]
            if len(nulls) == 1 and len(rest) == 1 and _fields_of(rest[0]) == {nulls[0].field}:
                self.add(rest[0])


def _fields_of(expr: Expr) -> set[str]:
    if isinstance(expr, Compare | InList | IsNull):
        return {expr.field}
    if isinstance(expr, And | Or):
        return set().union(*(_fields_of(a) for a in expr.args))
    return {"?"}  # a negation: not a shape read here


def rule_bounds(source: PlanSource) -> RuleBounds:
    """Return the bounds the source's rules put on its fields."""
    bounds = RuleBounds()
    for rule in source.rules:
        bounds.add(from_json(rule.ast))
    return bounds


class SchemaGenerator:
    """Draw events of one source from its schema; deterministic for a seed and the times given."""

    def __init__(self, source: PlanSource, seed: int = 7) -> None:
        """Read the schema and the rules once."""
        self.source = source
        self.codec = EventCodec(source)
        self._rng = random.Random(seed)
        self._bounds = rule_bounds(source)
        self._draw: list[tuple[str, Callable[[random.Random, int], Any]]] = [
            (f.name, self._drawer(f)) for f in source.fields
        ]

    def draw(self, time_ms: int) -> dict[str, Any]:
        """One event at ``time_ms`` (UTC ms); not yet validated."""
        rng = self._rng
        return {name: draw(rng, time_ms) for name, draw in self._draw}

    def event(self, time_ms: int) -> dict[str, Any] | None:
        """One event at ``time_ms`` that passes the codec's validation, or None after :data:`DRAWS` tries."""
        for _ in range(DRAWS):
            event = self.draw(time_ms)
            if self.codec.validate(event) is None:
                return event
        return None

    def _drawer(self, f: PlanField) -> Callable[[random.Random, int], Any]:
        src = self.source
        value = self._value_drawer(f)
        if not f.nullable or f.name in (src.key, src.event_id, src.event_time):
            return value

        def nullable(rng: random.Random, time_ms: int) -> Any:
            return None if rng.random() < NULL_SHARE else value(rng, time_ms)

        return nullable

    def _value_drawer(self, f: PlanField) -> Callable[[random.Random, int], Any]:
        src, bounds = self.source, self._bounds.of(f.name)
        if bounds.choices is not None:
            choices = bounds.choices
            return lambda rng, _t: rng.choice(choices)
        if f.kind == "timestamp":
            per_ms = 1000 if f.time_unit == "us" else 1
            if f.name == src.event_time:
                return lambda _rng, t: t * per_ms
            return lambda rng, t: (t - rng.randrange(OTHER_TIME_SPAN_MS)) * per_ms
        if f.kind == "enum":
            symbols = list(f.symbols)
            weights = [1.0 / (i + 1) for i in range(len(symbols))]  # the first symbols are the common ones
            return lambda rng, _t: rng.choices(symbols, weights)[0]
        if f.kind == "boolean":
            return lambda rng, _t: rng.random() < 0.5
        if f.kind == "string":
            return self._text_drawer(f)
        if f.kind in ("int", "long"):
            return self._whole_id_drawer(f) or _whole_drawer(bounds)
        return _number_drawer(bounds)

    def _whole_id_drawer(self, f: PlanField) -> Callable[[random.Random, int], int] | None:
        """Draw numeric ids: a unique event id; the key and ``*_id`` fields from a skewed pool."""
        src = self.source
        if f.name == src.event_id:
            bits = 62 if f.kind == "long" else 30
            return lambda rng, _t: rng.getrandbits(bits)
        if f.name == src.key or f.name.endswith("_id"):
            pool = KEY_POOL if f.name == src.key else ID_POOL
            return lambda rng, _t: int(pool * rng.random() ** 2)
        return None

    def _text_drawer(self, f: PlanField) -> Callable[[random.Random, int], Any]:
        src = self.source
        if f.name == src.event_id:
            return lambda rng, _t: f"{rng.getrandbits(128):032x}"
        if f.name == src.key or f.name.endswith("_id"):
            stem = f.name.removesuffix("_id") or f.name
            pool = KEY_POOL if f.name == src.key else ID_POOL
            # skewed: a few keys are much busier than the rest, as in real traffic
            return lambda rng, _t: f"{stem}-{int(pool * rng.random() ** 2):05d}"
        return lambda rng, _t: f"{f.name}-{rng.randrange(WORD_POOL)}"


def _whole_drawer(b: Bounds) -> Callable[[random.Random, int], int]:
    low = None if b.low is None else (math.floor(b.low) + 1 if b.low_strict else math.ceil(b.low))
    high = None if b.high is None else (math.ceil(b.high) - 1 if b.high_strict else math.floor(b.high))
    if low is None:
        low = (high if high is not None else 1_000) - 1_000
    if high is None:
        high = low + 1_000
    first, last = low, max(low, high)
    return lambda rng, _t: rng.randint(first, last)


def _number_drawer(b: Bounds) -> Callable[[random.Random, int], float]:
    if b.low is not None and b.high is not None:
        low, high = b.low, b.high
        return lambda rng, _t: round(rng.uniform(low, high), 4)
    if b.high is not None:
        high = b.high
        return lambda rng, _t: round(high - rng.lognormvariate(3.0, 1.0), 2)
    low = b.low if b.low is not None else 0.0
    return lambda rng, _t: round(low + rng.lognormvariate(3.0, 1.0), 2)


def produce_synthetic(
    kafka: KafkaProducer,
    source: PlanSource,
    *,
    rate: float,
    duration_s: float,
    max_events: int | None = None,
    seed: int = 7,
    progress: Callable[[RunStats], None] | None = None,
    topic: str | None = None,
    history_s: float | None = None,
) -> RunStats:
    """Send random valid events of ``source`` to its topic (or ``topic``) at ``rate`` per second (0: at once).

    Stops after ``duration_s`` seconds or ``max_events`` events drawn. With ``history_s`` (a
    backfill, ``max_events`` required) the event times step evenly through the ``history_s``
    seconds before now, in order, the last just before now, and the events are sent as fast as
    possible. ``kafka`` is flushed, not closed. ``rejected`` counts the draws that never passed the
    source's rules.
    """
    generator = SchemaGenerator(source, seed)
    stats = RunStats()
    sender = Sender(kafka, topic or source.topic, generator.codec, stats, progress)
    deadline = sender.started + duration_s
    codec = generator.codec
    backfill: tuple[int, float] | None = None
    if history_s is not None:
        if not max_events:
            msg = "a history needs max_events: how many events to spread over it"
            raise ValueError(msg)
        span_ms = history_s * 1000
        backfill, rate, deadline = (
            (time.time_ns() // 1_000_000 - round(span_ms), span_ms / max_events),
            0,
            math.inf,
        )
    while max_events is None or stats.read < max_events:
        if rate > 0:
            sender.wait_until(sender.started + stats.read / rate)
        if time.monotonic() >= deadline:
            break
        stats.read += 1
        now_ms = time.time_ns() // 1_000_000
        at_ms = now_ms if backfill is None else backfill[0] + int((stats.read - 0.5) * backfill[1])
        event = generator.event(at_ms)
        if event is None:
            stats.rejected += 1
        else:
            sender.send(codec.encode(event), codec.key(event), now_ms)
        sender.tick()
    return sender.finish()
