"""``headwater monitor`` on small Parquet files: a planted drift and a planted missing-rate breach."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from headwater.cli.main import main
from headwater.ranking.feature_stats import EPSILON
from headwater.registry.testing import MINIMAL_VIEW, ScratchRepo

EXAMPLE = Path(__file__).resolve().parents[3] / "features"
DAY = datetime(2026, 12, 4, tzinfo=UTC)
DAY_MS = 86_400_000
VIEW = MINIMAL_VIEW.replace(
    "    window: 30s", "    window: 30s\n    expect: {min: 0, max_missing_rate: 0.1}"
) + (
    "  - name: views_30s\n"
    "    agg: count\n"
    "    where: \"event_type = 'impression'\"\n"
    "    window: 30s\n"
    "    expect: {min: 0, max_drift_psi: 0.2}\n"
)
# Uniform over 0..9: ten distinct values, so PSI has one bin per value and one for anything else.
UNIFORM = np.tile(np.arange(10, dtype=np.float64), 50)
# views_30s shifted by 5 on the monitored day: 5..9 keep a tenth each, half the values are new.
SHIFTED_PSI = 5 * (EPSILON - 0.1) * math.log(EPSILON / 0.1) + (0.5 - EPSILON) * math.log(0.5 / EPSILON)


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    repo = ScratchRepo(tmp_path / "features", template=EXAMPLE)
    repo.write("v1.yaml", VIEW)
    assert repo.check().ok
    base = tmp_path / "training.parquet"
    pq.write_table(pa.table({"user.clicks_30s": UNIFORM, "user.views_30s": UNIFORM, "label": UNIFORM}), base)
    start = int(DAY.timestamp() * 1000)
    clicks_today = UNIFORM.copy()
    clicks_today[:100] = np.nan  # ten whole cycles: 20% missing, the present values as uniform as before
    served = pa.table(
        {
            "at_ms": np.concatenate([np.full(500, start - DAY_MS + 1000), np.full(500, start + 1000)]),
            "user.clicks_30s": np.concatenate([UNIFORM, clicks_today]),
            "user.views_30s": np.concatenate([UNIFORM, UNIFORM + 5]),
        }
    )
    path = tmp_path / "served.parquet"
    pq.write_table(served, path)
    return {"features": repo.root, "baseline": base, "served": path}


def _run(files: dict[str, Path], *extra: str) -> tuple[int, str]:
    args = ["monitor", "--features", str(files["features"]), "--served", str(files["served"])]
    result = CliRunner().invoke(main, [*args, *extra])
    return result.exit_code, result.output


def test_breaches_are_named_one_line_each(files: dict[str, Path]) -> None:
    code, out = _run(files, "--baseline", str(files["baseline"]))
    assert code == 1, out
    lines = out.splitlines()
    breaches = [line for line in lines if line.startswith("BREACH")]
    assert breaches == [
        "BREACH v1.clicks_30s (user.clicks_30s): missing rate 0.200 (100 of 500) > max_missing_rate 0.1"
        " [features/v1.yaml:10]",
        f"BREACH v1.views_30s (user.views_30s): PSI {SHIFTED_PSI:.3f} against the training set"
        " > max_drift_psi 0.2 [features/v1.yaml:15]",
        f"BREACH v1.views_30s (user.views_30s): PSI {SHIFTED_PSI:.3f} against the previous day"
        " > max_drift_psi 0.2 [features/v1.yaml:15]",
    ]
    assert lines[-1] == (
        "monitor 2026-12-04: 2 feature column(s), up to 500 served value(s) each, 2 with expectations:"
        f" 3 BREACH(ES); largest PSI vs the training set: user.views_30s {SHIFTED_PSI:.3f}"
    )


def test_json_report_holds_the_figures(files: dict[str, Path]) -> None:
    code, out = _run(files, "--baseline", str(files["baseline"]), "--format", "json")
    assert code == 1
    doc = json.loads(out)
    assert (doc["day"], doc["previous_day"], doc["ok"], doc["expectations"]) == (
        "2026-12-04",
        "2026-12-03",
        False,
        2,
    )
    got = [(b["column"], b["check"], b["against"], round(b["value"], 6), b["limit"]) for b in doc["breaches"]]
    assert got == [
        ("user.clicks_30s", "max_missing_rate", "served", 0.2, 0.1),
        ("user.views_30s", "max_drift_psi", "training set", round(SHIFTED_PSI, 6), 0.2),
        ("user.views_30s", "max_drift_psi", "previous day", round(SHIFTED_PSI, 6), 0.2),
    ]
    columns = {c["column"]: c for c in doc["columns"]}
    clicks = columns["user.clicks_30s"]
    assert (clicks["served"]["count"], clicks["served"]["missing"]) == (500, 100)
    assert clicks["drift_vs_training"]["psi"] == pytest.approx(
        0.0, abs=1e-12
    )  # the present values did not move
    views = columns["user.views_30s"]
    assert views["served"]["mean"] == 9.5
    assert views["drift_vs_training"]["ks"] == pytest.approx(0.5)
    assert views["training_set"]["mean"] == 4.5
    assert views["previous_day"]["mean"] == 4.5
    assert "label" not in columns


def test_a_clean_day_exits_0(files: dict[str, Path]) -> None:
    code, out = _run(files, "--baseline", str(files["baseline"]), "--day", "2026-12-03")
    assert code == 0, out
    assert "BREACH" not in out
    assert out.splitlines()[-1].startswith(
        "monitor 2026-12-03: 2 feature column(s), up to 500 served value(s) each,"
    )
    assert "note: nothing served on 2026-12-02: no drift against it" in out


def test_without_baseline_only_the_previous_day(files: dict[str, Path]) -> None:
    code, out = _run(files)
    assert code == 1
    assert "note: no training set given (--baseline): drift against the previous day only" in out
    assert sum(line.startswith("BREACH") and "previous day" in line for line in out.splitlines()) == 1
    assert "against the training set" not in out


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (("--baseline", "nowhere.parquet"), "--baseline nowhere.parquet: no such file"),
        (("--day", "2026-11-01"), "nothing was served on 2026-11-01 (the last day served is 2026-12-04)"),
    ],
)
def test_clear_errors_exit_2(files: dict[str, Path], extra: tuple[str, ...], words: str) -> None:
    code, out = _run(files, *extra)
    assert code == 2, out
    assert words in out
    assert "Traceback" not in out


def test_served_file_errors(files: dict[str, Path], tmp_path: Path) -> None:
    bad = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"user.clicks_30s": [1.0]}), bad)
    files["served"] = bad
    code, out = _run(files)
    assert (code, "no 'at_ms' column" in out) == (2, True), out
    text = tmp_path / "text.parquet"
    pq.write_table(pa.table({"at_ms": [1], "user.clicks_30s": ["x"]}), text)
    files["served"] = text
    code, out = _run(files)
    assert (code, "column 'user.clicks_30s' is string, not numbers" in out) == (2, True), out
    broken = tmp_path / "broken.parquet"
    broken.write_text("not parquet", encoding="utf-8")
    files["served"] = broken
    code, out = _run(files)
    assert (code, "not a readable Parquet file" in out) == (2, True), out


def test_a_broken_feature_repo_stops_first(files: dict[str, Path]) -> None:
    (files["features"] / "v1.yaml").write_text(VIEW.replace("max_missing_rate: 0.1", "max_missing_rate: 2"))
    code, out = _run(files)
    assert code == 2
    assert "has errors: run `headwater check` and fix them first" in out


def test_metrics_file_holds_the_breaches_of_the_run(files: dict[str, Path], tmp_path: Path) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    out = tmp_path / "textfile" / "headwater_monitor.prom"
    out.parent.mkdir()
    code, _ = _run(files, "--metrics-file", str(out))
    assert code == 1  # the breach still decides the exit status; the file is written first
    breach = {
        (s.labels["feature"], s.labels["check"]): s.value
        for f in text_string_to_metric_families(out.read_text())
        for s in f.samples
        if s.name == "headwater_monitor_breach"
    }
    assert breach == {
        ("clicks_30s", "min"): 0.0,
        ("clicks_30s", "max_missing_rate"): 1.0,
        ("views_30s", "min"): 0.0,
        ("views_30s", "max_drift_psi"): 1.0,
    }
    code, text = _run(files, "--metrics-file", str(tmp_path / "missing" / "m.prom"))
    assert code == 2
    assert "no folder" in text
