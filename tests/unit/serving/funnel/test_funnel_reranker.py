"""The sequence re-ranker: no look-ahead in its click sequences, training, artifact round trip."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from headwater.serving.artifact import ArtifactError
from headwater.serving.funnel.reranker import (
    Reranker,
    RerankOptions,
    SequenceReranker,
    click_sequences,
    load_reranker,
    save_reranker,
    train_reranker,
)
from headwater.serving.synthetic import make_world, small_registry, training_set

REGISTRY = small_registry({"u": ["a", "b"]}, {"i": ["x", "y", "z"]}, "i.x")


def test_sequences_hold_only_earlier_clicks_of_the_same_user() -> None:
    world = make_world(REGISTRY, users=20, items=50, seed=3)
    ts = training_set(REGISTRY, world, slates=300, k=5, seed=3)
    ts = type(ts)(**{**ts.__dict__, "event_time_ms": ts.event_time_ms // 5000 * 5000})  # ties: one per slate
    seqs = click_sequences(ts, 4)
    checked = 0
    for row in range(len(ts)):
        for prev in seqs[row][seqs[row] >= 0].tolist():
            assert ts.user_ids[prev] == ts.user_ids[row]
            assert ts.label[prev] == 1.0
            assert ts.event_time_ms[prev] < ts.event_time_ms[row]  # never the same slate, never later
            checked += 1
    assert checked > 100


def test_an_untrained_reranker_keeps_the_dcn_scores() -> None:
    model = SequenceReranker(3, dim=8, heads=2).eval()
    reranker = Reranker("v", ("x", "y", "z"), model, 5)
    base = np.array([0.9, 0.2, 0.5], np.float32)
    items = np.random.default_rng(0).normal(size=(3, 3)).astype(np.float32)
    clicks = np.random.default_rng(1).normal(size=(2, 3)).astype(np.float32)
    assert reranker.score(items, base, clicks) == pytest.approx(base, abs=1e-5)
    assert reranker.score(items, base, np.zeros((0, 3), np.float32)) == pytest.approx(base, abs=1e-5)


def test_train_save_load_round_trip(tmp_path: Path) -> None:
    world = make_world(REGISTRY, users=30, items=60, seed=4)
    ts = training_set(REGISTRY, world, slates=400, k=5, seed=4)
    base = np.full(len(ts), 0.3, np.float32)
    model, metrics = train_reranker(ts, base, RerankOptions(epochs=1, dim=8, threads=1))
    assert set(metrics["holdout"]) == {"dcn", "dcn+reranker"}
    assert metrics["rows_with_clicks"] > 0
    saved = save_reranker(tmp_path, model, ts, metrics, 20)
    loaded = load_reranker(tmp_path)
    assert loaded.version == saved.version
    assert loaded.item_features == ts.item_features
    items, clicks = ts.item[:7], ts.item[10:13]
    assert loaded.score(items, base[:7], clicks) == pytest.approx(saved.score(items, base[:7], clicks))
    state = torch.load(saved_path(tmp_path), weights_only=True)
    state["state"]["head.0.bias"] += 1.0
    torch.save(state, saved_path(tmp_path))
    with pytest.raises(ArtifactError, match="modified or is corrupt"):
        load_reranker(tmp_path)


def saved_path(folder: Path) -> Path:
    return next(folder.glob("reranker-*.pt"))


def test_a_folder_without_a_reranker_names_the_command(tmp_path: Path) -> None:
    with pytest.raises(ArtifactError, match=r"train-reranker|train the re-ranker"):
        load_reranker(tmp_path)
