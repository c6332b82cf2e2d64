"""The demo's experiment traffic: who it sends, and which fallbacks it calls by design or a fault."""

from __future__ import annotations

import importlib.util
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

_PATH = Path(__file__).resolve().parents[3] / "infra/demo/experiment_traffic.py"
_spec = importlib.util.spec_from_file_location("demo_experiment_traffic", _PATH)
assert _spec is not None
assert _spec.loader is not None
traffic = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(traffic)


def test_active_users_come_from_the_labels_by_their_impressions(tmp_path: Path) -> None:
    labels = tmp_path / "labels.parquet"
    pq.write_table(pa.table({"user_id": ["u1"] * 9 + ["u2"]}), labels)
    drawn = traffic.draw_users(random.Random(3), labels, 2000, 0.05)
    cold = [u for u, is_cold in drawn if is_cold]
    warm = [u for u, is_cold in drawn if not is_cold]
    assert all(u.startswith("u-new-") for u in cold)
    assert set(warm) == {"u1", "u2"}
    assert 0.02 < len(cold) / len(drawn) < 0.08
    assert 0.85 < warm.count("u1") / len(warm) < 0.95  # drawn by impressions: 9 of 10 rows


def test_without_labels_every_user_is_new() -> None:
    drawn = traffic.draw_users(random.Random(3), None, 5, 0.05)
    assert [u for u, _ in drawn] == [f"u-new-{i:06d}" for i in range(5)]
    assert all(cold for _, cold in drawn)


def test_only_the_challenger_arm_and_cold_users_fall_back_by_design() -> None:
    assert traffic.by_design("linear: experiment", cold=False) is not None
    assert traffic.by_design("popularity: missing_user_features", cold=True) is not None
    assert traffic.by_design("popularity: missing_user_features", cold=False) is None  # a user with history
    assert traffic.by_design("popularity: deadline", cold=True) is None
    assert traffic.by_design("editorial: store_error", cold=True) is None
