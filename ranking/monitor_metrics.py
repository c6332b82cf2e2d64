"""``headwater monitor --metrics-file``: the monitor's report as Prometheus gauges in a text file.

The file follows node_exporter's textfile-collector convention: ``prometheus_client``'s
``write_to_textfile`` writes a temporary file beside the target and renames it over the target, so a
scrape reads either the previous report or the new one, never half of one. Every gauge carries the
labels ``view``, ``feature`` and ``column`` (the training-set column, ``user.<slot>``...; a column no
view declares has empty ``view`` and ``feature``). The names are :data:`METRIC_NAMES`; the alert
rules (:mod:`headwater.ranking.alerts`) read them.

Label values come from feature and column names; ``prometheus_client`` escapes backslashes, quotes
and newlines in them, so any name yields a well-formed file.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from prometheus_client import CollectorRegistry, Gauge, write_to_textfile

from headwater.ranking.monitor import ColumnReport, MonitorError, MonitorReport

CHECKS = ("min", "max", "max_missing_rate", "max_drift_psi", "max_drift_ks")
"""The ``expect:`` keys, in the order of :class:`headwater.registry.models.ExpectationSpec`."""
AGAINST = {"training set": "training_set", "previous day": "previous_day"}
"""A drift's baseline as the ``against`` label value."""

PSI = "headwater_monitor_psi"
KS = "headwater_monitor_ks"
MISSING_RATE = "headwater_monitor_missing_rate"
SERVED_MIN = "headwater_monitor_served_min"
SERVED_MAX = "headwater_monitor_served_max"
SERVED_COUNT = "headwater_monitor_served_values"
LIMIT = "headwater_monitor_expectation_limit"
BREACH = "headwater_monitor_breach"
DAY = "headwater_monitor_day_timestamp_seconds"
METRIC_NAMES = (PSI, KS, MISSING_RATE, SERVED_MIN, SERVED_MAX, SERVED_COUNT, LIMIT, BREACH, DAY)
COLUMN_LABELS = ("view", "feature", "column")


def monitor_registry(report: MonitorReport) -> CollectorRegistry:
    """Return a registry of its own holding ``report``'s gauges (see the module docstring)."""
    registry = CollectorRegistry(auto_describe=True)
    g = {
        PSI: Gauge(PSI, "PSI of the day's served values against a baseline (training_set or previous_day).",
                   [*COLUMN_LABELS, "against"], registry=registry),
        KS: Gauge(KS, "Two-sample KS statistic of the day's served values against a baseline.",
                  [*COLUMN_LABELS, "against"], registry=registry),
        MISSING_RATE: Gauge(MISSING_RATE, "Share of the day's served values missing (null, NaN, inf).",
                            COLUMN_LABELS, registry=registry),
        SERVED_MIN: Gauge(SERVED_MIN, "Smallest present value served on the day.", COLUMN_LABELS,
                          registry=registry),
        SERVED_MAX: Gauge(SERVED_MAX, "Largest present value served on the day.", COLUMN_LABELS,
                          registry=registry),
        SERVED_COUNT: Gauge(SERVED_COUNT, "Values served on the day (missing ones included).", COLUMN_LABELS,
                            registry=registry),
        LIMIT: Gauge(LIMIT, "The feature's expect: limit, by check (the expect key).",
                     [*COLUMN_LABELS, "check"], registry=registry),
        BREACH: Gauge(BREACH, "1 when the day's values breach the expect: check, else 0.",
                      [*COLUMN_LABELS, "check"], registry=registry),
    }  # fmt: skip
    day = Gauge(DAY, "Start of the UTC day monitored (epoch s): how old the report is.", registry=registry)
    day.set(datetime(report.day.year, report.day.month, report.day.day, tzinfo=UTC).timestamp())
    breached = {(b.column, b.check) for b in report.breaches}
    for row in report.columns:
        _column(g, row)
    for column, limits in _limits(report).items():
        labels = _labels(next(c for c in report.columns if c.column == column))
        for check, limit in limits.items():
            g[LIMIT].labels(*labels, check).set(limit)
            g[BREACH].labels(*labels, check).set(1.0 if (column, check) in breached else 0.0)
    return registry


def _labels(row: ColumnReport) -> tuple[str, str, str]:
    return row.view or "", row.feature or "", row.column


def _column(g: dict[str, Gauge], row: ColumnReport) -> None:
    labels = _labels(row)
    g[MISSING_RATE].labels(*labels).set(row.served.missing_rate)
    g[SERVED_COUNT].labels(*labels).set(row.served.count)
    # min/max of a column with no present value are unknown: no sample rather than a made-up 0.
    if row.served.min is not None:
        g[SERVED_MIN].labels(*labels).set(row.served.min)
    if row.served.max is not None:
        g[SERVED_MAX].labels(*labels).set(row.served.max)
    for against, result in (("training_set", row.vs_training), ("previous_day", row.vs_previous)):
        if result is not None and result.note is None:  # a noted drift is 0 for want of values
            g[PSI].labels(*labels, against).set(result.psi)
            g[KS].labels(*labels, against).set(result.ks)


def _limits(report: MonitorReport) -> dict[str, dict[str, float]]:
    """``{column: {check: limit}}`` of every column checked against an ``expect:`` block."""
    out: dict[str, dict[str, float]] = {}
    for column, expect in report.expected.items():
        out[column] = {k: float(v) for k in CHECKS if (v := getattr(expect, k)) is not None}
    return out


def write_metrics_file(report: MonitorReport, path: Path) -> None:
    """Write ``report``'s gauges to ``path`` atomically (temporary file, then rename).

    Raises:
        MonitorError: the folder does not exist or cannot be written.
    """
    if not path.parent.is_dir():
        msg = f"--metrics-file {path}: no folder {path.parent}; create it or point at the textfile folder"
        raise MonitorError(msg)
    try:
        write_to_textfile(str(path), monitor_registry(report))
    except OSError as exc:
        msg = f"--metrics-file {path}: cannot write it ({exc.strerror or exc})"
        raise MonitorError(msg) from exc
