"""CTR intervals (delta method over users, Wilson) and the SRM test against known values and mpmath."""

from __future__ import annotations

import math

import mpmath
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headwater.ranking.experiment_stats import (
    SRM_MAX_DEVIATION,
    Z_95,
    RatioMoments,
    chi_square_sf,
    ratio_interval,
    sample_ratio_test,
    wilson_interval,
)

# Newcombe (1998), "Two-sided confidence intervals for the single proportion: comparison of seven
# methods", Statistics in Medicine 17, Table I, method 3 (score interval without continuity correction).
NEWCOMBE = [
    (81, 263, 0.2553, 0.3662),
    (15, 148, 0.0624, 0.1605),
    (0, 20, 0.0000, 0.1611),
    (1, 29, 0.0061, 0.1718),
]


@pytest.mark.parametrize(("x", "n", "lo", "hi"), NEWCOMBE)
def test_wilson_interval_matches_newcombe(x: int, n: int, lo: float, hi: float) -> None:
    got = wilson_interval(x, n)
    assert got is not None
    assert got == pytest.approx((lo, hi), abs=0.00005)


def wilson_reference(x: int, n: int) -> tuple[float, float]:
    """The interval as the roots of (p - p_hat)^2 = z^2 p (1 - p) / n, solved by mpmath."""
    mpmath.mp.dps = 30
    z = mpmath.sqrt(2) * mpmath.erfinv(mpmath.mpf("0.95"))
    p_hat = mpmath.mpf(x) / n
    a = 1 + z**2 / n
    b = -(2 * p_hat + z**2 / n)
    c = p_hat**2
    root = mpmath.sqrt(b**2 - 4 * a * c)
    return float((-b - root) / (2 * a)), float((-b + root) / (2 * a))


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 10**7).flatmap(lambda n: st.tuples(st.integers(0, n), st.just(n))))
def test_wilson_interval_solves_the_score_equation(case: tuple[int, int]) -> None:
    x, n = case
    got = wilson_interval(x, n)
    assert got is not None
    lo, hi = wilson_reference(x, n)
    assert got[0] == pytest.approx(max(lo, 0.0), abs=1e-9)
    assert got[1] == pytest.approx(min(hi, 1.0), abs=1e-9)
    assert got[0] <= x / n <= got[1]


def test_wilson_interval_refuses_impossible_counts() -> None:
    assert wilson_interval(0, 0) is None
    with pytest.raises(ValueError, match="0 <= successes <= trials; got 5 of 3"):
        wilson_interval(5, 3)


# Upper-tail critical values of the chi-square distribution (any statistics table, e.g. NIST/SEMATECH
# e-Handbook 1.3.6.7.4): P(X >= value) = p.
CRITICAL = [
    (3.841459, 1, 0.05),
    (6.634897, 1, 0.01),
    (10.827566, 1, 0.001),
    (5.991465, 2, 0.05),
    (13.815511, 2, 0.001),
    (7.814728, 3, 0.05),
    (13.276704, 4, 0.01),
    (18.307038, 10, 0.05),
]


@pytest.mark.parametrize(("value", "df", "p"), CRITICAL)
def test_chi_square_tail_matches_the_tables(value: float, df: int, p: float) -> None:
    assert chi_square_sf(value, df) == pytest.approx(p, rel=1e-5)


@settings(max_examples=300, deadline=None)
@given(st.floats(0.0, 400.0, allow_nan=False), st.integers(1, 30))
def test_chi_square_tail_matches_mpmath(value: float, df: int) -> None:
    reference = float(
        mpmath.gammainc(mpmath.mpf(df) / 2, mpmath.mpf(value) / 2, mpmath.inf, regularized=True)
    )
    assert chi_square_sf(value, df) == pytest.approx(reference, rel=1e-9, abs=1e-300)


def test_srm_flags_a_split_off_by_more_than_half_a_percent_beyond_chance() -> None:
    # 50/50 expected; 50,600 vs 49,400: shares 0.506 / 0.494, deviations +1.2% / -1.2%, chi2 = 14.4
    srm = sample_ratio_test({"a": 50_600, "b": 49_400}, {"a": 1, "b": 1})
    assert srm.chi_square == pytest.approx(14.4)
    assert srm.p_value == pytest.approx(math.erfc(math.sqrt(14.4 / 2)), rel=1e-9)  # df 1: erfc(sqrt(x/2))
    assert srm.deviation == pytest.approx({"a": 0.012, "b": -0.012})
    assert srm.flagged


def test_srm_does_not_flag_chance_or_a_tiny_bias() -> None:
    # off by 1.2% but on 1,000 users: chance (p = 0.71)
    small = sample_ratio_test({"a": 506, "b": 494}, {"a": 1, "b": 1})
    assert small.p_value > 0.5
    assert not small.flagged
    # significant (chi2 = 40, p ~ 2.5e-10) but off by only 0.2% of the weight: under the 0.5% tolerance
    big = sample_ratio_test({"a": 5_010_000, "b": 4_990_000}, {"a": 50, "b": 50})
    assert big.p_value < 1e-9
    assert big.max_deviation == pytest.approx(0.002)
    assert big.max_deviation < SRM_MAX_DEVIATION
    assert not big.flagged


def test_srm_with_uneven_weights_and_a_missing_arm() -> None:
    srm = sample_ratio_test({"control": 900}, {"control": 90, "treatment": 10})
    assert srm.observed_share == {"control": 1.0, "treatment": 0.0}
    assert srm.chi_square == pytest.approx(100.0)  # (900-810)^2/810 + (0-90)^2/90
    assert srm.flagged
    with pytest.raises(ValueError, match="have units but no expected weight"):
        sample_ratio_test({"x": 3}, {"control": 1, "treatment": 1})


# --- the delta method over users ------------------------------------------------------------------

# Worked by hand: users (clicks, impressions) (1, 10), (0, 5), (3, 15), (2, 10): R = 6 / 40 = 0.15,
# mean I = 10, var C = 5/3, var I = 50/3, cov = 5 (n - 1 = 3), Var(R) = (5/3 - 2 * 0.15 * 5 +
# 0.15^2 * 50/3) / (4 * 10^2) = 0.541667 / 400 = 0.00135417, sd 0.0367990, half 0.0721254.
HAND = [(1, 10), (0, 5), (3, 15), (2, 10)]


def test_ratio_interval_matches_the_hand_worked_example() -> None:
    got = ratio_interval(RatioMoments.of(HAND))
    assert got == pytest.approx((0.15 - 0.0721254, 0.15 + 0.0721254), abs=1e-6)


def test_ratio_interval_is_the_variance_of_the_linearized_mean() -> None:
    """The same variance, computed the other way: the sample variance of (C_u - R I_u) / mean(I), over n."""
    n = len(HAND)
    ratio = sum(c for c, _ in HAND) / sum(i for _, i in HAND)
    mean_i = sum(i for _, i in HAND) / n
    lin = [(c - ratio * i) / mean_i for c, i in HAND]
    mean = sum(lin) / n
    variance = sum((v - mean) ** 2 for v in lin) / (n - 1) / n
    got = ratio_interval(RatioMoments.of(HAND))
    assert got is not None
    assert (got[1] - got[0]) / 2 == pytest.approx(Z_95 * math.sqrt(variance), rel=1e-12)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.booleans(), min_size=2, max_size=400))
def test_one_impression_per_user_gives_the_wald_interval(clicks: list[bool]) -> None:
    n, x = len(clicks), sum(clicks)
    p = x / n
    half = Z_95 * math.sqrt(p * (1 - p) / (n - 1))  # the n - 1 sample variance of a 0/1 variable, over n
    got = ratio_interval(RatioMoments.of([(float(c), 1.0) for c in clicks]))
    assert got == pytest.approx((max(0.0, p - half), min(1.0, p + half)), abs=1e-12)


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 5), st.integers(1, 20)), min_size=3, max_size=50),
    st.integers(2, 50),
)
def test_more_impressions_of_the_same_users_do_not_narrow_the_interval(
    users: list[tuple[int, int]], k: int
) -> None:
    """k times as many items per user at the same CTRs: the same interval (Wilson would shrink by sqrt(k))."""
    users = [(min(c, i), i) for c, i in users]
    once = ratio_interval(RatioMoments.of([(float(c), float(i)) for c, i in users]))
    scaled = ratio_interval(RatioMoments.of([(float(k * c), float(k * i)) for c, i in users]))
    assert once is not None
    assert scaled is not None
    assert scaled == pytest.approx(once, abs=1e-9)


def test_ratio_interval_needs_two_users_and_an_impression() -> None:
    assert ratio_interval(RatioMoments.of([(1.0, 3.0)])) is None
    assert ratio_interval(RatioMoments.of([(0.0, 0.0), (0.0, 0.0)])) is None


def test_the_report_line_gives_each_arm_its_interval_or_says_why_not() -> None:
    from headwater.ranking.experiment_report import ArmCounts, build_report

    counts = {
        "a": ArmCounts(4, 40, 6, RatioMoments.of([(float(c), float(i)) for c, i in HAND])),
        "b": ArmCounts(1, 10, 1, RatioMoments.of([(1.0, 10.0)])),
    }
    line = build_report("e", counts, {"a": 1, "b": 1, "c": 1}, "--weights").line()
    assert line.startswith(
        "experiment e: a CTR 15.00% [7.79%, 22.21%] of 40 impressions, 4 users;"
        " b CTR 10.00% of 10 impressions, 1 user(s): no interval; c no impressions; SRM p "
    )
