"""Statistics of one feature's values and the drift between two samples (numpy only, no I/O).

A sample is a 1-d array of floats as the online vector holds them: a missing value is NaN, and an
infinite one counts as missing too (no tier writes one on purpose, and it would poison every mean).
Every function takes any array, empty, constant or all missing included, and returns finite
figures; where a figure cannot be computed it says so in ``note`` instead of raising.

Drift figures:

- **PSI** (population stability index): ``sum((c - b) * ln(c / b))`` over bins, ``b`` and ``c``
  the baseline's and the current sample's share of values in each bin. The bins are fixed by the
  baseline alone: its distinct values when it has at most ``bins`` of them (counts, ids, flags:
  one bin per value, one for anything else), else the edges of its ``bins`` quantiles. A share of 0
  is raised to :data:`EPSILON` so an empty bin costs a large but finite term. Each term is >= 0, so
  PSI is >= 0, and 0 for a sample against itself.
- **KS**: the two-sample Kolmogorov-Smirnov statistic, the largest gap between the two empirical
  CDFs, in [0, 1].

Both compare the present values only; the missing share is its own figure (and expectation).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

QUANTILES = (0.01, 0.05, 0.25, 0.5, 0.75, 0.95, 0.99)
"""The quantiles every summary reports."""
BINS = 10
"""PSI bins: deciles of the baseline (the usual choice; fewer distinct values: one bin each)."""
EPSILON = 1e-4
"""The share an empty bin counts as in PSI: ln(c / 0) would be infinite."""
TOP_VALUES = 5

Floats = npt.NDArray[np.float64]


def present(values: npt.ArrayLike) -> Floats:
    """Return the finite values of ``values`` as float64 (NaN and +-inf dropped)."""
    array = np.asarray(values, dtype=np.float64).ravel()
    kept: Floats = array[np.isfinite(array)]
    return kept


@dataclass(frozen=True)
class FeatureStats:
    """One feature's values summarised: how many, how many missing, where they lie."""

    count: int
    """Values in the sample, missing ones included."""
    missing: int
    """Null, NaN or infinite values."""
    mean: float | None = None
    std: float | None = None
    """Population standard deviation (ddof 0)."""
    min: float | None = None
    max: float | None = None
    quantiles: dict[str, float] = field(default_factory=dict)
    """``{"p50": ...}`` for each of :data:`QUANTILES`; empty when no value is present."""
    top: list[tuple[float, int]] = field(default_factory=list)
    """The most frequent values with their counts (id-like and categorical features only)."""

    @property
    def missing_rate(self) -> float:
        """Share of missing values (0 for an empty sample: nothing is missing from nothing)."""
        return self.missing / self.count if self.count else 0.0

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON data (``missing_rate`` included)."""
        data = asdict(self)
        data["missing_rate"] = self.missing_rate
        data["top"] = [[value, n] for value, n in self.top]
        return data


def summarize(values: npt.ArrayLike, *, categorical: bool = False, top: int = TOP_VALUES) -> FeatureStats:
    """Return the statistics of one sample; ``categorical`` adds its ``top`` most frequent values."""
    array = np.asarray(values, dtype=np.float64).ravel()
    kept = array[np.isfinite(array)]
    count, missing = int(array.size), int(array.size - kept.size)
    if not kept.size:
        return FeatureStats(count, missing)
    with np.errstate(over="ignore", invalid="ignore"):  # values near the float limits: see _finite
        quantiles = np.quantile(kept, QUANTILES)
        bad = ~np.isfinite(quantiles)
        if bad.any():  # interpolating between -1e308 and 1e308 overflows: take the value below instead
            quantiles[bad] = np.quantile(kept, QUANTILES, method="lower")[bad]
        mean, std = _finite(np.mean(kept)), _finite(np.std(kept))
    frequent: list[tuple[float, int]] = []
    if categorical:
        distinct, counts = np.unique(kept, return_counts=True)
        order = np.lexsort((distinct, -counts))[:top]  # most frequent first, ties by value: stable output
        frequent = [(float(distinct[i]), int(counts[i])) for i in order]
    return FeatureStats(
        count=count,
        missing=missing,
        mean=mean,
        std=std,
        min=float(kept.min()),
        max=float(kept.max()),
        quantiles={_label(q): float(v) for q, v in zip(QUANTILES, quantiles, strict=True)},
        top=frequent,
    )


def _label(q: float) -> str:
    return f"p{q * 100:g}"


def _finite(value: Any) -> float:
    # The mean or std of finite float64 values can still overflow (1e308 + 1e308): report the largest
    # float of that sign (a NaN from inf - inf as the largest positive one).
    number = float(value)
    if math.isfinite(number):
        return number
    return math.copysign(float(np.finfo(np.float64).max), -1.0 if number < 0 else 1.0)


@dataclass(frozen=True)
class Drift:
    """The drift of a current sample against a baseline: PSI and KS over the present values."""

    psi: float
    ks: float
    baseline: int
    """Present values in the baseline."""
    current: int
    """Present values in the current sample."""
    note: str | None = None
    """Why a figure is 0 because it could not be computed (a side without any value)."""

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON data."""
        return asdict(self)


def drift(baseline: npt.ArrayLike, current: npt.ArrayLike, bins: int = BINS) -> Drift:
    """Return PSI and KS of ``current`` against ``baseline``; 0 with a note when a side has no value."""
    base, cur = present(baseline), present(current)
    if not base.size or not cur.size:
        side = "the baseline" if not base.size else "the current sample"
        note = f"{side} has no present value (all missing or empty): no drift computed"
        return Drift(0.0, 0.0, int(base.size), int(cur.size), note)
    return Drift(psi(base, cur, bins), ks(base, cur), int(base.size), int(cur.size))


def bin_shares(baseline: npt.ArrayLike, current: npt.ArrayLike, bins: int = BINS) -> tuple[Floats, Floats]:
    """Return the shares of each sample's present values in the bins fixed by the baseline."""
    base, cur = present(baseline), present(current)
    distinct = np.unique(base)
    if distinct.size <= bins:
        # One bin per distinct value, and the last for anything else: a constant or a few counts
        # would otherwise fall into one quantile bin whatever the current values are.
        def index(x: Floats) -> npt.NDArray[np.intp]:
            at = np.searchsorted(distinct, x)
            hit = (at < distinct.size) & (distinct[np.minimum(at, distinct.size - 1)] == x)
            return np.where(hit, at, distinct.size)

        n = distinct.size + 1
    else:
        # inverted_cdf: each edge is a baseline value, never an interpolation that could overflow;
        # i / bins rather than linspace, whose 0.30000000000000004 would move an edge by one value.
        edges = np.unique(np.quantile(base, np.arange(1, bins) / bins, method="inverted_cdf"))

        def index(x: Floats) -> npt.NDArray[np.intp]:
            return np.searchsorted(edges, x, side="left")  # bin i: (edge i-1, edge i]

        n = edges.size + 1
    return _shares(index(base), n), _shares(index(cur), n)


def _shares(index: npt.NDArray[np.intp], n: int) -> Floats:
    counts = np.bincount(index, minlength=n).astype(np.float64)
    total = counts.sum()
    return counts / total if total else counts


def psi(baseline: npt.ArrayLike, current: npt.ArrayLike, bins: int = BINS, epsilon: float = EPSILON) -> float:
    """Return the population stability index of ``current`` against ``baseline`` (0 when a side is empty)."""
    b, c = bin_shares(baseline, current, bins)
    if not b.sum() or not c.sum():
        return 0.0
    b, c = np.maximum(b, epsilon), np.maximum(c, epsilon)
    return float(np.sum((c - b) * np.log(c / b)))


def ks(baseline: npt.ArrayLike, current: npt.ArrayLike) -> float:
    """Return the two-sample Kolmogorov-Smirnov statistic of the present values (0 when a side is empty)."""
    a, b = np.sort(present(baseline)), np.sort(present(current))
    if not a.size or not b.size:
        return 0.0
    points = np.concatenate([a, b])
    gap = np.abs(
        np.searchsorted(a, points, side="right") / a.size - np.searchsorted(b, points, side="right") / b.size
    )
    return float(gap.max())
