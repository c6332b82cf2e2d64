"""The cost report: `headwater costs`, `features describe` and `check --format json` show the same figures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from headwater.registry.calibration import parse_calibration
from headwater.registry.commands import check, features
from headwater.registry.costs_cli import costs, measured_cost
from headwater.registry.validate import check_repo


def test_check_json_carries_the_estimate_its_basis_and_the_declared_cost(example: Path) -> None:
    outcome = CliRunner().invoke(check, [str(example), "--format", "json"])
    assert outcome.exit_code == 0, outcome.output
    doc = json.loads(outcome.output)
    for row in doc["views"]:
        cost = row["cost"]
        assert cost["estimate"]["cpu_hours_per_day"] == pytest.approx(row["estimated_cost"], abs=1e-3)
        assert cost["declared_cpu_hours_per_day"] == row["compute_cost"]
        assert cost["basis"]["rate_per_s"] in (2000, 200)
        assert f"{row['tier']}" in cost["basis"]["constants"]
        assert cost["footprint"]["online_bytes"] > 0
        assert "measured" in cost


def test_costs_lists_every_view_declared_estimated_measured(example: Path) -> None:
    result = check_repo(example)
    outcome = CliRunner().invoke(costs, [str(example), "--format", "json"])
    assert outcome.exit_code == 0, outcome.output
    views = json.loads(outcome.output)["views"]
    assert set(views) == {v.name for v in result.views}
    text = CliRunner().invoke(costs, [str(example)])
    assert text.exit_code == 0
    header = text.output.splitlines()[0].split()
    assert header[:5] == ["view", "tier", "declared", "estimated", "measured"]
    assert "no tier reports CPU per view yet" in text.output


def test_describe_shows_the_cost_basis(example: Path) -> None:
    outcome = CliRunner().invoke(features, ["describe", "user_dwell_realtime", str(example)])
    assert outcome.exit_code == 0, outcome.output
    assert "cost: declared 8, estimated" in outcome.output
    assert "constants: realtime.json" in outcome.output
    assert "online memory" in outcome.output


def test_measured_cost_scales_the_calibration_run_to_the_declared_rate(example: Path) -> None:
    result = check_repo(example)
    view = next(v for v in result.views if v.name == "user_engagement_nearline")
    cal = parse_calibration(
        "nearline",
        {
            "constants": {"fixed_cores": 0.0},
            "measured_at": "2026-12-01",
            "measured": {view.name: {"us_per_record": 50.0, "state_bytes": 10}},
        },
    )
    got = measured_cost(view, 2000, cal)
    assert got is not None
    assert got["cpu_hours_per_day"] == pytest.approx(50.0 * 2000 * 86400 / 1e6 / 3600)
    assert "no tier reports CPU per view" in got["how"]
    rt = parse_calibration(
        "realtime", {"measured": {view.name: {"cores": [0.1, 0.3], "rates": [1000, 3000]}}}
    )
    got = measured_cost(view, 2000, rt)
    assert got is not None
    assert got["cpu_hours_per_day"] == pytest.approx(0.2 * 24)
    assert measured_cost(view, 2000, parse_calibration("offline", {})) is None
    # offline: CPU seconds of a daily run at two stream sizes, a fixed part and a per-event slope
    off = parse_calibration(
        "offline", {"measured": {view.name: {"cpu_s_per_day": [10.0, 30.0], "events_per_day": [1e6, 3e6]}}}
    )
    got = measured_cost(view, 2000, off)
    assert got is not None
    assert got["cpu_hours_per_day"] == pytest.approx((0.0 + 1e-5 * 2000 * 86400) / 3600)
