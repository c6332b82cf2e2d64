"""plan: the diff against the last apply; the tier plans apply writes (Feast skipped here)."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from headwater.cli.registry import plan
from headwater.registry.apply import apply_repo
from headwater.registry.expr import from_json
from headwater.registry.plans import SCHEMA_VERSION, read_plan
from headwater.registry.testing import MINIMAL_VIEW, ScratchRepo


def _apply(repo: ScratchRepo, state: Path) -> str:
    result = repo.check()
    assert result.ok, [d.format() for d in result.diagnostics.items]
    return apply_repo(result, state, "127.0.0.1:9092").registry_hash


def test_plan_before_any_apply_adds_everything(repo: ScratchRepo, tmp_path: Path) -> None:
    repo.write("v1.yaml", MINIMAL_VIEW)
    out = CliRunner().invoke(plan, [str(repo.root), "--state-dir", str(tmp_path / "state")])
    assert out.exit_code == 0, out.output
    assert "registry (nothing applied yet)" in out.output
    assert "+ v1 [realtime] cost 0.00 -> 10.00 (+10.00 CPU-h/day), sla 10s" in out.output
    assert "1 to add, 0 to change (state restarts), 0 metadata only, 0 to remove" in out.output
    assert "version new: its state starts anew; the other views keep theirs" in out.output
    assert "backfill: replayed by the realtime job itself when `run realtime` restarts" in out.output
    assert "longest window (30s) plus the lateness margins" in out.output


def test_plan_shows_the_diff_after_an_edit(repo: ScratchRepo, tmp_path: Path) -> None:
    state = tmp_path / "state"
    repo.write("v1.yaml", MINIMAL_VIEW)
    repo.write("v2.yaml", MINIMAL_VIEW.replace("v1", "v2"))
    applied_hash = _apply(repo, state)
    assert "No changes" in CliRunner().invoke(plan, [str(repo.root), "--state-dir", str(state)]).output
    edited = (
        MINIMAL_VIEW.replace("compute_cost: 10", "compute_cost: 12")
        .replace("freshness_sla: PT10S", "freshness_sla: PT20S")
        .replace("window: 30s", "window: 1m")
        + "  - name: views_1m\n    agg: count\n    where: \"event_type = 'impression'\"\n    window: 1m\n"
    )
    repo.write("v1.yaml", edited)
    (repo.root / "v2.yaml").unlink()
    repo.write("v3.yaml", MINIMAL_VIEW.replace("v1", "v3"))
    out = CliRunner().invoke(plan, [str(repo.root), "--state-dir", str(state), "--format", "json"])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.output)
    assert doc["applied_hash"] == applied_hash != doc["registry_hash"]
    changes = {c["name"]: c for c in doc["changes"]}
    assert {n: c["kind"] for n, c in changes.items()} == {"v1": "changed", "v2": "removed", "v3": "added"}
    v1 = changes["v1"]
    assert v1["cost_delta"] == 2.0
    assert (v1["sla_before"], v1["sla_after"]) == (10.0, 20.0)
    assert "compute_cost: 10 -> 12" in v1["changes"]
    assert "freshness_sla: PT10S -> PT20S" in v1["changes"]
    assert "+ feature views_1m" in v1["changes"]
    assert any(c.startswith("~ feature clicks_30s: window 30s -> 1m") for c in v1["changes"])
    assert changes["v2"]["cost_delta"] == -10.0
    assert changes["v2"]["backfill"] is None  # removed: nothing to fill
    assert "(1m)" in v1["backfill"]  # changed: backfilled over its new longest window
    text = CliRunner().invoke(plan, [str(repo.root), "--state-dir", str(state)]).output
    assert "! v1 [realtime] cost 10.00 -> 12.00 (+2.00 CPU-h/day), sla 10s -> 20s" in text
    assert f"{v1['version_before']} -> {v1['version_after']}, restarts" in text
    assert "1 to add, 1 to change (state restarts), 0 metadata only, 1 to remove; charged cost +2.00" in text


def test_metadata_edits_keep_the_view_version(repo: ScratchRepo, tmp_path: Path) -> None:
    state = tmp_path / "state"
    repo.write("v1.yaml", MINIMAL_VIEW)
    repo.write("v2.yaml", MINIMAL_VIEW.replace("v1", "v2"))
    _apply(repo, state)
    before = {v.name: v.version for v in read_plan(state, "realtime").views}
    repo.write(
        "v1.yaml",
        MINIMAL_VIEW.replace("compute_cost: 10", "compute_cost: 11")
        .replace("a small test view", "a small test view, described again")
        .replace("owner: team-a", "owner: team-b")
        .replace("freshness_sla: PT10S", "freshness_sla: PT15S"),
    )
    repo.write("v2.yaml", MINIMAL_VIEW.replace("v1", "v2").replace("window: 30s", "window: 1m"))
    out = CliRunner().invoke(plan, [str(repo.root), "--state-dir", str(state), "--format", "json"])
    kinds = {c["name"]: c["kind"] for c in json.loads(out.output)["changes"]}
    assert kinds == {"v1": "metadata", "v2": "changed"}
    _apply(repo, state)
    after = {v.name: v.version for v in read_plan(state, "realtime").views}
    assert after["v1"] == before["v1"]
    assert after["v2"] != before["v2"]
    text = CliRunner().invoke(plan, [str(repo.root), "--state-dir", str(state)]).output
    assert "No changes" in text


def test_plan_refuses_a_repo_with_errors(repo: ScratchRepo, tmp_path: Path) -> None:
    repo.write("v1.yaml", MINIMAL_VIEW.replace("entity: user", "entity: usr"))
    out = CliRunner().invoke(plan, [str(repo.root), "--state-dir", str(tmp_path / "s")])
    assert out.exit_code == 1
    assert "unknown entity 'usr'" in out.output


def test_apply_writes_versioned_tier_plans(repo: ScratchRepo, tmp_path: Path) -> None:
    repo.write("v1.yaml", MINIMAL_VIEW)
    state = tmp_path / "state"
    reg_hash = _apply(repo, state)
    realtime = read_plan(state, "realtime")
    assert (realtime.schema_version, realtime.registry_hash) == (SCHEMA_VERSION, reg_hash)
    (view,) = realtime.views
    feature = view.features[0]
    assert (feature.agg, feature.window_s, feature.slide_s, feature.dtype) == ("count", 30.0, 1.0, "int64")
    assert feature.where is not None
    assert feature.where.sql == {"flink": "`event_type` = 'click'", "spark": "`event_type` = 'click'"}
    assert from_json(feature.where.ast).field == "event_type"  # type: ignore[union-attr]
    assert read_plan(state, "nearline").views == []
    assert read_plan(state, "offline").registry_hash == reg_hash


def test_a_new_schema_version_is_planned_and_keeps_every_view(repo: ScratchRepo, tmp_path: Path) -> None:
    state = tmp_path / "state"
    repo.write("v1.yaml", MINIMAL_VIEW)
    _apply(repo, state)
    before = read_plan(state, "realtime").views[0].version
    schema = repo.root / "schemas" / "behavior_event.avsc"
    doc = json.loads(schema.read_text())
    doc["fields"].append({"name": "campaign", "type": ["null", "string"], "default": None})
    (repo.root / "schemas" / "behavior_event.v2.avsc").write_text(schema.read_text())
    schema.write_text(json.dumps(doc))
    sources = (repo.root / "sources.yaml").read_text()
    old = "previous_schemas: [schemas/behavior_event.v1.avsc]"
    assert old in sources
    new = "previous_schemas: [schemas/behavior_event.v1.avsc, schemas/behavior_event.v2.avsc]"
    (repo.root / "sources.yaml").write_text(sources.replace(old, new))
    out = CliRunner().invoke(plan, [str(repo.root), "--state-dir", str(state)])
    assert out.exit_code == 0, out.output
    assert "~ source events: + schema " in out.output
    assert "No view changes: every view keeps its version" in out.output
    doc_out = json.loads(
        CliRunner().invoke(plan, [str(repo.root), "--state-dir", str(state), "--format", "json"]).output
    )
    assert doc_out["changes"] == []
    assert len(doc_out["sources"]) == 1
    assert _apply(repo, state) == doc_out["registry_hash"]
    assert read_plan(state, "realtime").views[0].version == before
