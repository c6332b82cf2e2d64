"""Prometheus metrics of freshness per view (labels ``view``, ``tier``), read from the write logs.

Register a :class:`FreshnessCollector` with any ``prometheus_client`` registry (the ranking
service's ``/metrics``, or ``headwater freshness --serve-metrics PORT``). Each scrape reads only
the log entries written since the previous scrape, so the lag histogram is a true cumulative
Prometheus histogram (rows by lag bucket since this process started; the first scrape counts what
the capped log still holds). Exposed:

- ``headwater_pipeline_lag_seconds`` (histogram): write time - event time, one observation per row;
- ``headwater_pipeline_lag_window_seconds{quantile}``: p50/p99 lag over the window;
- ``headwater_read_age_seconds``: now - the boundary the view's tier has published up to;
- ``headwater_read_age_window_seconds{quantile}``: time-weighted p50/p99 age over the window;
- ``headwater_freshness_sla_seconds``, ``headwater_freshness_breach`` (1 = breach, see the report),
  ``headwater_published_boundary_timestamp_seconds``;
- ``headwater_repair_keys_total{kind}``: keys the tier's reconciliation passes checked, found missing,
  found stale and repaired (kind ``checked``, ``missing``, ``stale``, ``repaired``; :mod:`.repairs`),
  only for views with a counted pass;
- ``headwater_freshness_scrape_ok``: 0 when the store could not be read (figures then omitted).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from headwater.pipelines.freshness.repairs import RepairStatus, read_repair_status
from headwater.pipelines.freshness.report import BREACH, FreshnessTarget, plan_views, view_freshness
from headwater.pipelines.freshness.samples import Entry, read_entries
from headwater.pipelines.store.layout import DEFAULT_NAMESPACE
from headwater.pipelines.store.store import OnlineStore
from headwater.pipelines.store.transport import StoreError

LAG_BUCKETS = (
    0.1,
    0.25,
    0.5,
    1,
    2,
    5,
    10,
    30,
    60,
    120,
    300,
    600,
    1800,
    3600,
    7200,
    21600,
    43200,
    86400,
    172800,
)
log = logging.getLogger(__name__)


@dataclass
class _ViewState:
    """What one view's collector keeps between scrapes."""

    last_id: bytes | str = "-"
    entries: list[Entry] = field(default_factory=list)
    buckets: npt.NDArray[np.float64] = field(default_factory=lambda: np.zeros(len(LAG_BUCKETS) + 1))
    lag_sum: float = 0.0

    def absorb(self, new: Sequence[Entry], keep_after_ms: int) -> None:
        """Count the new rows into the histogram; keep the entries of the window plus one anchor."""
        for e in new:
            for b, count in e.samples:
                lag = (e.write_ms - b) / 1000.0
                self.buckets[int(np.searchsorted(LAG_BUCKETS, lag, side="left"))] += count
                self.lag_sum += lag * count
        entries = self.entries + list(new)
        old = [e for e in entries if e.write_ms <= keep_after_ms]
        if old:
            anchor = max(old, key=lambda e: e.progress_ms)
            recent = [e for e in entries if e.write_ms > keep_after_ms]
            entries = [Entry(max(e.write_ms for e in old), 0, 0, anchor.progress_ms, ()), *recent]
        self.entries = entries


class FreshnessCollector(Collector):
    """Collects freshness metrics of ``specs`` from the write logs in Redis at each scrape."""

    def __init__(
        self,
        client: Any,
        specs: Sequence[FreshnessTarget],
        window_s: float = 900.0,
        namespace: str = DEFAULT_NAMESPACE,
        clock_ms: Callable[[], int] | None = None,
    ) -> None:
        self.client = client
        self.specs = list(specs)
        self.window_s = window_s
        self.namespace = namespace
        self._clock = clock_ms or (lambda: time.time_ns() // 1_000_000)
        self._state = {s.view: _ViewState() for s in self.specs}
        self._lock = threading.Lock()  # scrapes may come from several server threads at once

    @classmethod
    def from_plans(cls, client: Any, state_dir: Path, **kwargs: Any) -> FreshnessCollector:
        """Collect for every view of the applied plans under ``state_dir`` (raises NoPlansError)."""
        return cls(client, plan_views(state_dir), **kwargs)

    @classmethod
    def for_store(cls, store: OnlineStore, state_dir: Path, **kwargs: Any) -> FreshnessCollector:
        """Collect from ``store``'s Redis and namespace for every view of the applied plans."""
        return cls.from_plans(store.client, state_dir, namespace=store.namespace, **kwargs)

    def describe(self) -> list[Metric]:
        """Nothing up front: keeps registration from scraping Redis."""
        return []

    def collect(self) -> Iterator[Metric]:
        """Read the new log entries of every view and yield the metric families."""
        with self._lock:
            metrics = list(self._collect())
        yield from metrics

    def _collect(self) -> Iterator[Metric]:
        labels = ["view", "tier"]
        ok = GaugeMetricFamily("headwater_freshness_scrape_ok", "1 when the write logs could be read")
        now = self._clock()
        window_ms = int(self.window_s * 1000)
        try:
            for spec in self.specs:
                st = self._state[spec.view]
                new, last = read_entries(self.client, spec.view, self.namespace, st.last_id)
                st.absorb(new, now - window_ms)
                st.last_id = last if last is not None else st.last_id
            repairs = read_repair_status(self.client, [s.view for s in self.specs], self.namespace)
        except StoreError as exc:
            log.warning("freshness metrics: %s", exc)
            ok.add_metric([], 0.0)
            yield ok
            return
        ok.add_metric([], 1.0)
        yield ok
        hist = HistogramMetricFamily(
            "headwater_pipeline_lag_seconds",
            "Write time minus event time (window boundary) per row",
            labels=labels,
        )
        fams = {
            "lag_q": GaugeMetricFamily(
                "headwater_pipeline_lag_window_seconds",
                "Pipeline lag quantile over the window",
                labels=[*labels, "quantile"],
            ),
            "age": GaugeMetricFamily(
                "headwater_read_age_seconds",
                "Now minus the boundary the tier has published up to",
                labels=labels,
            ),
            "age_q": GaugeMetricFamily(
                "headwater_read_age_window_seconds",
                "Time-weighted read-time age quantile over the window",
                labels=[*labels, "quantile"],
            ),
            "sla": GaugeMetricFamily(
                "headwater_freshness_sla_seconds", "The view's freshness SLA", labels=labels
            ),
            "breach": GaugeMetricFamily(
                "headwater_freshness_breach", "1 when the view breaches its SLA", labels=labels
            ),
            "boundary": GaugeMetricFamily(
                "headwater_published_boundary_timestamp_seconds",
                "Boundary the tier has published up to (epoch s)",
                labels=labels,
            ),
        }
        for spec in self.specs:
            self._add_view(spec, now, window_ms, hist, fams)
        yield hist
        yield from fams.values()
        yield _repair_family(self.specs, repairs)

    def _add_view(
        self,
        spec: FreshnessTarget,
        now: int,
        window_ms: int,
        hist: HistogramMetricFamily,
        fams: dict[str, GaugeMetricFamily],
    ) -> None:
        st = self._state[spec.view]
        lv = [spec.view, spec.tier]
        cum = np.cumsum(st.buckets)
        bounds = [*(str(float(b)) for b in LAG_BUCKETS), "+Inf"]
        hist.add_metric(lv, list(zip(bounds, cum.tolist(), strict=True)), st.lag_sum)
        fams["sla"].add_metric(lv, spec.sla_s)
        f = view_freshness(spec, st.entries, now, window_ms)
        for q, pair_value in (("0.5", f.lag_window.p50), ("0.99", f.lag_window.p99)):
            if pair_value is not None:
                fams["lag_q"].add_metric([*lv, q], pair_value)
        for q, pair_value in (("0.5", f.age_window.p50), ("0.99", f.age_window.p99)):
            if pair_value is not None:
                fams["age_q"].add_metric([*lv, q], pair_value)
        if f.age_now_s is not None:
            fams["age"].add_metric(lv, f.age_now_s)
        if f.progress_ms is not None:
            fams["boundary"].add_metric(lv, f.progress_ms / 1000.0)
        fams["breach"].add_metric(lv, 1.0 if f.verdict == BREACH else 0.0)


def _repair_family(specs: Sequence[FreshnessTarget], repairs: dict[str, RepairStatus]) -> Metric:
    """``headwater_repair_keys_total`` of every view with repair counters (see the module docstring)."""
    fam = CounterMetricFamily(
        "headwater_repair_keys",
        "Keys the reconciliation passes checked, found missing or stale, and repaired",
        labels=["view", "tier", "kind"],
    )
    for spec in specs:
        status = repairs.get(spec.view)
        if status is not None:
            for kind, value in status.counts.as_dict().items():
                fam.add_metric([spec.view, spec.tier, kind], float(value))
    return fam
