"""`headwater freshness` and the Prometheus collector on real Redis, views from applied plans."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import redis
from click.testing import CliRunner
from prometheus_client import CollectorRegistry, generate_latest

from headwater.cli.main import main
from headwater.pipelines.freshness.metrics import FreshnessCollector
from headwater.pipelines.freshness.report import plan_views
from headwater.pipelines.store import OnlineStore, ViewLayout, epoch_ms

REALTIME = ViewLayout(view="user_session_realtime", entity="user", features=("a",))  # SLA 5 s
NEARLINE = ViewLayout(view="user_search_nearline", entity="user", features=("a",))  # SLA 5 min


def publish(
    store: OnlineStore, layout: ViewLayout, lags_s: list[float], write_ms: int, first: int = 0
) -> None:
    n = len(lags_s)
    times = np.array([write_ms - int(lag * 1000) for lag in lags_s], dtype=np.int64)
    store.write_batch(
        layout, [f"u{i}" for i in range(first, first + n)], np.zeros((n, 1)), times, write_time_ms=write_ms
    )


def run(state_dir: Path, client: redis.Redis, namespace: str, *args: str) -> tuple[int, str]:
    url = "redis://{host}:{port}/{db}".format(**client.connection_pool.connection_kwargs)
    cmd = ["freshness", "--state-dir", str(state_dir), "--redis-url", url, "--namespace", namespace, *args]
    result = CliRunner().invoke(main, cmd)
    return result.exit_code, result.output


def test_json_reports_every_plan_view_and_exits_0_when_within_sla(
    state_dir: Path, store: OnlineStore, client: redis.Redis, namespace: str
) -> None:
    now = epoch_ms()
    publish(store, REALTIME, [1.0, 2.0, 2.0, 3.0], now - 1000)
    publish(store, NEARLINE, [60.0, 90.0], now - 30_000)
    code, out = run(state_dir, client, namespace, "--format", "json", "--window", "5m")
    assert code == 0, out
    data = json.loads(out)
    views = {v["view"]: v for v in data["views"]}
    assert set(views) == {s.view for s in plan_views(state_dir)}
    rt = views["user_session_realtime"]
    assert (rt["tier"], rt["sla_s"], rt["verdict"]) == ("realtime", 5.0, "ok")
    assert rt["lag_window"] == {"p50": 2.0, "p99": 3.0}
    assert rt["rows_window"] == 4
    assert views["user_search_nearline"]["lag_window"] == {"p50": 60.0, "p99": 90.0}
    assert views["item_popularity_offline"]["verdict"] == "no data"
    assert data["ok"] is True
    assert data["window_s"] == 300.0


def test_text_table_and_exit_1_on_breach(
    state_dir: Path, store: OnlineStore, client: redis.Redis, namespace: str
) -> None:
    publish(store, REALTIME, [1.0], epoch_ms() - 20_000)  # published 20 s ago: age > 5 s
    code, out = run(state_dir, client, namespace)
    assert code == 1
    line = next(x for x in out.splitlines() if "user_session_realtime" in x)
    assert "BREACH" in line
    assert out.rstrip().endswith("1 in breach: user_session_realtime")


def test_html_is_written_to_out(
    state_dir: Path, store: OnlineStore, client: redis.Redis, namespace: str, tmp_path: Path
) -> None:
    publish(store, REALTIME, [1.0], epoch_ms() - 500)
    out = tmp_path / "fresh.html"
    code, _ = run(state_dir, client, namespace, "--format", "html", "--out", str(out))
    assert code == 0
    page = out.read_text()
    assert page.count('<figure class="view"') == len(plan_views(state_dir))


def test_no_plans_is_a_clear_error_with_exit_2(tmp_path: Path, client: redis.Redis, namespace: str) -> None:
    code, out = run(tmp_path, client, namespace)
    assert code == 2
    assert "run `headwater apply features/` first" in out


def test_collector_histogram_is_cumulative_across_scrapes(
    state_dir: Path, store: OnlineStore, client: redis.Redis, namespace: str
) -> None:
    now = epoch_ms()
    publish(store, REALTIME, [0.2, 3.0, 3.0], now - 2000)
    registry = CollectorRegistry()
    registry.register(FreshnessCollector.for_store(store, state_dir, window_s=60))
    labels = {"view": "user_session_realtime", "tier": "realtime"}

    def value(name: str, **extra: str) -> float | None:
        return registry.get_sample_value(name, {**labels, **extra})

    assert value("headwater_pipeline_lag_seconds_count") == 3
    assert value("headwater_pipeline_lag_seconds_bucket", le="0.25") == 1
    assert value("headwater_pipeline_lag_seconds_bucket", le="5.0") == 3
    assert value("headwater_pipeline_lag_seconds_sum") == pytest.approx(6.2)
    assert value("headwater_freshness_sla_seconds") == 5.0
    assert value("headwater_pipeline_lag_window_seconds", quantile="0.99") == 3.0
    publish(store, REALTIME, [10.0], now - 1000, first=100)
    assert value("headwater_pipeline_lag_seconds_count") == 4
    assert value("headwater_pipeline_lag_seconds_bucket", le="5.0") == 3
    age = value("headwater_read_age_seconds")
    assert age is not None
    assert 1.8 <= age < 60  # progress = boundary now - 2.2 s, scraped a moment later
    assert registry.get_sample_value("headwater_freshness_scrape_ok") == 1.0
    assert b'headwater_read_age_window_seconds{quantile="0.99",tier="realtime"' in generate_latest(registry)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_serve_metrics_exposes_the_collector(
    state_dir: Path, store: OnlineStore, client: redis.Redis, namespace: str
) -> None:
    publish(store, REALTIME, [1.0, 1.0], epoch_ms() - 100)
    url = "redis://{host}:{port}/{db}".format(**client.connection_pool.connection_kwargs)
    port = _free_port()
    cli = [str(Path(sys.executable).with_name("headwater"))]
    proc = subprocess.Popen(
        [
            *cli,
            "freshness",
            "--state-dir",
            str(state_dir),
            "--redis-url",
            url,
            "--namespace",
            namespace,
            "--serve-metrics",
            str(port),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        body = b""
        for _ in range(100):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as resp:
                    body = resp.read()
                break
            except OSError:
                time.sleep(0.1)
        assert (
            b'headwater_pipeline_lag_seconds_count{tier="realtime",view="user_session_realtime"} 2.0' in body
        )
    finally:
        proc.terminate()
        proc.wait(timeout=10)
