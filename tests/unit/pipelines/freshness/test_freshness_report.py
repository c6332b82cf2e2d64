"""The per-view report: verdicts against the SLA, JSON, text table and the plans it reads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from headwater.pipelines.freshness.report import (
    BREACH,
    NO_DATA,
    OK,
    FreshnessTarget,
    NoPlansError,
    Report,
    plan_views,
    view_freshness,
)
from headwater.pipelines.freshness.samples import Entry
from headwater.pipelines.freshness.text import fmt_s, render_text
from headwater.registry.plans import build_plans, plan_path
from headwater.registry.plans import plan_views as plan_views_of
from headwater.registry.validate import check_repo

ROOT = Path(__file__).resolve().parents[4]
T0 = 1_800_000_000_000
SPEC = FreshnessTarget("user_session_realtime", "realtime", 5.0)


def publishing(n: int, period_ms: int, lag_ms: int, rows: int = 4) -> list[Entry]:
    """A tier publishing boundary t - lag every period, ``rows`` rows each time."""
    return [
        Entry(
            T0 + i * period_ms,
            rows,
            rows,
            T0 + i * period_ms - lag_ms,
            ((T0 + i * period_ms - lag_ms, rows),),
        )
        for i in range(n)
    ]


def test_a_view_within_its_sla_is_ok_with_exact_figures() -> None:
    f = view_freshness(SPEC, publishing(61, 1000, 1500), T0 + 60_000, 60_000)
    assert f.verdict == OK
    assert (f.lag_window.p50, f.lag_window.p99) == (1.5, 1.5)
    assert (f.lag_now.p50, f.lag_now.p99) == (1.5, 1.5)
    assert f.age_now_s == 1.5
    assert f.age_window.p50 == pytest.approx(2.0, abs=1e-6)  # ages spread over [1.5, 2.5)
    assert f.age_window.p99 == pytest.approx(2.49, abs=1e-6)
    assert f.rows_window == 240  # 60 writes after the window start, 4 rows each
    assert f.writes_window == 60
    assert f.progress_ms == T0 + 60_000 - 1500


def test_a_stopped_tier_breaches_by_its_age_now() -> None:
    f = view_freshness(SPEC, publishing(10, 1000, 1500), T0 + 60_000, 60_000)
    assert f.verdict == BREACH
    assert f.age_now_s == pytest.approx(52.5)  # last boundary T0 + 7.5 s, published at T0 + 9 s


def test_a_slow_pipeline_breaches_and_flags_its_lag() -> None:
    f = view_freshness(SPEC, publishing(61, 1000, 7000), T0 + 60_000, 60_000)
    assert f.verdict == BREACH
    assert f.lag_over_sla
    assert f.lag_window.p99 == 7.0


def test_a_view_never_written_has_no_data() -> None:
    f = view_freshness(SPEC, [], T0, 60_000)
    assert f.verdict == NO_DATA
    assert f.age_now_s is None
    assert f.lag_window.p50 is None


def test_json_and_text_carry_the_same_figures() -> None:
    ok = view_freshness(SPEC, publishing(61, 1000, 1500), T0 + 60_000, 60_000)
    bad = view_freshness(FreshnessTarget("v2", "nearline", 300.0), [], T0 + 60_000, 60_000)
    report = Report(T0 + 60_000, 60.0, [ok, bad])
    data = json.loads(json.dumps(report.to_json()))
    assert data["ok"] is True
    assert data["views"][0]["lag_window"] == {"p50": 1.5, "p99": 1.5}
    assert data["views"][0]["verdict"] == "ok"
    assert data["views"][1]["verdict"] == "no data"
    assert "age_series" not in data["views"][0]
    text = render_text(report)
    assert "user_session_realtime" in text
    assert "1.5s / 1.5s" in text
    assert text.rstrip().endswith("window 1m00s: 2 views, 1 with data, 0 in breach")


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(None, "-"), (0.25, "250ms"), (4.2, "4.2s"), (185, "3m05s"), (7800, "2h10m"), (97200, "1d03h")],
)
def test_fmt_s(seconds: float | None, text: str) -> None:
    assert fmt_s(seconds) == text


def test_plan_views_reads_every_tier_with_its_sla(tmp_path: Path) -> None:
    result = check_repo(ROOT / "features")
    for tier, plan in build_plans(result, "sha256:" + "0" * 64).items():
        plan_path(tmp_path, tier).parent.mkdir(parents=True, exist_ok=True)
        plan_path(tmp_path, tier).write_text(plan.model_dump_json())
    specs = {s.view: s for s in plan_views(tmp_path)}
    versions = {v.name: v.version for v in plan_views_of(result)}
    assert specs["user_session_realtime"] == FreshnessTarget(
        "user_session_realtime", "realtime", 5.0, versions["user_session_realtime"]
    )
    assert specs["user_search_nearline"] == FreshnessTarget(
        "user_search_nearline", "nearline", 300.0, versions["user_search_nearline"]
    )
    assert specs["item_popularity_offline"].sla_s == 86400.0
    assert len(specs) == len(result.views)


def test_plan_views_without_plans_says_what_to_run(tmp_path: Path) -> None:
    with pytest.raises(NoPlansError, match="run `headwater apply features/` first"):
        plan_views(tmp_path)


def test_lag_series_has_the_median_and_the_max_lag_of_each_write() -> None:
    e = Entry(T0 + 10_000, 4, 4, T0 + 8_000, ((T0 + 8_000, 3), (T0, 1)))  # lags 2 s (3 rows), 10 s (1 row)
    f = view_freshness(SPEC, [e], T0 + 20_000, 60_000)
    assert f.lag_series == [(T0 + 10_000, 2.0, 10.0)]
    assert (f.lag_now.p50, f.lag_now.p99) == (2.0, 10.0)
