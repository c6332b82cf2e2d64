"""The cost model, the under-declared check and the budget gate (including the CLI exit code)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from headwater.registry.commands import check
from headwater.registry.cost import SECONDS_PER_DAY
from headwater.registry.testing import MINIMAL_VIEW, ScratchRepo, line_of
from headwater.registry.tiers import TIERS


def test_estimate_follows_the_formula(repo: ScratchRepo) -> None:
    repo.write("v1.yaml", MINIMAL_VIEW)
    (view,) = repo.check().views
    tier = TIERS["realtime"]
    panes = 30 / tier.default_slide_s
    units = tier.view_overhead_units + (1.0 + 0.1) * (1 + tier.pane_cost * (panes - 1))
    expected = 2000 * SECONDS_PER_DAY * units * tier.cpu_us_per_event / 1e6 / 3600
    assert view.estimated_cost == pytest.approx(expected)


def test_estimate_grows_with_rate_windows_and_aggs(repo: ScratchRepo) -> None:
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
    assert repo.check().views[0].estimated_cost == pytest.approx(2 * base)


def test_under_declared_cost_is_an_error(repo: ScratchRepo) -> None:
    text = MINIMAL_VIEW.replace("compute_cost: 10", "compute_cost: 0.1")
    repo.write("v1.yaml", text)
    result = repo.check()
    (diag,) = result.diagnostics.errors
    assert diag.code == "under-declared"
    assert diag.line == line_of(text, "compute_cost")
    assert "estimate is 2.08" in diag.message
    assert "172,800,000 events/day" in (diag.expected or "")
    assert diag.hint == "declare compute_cost: 2.08 or more, or cut the rate, windows or aggregations"


def test_far_over_declared_cost_is_a_warning(repo: ScratchRepo) -> None:
    repo.write("v1.yaml", MINIMAL_VIEW.replace("compute_cost: 10", "compute_cost: 30"))
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
    assert table[2].split()[:6] == ["v1", "realtime", "team-a", "10.00", "2.08", "10.00"]
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
    view.write_text(view.read_text().replace("window: 30d", "window: 90d"))
    script = Path(sys.executable).with_name("headwater")
    proc = subprocess.run(
        [str(script), "check", str(copy)], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "view 'user_activity_offline': compute_cost 9 CPU-h/day is under-declared" in proc.stdout
    assert "tier 'offline' is over budget" in proc.stdout
    assert "user_activity_offline    offline" in proc.stdout
