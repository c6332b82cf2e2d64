"""The generated rules under ``promtool``: valid, and firing on series that breach them.

promtool is not a Python dependency: the tests run where it is on PATH (or $HEADWATER_PROMTOOL
names it; Debian's ``prometheus`` package has it) and are skipped elsewhere, never downloaded.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from headwater.ranking.alerts import dump_rules
from headwater.registry.validate import check_repo

EXAMPLE = Path(__file__).resolve().parents[3] / "features"
PROMTOOL = os.environ.get("HEADWATER_PROMTOOL") or shutil.which("promtool")
pytestmark = pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (set HEADWATER_PROMTOOL)")


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=120, check=False)


def test_promtool_accepts_the_example_rules(tmp_path: Path) -> None:
    rules = tmp_path / "headwater.rules.yml"
    rules.write_text(dump_rules(check_repo(EXAMPLE).views))
    run = _promtool("check", "rules", str(rules))
    assert run.returncode == 0, run.stdout + run.stderr
    assert "SUCCESS: 24 rules found" in run.stdout


def _expect(
    rules: dict[str, Any], alert: str, series: dict[str, str] | None = None, **labels: str
) -> dict[str, Any]:
    """The alert promtool must see: the rule's labels, the series' own, and the rule's annotations."""
    rule = next(
        r
        for g in rules["groups"]
        for r in g["rules"]
        if r["alert"] == alert and labels.items() <= r["labels"].items()
    )
    return {"exp_labels": {**rule["labels"], **(series or {})}, "exp_annotations": rule["annotations"]}


def test_the_rules_fire_on_breaching_series(tmp_path: Path) -> None:
    text = dump_rules(check_repo(EXAMPLE).views)
    (tmp_path / "headwater.rules.yml").write_text(text)
    rules = yaml.safe_load(text)
    session = {"view": "user_session_realtime", "feature": "clicks_5m", "column": "user.clicks_5m"}
    series = [
        # 1 answer in 500 scored by a drifted model: 0.2%, over the 0.1% line.
        {"series": 'headwater_model_answers_total{model_version="m1",version_drift="true"}',
         "values": "0+1x40"},
        {"series": 'headwater_model_answers_total{model_version="m1",version_drift="false"}',
         "values": "0+499x40"},
        {"series": 'headwater_monitor_missing_rate{view="user_session_realtime",feature="clicks_5m",'
                   'column="user.clicks_5m"}', "values": "0.05x40"},
        {"series": 'headwater_read_age_window_seconds{view="user_session_realtime",tier="realtime",'
                   'quantile="0.99"}', "values": "2x5 9x35"},
    ]  # fmt: skip
    test = {
        "rule_files": ["headwater.rules.yml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": series,
                "alert_rule_test": [
                    {"eval_time": "30m", "alertname": "HeadwaterVersionDrift",
                     "exp_alerts": [_expect(rules, "HeadwaterVersionDrift")]},
                    {"eval_time": "5m", "alertname": "HeadwaterFeatureExpectation",
                     "exp_alerts": [_expect(rules, "HeadwaterFeatureExpectation", session,
                                            feature="clicks_5m", check="max_missing_rate")]},
                    {"eval_time": "20m", "alertname": "HeadwaterFreshnessSLA",
                     "exp_alerts": [_expect(rules, "HeadwaterFreshnessSLA", view="user_session_realtime")]},
                    {"eval_time": "5m", "alertname": "HeadwaterFreshnessSLA", "exp_alerts": []},
                ],
            }
        ],
    }  # fmt: skip
    (tmp_path / "test.yml").write_text(yaml.safe_dump(test, sort_keys=False))
    run = _promtool("test", "rules", str(tmp_path / "test.yml"))
    assert run.returncode == 0, run.stdout + run.stderr
    assert "SUCCESS" in run.stdout
