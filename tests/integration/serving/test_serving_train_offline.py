"""`headwater model train --training-set` on a training set built by the real offline path (Spark + Delta).

Three days of scripted sessions land in a bronze table; every view of the example registry (all
three tiers) is computed by the offline job; impressions labelled by clicks are joined point in
time; the model trains from that Parquet and binds to the registry it came from.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import date
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from headwater.cli.serve import model
from headwater.pipelines.offline.bronze import append_events
from headwater.pipelines.offline.job import BronzeTables, read_bronze, run_view
from headwater.pipelines.offline.labels import derive_labels
from headwater.pipelines.offline.lake import bronze_path, days
from headwater.pipelines.offline.testing import DAY_MS, T0, event
from headwater.pipelines.store import OnlineStore
from headwater.pipelines.windows import RedisDictionary
from headwater.ranking.features import bind_plans
from headwater.ranking.training_set import build_training_set
from headwater.ranking.trainset import read_parquet
from headwater.registry.plans import build_plans, registry_hash
from headwater.registry.tiers import TIER_NAMES
from headwater.registry.validate import check_repo
from headwater.serving.runtime import load_models

FEATURES = Path(__file__).resolve().parents[3] / "features"
CATEGORIES = ("music", "books", "art", "tech")


def history(seed: int = 5) -> list[dict[str, Any]]:
    """Sessions of 8 impressions over 3 days; users click items of their favourite category more."""
    rng = np.random.default_rng(seed)
    out: list[dict[str, Any]] = []
    n = 0
    for day in range(3):
        for s in range(60):
            user = f"u{s % 15}"
            favourite = CATEGORIES[s % 15 % len(CATEGORIES)]
            t = T0 + day * DAY_MS + (s + 1) * 20 * 60_000
            session = f"s{day}-{s}"
            for pos in range(1, 9):
                item = int(rng.integers(0, 24))
                cat = CATEGORIES[item % len(CATEGORIES)]
                fields = {"item_id": f"i{item}", "category": cat, "price": float(5 + item), "position": pos}
                n += 1
                out.append(event(n, user, "impression", t + pos * 1000, session_id=session, **fields))
                if rng.random() < (0.45 if cat == favourite else 0.08):
                    n += 1
                    out.append(event(n, user, "click", t + pos * 1000 + 500, session_id=session, **fields))
                    n += 1
                    out.append(event(n, user, "dwell", t + pos * 1000 + 900, session_id=session,
                                     dwell_ms=int(rng.integers(500, 9000)), **fields))  # fmt: skip
    return out


@pytest.fixture
def ids(redis_url: str) -> Iterator[Any]:
    namespace = f"hwtest-train-{uuid.uuid4().hex[:8]}"
    store = OnlineStore.from_url(redis_url, namespace=namespace)
    yield RedisDictionary(store.client, namespace).ids
    for key in store.client.scan_iter(match=f"{namespace}:*"):
        store.client.delete(key)
    store.close()


def test_model_trains_from_an_offline_training_set_and_binds_to_its_registry(
    spark: Any, ids: Any, tmp_path: Path
) -> None:
    result = check_repo(FEATURES)
    reg_hash = registry_hash(result)
    plans = build_plans(result, reg_hash)
    registry = bind_plans([plans[t] for t in TIER_NAMES], "item_popularity_offline.item_clicks_1d")
    views = [v for t in TIER_NAMES for v in plans[t].views]
    lake = tmp_path / "lake"
    source = next(s for s in plans["offline"].sources if s.name == "events")
    append_events(spark, source, history(), bronze_path(lake, source.name))
    bronze = read_bronze(spark, lake, source)
    for v in plans["offline"].views:  # realtime and nearline views are recomputed at each label's time
        if v.source == source.name:  # the payments views have no user or item key: not in the training set
            run_view(spark, bronze, v, source, lake, days(date(2026, 1, 1), date(2026, 1, 2)), zorder=False)
    labels = derive_labels(bronze, source, date(2026, 1, 2), date(2026, 1, 3))  # day 1 has no past
    out = tmp_path / "train.parquet"
    tables = BronzeTables(spark, lake, plans["offline"].sources)
    on_demand = plans["offline"].on_demand  # as `headwater training-set` passes them: pair features
    built = build_training_set(spark, labels, views, lake, out, reg_hash, ids, tables, on_demand)
    assert built.rows == 2 * 60 * 8
    assert 0 < built.positives < built.rows

    ts = read_parquet(out)
    assert ts.position is not None
    assert set(np.unique(ts.position)) <= set(range(1, 9))  # the slots the history showed items at
    assert ts.user_features == registry.user.slots  # the Parquet's columns are the service's slots
    assert ts.item_features == registry.item.slots
    assert registry.on_demand is not None
    assert tuple(ts.pair) == registry.on_demand.names  # pair.<feature> columns, the service's evaluator
    # The user side is read at each slate's start (the service reads it once a page): every row of a
    # slate has one user vector, and the pair features are computed at the slate's start too.
    keys = list(zip(ts.group.tolist(), list(ts.user_ids), strict=True))
    number = {k: j for j, k in enumerate(dict.fromkeys(keys))}
    slate = np.array([number[k] for k in keys])
    start = np.full(slate.max() + 1, np.iinfo(np.int64).max)
    np.minimum.at(start, slate, ts.event_time_ms)
    for s in np.unique(slate)[:50]:
        rows = np.flatnonzero(slate == s)
        np.testing.assert_array_equal(ts.user[rows], np.repeat(ts.user[rows[:1]], len(rows), axis=0))
    np.testing.assert_allclose(  # the same numbers as the service computes from these slots
        np.column_stack([ts.pair[n] for n in ts.pair]),
        registry.on_demand.compute(ts.user, ts.item, start[slate]),
        rtol=1e-6,
        equal_nan=True,
    )
    assert ts.registry_version == registry.registry_version
    # the 24 h nearline window of a label early on day 2 holds day 1's clicks
    clicks_24h = ts.user[:, ts.user_features.index("clicks_24h")]
    first_day = ts.event_time_ms < T0 + 2 * DAY_MS
    assert clicks_24h[first_day].max() > 0

    models = tmp_path / "models"
    run = CliRunner().invoke(
        model, ["train", "--training-set", str(out), "--out", str(models), "--epochs", "2", "--device", "cpu"]
    )
    assert run.exit_code == 0, run.output
    assert "holdout" in run.output
    latest = json.loads((models / "latest.json").read_text())
    metrics = json.loads((models / latest["metrics"]).read_text())
    # the labels' position column reaches the training set: the per-slot offsets (never served)
    assert set(metrics["holdout"]) == {"dcn", "dcn_at_position", "linear", "popularity", "best_feature"}
    assert metrics["rows"]["train"] + metrics["rows"]["holdout"] == built.rows
    for scores in metrics["holdout"].values():
        assert 0.0 <= scores["auc"] <= 1.0
    # The scripted signal is a user x item interaction (favourite category), which 960 rows cannot
    # teach reliably; what the training set must carry is the user side of it, as of each label:
    top1 = ts.user[:, ts.user_features.index("favourite_categories_24h.top1")]
    favourite = {f"u{u}": ids("category", [CATEGORIES[u % len(CATEGORIES)]])[0] for u in range(15)}
    assert np.mean([top1[i] == favourite[u] for i, u in enumerate(ts.user_ids)]) > 0.6
    loaded = load_models(models, registry, "cpu")
    assert loaded.neural is not None
    assert loaded.linear is not None
    assert loaded.binding.user_columns is None
    assert loaded.binding.item_columns is not None  # the stored slots, then the on-demand ones
    assert len(loaded.binding.item_columns) == registry.item.dim + registry.on_demand.width
    assert loaded.binding.warning is None
