"""Freshness statistics of one view from its write log: pipeline lag and read-time age.

- Pipeline lag of a written row = write time - its event time (the window boundary B). Each
  log entry summarises its rows as (B, count) pairs, so lag percentiles are weighted by rows.
- Read-time age at time t = t - P(t), where P(t) is the greatest boundary the view's tier had
  published by t (running maximum of the entries' progress): an entity whose value did not change
  is still current as of that boundary. Over a window the age is a saw-tooth; its percentiles are
  time-weighted and exact (each flat-progress segment spreads its ages uniformly).

Quantiles are "inverted CDF" (the smallest value whose cumulative weight reaches q), so a
quantile is always a value that occurred.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from headwater.pipelines.freshness.samples import Entry

FloatArray = npt.NDArray[np.float64]
QUANTILES = (0.5, 0.99)


def weighted_quantiles(
    values: npt.ArrayLike, weights: npt.ArrayLike, qs: Sequence[float] = QUANTILES
) -> tuple[float, ...] | None:
    """Weighted quantiles of ``values``: for each q the smallest value whose weight share reaches q.

    Returns None when the total weight is 0 (no data).
    """
    v = np.asarray(values, dtype=np.float64)
    w = np.asarray(weights, dtype=np.float64)
    keep = w > 0
    v, w = v[keep], w[keep]
    if not len(v):
        return None
    order = np.argsort(v, kind="stable")
    v, cum = v[order], np.cumsum(w[order])
    total = cum[-1]
    idx = [min(int(np.searchsorted(cum, q * total - 1e-9 * total, side="left")), len(v) - 1) for q in qs]
    return tuple(float(v[i]) for i in idx)


def lag_samples(entries: Sequence[Entry], start_ms: int, end_ms: int) -> tuple[FloatArray, FloatArray]:
    """Lags in seconds and their row weights of the entries written in ``(start_ms, end_ms]``."""
    lags: list[float] = []
    weights: list[float] = []
    for e in entries:
        if start_ms < e.write_ms <= end_ms:
            for b, count in e.samples:
                lags.append((e.write_ms - b) / 1000.0)
                weights.append(float(count))
    return np.array(lags, dtype=np.float64), np.array(weights, dtype=np.float64)


@dataclass(frozen=True)
class Progress:
    """The step function P(t): from ``times_ms[i]`` on, the tier has published up to ``boundary_ms[i]``."""

    times_ms: npt.NDArray[np.int64]
    boundary_ms: npt.NDArray[np.int64]

    @classmethod
    def from_entries(cls, entries: Sequence[Entry]) -> Progress:
        """Build P(t): running maximum of the entries' progress by write time, kept where it rises."""
        ordered = sorted(entries, key=lambda e: e.write_ms)
        times: list[int] = []
        bounds: list[int] = []
        for e in ordered:
            if not bounds or e.progress_ms > bounds[-1]:
                if times and times[-1] == e.write_ms:
                    bounds[-1] = e.progress_ms
                else:
                    times.append(e.write_ms)
                    bounds.append(e.progress_ms)
        return cls(np.array(times, dtype=np.int64), np.array(bounds, dtype=np.int64))

    def at(self, t_ms: int) -> int | None:
        """Boundary published up to at ``t_ms`` (None before the first entry)."""
        i = int(np.searchsorted(self.times_ms, t_ms, side="right")) - 1
        return None if i < 0 else int(self.boundary_ms[i])

    def age_s(self, t_ms: int) -> float | None:
        """Read-time age at ``t_ms`` in seconds (None before the first entry)."""
        p = self.at(t_ms)
        return None if p is None else (t_ms - p) / 1000.0

    def segments(self, start_ms: int, end_ms: int) -> tuple[FloatArray, FloatArray, FloatArray]:
        """Flat-progress segments clipped to ``[start_ms, end_ms]``: (start, end, boundary) in ms."""
        if not len(self.times_ms) or end_ms < self.times_ms[0]:
            empty = np.zeros(0, dtype=np.float64)
            return empty, empty, empty
        lo = max(start_ms, int(self.times_ms[0]))
        first = int(np.searchsorted(self.times_ms, lo, side="right")) - 1
        last = int(np.searchsorted(self.times_ms, end_ms, side="right"))
        t = self.times_ms[first:last].astype(np.float64)
        b = self.boundary_ms[first:last].astype(np.float64)
        starts = np.maximum(t, lo)
        ends = np.append(t[1:], end_ms)
        return starts, ends, b

    def age_quantiles(
        self, start_ms: int, end_ms: int, qs: Sequence[float] = QUANTILES
    ) -> tuple[float, ...] | None:
        """Time-weighted quantiles of the read-time age (s) over ``[start_ms, end_ms]``, exact.

        Only the part of the window after the first entry counts; None when nothing was published
        by ``end_ms``.
        """
        starts, ends, b = self.segments(start_ms, end_ms)
        if not len(starts):
            return None
        lengths = ends - starts
        total = float(lengths.sum())
        if total <= 0:
            age = (end_ms - b[-1]) / 1000.0
            return tuple(age for _ in qs)
        lo_age = starts - b
        out = []
        for q in qs:
            target = q * total
            x_lo, x_hi = float(lo_age.min()), float((ends - b).max())
            for _ in range(100):
                mid = (x_lo + x_hi) / 2
                if float(np.clip(mid - lo_age, 0.0, lengths).sum()) >= target:
                    x_hi = mid
                else:
                    x_lo = mid
            out.append(x_hi / 1000.0)
        return tuple(out)

    def age_series(self, start_ms: int, end_ms: int, max_points: int = 2000) -> list[tuple[int, float]]:
        """Polyline of the age saw-tooth over the window: (time ms, age s) at each rise and drop.

        With more segments than ``max_points / 2``, the envelope of the peaks is kept instead (one
        point per group of segments at its highest age), so an SLA breach stays visible.
        """
        starts, ends, b = self.segments(start_ms, end_ms)
        if not len(starts):
            return []
        if 2 * len(starts) <= max_points:
            points: list[tuple[int, float]] = []
            for s, e, bound in zip(starts.tolist(), ends.tolist(), b.tolist(), strict=True):
                points.append((int(s), (s - bound) / 1000.0))
                points.append((int(e), (e - bound) / 1000.0))
            return points
        groups = np.array_split(np.arange(len(starts)), max_points // 2)
        env: list[tuple[int, float]] = []
        for g in groups:
            peak = g[int(np.argmax(ends[g] - b[g]))]
            env.append((int(ends[peak]), float(ends[peak] - b[peak]) / 1000.0))
        return env
