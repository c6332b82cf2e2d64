"""The retrieval user tower on ONNX Runtime: the same embeddings as torch, and torch when ORT fails.

- the ORT session's embeddings equal torch's within 1e-5 (NaN inputs included, any rows);
- ``HEADWATER_RANKER_RUNTIME=torch``, a failed export and failing calls: torch embeds, each failure is
  counted, and after 3 failed calls in a row the retriever stays on torch; retrieval still answers.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from headwater.ranking.accel import ONNXRUNTIME, RUNTIME_ENV, TORCH
from headwater.ranking.onnx_scorer import ONNX_FAILURES_TO_DROP, OnnxTower
from headwater.ranking.towers import TwoTowerModel
from headwater.serving.retrieval.index import ExactIndex
from headwater.serving.retrieval.retriever import TwoTowerRetriever

pytest.importorskip("onnxruntime")

USER_DIM, ITEM_DIM = 11, 5


def _retriever(runtime: str | None = None, seed: int = 0) -> TwoTowerRetriever:
    torch.manual_seed(seed)
    model = TwoTowerModel(USER_DIM, ITEM_DIM, embed_dim=8, hidden=(16, 8)).eval()
    rng = np.random.default_rng(seed)
    model.set_normalization(
        (rng.normal(0, 1, USER_DIM), rng.uniform(0.5, 2, USER_DIM)),
        (rng.normal(0, 1, ITEM_DIM), rng.uniform(0.5, 2, ITEM_DIM)),
    )
    index = ExactIndex(8)
    items = rng.normal(0, 1, (50, ITEM_DIM)).astype(np.float32)
    index.upsert([f"i{k}" for k in range(50)], model.embed_items(items))
    return TwoTowerRetriever(model, index, runtime=runtime)


@settings(max_examples=10, deadline=None)
@given(
    rows=st.integers(1, 6),
    seed=st.integers(0, 2**16),
    missing=st.floats(0.0, 0.5),
)
def test_ort_embeds_users_as_torch_does(rows: int, seed: int, missing: float) -> None:
    retriever = _retriever(seed=seed % 7)
    assert retriever.runtime == ONNXRUNTIME
    rng = np.random.default_rng(seed)
    users = rng.normal(0, 3, (rows, USER_DIM)).astype(np.float32)
    users[rng.random(users.shape) < missing] = np.nan  # a missing value means the training mean in both
    np.testing.assert_allclose(
        retriever.embed_user(users), retriever.model.embed_users(users), atol=1e-5, rtol=0
    )
    ids, scores = retriever.retrieve(users[0], 10)
    torch_ids, torch_scores = _retriever(TORCH, seed % 7).retrieve(users[0], 10)
    np.testing.assert_allclose(scores, torch_scores, atol=1e-5, rtol=0)
    assert len(ids) == len(torch_ids) == 10


def test_the_env_var_keeps_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(RUNTIME_ENV, "torch")
    assert _retriever().runtime == TORCH
    monkeypatch.delenv(RUNTIME_ENV)
    assert _retriever().runtime == ONNXRUNTIME


def test_a_failed_export_is_counted_and_torch_embeds(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*_args: Any, **_kwargs: Any) -> OnnxTower:
        raise RuntimeError("exporter says no")

    monkeypatch.setattr(OnnxTower, "export", broken)
    retriever = _retriever()
    assert (retriever.runtime, retriever.onnx_failures) == (TORCH, 1)
    user = np.ones((1, USER_DIM), np.float32)
    np.testing.assert_array_equal(retriever.embed_user(user), retriever.model.embed_users(user))


def test_failing_calls_are_embedded_by_torch_and_dropped_after_three() -> None:
    retriever = _retriever()
    assert retriever.onnx is not None

    class Broken:
        def run(self, *_args: Any) -> Any:
            raise RuntimeError("session broke")

    retriever.onnx.session = Broken()
    user = np.full(USER_DIM, 0.5, np.float32)
    want = _retriever(TORCH).retrieve(user, 5)
    for n in range(1, ONNX_FAILURES_TO_DROP + 1):
        got = retriever.retrieve(user, 5)
        assert got[0] == want[0]
        assert retriever.onnx_failures == n
    assert retriever.runtime == TORCH
    retriever.retrieve(user, 5)
    assert retriever.onnx_failures == ONNX_FAILURES_TO_DROP  # no more ORT calls
    retriever.compile()  # a rebuilt session is used again
    assert retriever.runtime == ONNXRUNTIME
