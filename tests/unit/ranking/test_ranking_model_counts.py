"""Count inputs enter the ranking models as log(1 + x): the mask travels in the artifacts.

- :func:`count_columns` picks non-negative whole-number (or heavy-tailed) columns reaching 10, never
  rates or shares;
- a DCN or a linear model with masks scores what the same model without masks scores on log(1 + x)
  of the masked columns (NaN still means the training mean);
- an artifact saved before the masks existed (no ``user_log`` / ``item_log`` in its state) loads
  through the service's loaders and scores exactly as before;
- ONNX Runtime (the exported ``forward_shared``) gives torch's scores with masks (atol 1e-5);
- ``train_and_save`` writes the masks into both artifacts and names the logged slots in the
  metadata; the service's loaders then score the holdout as training did.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from headwater.ranking.accel import ONNXRUNTIME, TORCH
from headwater.ranking.artifact import load_artifact, save_artifact
from headwater.ranking.inputs import count_columns, input_norm, split_by_time, standardized
from headwater.ranking.model import DCNRanker, LinearRanker, NeuralScorer, linear_logits
from headwater.ranking.quality_sets import generator_set
from headwater.ranking.scorers import linear_from_artifact, neural_from_artifact
from headwater.ranking.train import TrainOptions, _score_dcn, train_and_save

USER_DIM, ITEM_DIM = 4, 5
USER_LOG = np.array([True, False, True, False])
ITEM_LOG = np.array([False, True, True, False, False])


def _model(masks: bool, seed: int = 0) -> DCNRanker:
    torch.manual_seed(seed)
    model = DCNRanker(USER_DIM, ITEM_DIM, embed_dim=4, cross_layers=2, deep=(16, 8)).eval()
    rng = np.random.default_rng(seed)
    model.set_normalization(
        rng.normal(0, 1, USER_DIM),
        rng.uniform(0.5, 2, USER_DIM),
        rng.normal(0, 1, ITEM_DIM),
        rng.uniform(0.5, 2, ITEM_DIM),
        USER_LOG if masks else None,
        ITEM_LOG if masks else None,
    )
    return model


def _rows(n: int, seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    users = rng.integers(0, 3000, (2, USER_DIM)).astype(np.float32)
    items = rng.integers(0, 3000, (n, ITEM_DIM)).astype(np.float32)
    items[0, 1] = np.nan  # missing: the training mean
    items[1, 2] = -4.0  # a negative count counts as 0
    return users, items


def _logged(x: np.ndarray, mask: np.ndarray) -> np.ndarray:
    return np.where(mask, np.log1p(np.maximum(x, 0.0)), x).astype(np.float32)


def test_count_columns_are_non_negative_counts_reaching_ten_never_rates() -> None:
    rng = np.random.default_rng(0)
    n = 500
    x = np.column_stack([
        rng.poisson(40, n),  # a count
        rng.poisson(0.3, n),  # a count that never reaches 10: left as it is
        rng.uniform(0, 1, n),  # a rate
        rng.lognormal(2.0, 1.2, n),  # a sum of amounts: heavy-tailed, p99 past 10
        rng.normal(50, 5, n),  # a non-whole, symmetric column
        rng.integers(-5, 100, n),  # whole numbers, some negative
        np.full(n, np.nan),  # never set
    ]).astype(np.float32)  # fmt: skip
    x[::7, 0] = np.nan  # missing values do not decide
    assert count_columns(x).tolist() == [True, False, False, True, False, False, False]


@settings(max_examples=30, deadline=None)
@given(
    counts=st.lists(st.integers(0, 10**6), min_size=2, max_size=40),
    rates=st.lists(st.floats(0.0, 1.0), min_size=2, max_size=40),
)
def test_count_columns_logs_every_whole_column_reaching_ten_and_no_share(
    counts: list[int], rates: list[float]
) -> None:
    n = min(len(counts), len(rates))
    x = np.column_stack([np.asarray(counts[:n], np.float32), np.asarray(rates[:n], np.float32)])
    assert count_columns(x).tolist() == [max(counts[:n]) >= 10, False]


def test_a_masked_dcn_scores_the_unmasked_dcn_on_logged_inputs() -> None:
    masked, plain = _model(masks=True), _model(masks=False)
    users, items = _rows(12)
    index = torch.tensor([0] * 6 + [1] * 6)
    with torch.inference_mode():
        got = masked(torch.from_numpy(users), torch.from_numpy(items), index)
        want = plain(
            torch.from_numpy(_logged(users, USER_LOG)), torch.from_numpy(_logged(items, ITEM_LOG)), index
        )
        rows = masked.forward_rows(torch.from_numpy(users), torch.from_numpy(items), index)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got, rows, atol=1e-5, rtol=1e-5)  # forward_shared = the whole network
    assert torch.isfinite(got).all()


def test_a_dcn_artifact_without_masks_loads_and_scores_as_before(tmp_path: Path) -> None:
    model = _model(masks=False)
    old_state = {k: v for k, v in model.state_dict().items() if k not in ("user_log", "item_log")}
    meta = {"kind": "dcn", "user_features": list("abcd"), "item_features": list("vwxyz")}
    meta["hyperparameters"] = {"embed_dim": 4, "cross_layers": 2, "deep": [16, 8]}
    artifact = load_artifact(save_artifact(tmp_path, meta, old_state).path)
    assert "user_log" not in artifact.state
    scorer = neural_from_artifact(artifact, "cpu")
    assert not scorer.model.user_log.any()
    assert not scorer.model.item_log.any()
    assert "user_log" not in artifact.state  # loading did not write into the artifact's state
    users, items = _rows(8)
    job = [(users[0], items)]
    before = NeuralScorer(model, "cpu", runtime=TORCH).score_batch(job)[0]
    np.testing.assert_array_equal(
        NeuralScorer(scorer.model, "cpu", runtime=TORCH).score_batch(job)[0], before
    )


def test_a_linear_model_with_masks_scores_logged_inputs_and_without_them_as_before() -> None:
    rng = np.random.default_rng(3)
    state = {
        "user_mean": rng.normal(0, 1, USER_DIM).astype(np.float32),
        "user_scale": rng.uniform(0.5, 2, USER_DIM).astype(np.float32),
        "item_mean": rng.normal(0, 1, ITEM_DIM).astype(np.float32),
        "item_scale": rng.uniform(0.5, 2, ITEM_DIM).astype(np.float32),
        "w_user": rng.normal(0, 1, USER_DIM).astype(np.float32),
        "w_item": rng.normal(0, 1, ITEM_DIM).astype(np.float32),
        "w_cross": rng.normal(0, 1, (USER_DIM, ITEM_DIM)).astype(np.float32),
        "bias": np.array([0.1], np.float32),
    }
    users, items = _rows(6)
    plain = LinearRanker(state)
    masked = LinearRanker(
        {**state, "user_log": USER_LOG.astype(np.float32), "item_log": ITEM_LOG.astype(np.float32)}
    )
    np.testing.assert_allclose(
        masked.score(users[0], items),
        plain.score(_logged(users[0], USER_LOG), _logged(items, ITEM_LOG)),
        rtol=1e-6,
    )
    assert plain.user_log is None  # an old artifact: no transform at all
    assert plain.item_log is None


def test_onnx_runtime_gives_torchs_scores_with_count_masks() -> None:
    pytest.importorskip("onnxruntime")
    model = _model(masks=True, seed=4)
    ort = NeuralScorer(model, "cpu", runtime=ONNXRUNTIME)
    assert ort.runtime == ONNXRUNTIME
    rng = np.random.default_rng(5)
    jobs = []
    for n in (1, 7, 300):
        users, items = _rows(max(n, 2), seed=int(rng.integers(100)))
        jobs.append((users[0], items[:n] if n > 1 else items[:1]))
    torch_scores = NeuralScorer(model, "cpu", runtime=TORCH).score_batch(jobs)
    for got, want in zip(ort.score_batch(jobs), torch_scores, strict=True):
        np.testing.assert_allclose(got, want, atol=1e-5)
    assert ort.onnx_failures == 0


def test_train_and_save_writes_the_masks_and_the_loaders_score_as_training_did(tmp_path: Path) -> None:
    ts = generator_set(6_000, seed=3, users=200, items=100)
    report = train_and_save(ts, tmp_path, TrainOptions(seed=0, epochs=1))
    counts = {"clicks", "impressions", "item_impressions", "item_clicks", "neighbour_impressions"}
    ranked = ts.for_ranker()
    assert report.dcn.metadata["log_inputs"] == {
        "user": [f for f in ranked.user_features if f in counts],
        "item": [f for f in ranked.item_features if f in counts],
    }
    for artifact in (report.dcn, report.linear):
        assert artifact.state["user_log"].tolist() == [f in counts for f in ranked.user_features]
        assert artifact.state["item_log"].tolist() == [f in counts for f in ranked.item_features]
    train_rows, test_rows = split_by_time(ranked, 0.2)
    test = ranked.take(test_rows)
    slate = test.take(np.flatnonzero(test.group == test.group[0]))
    norm = input_norm(ranked.take(train_rows), "auto")
    weights = {k: v for k, v in report.linear.state.items() if k.startswith(("w_", "bias"))}
    trained_linear = linear_logits(weights, *standardized(slate, norm)).numpy()
    linear = linear_from_artifact(load_artifact(report.linear.path))
    np.testing.assert_allclose(linear.score(slate.user[0], slate.item), trained_linear, atol=1e-4)
    dcn = neural_from_artifact(load_artifact(report.dcn.path), "cpu")
    served = dcn.score_batch([(slate.user[0], slate.item)])[0]
    trained = 1.0 / (1.0 + np.exp(-_score_dcn(dcn.model, slate).astype(np.float64)))
    np.testing.assert_allclose(served, trained, atol=1e-5)
