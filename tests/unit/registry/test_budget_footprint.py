"""State and online-memory budgets: optional budget.yaml lines, checked against each view's estimate."""

from __future__ import annotations

import pytest

from headwater.registry.budget import GIB, view_footprint
from headwater.registry.testing import MINIMAL_VIEW, ScratchRepo, line_of

BUDGET = "tiers:\n  realtime: 100\n  nearline: 100\n  offline: 100\n"


def test_budget_without_state_lines_checks_no_footprint(repo: ScratchRepo) -> None:
    repo.write("budget.yaml", BUDGET)
    repo.write("v1.yaml", MINIMAL_VIEW)
    assert repo.check().ok


def test_a_view_over_the_state_budget_is_an_error_at_the_view(repo: ScratchRepo) -> None:
    repo.write("budget.yaml", BUDGET + "state:\n  realtime: 0.000001\nentities:\n  user: 1000000\n")
    repo.write("v1.yaml", MINIMAL_VIEW)
    result = repo.check()
    (diag,) = result.diagnostics.errors
    assert diag.code == "over-state"
    assert diag.file == "features/v1.yaml"
    assert diag.line == line_of(MINIMAL_VIEW, "feature_view")
    assert diag.view == "v1"
    assert "over the realtime budget of 1e-06 GiB" in diag.message
    assert "entities x" in (diag.found or "")
    assert "raise state.realtime in budget.yaml" in (diag.hint or "")
    fp = view_footprint(result.views[0], result)
    assert fp is not None
    assert fp.entities_declared


def test_views_together_over_the_online_budget_is_an_error_at_the_line(repo: ScratchRepo) -> None:
    repo.write("v1.yaml", MINIMAL_VIEW)
    repo.write("v2.yaml", MINIMAL_VIEW.replace("v1", "v2"))
    repo.write("budget.yaml", BUDGET)
    result = repo.check()
    one = view_footprint(result.views[0], result)
    assert one is not None
    limit = 1.5 * one.online_bytes / GIB  # each view fits, both do not
    text = BUDGET + f"online_memory:\n  realtime: {limit:.12f}\n"
    repo.write("budget.yaml", text)
    (diag,) = repo.check().diagnostics.errors
    assert diag.code == "over-online-memory"
    assert (diag.file, diag.line) == ("features/budget.yaml", line_of(text, "realtime", 2))
    assert "tier 'realtime' is over its online memory budget" in diag.message
    assert "the largest is 'v" in (diag.hint or "")


def test_undeclared_entities_bound_the_estimate_by_events(repo: ScratchRepo) -> None:
    repo.write("budget.yaml", BUDGET)
    repo.write("v1.yaml", MINIMAL_VIEW)
    result = repo.check()
    fp = view_footprint(result.views[0], result)
    assert fp is not None
    assert not fp.entities_declared
    assert fp.entities == pytest.approx(2000 * 30)  # every event of the 30 s window a new key


def test_a_negative_budget_line_is_rejected(repo: ScratchRepo) -> None:
    repo.write("budget.yaml", BUDGET + "state:\n  realtime: -1\n")
    repo.write("v1.yaml", MINIMAL_VIEW)
    result = repo.check()
    assert not result.ok
    assert any(d.file == "features/budget.yaml" for d in result.diagnostics.errors)
