"""The cost report: `headwater costs`, `features describe` and `check --format json` show the same figures."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from headwater.cli.costs import (
    costs,
    describe_lines,
    measured_cost,
    offline_reported_cost,
    reported_cost,
)
from headwater.cli.registry import check, features
from headwater.registry.calibration import parse_calibration
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
    assert header[5] == "reported"
    assert "reported: what the running nearline workers' stats files say" in text.output


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
    assert "the calibration run's figure for this view alone" in got["how"]
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


def test_a_tiled_offline_view_measured_reads_one_day_and_its_tile_rows(example: Path) -> None:
    # user_activity_offline: windows of 7 and 30 days, slide 1 d: tiled. The calibration ran it from
    # bronze; its per-event slope is scaled to one day of events, and the tile rows of its 32 days
    # (30 d + 1 d + 1) for the declared entities are charged at tile_row_us, as the estimate does
    result = check_repo(example)
    view = next(v for v in result.views if v.name == "user_activity_offline")
    figures = {view.name: {"cpu_s_per_day": [10.0, 30.0], "events_per_day": [1e6, 3e6]}}
    windowed = parse_calibration(
        "offline", {"constants": {"reads_window": 1, "tile_row_us": 4.0}, "measured": figures}
    )
    got = measured_cost(view, 2000, windowed, entities=100_000)
    assert got is not None
    one_day = 1e-5 * 2000 * 86400
    # the report rounds to 1e-4 CPU-h; the tile rows add 12.8 s (0.0036 CPU-h)
    assert got["cpu_hours_per_day"] == pytest.approx((one_day + 100_000 * 32 * 4.0 / 1e6) / 3600, abs=1e-4)
    assert "3,200,000 tile rows x 4 us (tiled: one day read)" in got["basis"]
    # a view that is not tiled (a 1 h window) is scaled to its whole reach of events: 24 h + 10 min, 2 days
    untiled = next(v for v in result.views if v.name == "user_engagement_nearline")
    windowed_nl = parse_calibration(
        "offline",
        {"constants": {"reads_window": 1}, "measured": {untiled.name: figures[view.name]}},
    )
    got = measured_cost(untiled, 2000, windowed_nl)
    assert got is not None
    assert got["cpu_hours_per_day"] == pytest.approx(one_day * 2 / 3600)
    assert "tile rows" not in got["basis"]


def test_reported_cost_adds_each_tasks_fold_seconds_per_second(tmp_path: Path) -> None:
    # two workers of one group, one task each; a third file being rewritten (not JSON) is skipped
    group = tmp_path / "nearline-group"
    group.mkdir()
    for i, (fold, since) in enumerate([(36.0, 1_000.0), (18.0, 1_000.0)]):
        path = group / f"stats-{i}.json"
        task = {"fold_s": {"v": fold, "w": 1.0}, "fold_since": since}
        path.write_text(json.dumps({"tasks": [task]}), encoding="utf-8")
        os.utime(path, (1_360.0, 1_360.0))  # written 360 s after the tasks began
    (group / "stats-2.json").write_text("{", encoding="utf-8")
    got = reported_cost("v", tmp_path)
    assert got is not None
    # 36 s and 18 s of folds in 360 s: 0.1 + 0.05 cores = 3.6 CPU-h/day
    assert got["cpu_hours_per_day"] == pytest.approx(3.6)
    assert (got["fold_s"], got["tasks"]) == (54.0, 2)
    assert reported_cost("absent", tmp_path) is None
    assert reported_cost("v", tmp_path / "none") is None


def test_describe_shows_what_the_running_workers_report(tmp_path: Path, example: Path) -> None:
    result = check_repo(example)
    view = next(v for v in result.views if v.name == "user_engagement_nearline")
    group = tmp_path / "g"
    group.mkdir()
    path = group / "stats-0.json"
    task = {"fold_s": {view.name: 72.0}, "fold_since": 1_000.0}
    path.write_text(json.dumps({"tasks": [task]}), encoding="utf-8")
    os.utime(path, (1_720.0, 1_720.0))  # 72 s of folds in 720 s: 0.1 cores = 2.4 CPU-h/day
    lines = describe_lines(view, result, tmp_path)
    assert any("reported 2.40 CPU-h/day by 1 running task(s) (72 s in its folds" in line for line in lines)
    assert not any("running task(s)" in line for line in describe_lines(view, result, tmp_path / "none"))


def test_the_offline_job_reports_its_cpu_per_day_computed(tmp_path: Path, example: Path) -> None:
    from datetime import date

    from headwater.pipelines.offline.job import REPORTED_RUNS, DayRun, record_cpu, tree_cpu_s

    folder = tmp_path / "offline" / "reported"
    name = "user_purchase_offline"
    # a daily run (one day, 36 CPU s) and a backfill chunk (7 days, 216 CPU s)
    record_cpu(folder, DayRun(name, date(2026, 1, 1), date(2026, 1, 1), 10, 20.0, 36.0))
    record_cpu(folder, DayRun(name, date(2026, 1, 2), date(2026, 1, 8), 70, 90.0, 216.0))
    assert record_cpu(folder, DayRun(name, date(2026, 1, 9), date(2026, 1, 9), 10, 20.0, None)) is None
    got = offline_reported_cost(name, folder)
    assert got is not None
    # 252 CPU s over 8 days computed: 31.5 CPU s a day = 0.00875 CPU-h/day
    assert got["cpu_hours_per_day"] == pytest.approx(252 / 8 / 3600, abs=1e-4)
    assert (got["cpu_s"], got["days"], got["runs"]) == (252.0, 8, 2)
    assert offline_reported_cost("absent", folder) is None
    for _ in range(REPORTED_RUNS + 5):  # only the newest runs are kept
        record_cpu(folder, DayRun(name, date(2026, 2, 1), date(2026, 2, 1), 1, 1.0, 3.6))
    again = offline_reported_cost(name, folder)
    assert again is not None
    assert again["runs"] == REPORTED_RUNS
    assert again["cpu_hours_per_day"] == pytest.approx(0.001)
    result = check_repo(example)
    view = next(v for v in result.views if v.name == name)
    lines = describe_lines(view, result, tmp_path / "nearline")
    assert any(
        "reported 0.00 CPU-h/day by the offline job (108 CPU s over 30 day(s)" in line for line in lines
    )
    cpu = tree_cpu_s()
    assert cpu is not None
    assert 0 <= cpu <= (tree_cpu_s() or 0)
