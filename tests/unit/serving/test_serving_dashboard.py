"""The Grafana dashboard reads only metrics the service, the freshness collector and the monitor export."""

from __future__ import annotations

import json
import re
from pathlib import Path

from fastapi.testclient import TestClient

from headwater.ranking.monitor_metrics import METRIC_NAMES
from headwater.ranking.synthetic import small_registry
from headwater.serving.app import create_app
from headwater.serving.config import ServingConfig
from headwater.serving.recording import Recorder, RecordingConfig
from headwater.serving.runtime import LoadedModels
from headwater.serving.store import InMemoryFeatureStore

ROOT = Path(__file__).resolve().parents[3]
DASHBOARD = ROOT / "infra" / "grafana" / "headwater.json"
FRESHNESS = ROOT / "pipelines" / "freshness" / "metrics.py"
METRIC = re.compile(r"\bheadwater_[a-z_]+")
SUFFIXES = ("_bucket", "_count", "_sum", "_total", "_created")


def exported(tmp_path: Path) -> set[str]:
    """Metric family names on /metrics of a service with every optional part on, and the freshness ones."""
    registry = small_registry({"u": ["a"]}, {"i": ["x"]}, "i.x")
    recorder = Recorder(RecordingConfig(enabled=True), tmp_path / "r.jsonl")
    app = create_app(
        ServingConfig(),
        registry,
        InMemoryFeatureStore(),
        LoadedModels(None, None, None, None, "cpu"),
        recorder=recorder,
    )
    with TestClient(app) as c:
        text = c.get("/metrics").text
    names = set(re.findall(r"^# TYPE (\S+) ", text, re.MULTILINE))
    names |= set(
        re.findall(r'"(headwater_[a-z_]+)"', FRESHNESS.read_text())
    )  # read from Redis at scrape time
    names |= set(METRIC_NAMES)  # headwater monitor --metrics-file, through the textfile collector
    return names


def test_every_metric_the_dashboard_reads_is_exported(tmp_path: Path) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    exprs += [v["definition"] for v in dashboard["templating"]["list"] if "definition" in v]
    used = {m for e in exprs for m in METRIC.findall(e)}
    names = exported(tmp_path)
    missing = sorted(
        m for m in used if m not in names and not any(m.removesuffix(s) in names for s in SUFFIXES)
    )
    assert not missing, f"the dashboard reads metrics nobody exports: {missing}"
    assert {
        "headwater_impressions_total",
        "headwater_clicks_total",
        "headwater_read_age_window_seconds",
        "headwater_model_answers_total",
        "headwater_repair_keys_total",
        "headwater_monitor_psi",
        "headwater_monitor_ks",
        "headwater_monitor_missing_rate",
        "headwater_monitor_breach",
    } <= used


def test_monitoring_panels_read_version_drift_repairs_and_feature_drift() -> None:
    panels = {p["title"]: p for p in json.loads(DASHBOARD.read_text())["panels"]}
    exprs = {title: [t["expr"] for t in p.get("targets", [])] for title, p in panels.items()}
    assert exprs["Version drift share"] == [
        'sum(rate(headwater_model_answers_total{version_drift="true"}[$__rate_interval]))'
        " / sum(rate(headwater_model_answers_total[$__rate_interval]))"
    ]
    # The seed's 0.1% target is the stat's red line, as in the HeadwaterVersionDrift alert.
    steps = panels["Version drift share"]["fieldConfig"]["defaults"]["thresholds"]["steps"]
    assert steps[-1] == {"color": "red", "value": 0.001}
    assert exprs["Repair keys / s by view and kind"] == [
        "sum by (view, kind) (rate(headwater_repair_keys_total[$__rate_interval]))"
    ]
    psi = next(t for t in panels if t.startswith("Feature drift: PSI"))
    assert exprs[psi][0] == "max by (view, feature, against) (headwater_monitor_psi)"
    assert exprs["Feature missing rate"] == ["max by (view, feature) (headwater_monitor_missing_rate)"]
    assert exprs["Feature expectations breached"] == ["sum(headwater_monitor_breach)"]


def test_panels_do_not_overlap() -> None:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    cells: set[tuple[int, int]] = set()
    for p in panels:
        g = p["gridPos"]
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not cells & mine, p["title"]
        assert g["x"] + g["w"] <= 24
        cells |= mine
    assert len({p["id"] for p in panels}) == len(panels)
