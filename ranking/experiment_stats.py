"""The statistics of an experiment report: CTR intervals by the delta method, Wilson, and the SRM test.

The CTR of an arm is a ratio of sums over its users, ``sum(clicks_u) / sum(impressions_u)``: a
user's impressions are not independent trials (one user clicks more than another), so a binomial
interval over impressions (Wilson) is too narrow when users see many items. The report's interval
is the delta method's, with the user as the independent unit (Deng, Knoblich, Lu 2018, "Applying
the Delta Method in Metric Analytics", KDD): :func:`ratio_interval`.

Pure Python (no SciPy): the chi-square p-value is the regularized upper incomplete gamma function
``Q(df / 2, x / 2)``, by its series below ``a + 1`` and its continued fraction above (Numerical
Recipes, 6.2), accurate to ~1e-12 here; the unit tests check both against published values.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

Z_95 = 1.959963984540054
"""The standard normal quantile of 0.975: a two-sided 95% interval."""
SRM_MAX_DEVIATION = 0.005
"""An arm's share of the users may differ from its weight by at most 0.5% of that weight."""
SRM_P_VALUE = 0.001
"""Below this p-value the split differs from the weights beyond chance (the usual SRM threshold)."""


def wilson_interval(successes: int, trials: int, z: float = Z_95) -> tuple[float, float] | None:
    """Return the Wilson score interval of ``successes / trials`` (None without trials).

    Raises:
        ValueError: negative counts, or more successes than trials.
    """
    if successes < 0 or trials < 0 or successes > trials:
        msg = f"a proportion needs 0 <= successes <= trials; got {successes} of {trials}"
        raise ValueError(msg)
    if trials == 0:
        return None
    p = successes / trials
    z2 = z * z
    centre = (p + z2 / (2 * trials)) / (1 + z2 / trials)
    half = (z / (1 + z2 / trials)) * math.sqrt(p * (1 - p) / trials + z2 / (4 * trials * trials))
    # At 0 and at all successes a bound is exactly 0 (1); the float formula leaves ~1e-17 of rounding.
    lo = 0.0 if successes == 0 else max(0.0, centre - half)
    hi = 1.0 if successes == trials else min(1.0, centre + half)
    return lo, hi


@dataclass(frozen=True)
class RatioMoments:
    """Sums over the users of an arm that a ratio metric's delta-method variance needs.

    ``users``: the units (users with an impression or a click); ``clicks``/``impressions``: the sums
    of the per-user counts ``C_u``/``I_u``; ``clicks_sq``, ``impressions_sq``, ``cross``: the sums of
    ``C_u^2``, ``I_u^2`` and ``C_u * I_u``.
    """

    users: int
    clicks: float
    impressions: float
    clicks_sq: float
    impressions_sq: float
    cross: float

    @classmethod
    def of(cls, per_user: Sequence[tuple[float, float]]) -> RatioMoments:
        """Return the moments of ``(clicks, impressions)`` per user."""
        return cls(
            len(per_user),
            sum(c for c, _ in per_user),
            sum(i for _, i in per_user),
            sum(c * c for c, _ in per_user),
            sum(i * i for _, i in per_user),
            sum(c * i for c, i in per_user),
        )


def ratio_interval(m: RatioMoments, z: float = Z_95) -> tuple[float, float] | None:
    """Return the delta-method interval of ``sum(C_u) / sum(I_u)`` with the users as the unit.

    With ``n`` users, ``R = mean(C) / mean(I)`` and the sample (co)variances (``n - 1``) of the
    per-user counts, ``Var(R) = (var(C) - 2 R cov(C, I) + R^2 var(I)) / (n mean(I)^2)``: the variance
    of the mean of ``(C_u - R I_u) / mean(I)``. The interval is ``R +- z sqrt(Var(R))``, clipped to
    ``[0, 1]`` unless there are more clicks than impressions. With one impression per user it is the
    Wald interval with the ``n - 1`` variance. None without impressions or with fewer than 2 users
    (no variance can be estimated).
    """
    n = m.users
    if n < 2 or m.impressions <= 0:
        return None
    ratio = m.clicks / m.impressions
    mean_c, mean_i = m.clicks / n, m.impressions / n
    var_c = (m.clicks_sq - n * mean_c * mean_c) / (n - 1)
    var_i = (m.impressions_sq - n * mean_i * mean_i) / (n - 1)
    cov = (m.cross - n * mean_c * mean_i) / (n - 1)
    variance = max(0.0, (var_c - 2 * ratio * cov + ratio * ratio * var_i) / (n * mean_i * mean_i))
    half = z * math.sqrt(variance)
    lo, hi = ratio - half, ratio + half
    if m.clicks <= m.impressions:
        lo, hi = max(0.0, lo), min(1.0, hi)
    return lo, hi


def chi_square_sf(statistic: float, df: int) -> float:
    """Return ``P(X >= statistic)`` for ``X`` chi-square with ``df`` degrees of freedom."""
    if df < 1:
        msg = f"degrees of freedom must be at least 1; got {df}"
        raise ValueError(msg)
    half = statistic / 2.0
    if not half > 0.0:  # zero, negative, or a subnormal that halves to zero: no evidence at all
        return 1.0
    return _gamma_q(df / 2.0, half)


def _gamma_q(a: float, x: float) -> float:
    """Regularized upper incomplete gamma ``Q(a, x)``."""
    if x < a + 1.0:
        return 1.0 - _gamma_p_series(a, x)
    return _gamma_q_fraction(a, x)


def _gamma_p_series(a: float, x: float) -> float:
    term = total = 1.0 / a
    n = a
    for _ in range(10_000):
        n += 1.0
        term *= x / n
        total += term
        if abs(term) < abs(total) * 1e-16:
            break
    return total * math.exp(-x + a * math.log(x) - math.lgamma(a))


def _gamma_q_fraction(a: float, x: float) -> float:
    tiny = 1e-300
    b = x + 1.0 - a
    c = 1.0 / tiny
    d = 1.0 / b
    h = d
    for i in range(1, 10_000):
        an = -i * (i - a)
        b += 2.0
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1.0 / d
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-16:
            break
    return math.exp(-x + a * math.log(x) - math.lgamma(a)) * h


@dataclass(frozen=True)
class SampleRatio:
    """The sample-ratio-mismatch test of one split.

    ``deviation``: each arm's relative deviation from its expected share, ``observed / expected - 1``.
    ``flagged``: the largest ``|deviation|`` is over :data:`SRM_MAX_DEVIATION` *and* the chi-square
    p-value is under :data:`SRM_P_VALUE`: the split is off by more than 0.5% and not by chance.
    """

    total: int
    expected_share: dict[str, float]
    observed_share: dict[str, float]
    deviation: dict[str, float]
    chi_square: float
    df: int
    p_value: float
    flagged: bool

    @property
    def max_deviation(self) -> float:
        """The largest relative deviation of an arm, in absolute value."""
        return max((abs(v) for v in self.deviation.values()), default=0.0)


def sample_ratio_test(
    counts: Mapping[str, int],
    expected: Mapping[str, float],
    max_deviation: float = SRM_MAX_DEVIATION,
    p_threshold: float = SRM_P_VALUE,
) -> SampleRatio:
    """Test whether ``counts`` (units per arm) follow the ``expected`` weights (any positive scale).

    An arm with a weight but no units counts 0; an arm with units but no weight is an error.

    Raises:
        ValueError: no arms, a weight that is not positive, or an arm missing from ``expected``.
    """
    if not expected:
        msg = "the expected split names no arm"
        raise ValueError(msg)
    stray = sorted(set(counts) - set(expected))
    if stray:
        msg = f"arm(s) {', '.join(stray)} have units but no expected weight (expected: {', '.join(expected)})"
        raise ValueError(msg)
    if any(w <= 0 or not math.isfinite(w) for w in expected.values()):
        msg = f"expected weights must be positive numbers; got {dict(expected)}"
        raise ValueError(msg)
    weight = sum(expected.values())
    share = {arm: w / weight for arm, w in expected.items()}
    total = sum(counts.get(arm, 0) for arm in share)
    if total == 0:
        zeros = {arm: 0.0 for arm in share}
        return SampleRatio(0, share, zeros, zeros, 0.0, len(share) - 1, 1.0, False)
    observed = {arm: counts.get(arm, 0) / total for arm in share}
    chi = sum((counts.get(arm, 0) - total * s) ** 2 / (total * s) for arm, s in share.items())
    df = len(share) - 1
    p = chi_square_sf(chi, df) if df > 0 else 1.0
    deviation = {arm: observed[arm] / share[arm] - 1.0 for arm in share}
    worst = max(abs(v) for v in deviation.values())
    return SampleRatio(
        total, share, observed, deviation, chi, df, p, worst > max_deviation and p < p_threshold
    )
