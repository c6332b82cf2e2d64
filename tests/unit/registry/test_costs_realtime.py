"""``headwater costs`` and ``features describe``: the realtime job's reported per-view CPU (issue 17).

The realtime operator subtasks write ``<state>/realtime/reported/stats-<source>-<group>-<subtask>.json``
in the nearline workers' format (``ViewCpuStats``), plus the ``events`` each read; one reader serves
both tiers (:func:`headwater.cli.costs.reported_cost`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from headwater.cli.costs import (
    REALTIME_FRESH_S,
    cost_report,
    describe_lines,
    reported_cost,
    tier_reported,
)
from headwater.registry.validate import check_repo


def write(path: Path, fold: dict[str, float], since: float, events: int, written: float) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    task = {"fold_s": fold, "fold_since": since, "events": events, "hits": dict.fromkeys(fold, events)}
    path.write_text(json.dumps({"source": "events", "tasks": [task]}), encoding="utf-8")
    os.utime(path, (written, written))


def test_subtasks_add_up_and_give_us_per_event(tmp_path: Path) -> None:
    reported = tmp_path / "realtime" / "reported"
    # two subtasks of one group, 600 s since they began: 30 s and 6 s of the view's work
    write(reported / "stats-events-1-0.json", {"v": 30.0, "w": 60.0}, 10_000.0, 1_000_000, 10_600.0)
    write(reported / "stats-events-1-1.json", {"v": 6.0, "w": 12.0}, 10_000.0, 200_000, 10_600.0)
    got = reported_cost("v", tmp_path / "realtime")
    assert got is not None
    # 0.05 + 0.01 cores = 1.44 CPU-h/day; 36 s over 1.2M events = 30 us an event
    assert got["cpu_hours_per_day"] == pytest.approx(1.44)
    assert (got["fold_s"], got["tasks"], got["events"], got["us_per_event"]) == (36.0, 2, 1_200_000, 30.0)


def test_a_previous_runs_files_are_not_added(tmp_path: Path) -> None:
    reported = tmp_path / "realtime" / "reported"
    write(reported / "stats-events-1-0.json", {"v": 30.0}, 10_000.0, 1_000, 10_600.0)
    # a subtask of an earlier run with parallelism 3, last written an hour before
    write(reported / "stats-events-1-2.json", {"v": 90.0}, 5_000.0, 1_000, 6_800.0)
    assert reported_cost("v", tmp_path / "realtime")["tasks"] == 2  # type: ignore[index]
    got = reported_cost("v", tmp_path / "realtime", fresh_s=REALTIME_FRESH_S)
    assert got is not None
    assert (got["tasks"], got["fold_s"], got["cpu_hours_per_day"]) == (1, 30.0, pytest.approx(1.2))


def test_costs_and_describe_show_the_realtime_jobs_report(tmp_path: Path, example: Path) -> None:
    result = check_repo(example)
    view = next(v for v in result.views if v.name == "user_session_realtime")
    other = next(v for v in result.views if v.name == "user_dwell_realtime")
    nearline_root = tmp_path / "nearline"  # what `headwater costs` passes: the realtime files are beside it
    assert tier_reported(view, nearline_root) is None  # nothing written yet
    fold = {view.name: 72.0, other.name: 36.0}
    write(tmp_path / "realtime" / "reported" / "stats-events-1-0.json", fold, 1_000.0, 720_000, 1_720.0)
    got = cost_report(view, result, nearline_root)["reported"]
    # 72 s in 720 s: 0.1 cores = 2.4 CPU-h/day; 72 s over 720k events: 100 us an event
    assert (got["cpu_hours_per_day"], got["us_per_event"], got["tasks"]) == (2.4, 100.0, 1)
    assert "ViewOperator" in got["how"]
    # 100 us an event at the source's declared rate
    rate = result.sources[view.source].spec.expected_rate_per_s
    assert got["at_declared_rate_cpu_hours_per_day"] == pytest.approx(100e-6 * rate * 24)
    lines = describe_lines(view, result, nearline_root)
    want = (
        "reported 2.40 CPU-h/day by 1 operator subtask(s) (72 s in its folds and fires, 100.0 us/event: "
        f"{100e-6 * rate * 24:.2f} CPU-h/day at {rate:g} events/s;"
    )
    assert any(want in line for line in lines), lines
    assert cost_report(other, result, nearline_root)["reported"]["cpu_hours_per_day"] == 1.2
    # the nearline tier still reads only its own folder
    nearline = next(v for v in result.views if v.tier == "nearline")
    assert tier_reported(nearline, nearline_root) is None


def test_check_json_carries_what_the_running_tiers_report(
    tmp_path: Path, example: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from click.testing import CliRunner

    from headwater.cli.registry import check

    monkeypatch.setenv("HEADWATER_STATE_DIR", str(tmp_path))
    now = 20_000.0
    write(tmp_path / "realtime" / "reported" / "stats-events-1-0.json", {"user_session_realtime": 60.0},
          now - 600, 100_000, now)  # fmt: skip
    write(
        tmp_path / "nearline" / "w0" / "stats-0.json", {"user_engagement_nearline": 12.0}, now - 600, 0, now
    )
    outcome = CliRunner().invoke(check, [str(example), "--format", "json"])
    assert outcome.exit_code == 0, outcome.output
    cost = {row["name"]: row["cost"]["reported"] for row in json.loads(outcome.output)["views"]}
    # 60 s of 600 = 0.1 cores = 2.4 CPU-h/day, 600 us an event; 12 s of 600 = 0.48 CPU-h/day
    assert cost["user_session_realtime"]["cpu_hours_per_day"] == pytest.approx(2.4)
    assert cost["user_session_realtime"]["us_per_event"] == pytest.approx(600.0)
    assert cost["user_engagement_nearline"]["cpu_hours_per_day"] == pytest.approx(0.48)
    assert cost["user_dwell_realtime"] is None  # no subtask reports it
