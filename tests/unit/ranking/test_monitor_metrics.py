"""headwater monitor's metrics file: gauges per view and feature, atomic, any feature name safe."""

from __future__ import annotations

import math
from datetime import date
from pathlib import Path

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from headwater.ranking.monitor import MonitorError, MonitorReport, Served, Watched, monitor
from headwater.ranking.monitor_metrics import METRIC_NAMES, write_metrics_file
from headwater.registry.models import ExpectationSpec

DEC_4 = 1_796_342_400_000  # 2026-12-04T00:00:00Z
DAY_MS = 86_400_000


def _samples(path: Path) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    # Bytes, not read_text(): universal newlines would turn a "\r" inside a label value into a line end.
    for family in text_string_to_metric_families(path.read_bytes().decode("utf-8")):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _report(
    view: str = "user_session_realtime", feature: str = "clicks_5m", column: str = "user.clicks_5m"
) -> MonitorReport:
    served = Served()
    rng = np.random.default_rng(7)
    served.add(column, rng.normal(0, 1, 2000), DEC_4 - DAY_MS + 1)  # the day before
    today = rng.normal(3, 1, 2000)
    today[:100] = np.nan  # 5% missing
    served.add(column, today, DEC_4 + 1)
    served.add("user.other", np.ones(10), DEC_4 + 1)  # no view declares it
    watched = {
        column: Watched(
            column, view, feature, expect=ExpectationSpec(max_missing_rate=0.01, max_drift_psi=0.25)
        )
    }
    baseline = {column: rng.normal(0, 1, 4000)}
    return monitor(served, baseline, watched, date(2026, 12, 4))


def test_the_metrics_file_holds_the_reports_figures(tmp_path: Path) -> None:
    report = _report()
    path = tmp_path / "headwater_monitor.prom"
    write_metrics_file(report, path)
    got = _samples(path)
    col = (("column", "user.clicks_5m"), ("feature", "clicks_5m"), ("view", "user_session_realtime"))
    row = next(c for c in report.columns if c.column == "user.clicks_5m")
    assert row.vs_training is not None
    assert row.vs_previous is not None
    assert got[
        ("headwater_monitor_psi", tuple(sorted((*col, ("against", "training_set")))))
    ] == pytest.approx(row.vs_training.psi)
    assert got[("headwater_monitor_ks", tuple(sorted((*col, ("against", "previous_day")))))] == pytest.approx(
        row.vs_previous.ks
    )
    assert got[("headwater_monitor_missing_rate", col)] == pytest.approx(0.05)
    assert got[("headwater_monitor_served_values", col)] == 2000
    lim = {c: got[("headwater_monitor_expectation_limit", tuple(sorted((*col, ("check", c)))))] for c in
           ("max_missing_rate", "max_drift_psi")}  # fmt: skip
    assert lim == {"max_missing_rate": 0.01, "max_drift_psi": 0.25}
    breach = {c: got[("headwater_monitor_breach", tuple(sorted((*col, ("check", c)))))] for c in lim}
    assert breach == {"max_missing_rate": 1.0, "max_drift_psi": 1.0}  # 5% missing, a 3-sigma shift
    assert ("headwater_monitor_breach", tuple(sorted((*col, ("check", "min"))))) not in got  # no min declared
    other = (("column", "user.other"), ("feature", ""), ("view", ""))
    assert got[("headwater_monitor_served_min", other)] == 1.0
    assert got[("headwater_monitor_day_timestamp_seconds", ())] == DEC_4 / 1000
    assert {name for name, _ in got} <= set(METRIC_NAMES)
    assert [p.name for p in tmp_path.iterdir()] == ["headwater_monitor.prom"]  # the temporary file renamed


def test_a_clean_day_sets_breach_gauges_to_zero(tmp_path: Path) -> None:
    served = Served()
    served.add("user.a", np.arange(100.0), DEC_4 + 1)
    watched = {"user.a": Watched("user.a", "v", "a", expect=ExpectationSpec(min=0, max=1000))}
    write_metrics_file(monitor(served, None, watched), tmp_path / "m.prom")
    got = _samples(tmp_path / "m.prom")
    col = (("column", "user.a"), ("feature", "a"), ("view", "v"))
    assert got[("headwater_monitor_breach", tuple(sorted((*col, ("check", "min")))))] == 0.0
    assert got[("headwater_monitor_breach", tuple(sorted((*col, ("check", "max")))))] == 0.0
    assert not any(name == "headwater_monitor_psi" for name, _ in got)  # no baseline, no day before


def test_a_missing_folder_is_a_diagnostic(tmp_path: Path) -> None:
    with pytest.raises(MonitorError, match=r"--metrics-file .*nowhere.*create it"):
        write_metrics_file(_report(), tmp_path / "nowhere" / "m.prom")


@settings(max_examples=100, deadline=None)
@example(view='v"\\\n', feature="\r\u2028", column="a\rb")  # quote, backslash, newline, CR, LS
@given(view=st.text(max_size=20), feature=st.text(max_size=20), column=st.text(min_size=1, max_size=20))
def test_any_name_round_trips_through_the_file(
    tmp_path_factory, view: str, feature: str, column: str
) -> None:
    # Names with quotes, backslashes, newlines or any unicode must come back as they went in.
    path = tmp_path_factory.mktemp("m") / "m.prom"
    report = _report(view, feature, "user." + column)
    write_metrics_file(report, path)
    got = _samples(path)
    rates = {
        dict(labels).get("column"): v for (name, labels), v in got.items() if name.endswith("missing_rate")
    }
    assert rates["user." + column] == pytest.approx(0.05)
    views = {dict(labels).get("view") for (name, labels), _ in got.items() if name.endswith("missing_rate")}
    assert view in views
    assert all(math.isfinite(v) for v in got.values())
