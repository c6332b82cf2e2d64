"""The cost model: estimated CPU-hours per day of a feature view.

    events/day  = expected_rate_per_s of the source x 86,400
    units/event = tier.view_overhead_units + sum over features of
                  agg.cost_units x (1 + tier.pane_cost x (panes - 1)) + WHERE_UNITS per filter
                  with panes = ceil(window / slide); a ratio counts both of its operands
    CPU-h/day   = events/day x units/event x tier.cpu_us_per_event / 1e6 / 3,600

Every event of the source is counted for every aggregation (filters are not assumed selective),
so the estimate errs high. The constants live in :mod:`headwater.registry.tiers` and
:mod:`headwater.registry.aggs`, to be calibrated from the tiers' benchmarks under ``bench/``.

A declared ``compute_cost`` below ``UNDER_DECLARED_FACTOR`` x the estimate is under-declared (an
error); one above ``OVER_DECLARED_FACTOR`` x the estimate holds budget it will not use (a warning).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from headwater.registry.aggs import AGGS
from headwater.registry.compiled import CompiledFeature, Operand
from headwater.registry.tiers import Tier

SECONDS_PER_DAY = 86_400
WHERE_UNITS = 0.1
UNDER_DECLARED_FACTOR = 0.5
OVER_DECLARED_FACTOR = 10.0


@dataclass(frozen=True)
class CostEstimate:
    """A view's estimate and how it was reached (printed with under-declared errors)."""

    cpu_hours_per_day: float
    events_per_day: float
    units_per_event: float
    cpu_us_per_event: float

    def explain(self) -> str:
        """One line: the numbers that make the estimate."""
        return (
            f"{self.events_per_day:,.0f} events/day x {self.units_per_event:.2f} units/event x "
            f"{self.cpu_us_per_event:g} us/unit = {self.cpu_hours_per_day:.2f} CPU-h/day"
        )


def feature_units(feature: CompiledFeature, tier: Tier) -> float:
    """Per-event cost units of one feature on ``tier``."""
    panes = max(1, math.ceil(feature.window.seconds / feature.slide.seconds - 1e-9))
    window_factor = 1.0 + tier.pane_cost * (panes - 1)
    units = AGGS[feature.agg].cost_units
    operands = [op for op in (feature.numerator, feature.denominator) if op is not None]
    units += sum(_operand_units(op) for op in operands)
    if feature.where is not None:
        units += WHERE_UNITS
    return units * window_factor


def _operand_units(operand: Operand) -> float:
    return AGGS[operand.agg].cost_units + (WHERE_UNITS if operand.where is not None else 0.0)


def estimate_view(features: tuple[CompiledFeature, ...], rate_per_s: float, tier: Tier) -> CostEstimate:
    """Estimated CPU-hours per day of a view with ``features`` on ``tier`` at ``rate_per_s``."""
    events = rate_per_s * SECONDS_PER_DAY
    units = tier.view_overhead_units + sum(feature_units(f, tier) for f in features)
    hours = events * units * tier.cpu_us_per_event / 1e6 / 3600
    return CostEstimate(
        cpu_hours_per_day=hours,
        events_per_day=events,
        units_per_event=units,
        cpu_us_per_event=tier.cpu_us_per_event,
    )
