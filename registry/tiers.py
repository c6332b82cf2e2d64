"""The tier table: the one place that says what each tier can deliver.

Every SLA check, window check and cheaper-tier suggestion reads this table. What a tier costs is
measured data, not a constant here: ``registry/calibration/<tier>.json`` (read by
:mod:`headwater.registry.cost`, written by ``bench/bench_calibrate.py``).

The freshness floors: realtime 5 s. The realtime job publishes boundary B as soon as its clock
(the newest event time it has seen) passes B and revises it when an out-of-order event arrives, so
the read-time age of a value is at most one slide plus the job's delay: bench/bench_realtime.py
measured write - B p50/p99 56/157 ms at 10k events/s and 59/563 ms at 20k events/s (2 min each, 1 s
slides: event to write p99 1.1 s and 1.3 s); 5 s leaves room for load and GC pauses. (Until the
JVM operator, values waited for the watermark, 5 s of out-of-orderness, and the floor was 10 s.)
Nearline 3 min and offline 24 h as in the seed (bench/bench_nearline.py measures nearline well
inside its floor).
"""

from __future__ import annotations

from dataclasses import dataclass

from headwater.registry.aggs import AGG_NAMES, OPERAND_AGG_NAMES
from headwater.registry.durations import format_seconds

MINUTE = 60
HOUR = 3600
DAY = 86400
ALL_AGGS = frozenset(AGG_NAMES)
ALL_OPERANDS = frozenset(OPERAND_AGG_NAMES)


@dataclass(frozen=True)
class Tier:
    """What one tier can deliver.

    Attributes:
        name: realtime | nearline | offline.
        cheapness: rank, 0 = cheapest; a view is warned when a cheaper tier could meet its SLA.
        freshness_floor_s: the tightest freshness SLA the tier can deliver, in seconds.
        max_window_s: the longest window the tier keeps state for, in seconds.
        default_slide_s: the update step of a window when the feature declares no ``slide``.
        aggregations: the aggregations the tier computes (capability table: what passes ``check``
            runs in its tier).
        ratio_operands: the aggregations a ``ratio`` may divide on this tier.
        one_slide_per_view: whether every feature of a view must share one slide (the realtime job
            publishes a view at one slide).
    """

    name: str
    cheapness: int
    freshness_floor_s: float
    max_window_s: float
    default_slide_s: float
    aggregations: frozenset[str] = ALL_AGGS
    ratio_operands: frozenset[str] = ALL_OPERANDS
    one_slide_per_view: bool = False

    def describe(self) -> str:
        """E.g. ``realtime (freshness floor 5s, windows up to 1h)``."""
        return (
            f"{self.name} (freshness floor {format_seconds(self.freshness_floor_s)}, "
            f"windows up to {format_seconds(self.max_window_s)})"
        )


TIERS: dict[str, Tier] = {
    "realtime": Tier(
        name="realtime",
        cheapness=2,
        freshness_floor_s=5,
        max_window_s=1 * HOUR,
        default_slide_s=1,
        one_slide_per_view=True,
    ),
    "nearline": Tier(
        name="nearline",
        cheapness=1,
        freshness_floor_s=3 * MINUTE,
        max_window_s=7 * DAY,
        default_slide_s=1 * MINUTE,
    ),
    "offline": Tier(
        name="offline",
        cheapness=0,
        freshness_floor_s=1 * DAY,
        max_window_s=90 * DAY,
        default_slide_s=1 * DAY,
    ),
}
TIER_NAMES = tuple(TIERS)


def cheaper_tier_meeting(tier: Tier, sla_s: float, longest_window_s: float) -> Tier | None:
    """Find the cheapest tier cheaper than ``tier`` whose floor meets ``sla_s`` and keeps the window."""
    fits = [
        other
        for other in TIERS.values()
        if other.cheapness < tier.cheapness
        and other.freshness_floor_s <= sla_s
        and other.max_window_s >= longest_window_s
    ]
    return min(fits, key=lambda t: t.cheapness) if fits else None


def tiers_keeping(window_s: float) -> list[str]:
    """Names of the tiers that keep state for a window of ``window_s`` seconds."""
    return [t.name for t in TIERS.values() if t.max_window_s >= window_s]
