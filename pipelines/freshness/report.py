"""The freshness report: every applied view's pipeline lag and read-time age against its SLA.

Views come from the applied tier plans (``registry/plans.py``); figures from the views' write logs
(:mod:`~headwater.pipelines.freshness.samples`). A view's verdict is about read-time age, the
quantity its ``freshness_sla`` bounds ("max age of a value when it is read"):

- ``breach``: the age now, or the p99 age over the window, is above the SLA;
- ``no data``: nothing was ever published for the view (no write log);
- ``ok``: otherwise. Pipeline lag is reported beside it (a lag above the SLA shows as ``lag>sla``).

With ``after_catch_up`` (``headwater freshness --after-catch-up``), a view is judged only from the
moment its tier caught up: the first write whose own pipeline lag (write time - the newest boundary
it publishes) is within the SLA. A job that starts on a backlog (``run realtime --from-latest``
still has to read what arrived while it started) writes stale values first; those seconds are
shown as the catch-up, with its duration, not counted as a breach. A view that has not caught up
yet is ``catching up`` (a failing verdict too: it does not meet its SLA).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from headwater.pipelines.freshness.repairs import RepairStatus, read_repair_status
from headwater.pipelines.freshness.samples import Entry, read_entries, read_since
from headwater.pipelines.freshness.stats import Progress, lag_samples, weighted_quantiles
from headwater.pipelines.store.layout import DEFAULT_NAMESPACE
from headwater.registry.errors import HeadwaterError
from headwater.registry.tiers import TIER_NAMES

OK, BREACH, NO_DATA, CATCHING_UP = "ok", "breach", "no data", "catching up"
FAILING = (BREACH, CATCHING_UP)
"""Verdicts of a view that does not meet its SLA (``headwater freshness`` exits 1)."""


class NoPlansError(HeadwaterError, RuntimeError):
    """No tier plan was applied: there are no views to report on."""


@dataclass(frozen=True)
class FreshnessTarget:
    """What the report needs of a plan view."""

    view: str
    tier: str
    sla_s: float
    version: str = ""
    """The applied version of the view ("" when unknown)."""


@dataclass(frozen=True)
class Pair:
    """p50 and p99 in seconds (None: no data)."""

    p50: float | None = None
    p99: float | None = None

    @classmethod
    def of(cls, q: tuple[float, ...] | None) -> Pair:
        """Build from a (p50, p99) tuple or None."""
        return cls() if q is None else cls(q[0], q[1])


@dataclass(frozen=True)
class ViewFreshness:
    """Freshness figures of one view over a window ending at ``now_ms``."""

    view: str
    tier: str
    sla_s: float
    verdict: str
    lag_now: Pair
    lag_window: Pair
    age_now_s: float | None
    age_window: Pair
    rows_window: int
    writes_window: int
    progress_ms: int | None
    last_write_ms: int | None
    log_start_ms: int | None
    age_series: list[tuple[int, float]] = field(repr=False)
    lag_series: list[tuple[int, float, float]] = field(repr=False)
    version: str = ""
    """The applied version of the view."""
    written_version: str | None = None
    """The version of the newest write the log holds (None: none logged one); another value than
    ``version`` means the tier still runs an older definition of the view."""
    caught_up_ms: int | None = None
    """With ``after_catch_up``: when the tier caught up (None: not judged so, or not caught up yet)."""
    catch_up_s: float | None = None
    """With ``after_catch_up``: seconds from the view's first write to catching up (so far, if not yet)."""
    judged_from_ms: int | None = None
    """Start of the judged window: now - window, or the catch-up when later."""
    repair: RepairStatus | None = None
    """What the tier's reconciliation passes checked and repaired (None: no pass counted any key)."""

    @property
    def lag_over_sla(self) -> bool:
        """Whether the p99 pipeline lag over the window is above the SLA."""
        return self.lag_window.p99 is not None and self.lag_window.p99 > self.sla_s


@dataclass(frozen=True)
class Report:
    """The whole report: one :class:`ViewFreshness` per applied view, tiers in order."""

    now_ms: int
    window_s: float
    views: list[ViewFreshness]
    after_catch_up: bool = False
    """Whether each view was judged from its catch-up on (see the module docstring)."""

    @property
    def breached(self) -> list[ViewFreshness]:
        """Views whose verdict is breach."""
        return [v for v in self.views if v.verdict == BREACH]

    @property
    def catching_up(self) -> list[ViewFreshness]:
        """Views that have not caught up yet (only with ``after_catch_up``)."""
        return [v for v in self.views if v.verdict == CATCHING_UP]

    @property
    def failing(self) -> list[ViewFreshness]:
        """Views that do not meet their SLA: in breach or still catching up."""
        return [v for v in self.views if v.verdict in FAILING]

    def to_json(self) -> dict[str, Any]:
        """Plain JSON: figures in seconds, times in epoch ms and ISO-8601 UTC; no plot series."""
        views = []
        for v in self.views:
            d = asdict(v)
            d.pop("age_series")
            d.pop("lag_series")
            d["lag_over_sla"] = v.lag_over_sla
            d["progress"] = _iso(v.progress_ms)
            views.append(d)
        return {
            "generated_at": _iso(self.now_ms),
            "now_ms": self.now_ms,
            "window_s": self.window_s,
            "after_catch_up": self.after_catch_up,
            "ok": not self.failing,
            "breached": [v.view for v in self.breached],
            "catching_up": [v.view for v in self.catching_up],
            "views": views,
        }


def _iso(ms: int | None) -> str | None:
    return (
        None if ms is None else datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(timespec="milliseconds")
    )


def caught_up_at(entries: Sequence[Entry], sla_s: float) -> int | None:
    """Return the write time of the first write whose own lag is within ``sla_s`` (None: none yet).

    A write's own lag is its write time minus the newest boundary it publishes: how far behind the
    events the tier was when it wrote. Under the SLA, the tier is processing live events.
    """
    for e in sorted(entries, key=lambda e: e.write_ms):
        if e.rows > 0 and e.write_ms - e.progress_ms <= sla_s * 1000:
            return e.write_ms
    return None


def view_freshness(
    spec: FreshnessTarget,
    entries: Sequence[Entry],
    now_ms: int,
    window_ms: int,
    after_catch_up: bool = False,
) -> ViewFreshness:
    """Compute one view's figures from its write log over ``(now_ms - window_ms, now_ms]``.

    With ``after_catch_up`` the window starts at the catch-up when that is later (module docstring);
    ``entries`` must then be the whole log, so that the catch-up's duration is known.
    """
    start = now_ms - window_ms
    caught = catch_up_s = None
    if after_catch_up:
        first = min((e.write_ms for e in entries if e.rows > 0 and e.write_ms <= now_ms), default=None)
        caught = caught_up_at([e for e in entries if e.write_ms <= now_ms], spec.sla_s)
        if first is not None:
            catch_up_s = ((caught if caught is not None else now_ms) - first) / 1000
        if caught is not None:
            start = max(start, caught)
    progress = Progress.from_entries(entries)
    lags, weights = lag_samples(entries, start, now_ms)
    written = [e for e in entries if e.rows > 0 and e.write_ms <= now_ms]
    last = max(written, key=lambda e: e.write_ms) if written else None
    lag_now = Pair()
    if last is not None:
        lag_now = Pair.of(
            weighted_quantiles(
                [(last.write_ms - b) / 1000 for b, _ in last.samples], [c for _, c in last.samples]
            )
        )
    age_now = progress.age_s(now_ms)
    age_window = Pair.of(progress.age_quantiles(start, now_ms))
    if age_now is None:
        verdict = NO_DATA
    elif after_catch_up and caught is None:
        verdict = CATCHING_UP
    elif age_now > spec.sla_s or (age_window.p99 is not None and age_window.p99 > spec.sla_s):
        verdict = BREACH
    else:
        verdict = OK
    in_window = [e for e in entries if start < e.write_ms <= now_ms]
    return ViewFreshness(
        view=spec.view,
        tier=spec.tier,
        sla_s=spec.sla_s,
        verdict=verdict,
        lag_now=lag_now,
        lag_window=Pair.of(weighted_quantiles(lags, weights)),
        age_now_s=age_now,
        age_window=age_window,
        rows_window=int(weights.sum()),
        writes_window=len(in_window),
        progress_ms=progress.at(now_ms),
        last_write_ms=max((e.write_ms for e in entries), default=None),
        log_start_ms=min((e.write_ms for e in entries), default=None),
        age_series=progress.age_series(start, now_ms),
        lag_series=_lag_points(in_window),
        version=spec.version,
        written_version=next((e.version for e in reversed(entries) if e.version), None),
        caught_up_ms=caught,
        catch_up_s=catch_up_s,
        judged_from_ms=start,
    )


def _lag_points(entries: Sequence[Entry], max_points: int = 1500) -> list[tuple[int, float, float]]:
    """(write time ms, p50 lag s, max lag s) per write with rows, thinned to at most ``max_points``."""
    pts = []
    for e in entries:
        if e.samples:
            ordered = sorted(e.samples)  # by boundary: the lag falls as the boundary rises
            half, seen, median_b = e.rows / 2, 0, ordered[-1][0]
            for b, count in reversed(ordered):
                seen += count
                if seen >= half:
                    median_b = b
                    break
            pts.append((e.write_ms, (e.write_ms - median_b) / 1000, (e.write_ms - ordered[0][0]) / 1000))
    if len(pts) > max_points:
        step = len(pts) / max_points
        pts = [pts[int(i * step)] for i in range(max_points)]
    return pts


def plan_views(state_dir: Path) -> list[FreshnessTarget]:
    """Every view of the applied tier plans, tiers in order realtime, nearline, offline.

    Raises:
        NoPlansError: no plan file exists under ``state_dir/plans``.
    """
    from headwater.registry.plans import read_plan

    specs: list[FreshnessTarget] = []
    found = False
    for tier in TIER_NAMES:
        try:
            plan = read_plan(state_dir, tier)
        except FileNotFoundError:
            continue
        found = True
        specs.extend(FreshnessTarget(v.name, tier, v.freshness_sla_s, v.version) for v in plan.views)
    if not found:
        msg = (
            f"no applied plans under {state_dir / 'plans'}: run `headwater apply features/` first"
            " (or pass --state-dir)"
        )
        raise NoPlansError(msg)
    return specs


def build_report(
    client: Any,
    specs: Sequence[FreshnessTarget],
    now_ms: int,
    window_s: float,
    namespace: str = DEFAULT_NAMESPACE,
    after_catch_up: bool = False,
) -> Report:
    """Read every view's write log from Redis and compute its figures (see :func:`view_freshness`).

    With ``after_catch_up`` each view's whole kept log is read (its catch-up may be older than the
    window); otherwise only what the window needs (:func:`read_since`).
    """
    window_ms = int(window_s * 1000)
    views = []
    for s in specs:
        if after_catch_up:
            entries = read_entries(client, s.view, namespace)[0]
        else:
            entries = read_since(client, s.view, now_ms - window_ms, namespace)
        views.append(view_freshness(s, entries, now_ms, window_ms, after_catch_up))
    repairs = read_repair_status(client, [v.view for v in views], namespace)
    views = [v if v.view not in repairs else dataclasses.replace(v, repair=repairs[v.view]) for v in views]
    return Report(now_ms, window_s, views, after_catch_up)
