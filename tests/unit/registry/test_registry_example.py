"""The example repo in features/ passes check and covers the three tiers."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from headwater.cli.registry import check, features
from headwater.registry.validate import check_repo


def test_example_repo_passes_check(example: Path) -> None:
    result = check_repo(example)
    assert [d.format() for d in result.diagnostics.items] == []
    tiers = sorted({v.tier for v in result.views})
    assert tiers == ["nearline", "offline", "realtime"]
    assert len(result.views) >= 10
    aggs = {f.agg for v in result.views for f in v.features}
    assert aggs == {"count", "sum", "avg", "max", "last", "distinct_count", "top_k", "ratio"}


def test_check_cli_on_example_exits_0(example: Path) -> None:
    outcome = CliRunner().invoke(check, [str(example)])
    assert outcome.exit_code == 0, outcome.output
    assert "OK: 16 view file(s), 16 view(s) checked; 0 error(s), 0 warning(s)" in outcome.output


def test_features_list_and_describe(example: Path) -> None:
    listed = CliRunner().invoke(features, ["list", str(example)])
    assert listed.exit_code == 0, listed.output
    rows = listed.output.splitlines()
    assert rows[0].split()[0] == "view"
    assert any(r.split()[:3] == ["user_session_realtime", "realtime", "5s"] for r in rows)
    described = CliRunner().invoke(features, ["describe", "user_session_realtime", str(example)])
    assert described.exit_code == 0, described.output
    assert "- ctr_5m: ratio over 5m (slide 1s) -> float64" in described.output
    assert "sql   `event_type` = 'click'" in described.output
    missing = CliRunner().invoke(features, ["describe", "nope", str(example)])
    assert missing.exit_code == 1
    assert "no feature view 'nope'" in missing.output
