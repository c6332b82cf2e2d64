"""A Feast client reads what the tiers write: apply the example repo, write one vector per view
with the tiers' layout, and FeatureStore.get_online_features returns the same slots."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import numpy as np
from click.testing import CliRunner

from headwater.cli.registry import apply
from headwater.pipelines.store import OnlineStore
from headwater.pipelines.windows.spec import compile_view
from headwater.pipelines.windows.vector import view_layout
from headwater.registry.plans import read_plan

EXAMPLE = Path(__file__).resolve().parents[3] / "features"
TEST_DB = 12


def test_feast_reads_the_vectors_the_tiers_wrote(tmp_path: Path, redis_url: str) -> None:
    os.environ.setdefault("FEAST_USAGE", "False")
    from feast import FeatureStore

    db_url = f"{redis_url.rsplit('/', 1)[0]}/{TEST_DB}"
    state = tmp_path / "state"
    result = CliRunner().invoke(apply, [str(EXAMPLE), "--state-dir", str(state), "--redis-url", db_url])
    assert result.exit_code == 0, result.output

    store = OnlineStore.from_url(db_url)
    feast = FeatureStore(repo_path=str(state / "feast"))
    entity_id = f"test-{uuid.uuid4().hex[:8]}"
    rng = np.random.default_rng(3)
    checked = 0
    try:
        for tier in ("realtime", "nearline", "offline"):
            plan = read_plan(state, tier)
            for view in plan.views:
                layout = view_layout(compile_view(view))
                vector = rng.random((1, len(layout.features)), dtype=np.float32)
                written = store.write_batch(layout, [entity_id], vector, [1_700_000_000_000])
                assert written.written == 1

                refs = [f"{view.name}:{slot}" for slot in layout.features]
                online = feast.get_online_features(
                    features=refs, entity_rows=[{view.join_key: entity_id}]
                ).to_dict()
                got = np.array([online[slot][0] for slot in layout.features], dtype=np.float32)
                np.testing.assert_array_equal(got, vector[0])
                checked += 1
    finally:
        for key in store.client.scan_iter(match=f"*{entity_id}*"):
            store.client.delete(key)
    assert checked == 15  # every view of the example repo (both sources), top_k slots included
