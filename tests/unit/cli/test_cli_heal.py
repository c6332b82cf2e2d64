"""`materialize --heal` and `training-set --values`: a clear refusal before Spark starts, no traceback."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from headwater.cli.main import main
from headwater.pipelines.offline.testing import feature, view, write_plan


def test_materialize_heal_without_a_heal_view_says_how_to_declare_one(tmp_path: Path) -> None:
    write_plan(tmp_path, "offline", [view("plain_user", "user", "user_id", [feature("c", "count", "1d")])])
    result = CliRunner().invoke(main, ["materialize", "--heal", "--state-dir", str(tmp_path)])
    assert result.exit_code == 1
    assert "no view of the offline plan has late: heal" in result.output
    assert "set late: heal in a view's YAML and run `headwater apply`" in result.output
    assert "Traceback" not in result.output


def test_training_set_values_are_as_served_or_as_corrected(tmp_path: Path) -> None:
    args = ["training-set", "--labels", "bronze", "--out", str(tmp_path / "t.parquet"), "--values", "healed"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2
    assert "'healed' is not one of 'as-served', 'as-corrected'" in result.output
