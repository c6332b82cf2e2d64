from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from headwater.ranking.artifact import ArtifactError, check_binding, load_artifact, save_artifact
from headwater.ranking.evaluation import auc, ndcg_at_k, popularity_scores
from headwater.ranking.model import DCNRanker, LinearRanker, NeuralScorer
from headwater.ranking.synthetic import small_registry


def _model(du: int = 5, di: int = 4) -> DCNRanker:
    torch.manual_seed(0)
    return DCNRanker(du, di, embed_dim=3, cross_layers=2, deep=(8, 4)).eval()


def test_forward_shape_and_user_index_expansion() -> None:
    model = _model()
    users = torch.randn(2, 5)
    items = torch.randn(7, 4)
    index = torch.tensor([0, 0, 0, 1, 1, 1, 1])
    merged = model(users, items, index)
    per_row = model(users[index], items, torch.arange(7))
    assert merged.shape == (7,)
    torch.testing.assert_close(merged, per_row)


def test_nan_inputs_mean_the_training_mean() -> None:
    model = _model()
    model.set_normalization(np.ones(5), np.full(5, 2.0), np.zeros(4), np.ones(4))
    users = torch.tensor([[float("nan")] * 5, [1.0] * 5])
    out = model(users, torch.zeros(2, 4), torch.tensor([0, 1]))
    assert torch.isfinite(out).all()
    assert out[0].item() == pytest.approx(out[1].item())


def test_neural_scorer_splits_batch_per_job() -> None:
    scorer = NeuralScorer(_model(), "cpu")
    jobs = [
        (np.ones(5, np.float32), np.zeros((3, 4), np.float32)),
        (np.zeros(5, np.float32), np.ones((2, 4), np.float32)),
    ]
    out = scorer.score_batch(jobs)
    assert [len(o) for o in out] == [3, 2]
    assert ((out[0] > 0) & (out[0] < 1)).all()
    alone = scorer.score_batch([jobs[1]])[0]
    np.testing.assert_allclose(out[1], alone, rtol=1e-5)


def test_artifact_round_trip_with_weights_only(tmp_path: Path) -> None:
    model = _model()
    meta = {"kind": "dcn", "user_features": ["a"] * 0 + ["u1"], "item_features": ["i1"], "created_at": "x"}
    saved = save_artifact(tmp_path, meta, model.state_dict())
    assert saved.path.name == f"dcn-{saved.version}.pt"
    raw = torch.load(saved.path, weights_only=True)
    assert set(raw) == {"format", "metadata_json", "state"}
    loaded = load_artifact(saved.path)
    assert loaded.version == saved.version
    assert len(saved.version) == 12
    for name, tensor in model.state_dict().items():
        torch.testing.assert_close(loaded.state[name], tensor)
    again = save_artifact(tmp_path / "again", {**meta, "created_at": "later"}, model.state_dict())
    assert again.version == saved.version  # content hash ignores the creation time


def test_tampered_artifact_is_refused(tmp_path: Path) -> None:
    saved = save_artifact(tmp_path, {"kind": "linear"}, {"w": torch.ones(3)})
    raw = torch.load(saved.path, weights_only=True)
    raw["state"]["w"] = torch.zeros(3)
    torch.save(raw, saved.path)
    with pytest.raises(ArtifactError, match="content hash"):
        load_artifact(saved.path)


def test_missing_artifact_names_the_command(tmp_path: Path) -> None:
    with pytest.raises(ArtifactError, match="headwater model train"):
        load_artifact(tmp_path / "nope.pt")


REGISTRY = small_registry({"u": ["a", "b"]}, {"i": ["x"]}, "i.x", registry_hash="sha256:" + "12" * 32)


def test_binding_accepts_the_same_slots_and_maps_another_order() -> None:
    same = check_binding(
        {"user_features": ["a", "b"], "item_features": ["x"], "registry_version": "1212121212121212"},
        REGISTRY,
    )
    assert (same.user_columns, same.item_columns, same.warning) == (None, None, None)
    swapped = check_binding(
        {"user_features": ["b", "a"], "item_features": ["x"], "registry_version": "1212121212121212"},
        REGISTRY,
    )
    assert swapped.user_columns is not None
    assert swapped.user_columns.tolist() == [1, 0]
    assert swapped.item_columns is None


def test_binding_with_another_registry_version_but_same_slots_warns() -> None:
    other = check_binding(
        {"user_features": ["a", "b"], "item_features": ["x"], "registry_version": "abc"}, REGISTRY
    )
    assert other.warning is not None
    assert "trained on registry abc and records no view versions" in other.warning
    assert "the applied registry is 1212121212121212" in other.warning
    assert other.changed_views == ()


def test_binding_names_the_views_whose_version_changed_since_training() -> None:
    applied = REGISTRY.view_versions
    assert set(applied) == {"u", "i"}
    same = {"user_features": ["a", "b"], "item_features": ["x"], "view_versions": dict(applied)}
    assert check_binding({**same, "registry_version": "other"}, REGISTRY).warning is None
    moved = check_binding({**same, "view_versions": {**applied, "i": "v0000000000000000"}}, REGISTRY)
    assert moved.changed_views == ("i",)
    assert moved.warning is not None
    assert "other versions of views i than the applied ones" in moved.warning
    # a view the model never saw, or a malformed record, is not a change
    assert check_binding({**same, "view_versions": {"gone": "v1"}}, REGISTRY).changed_views == ()
    assert check_binding({**same, "view_versions": ["u"]}, REGISTRY).changed_views == ()


def test_binding_mismatch_names_the_slots_and_what_to_do() -> None:
    with pytest.raises(ArtifactError) as err:
        check_binding({"user_features": ["a", "c"], "item_features": ["x"], "model_version": "m1"}, REGISTRY)
    text = str(err.value)
    assert "user slots the model needs but the registry lacks: c" in text
    assert "registry user slots the model was not trained on: b" in text
    assert "headwater model train --training-set" in text


def test_linear_ranker_matches_formula() -> None:
    state = {
        "user_mean": np.zeros(2, np.float32),
        "user_scale": np.ones(2, np.float32),
        "item_mean": np.zeros(2, np.float32),
        "item_scale": np.ones(2, np.float32),
        "w_user": np.array([1.0, 0.0], np.float32),
        "w_item": np.array([0.0, 2.0], np.float32),
        "w_cross": np.array([[1.0, 0.0], [0.0, 0.0]], np.float32),
        "bias": np.array([0.5], np.float32),
    }
    lin = LinearRanker(state)
    out = lin.score(np.array([1.0, 3.0], np.float32), np.array([[2.0, 1.0], [0.0, 0.0]], np.float32))
    # u.w_u = 1, i.w_i = 2 / 0, u^T W i = 2 / 0, bias 0.5
    np.testing.assert_allclose(out, [5.5, 1.5])


def test_auc_and_ndcg_known_values() -> None:
    labels = np.array([1, 0, 1, 0], np.float32)
    assert auc(labels, np.array([0.9, 0.1, 0.8, 0.2])) == 1.0
    assert auc(labels, np.array([0.1, 0.9, 0.2, 0.8])) == 0.0
    assert auc(labels, np.array([0.5, 0.5, 0.5, 0.5])) == 0.5
    groups = np.array([0, 0, 0, 1, 1], np.int64)
    lab = np.array([0, 1, 0, 0, 0], np.float32)  # group 1 has no positive: ignored
    assert ndcg_at_k(groups, lab, np.array([3.0, 2.0, 1.0, 1.0, 2.0])) == pytest.approx(1 / np.log2(3))
    assert ndcg_at_k(groups, lab, np.array([1.0, 2.0, 0.0, 1.0, 2.0])) == 1.0


def test_popularity_scores_count_training_clicks() -> None:
    train_items = np.array(["a", "a", "b", "c"])
    train_labels = np.array([1, 1, 0, 1], np.float32)
    out = popularity_scores(train_items, train_labels, np.array(["a", "b", "c", "z"]))
    np.testing.assert_array_equal(out, [2, 0, 1, 0])
