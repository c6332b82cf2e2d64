"""Feature statistics, PSI and KS: known values on planted shifts, and properties over any input."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headwater.ranking.feature_stats import EPSILON, bin_shares, drift, ks, psi, summarize

# Any float column, NaN and infinities included, empty included.
COLUMNS = st.lists(
    st.one_of(
        st.floats(allow_nan=True, allow_infinity=True),
        st.sampled_from([0.0, 1.0, 2.0, math.nan]),  # repeated values: counts, ids, constants
    ),
    max_size=60,
)


def test_summary_values() -> None:
    stats = summarize([1.0, 2.0, 3.0, 4.0, math.nan, math.inf], categorical=True)
    assert (stats.count, stats.missing) == (6, 2)
    assert stats.missing_rate == pytest.approx(2 / 6)
    assert stats.mean == 2.5
    assert stats.std == pytest.approx(math.sqrt(1.25))
    assert (stats.min, stats.max) == (1.0, 4.0)
    assert stats.quantiles["p50"] == 2.5
    assert stats.quantiles["p25"] == 1.75
    assert stats.top == [(1.0, 1), (2.0, 1), (3.0, 1), (4.0, 1)]


def test_top_values_most_frequent_first() -> None:
    stats = summarize([7, 7, 7, 3, 3, 9, math.nan], categorical=True, top=2)
    assert stats.top == [(7.0, 3), (3.0, 2)]
    assert summarize([7, 7, 3]).top == []  # not id-like: no top values


def test_empty_and_all_missing_summaries() -> None:
    assert summarize([]).as_dict()["missing_rate"] == 0.0
    stats = summarize([math.nan, math.nan])
    assert (stats.count, stats.missing, stats.missing_rate, stats.mean, stats.quantiles) == (
        2,
        2,
        1.0,
        None,
        {},
    )


def test_planted_share_shift_psi_and_ks() -> None:
    # Two values, half and half; the current sample has a quarter of zeros.
    base = np.array([0.0] * 50 + [1.0] * 50)
    cur = np.array([0.0] * 25 + [1.0] * 75)
    # (0.25 - 0.5) ln(0.25 / 0.5) + (0.75 - 0.5) ln(0.75 / 0.5) = 0.25 ln 3; the "other" bin is empty on both
    assert psi(base, cur) == pytest.approx(0.25 * math.log(3))
    assert ks(base, cur) == pytest.approx(0.25)


def test_planted_location_shift_on_deciles() -> None:
    base = np.arange(1000, dtype=np.float64)
    b, c = bin_shares(base, base + 100)
    assert b == pytest.approx([0.1] * 10)  # deciles of the baseline: 100 values each
    assert c == pytest.approx([0.0] + [0.1] * 8 + [0.2])  # shifted one bin up, the top bin takes two
    expected = (EPSILON - 0.1) * math.log(EPSILON / 0.1) + (0.2 - 0.1) * math.log(2)
    assert psi(base, base + 100) == pytest.approx(expected)
    assert ks(base, base + 100) == pytest.approx(0.1)  # the CDFs are 100 of 1000 values apart


def test_constant_baseline_sees_a_shift() -> None:
    # One distinct value: a quantile bin would hold both samples and see nothing.
    assert psi([5.0] * 10, [6.0] * 10) == pytest.approx(2 * (1 - EPSILON) * math.log(1 / EPSILON))
    assert ks([5.0] * 10, [6.0] * 10) == 1.0


def test_an_empty_side_is_a_note_not_an_error() -> None:
    result = drift([math.nan, math.inf], [1.0, 2.0])
    assert (result.psi, result.ks, result.baseline, result.current) == (0.0, 0.0, 0, 2)
    assert result.note == "the baseline has no present value (all missing or empty): no drift computed"
    assert (
        drift([1.0], []).note
        == "the current sample has no present value (all missing or empty): no drift computed"
    )


@settings(max_examples=300, deadline=None)
@given(COLUMNS)
def test_a_sample_against_itself_is_zero(values: list[float]) -> None:
    assert psi(values, values) == 0.0
    assert ks(values, values) == 0.0
    assert drift(values, list(reversed(values))).psi == 0.0


@settings(max_examples=300, deadline=None)
@given(COLUMNS, COLUMNS)
def test_drift_is_finite_and_non_negative_for_any_columns(a: list[float], b: list[float]) -> None:
    result = drift(a, b)
    assert math.isfinite(result.psi)
    assert result.psi >= 0.0
    assert 0.0 <= result.ks <= 1.0
    assert result.ks == pytest.approx(ks(b, a))  # KS is symmetric
    if result.note is None:
        assert result.baseline > 0
        assert result.current > 0


@settings(max_examples=300, deadline=None)
@given(COLUMNS, st.booleans())
def test_summaries_are_finite_for_any_column(values: list[float], categorical: bool) -> None:
    stats = summarize(values, categorical=categorical)
    assert stats.count == len(values)
    assert stats.missing == sum(1 for v in values if not math.isfinite(v))
    figures = [stats.mean, stats.std, stats.min, stats.max, *stats.quantiles.values()]
    assert all(f is None or math.isfinite(f) for f in figures)
    if stats.quantiles:
        assert stats.min is not None
        assert stats.max is not None
        assert stats.min <= stats.quantiles["p50"] <= stats.max
    assert sum(n for _, n in stats.top) <= stats.count - stats.missing
