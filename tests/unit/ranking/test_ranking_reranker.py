"""The sequence re-ranker: no look-ahead in its click sequences, training, artifact round trip."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from headwater.ranking.artifact import ArtifactError
from headwater.ranking.reranker import (
    Reranker,
    RerankOptions,
    SequenceReranker,
    click_sequences,
    load_reranker,
    save_reranker,
    train_reranker,
)
from headwater.ranking.synthetic import make_world, small_registry, training_set

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


def test_onnx_runtime_scores_as_torch_with_and_without_clicks_and_missing_values() -> None:
    torch.manual_seed(5)
    model = SequenceReranker(3, dim=8, heads=2).eval()
    with torch.no_grad():  # a trained-looking head, so the attention read changes the scores
        for p in model.head.parameters():
            p.normal_(0.0, 0.5)
    on_torch = Reranker("v", ("x", "y", "z"), model, 5)
    on_onnx = Reranker("v", ("x", "y", "z"), model, 5)
    on_onnx.compile("onnxruntime")
    assert (on_torch.runtime, on_onnx.runtime, on_onnx.onnx_failures) == ("torch", "onnxruntime", 0)
    rng = np.random.default_rng(2)
    for rows, clicks in ((50, 20), (7, 1), (1, 0), (30, 8)):
        items = rng.normal(size=(rows, 3)).astype(np.float32)
        items[0, 1] = np.nan  # a missing slot: the normalisation's 0 in both
        seq = rng.normal(size=(clicks, 3)).astype(np.float32)
        base = rng.uniform(0.01, 0.99, size=rows).astype(np.float32)
        want = on_torch.score(items, base, seq)
        got = on_onnx.score(items, base, seq)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
        assert not np.allclose(want, base, atol=1e-3) or clicks == 0  # the model did something
    assert on_onnx.onnx_failures == 0
