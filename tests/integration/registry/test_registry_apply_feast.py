"""apply round-trips through Feast: the registry lists the views with their tags and sources."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from headwater.cli.registry import apply
from headwater.registry.plans import read_plan
from headwater.registry.testing import MINIMAL_VIEW, ScratchRepo

EXAMPLE = Path(__file__).resolve().parents[3] / "features"
TEST_DB = 13  # a Redis database of its own, so parallel tests never share keys


@pytest.fixture
def isolated_redis(redis_url: str) -> str:
    base = redis_url.rsplit("/", 1)[0] if redis_url.count("/") > 2 else redis_url
    return f"{base}/{TEST_DB}"


def test_apply_round_trips_through_feast(tmp_path: Path, isolated_redis: str) -> None:
    os.environ.setdefault("FEAST_USAGE", "False")
    from feast import FeatureStore

    repo = ScratchRepo(tmp_path / "features", template=EXAMPLE)
    repo.write("v1.yaml", MINIMAL_VIEW)
    repo.write("v2.yaml", MINIMAL_VIEW.replace("v1", "v2").replace("entity: user", "entity: item"))
    state = tmp_path / "state"
    args = [str(repo.root), "--state-dir", str(state), "--redis-url", isolated_redis]
    first = CliRunner().invoke(apply, args)
    assert first.exit_code == 0, first.output
    assert "Applied 2 view(s)" in first.output
    assert not list((state / "feast").glob("*.py"))

    store = FeatureStore(repo_path=str(state / "feast"))
    views = {fv.name: fv for fv in store.list_feature_views()}
    assert sorted(views) == ["v1", "v2"]
    tags = views["v1"].tags
    assert {k: tags[k] for k in ("tier", "freshness_sla", "compute_cost", "owner")} == {
        "tier": "realtime",
        "freshness_sla": "PT10S",
        "compute_cost": "10",
        "owner": "team-a",
    }
    assert tags["registry_hash"].startswith("sha256:")
    assert tags["version"] == next(v.version for v in read_plan(state, "realtime").views if v.name == "v1")
    assert [f.name for f in views["v1"].features] == ["clicks_30s"]
    assert views["v2"].entities == ["item"]
    assert views["v1"].stream_source is not None
    assert views["v1"].stream_source.name == "events"
    assert views["v1"].batch_source.name == "events_batch"
    assert sorted(e.name for e in store.list_entities()) == ["account", "item", "merchant", "user"]

    (repo.root / "v2.yaml").unlink()
    second = CliRunner().invoke(apply, args)
    assert second.exit_code == 0, second.output
    assert "deleted view: v2" in second.output
    assert [fv.name for fv in FeatureStore(repo_path=str(state / "feast")).list_feature_views()] == ["v1"]


def test_feast_cli_lists_the_example_views(tmp_path: Path, isolated_redis: str) -> None:
    state = tmp_path / "state"
    script = Path(sys.executable).with_name("headwater")
    env = {**os.environ, "FEAST_USAGE": "False"}
    applied = subprocess.run(
        [str(script), "apply", str(EXAMPLE), "--state-dir", str(state), "--redis-url", isolated_redis],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env=env,
    )
    assert applied.returncode == 0, applied.stdout + applied.stderr
    listed = subprocess.run(
        [str(Path(sys.executable).with_name("feast")), "-c", str(state / "feast"), "feature-views", "list"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env=env,
    )
    assert listed.returncode == 0, listed.stderr
    names = {line.split()[0] for line in listed.stdout.splitlines()[1:] if line.strip()}
    assert {"user_session_realtime", "user_search_nearline", "item_popularity_offline"} <= names
    assert len(names) == 15
