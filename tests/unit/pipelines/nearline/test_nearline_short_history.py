"""`features describe` says when a backfilled nearline view's windows are not yet full."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from headwater.cli.registry import describe
from headwater.pipelines.nearline.versions import short_history

ROOT = Path(__file__).resolve().parents[4]


def _stats(root: Path, group: str, worker: int, tasks: list[dict[str, object]]) -> None:
    folder = root / group
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"stats-{worker}.json").write_text(json.dumps({"counters": {}, "tasks": tasks}))


def test_the_latest_partition_decides_and_other_views_are_not_short(tmp_path: Path) -> None:
    _stats(tmp_path, "g1", 0, [{"partition": 0, "short_history": {"v": 1_000}}, {"partition": 1}])
    _stats(tmp_path, "g1", 1, [{"partition": 2, "short_history": {"v": 5_000, "w": 7}}])
    (tmp_path / "g1" / "stats-2.json").write_text("{half a file")  # a worker rewriting it
    assert short_history(tmp_path, "v") == 5_000
    assert short_history(tmp_path, "w") == 7
    assert short_history(tmp_path, "other") is None
    assert short_history(tmp_path / "missing", "v") is None


def test_describe_names_the_time_from_which_windows_are_full(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HEADWATER_STATE_DIR", str(tmp_path))
    repo = str(ROOT / "features")
    full = CliRunner().invoke(describe, ["merchant_risk_nearline", repo])
    assert full.exit_code == 0, full.output
    assert "history: full windows" in full.output
    _stats(tmp_path / "nearline", "headwater-nearline", 0, [{"short_history": {"merchant_risk_nearline": 0}}])
    short = CliRunner().invoke(describe, ["merchant_risk_nearline", repo])
    assert "history: partial" in short.output
    assert "its windows are full from 1970-01-01T00:00:00+00:00" in short.output
