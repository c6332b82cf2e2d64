"""Statistics of the freshness logs: weighted quantiles, lag samples, the progress step function."""

from __future__ import annotations

import pytest

from headwater.pipelines.freshness.samples import Entry
from headwater.pipelines.freshness.stats import Progress, lag_samples, weighted_quantiles

T0 = 1_800_000_000_000


def entry(write_ms: int, progress_ms: int, samples: tuple[tuple[int, int], ...] = ()) -> Entry:
    rows = sum(c for _, c in samples)
    return Entry(write_ms, rows, rows, progress_ms, samples)


def test_weighted_quantiles_follow_the_weights() -> None:
    assert weighted_quantiles([1.0, 2.0], [1, 1]) == (1.0, 2.0)
    # 99 rows at 1 s and 1 row at 10 s: p50 = 1, p99 = 1 (99 % of the weight is at 1), p100 = 10
    assert weighted_quantiles([10.0, 1.0], [1, 99], (0.5, 0.99, 1.0)) == (1.0, 1.0, 10.0)
    assert weighted_quantiles([3.0, 1.0, 2.0], [1, 1, 98], (0.01, 0.5, 0.995)) == (1.0, 2.0, 3.0)


def test_weighted_quantiles_of_nothing_is_none() -> None:
    assert weighted_quantiles([], []) is None
    assert weighted_quantiles([5.0], [0]) is None


def test_lag_samples_take_the_writes_inside_the_window_weighted_by_rows() -> None:
    entries = [
        entry(T0 - 1000, T0 - 3000, ((T0 - 3000, 5),)),  # outside: at or before the start
        entry(T0 + 2000, T0, ((T0 - 1000, 3), (T0, 7))),
        entry(T0 + 9000, T0, ((T0, 2),)),
    ]
    lags, weights = lag_samples(entries, T0 - 1000, T0 + 9000)
    assert lags.tolist() == [3.0, 2.0, 9.0]
    assert weights.tolist() == [3.0, 7.0, 2.0]


def test_progress_is_the_running_maximum_by_write_time() -> None:
    p = Progress.from_entries([entry(T0 + 20, T0 - 500), entry(T0, T0 - 1000), entry(T0 + 10, T0 - 2000)])
    assert p.times_ms.tolist() == [T0, T0 + 20]
    assert p.boundary_ms.tolist() == [T0 - 1000, T0 - 500]
    assert p.at(T0 - 1) is None
    assert p.at(T0 + 15) == T0 - 1000
    assert p.age_s(T0 + 15) == 1.015
    assert p.age_s(T0 + 1000) == 1.5


def sawtooth(n: int, period_ms: int = 10_000, lag_ms: int = 2_000) -> Progress:
    """Boundary t - lag published every period: the age runs from lag to lag + period."""
    return Progress.from_entries([entry(T0 + i * period_ms, T0 + i * period_ms - lag_ms) for i in range(n)])


def test_age_quantiles_of_a_sawtooth_are_exact() -> None:
    p = sawtooth(11)
    q = p.age_quantiles(T0, T0 + 100_000, (0.0, 0.5, 0.99, 1.0))
    assert q is not None
    # ages spread uniformly over [2 s, 12 s): p50 = 7 s, p99 = 2 + 0.99 * 10 = 11.9 s
    assert q == pytest.approx((2.0, 7.0, 11.9, 12.0), abs=1e-6)


def test_age_quantiles_count_only_time_after_the_first_publication() -> None:
    p = sawtooth(1)  # one publication at T0 of boundary T0 - 2 s, then nothing for 18 s
    q = p.age_quantiles(T0 - 60_000, T0 + 18_000)
    assert q == pytest.approx((11.0, 19.82), abs=1e-6)
    assert p.age_quantiles(T0 - 60_000, T0 - 1) is None


def test_age_series_draws_the_sawtooth_rise_and_drop() -> None:
    p = sawtooth(3)
    pts = p.age_series(T0 + 5_000, T0 + 25_000)
    assert pts == [
        (T0 + 5_000, 7.0),
        (T0 + 10_000, 12.0),
        (T0 + 10_000, 2.0),
        (T0 + 20_000, 12.0),
        (T0 + 20_000, 2.0),
        (T0 + 25_000, 7.0),
    ]


def test_age_series_keeps_the_peaks_when_thinned() -> None:
    p = sawtooth(1000, period_ms=1_000, lag_ms=500)
    late = Progress.from_entries(
        [*[entry(T0 + i * 1_000, T0 + i * 1_000 - 500) for i in range(1000) if i != 500]]
    )
    pts = late.age_series(T0, T0 + 1_000_000, max_points=100)
    assert len(pts) == 50
    assert max(a for _, a in pts) == pytest.approx(2.5)  # the missing publication at 500 s is visible
    assert max(a for _, a in p.age_series(T0, T0 + 1_000_000, max_points=100)) == pytest.approx(1.5)
