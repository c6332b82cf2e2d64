"""headwater alerts: the rules file of the example repo parses, has its rules, reads only real metrics."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from headwater.cli.main import main
from headwater.pipelines.freshness import metrics as freshness_metrics
from headwater.pipelines.freshness.repairs import RepairCounts, RepairStatus
from headwater.pipelines.freshness.report import FreshnessTarget
from headwater.ranking.alerts import AlertsError, alert_rules, dump_rules, quote, rule_metrics, write_rules
from headwater.ranking.monitor import Served, Watched, monitor
from headwater.ranking.monitor_metrics import monitor_registry
from headwater.registry.compiled import CheckResult
from headwater.registry.models import ExpectationSpec
from headwater.registry.validate import check_repo
from headwater.serving.telemetry import Telemetry

EXAMPLE = Path(__file__).resolve().parents[3] / "features"
SUFFIXES = ("_bucket", "_count", "_sum", "_total", "_created")


@functools.cache
def _example() -> CheckResult:
    return check_repo(EXAMPLE)


def _names(registry: CollectorRegistry) -> set[str]:
    """Family names a registry exposes, with or without samples (a counter's without _total)."""
    return {family.name for family in registry.collect()}


def registered(monkeypatch: pytest.MonkeyPatch) -> set[str]:
    """Every metric name the service, the freshness collector and the monitor's file register."""
    names = _names(Telemetry().registry)
    # The freshness collector reads Redis at scrape time: feed it one view with a repair status.
    monkeypatch.setattr(freshness_metrics, "read_entries", lambda *_a, **_k: ([], None))
    monkeypatch.setattr(
        freshness_metrics,
        "read_repair_status",
        lambda *_a, **_k: {"v": RepairStatus(RepairCounts(3, 1, 0, 1))},
    )
    fresh = CollectorRegistry()
    fresh.register(freshness_metrics.FreshnessCollector(object(), [FreshnessTarget("v", "nearline", 180.0)]))
    names |= _names(fresh)
    served = Served()
    served.add("user.a", np.arange(10.0), 1_796_342_400_000)
    report = monitor(served, {"user.a": np.arange(10.0)}, {"user.a": Watched("user.a", "v", "a")})
    names |= _names(monitor_registry(report))
    return names


def test_every_metric_a_rule_reads_is_registered(monkeypatch: pytest.MonkeyPatch) -> None:
    names = registered(monkeypatch)
    used = rule_metrics(alert_rules(check_repo(EXAMPLE).views))
    missing = sorted(
        m for m in used if m not in names and not any(m.removesuffix(s) in names for s in SUFFIXES)
    )
    assert not missing, f"rules read metrics nobody registers: {missing}"
    assert {
        "headwater_read_age_window_seconds",
        "headwater_repair_keys_total",
        "headwater_model_answers_total",
        "headwater_monitor_psi",
        "headwater_monitor_missing_rate",
        "headwater_monitor_served_min",
    } <= used


def test_the_example_repo_gets_its_rules() -> None:
    result = check_repo(EXAMPLE)
    rules = yaml.safe_load(dump_rules(result.views))
    groups = {g["name"]: g["rules"] for g in rules["groups"]}
    assert list(groups) == ["headwater-freshness", "headwater-expectations", "headwater-serving"]
    fresh = {r["labels"]["view"]: r for r in groups["headwater-freshness"]}
    assert set(fresh) == {v.name for v in result.views}
    session = fresh["user_session_realtime"]
    assert session["expr"] == (
        'max by (view, tier) (headwater_read_age_window_seconds{view="user_session_realtime",'
        ' quantile="0.99"}) > 5'
    )
    assert (session["for"], session["labels"]["tier"], session["labels"]["severity"]) == (
        "60s",
        "realtime",
        "critical",
    )
    expected = {
        (r["labels"]["feature"], r["labels"]["check"]): r["expr"]
        for r in groups["headwater-expectations"]
        if r["alert"] == "HeadwaterFeatureExpectation"
    }
    assert set(expected) == {
        ("clicks_5m", "min"),
        ("clicks_5m", "max_missing_rate"),
        ("clicks_5m", "max_drift_psi"),
        ("ctr_5m", "min"),
        ("ctr_5m", "max"),
        ("ctr_5m", "max_drift_psi"),
    }
    assert expected["clicks_5m", "max_missing_rate"] == (
        "max by (view, feature, column) (headwater_monitor_missing_rate"
        '{view="user_session_realtime", feature="clicks_5m"}) > 0.01'
    )
    assert expected["ctr_5m", "min"].endswith(") < 0")
    serving = {r["alert"]: r for r in groups["headwater-serving"]}
    assert serving["HeadwaterVersionDrift"]["expr"] == (
        'sum(rate(headwater_model_answers_total{version_drift="true"}[15m]))'
        " / sum(rate(headwater_model_answers_total[15m])) > 0.001"
    )
    assert 'kind="missing"' in serving["HeadwaterRepairMissingKeys"]["expr"]
    for group in rules["groups"]:
        for rule in group["rules"]:
            assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}
            assert {"summary", "description"} <= set(rule["annotations"])


def test_the_command_writes_the_file_and_refuses_a_broken_repo(tmp_path: Path) -> None:
    out = tmp_path / "headwater.rules.yml"
    run = CliRunner().invoke(main, ["alerts", "--features", str(EXAMPLE), "--out", str(out)])
    assert run.exit_code == 0, run.output
    n = sum(len(g["rules"]) for g in yaml.safe_load(out.read_text())["groups"])
    assert run.output == f"alerts: {n} rule(s) written to {out}\n"
    broken = tmp_path / "repo"
    broken.mkdir()
    (broken / "v.yaml").write_text("feature_view: [\n")
    run = CliRunner().invoke(main, ["alerts", "--features", str(broken)])
    assert run.exit_code != 0
    assert "has errors: run `headwater check`" in run.output
    assert "Traceback" not in run.output
    with pytest.raises(AlertsError, match="cannot write it"):
        write_rules(check_repo(EXAMPLE), tmp_path / "no" / "such" / "rules.yml")


def _promql_string(literal: str) -> str:
    """Decode a PromQL double-quoted literal (the escapes quote() emits)."""
    import json

    return str(json.loads(literal))


@settings(max_examples=60, deadline=None)
@given(st.text(max_size=40))
def test_quote_round_trips_any_label_value(value: str) -> None:
    literal = quote(value)
    assert literal.startswith('"')
    assert literal.endswith('"')
    assert '"' not in literal[1:-1].replace('\\"', "")  # every inner quote escaped
    assert "\n" not in literal
    assert _promql_string(literal) == value


@settings(max_examples=30, deadline=None)
@given(limit=st.floats(0, 1, allow_nan=False), psi=st.floats(0, 10, allow_nan=False))
def test_expectation_limits_are_written_as_declared(limit: float, psi: float) -> None:
    # A rule compares the gauge with the YAML's own figure: no rounding that moves the threshold.
    session = next(v for v in _example().views if v.name == "user_session_realtime")
    features = tuple(
        f.__class__(**{**f.__dict__, "expect": ExpectationSpec(max_missing_rate=limit, max_drift_psi=psi)})
        if f.name == "clicks_5m"
        else f
        for f in session.features
    )
    patched = session.__class__(**{**session.__dict__, "features": features})
    rules: dict[str, Any] = yaml.safe_load(dump_rules([patched]))
    exprs = [r["expr"] for r in rules["groups"][1]["rules"] if r["labels"].get("feature") == "clicks_5m"]
    values = sorted(float(e.rsplit(" ", 1)[1]) for e in exprs)
    assert values == sorted([limit, psi])
