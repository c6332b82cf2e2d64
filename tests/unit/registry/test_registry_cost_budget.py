"""The cost model, the under-declared check and the budget gate (including the CLI exit code)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from headwater.cli.registry import check
from headwater.registry import cost
from headwater.registry.calibration import load_calibration, parse_calibration
from headwater.registry.cost import SECONDS_PER_DAY, CostEstimate, estimate_view
from headwater.registry.expr import parse
from headwater.registry.testing import MINIMAL_VIEW, ScratchRepo, line_of
from headwater.registry.tiers import TIERS


def _estimate(repo: ScratchRepo) -> CostEstimate:
    (view,) = repo.check().views
    return estimate_view(view.features, 2000, TIERS["realtime"])


def test_estimate_follows_the_formula(repo: ScratchRepo) -> None:
    repo.write("v1.yaml", MINIMAL_VIEW)
    (view,) = repo.check().views
    cal = load_calibration("realtime")
    panes = 30 / TIERS["realtime"].default_slide_s
    sel = cal.share(parse("event_type = 'click'"))  # the filter's measured share (where_shares)
    us = (
        cal.scalar("event_us")
        + cal.scalar("where_us")
        + sel * (cal.per_agg("agg_us", "count") + cal.scalar("pane_us") * (panes - 1))
    )
    expected = 2000 * SECONDS_PER_DAY * us / 1e6 / 3600 + cal.scalar("fixed_cores") * 24
    # each boundary writes the entities an event touched since the last one (at most the declared ones)
    slide = TIERS["realtime"].default_slide_s
    result = repo.check()
    entities = result.budget.entities.get("user") if result.budget else None
    per_boundary = 2000 * slide if entities is None else min(entities, 2000 * slide)
    expected += per_boundary * SECONDS_PER_DAY / slide * cal.scalar("publish_us") / 1e6 / 3600
    # alone in its job: all of the job's and the group's fixed cost is the view's
    job = (
        cal.scalar("job_fixed_cores")
        + 2000 * cal.scalar("job_event_us") / 1e6
        + cal.scalar("group_fixed_cores")
    )
    expected += job * 24
    assert view.estimated_cost == pytest.approx(expected)


def test_estimate_grows_with_rate_windows_and_aggs(
    repo: ScratchRepo, monkeypatch: pytest.MonkeyPatch
) -> None:
    every_term = parse_calibration(
        "realtime",
        {
            "constants": {
                "event_us": 5,
                "agg_us": {"count": 1, "top_k": 4},
                "pane_us": 0.01,
                "fixed_cores": 0.1,
            }
        },
    )
    monkeypatch.setattr(cost, "load_calibration", lambda tier: every_term)
    repo.write("v1.yaml", MINIMAL_VIEW)
    base = repo.check().views[0].estimated_cost
    repo.write("v1.yaml", MINIMAL_VIEW.replace("window: 30s", "window: 30m"))
    assert repo.check().views[0].estimated_cost > base
    repo.write(
        "v1.yaml",
        MINIMAL_VIEW + "  - name: cats\n    agg: top_k\n    field: category\n    k: 3\n    window: 30s\n",
    )
    assert repo.check().views[0].estimated_cost > base
    sources = (
        (repo.root / "sources.yaml")
        .read_text()
        .replace("expected_rate_per_s: 2000", "expected_rate_per_s: 4000")
    )
    repo.write("sources.yaml", sources)
    repo.write("v1.yaml", MINIMAL_VIEW)
    fixed = 0.1 * 24  # the job's fixed cores do not grow with the rate
    assert repo.check().views[0].estimated_cost - fixed == pytest.approx(2 * (base - fixed))


def test_under_declared_cost_is_an_error(repo: ScratchRepo) -> None:
    repo.write("v1.yaml", MINIMAL_VIEW)
    est = _estimate(repo).cpu_hours_per_day
    declared = round(est * 0.2, 3)
    text = MINIMAL_VIEW.replace("compute_cost: 10", f"compute_cost: {declared}")
    repo.write("v1.yaml", text)
    result = repo.check()
    (diag,) = result.diagnostics.errors
    assert diag.code == "under-declared"
    assert diag.line == line_of(text, "compute_cost")
    assert f"estimate is {est:.2f}" in diag.message
    assert "172,800,000 events/day" in (diag.expected or "")
    assert "realtime.json" in (diag.expected or "")  # the constants' source is named
    assert diag.hint == f"declare compute_cost: {est:.2f} or more, or cut the rate, windows or aggregations"


def test_far_over_declared_cost_is_a_warning(repo: ScratchRepo) -> None:
    repo.write("budget.yaml", "tiers:\n  realtime: 400\n  nearline: 10\n  offline: 10\n")
    repo.write("v1.yaml", MINIMAL_VIEW.replace("compute_cost: 10", "compute_cost: 300"))
    result = repo.check()
    assert result.ok
    assert [d.code for d in result.diagnostics.warnings] == ["over-declared"]


def test_tier_over_budget_lists_largest_consumers(repo: ScratchRepo) -> None:
    repo.write("budget.yaml", "tiers:\n  realtime: 15\n  nearline: 10\n  offline: 10\n")
    repo.write("v1.yaml", MINIMAL_VIEW)
    repo.write("v2.yaml", MINIMAL_VIEW.replace("v1", "v2").replace("compute_cost: 10", "compute_cost: 9"))
    (diag,) = repo.check().diagnostics.errors
    assert diag.code == "over-budget"
    assert (diag.file, diag.line) == ("features/budget.yaml", 2)
    assert diag.message == "tier 'realtime' is over budget: 19.00 CPU-h/day > 15"
    table = (diag.detail or "").splitlines()
    assert table[0] == "largest consumers (CPU-h/day):"
    est = f"{repo.check().views[0].estimated_cost:.2f}"
    assert table[2].split()[:6] == ["v1", "realtime", "team-a", "10.00", est, "10.00"]
    assert table[3].split()[0] == "v2"
    assert "the largest is 'v1'" in (diag.hint or "")


def test_owner_over_budget(repo: ScratchRepo) -> None:
    repo.write(
        "budget.yaml", "tiers:\n  realtime: 100\n  nearline: 10\n  offline: 10\nowners:\n  team-a: 5\n"
    )
    repo.write("v1.yaml", MINIMAL_VIEW)
    (diag,) = repo.check().diagnostics.errors
    assert diag.message == "owner 'team-a' is over budget: 10.00 CPU-h/day > 5"
    assert diag.line == 6


def test_budget_overrun_fails_check_with_exit_1(repo: ScratchRepo) -> None:
    repo.write("budget.yaml", "tiers:\n  realtime: 5\n  nearline: 10\n  offline: 10\n")
    repo.write("v1.yaml", MINIMAL_VIEW)
    outcome = CliRunner().invoke(check, [str(repo.root)])
    assert outcome.exit_code == 1
    assert "tier 'realtime' is over budget: 10.00 CPU-h/day > 5" in outcome.output
    assert "FAILED" in outcome.output
    as_json = CliRunner().invoke(check, [str(repo.root), "--format", "json"])
    assert as_json.exit_code == 1
    doc = json.loads(as_json.output)
    assert doc["ok"] is False
    assert [d["code"] for d in doc["diagnostics"]] == ["over-budget"]


def test_example_pushed_over_budget_fails_the_console_script(tmp_path: Path, example: Path) -> None:
    copy = tmp_path / "features"
    shutil.copytree(example, copy)
    view = copy / "user_activity_offline.yaml"
    # a window of whole days is tiled (a day's run reads one day of events and its tiles); one of
    # 2,150 h (89.6 days) is not, so every day's run re-reads its 91 days of bronze
    view.write_text(view.read_text().replace("window: 30d", "window: 2150h"))
    sources = copy / "sources.yaml"  # and ten times the events
    sources.write_text(sources.read_text().replace("expected_rate_per_s: 2000", "expected_rate_per_s: 20000"))
    script = Path(sys.executable).with_name("headwater")
    proc = subprocess.run(
        [str(script), "check", str(copy)], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "view 'user_activity_offline': compute_cost 3 CPU-h/day is under-declared" in proc.stdout
    assert "tier 'offline' is over budget" in proc.stdout
    assert "user_activity_offline    offline" in proc.stdout
