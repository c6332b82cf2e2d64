"""Without Redis: the collector says so in a metric, the command exits 2 naming the store."""

from __future__ import annotations

from pathlib import Path

import redis
from click.testing import CliRunner
from prometheus_client import CollectorRegistry

from headwater.cli.main import main
from headwater.pipelines.freshness.metrics import FreshnessCollector
from headwater.pipelines.freshness.report import FreshnessTarget
from headwater.registry.plans import build_plans, plan_path
from headwater.registry.validate import check_repo

ROOT = Path(__file__).resolve().parents[4]
NOWHERE = "redis://127.0.0.1:1/0"  # nothing listens on port 1


def test_collector_reports_scrape_failure_as_a_metric() -> None:
    client = redis.Redis.from_url(NOWHERE, socket_connect_timeout=0.5)
    registry = CollectorRegistry()
    registry.register(FreshnessCollector(client, [FreshnessTarget("v", "realtime", 5.0)]))
    assert registry.get_sample_value("headwater_freshness_scrape_ok") == 0.0
    assert registry.get_sample_value("headwater_read_age_seconds", {"view": "v", "tier": "realtime"}) is None


def test_command_exits_2_when_the_store_is_unreachable(tmp_path: Path) -> None:
    for tier, plan in build_plans(check_repo(ROOT / "features"), "sha256:" + "0" * 64).items():
        plan_path(tmp_path, tier).parent.mkdir(parents=True, exist_ok=True)
        plan_path(tmp_path, tier).write_text(plan.model_dump_json())
    result = CliRunner().invoke(main, ["freshness", "--state-dir", str(tmp_path), "--redis-url", NOWHERE])
    assert result.exit_code == 2
    assert "127.0.0.1:1" in result.output
    assert "Is Redis running?" in result.output


def test_bad_window_exits_2_with_the_expected_forms(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["freshness", "--window", "soon", "--state-dir", str(tmp_path)])
    assert result.exit_code == 2
    assert "--window 'soon'" in result.output
    assert "30s" in result.output
