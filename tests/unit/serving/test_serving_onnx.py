"""The DCN on ONNX Runtime and the user's share computed once: the same scores, and torch when ORT fails.

- ``forward_shared`` (the first cross and deep layers' user share once per user) gives the logits of
  the network as written (``forward_rows``), for one user or a batch merged from several;
- the ORT session's scores equal torch's on the same rows (atol 1e-5);
- ORT not installed, ``HEADWATER_RANKER_RUNTIME=torch``, a failed export, a failing ORT call: torch
  scores, the failure is counted, and the service answers 200 with the neural model.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient
from hypothesis import given, settings
from hypothesis import strategies as st

from headwater.ranking import accel
from headwater.ranking.accel import ONNXRUNTIME, TORCH, plan_for, ranker_runtime
from headwater.ranking.model import DCNRanker, NeuralScorer
from headwater.ranking.onnx_scorer import ONNX_FAILURES_TO_DROP, OnnxRanker
from headwater.serving.app import create_app
from headwater.serving.config import ServingConfig
from headwater.serving.runtime import LoadedModels

from .four_items import ITEMS, REGISTRY, four_item_store

pytest.importorskip("onnxruntime")  # a pinned dependency; the fallback tests below need no ORT

USER_DIM, ITEM_DIM = 9, 6


def _model(user_dim: int = USER_DIM, item_dim: int = ITEM_DIM, seed: int = 0) -> DCNRanker:
    torch.manual_seed(seed)
    model = DCNRanker(user_dim, item_dim, embed_dim=4, cross_layers=2, deep=(16, 8)).eval()
    rng = np.random.default_rng(seed)
    model.set_normalization(
        rng.normal(0, 1, user_dim),
        rng.uniform(0.5, 2, user_dim),
        rng.normal(0, 1, item_dim),
        np.ones(item_dim),
    )
    return model


def _jobs(sizes: list[int], seed: int = 1) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(seed)
    jobs = []
    for n in sizes:
        items = rng.normal(0, 2, (n, ITEM_DIM)).astype(np.float32)
        items[0, 0] = np.nan  # a missing value means the training mean in both runtimes
        jobs.append((rng.normal(0, 2, USER_DIM).astype(np.float32), items))
    return jobs


@settings(max_examples=25, deadline=None)
@given(users=st.integers(1, 4), rows=st.integers(1, 40), seed=st.integers(0, 2**16))
def test_the_users_share_computed_once_gives_the_logits_of_the_whole_network(
    users: int, rows: int, seed: int
) -> None:
    model = _model(seed=seed % 7)
    gen = torch.Generator().manual_seed(seed)
    u = torch.randn(users, USER_DIM, generator=gen) * 3
    i = torch.randn(rows, ITEM_DIM, generator=gen) * 3
    index = torch.randint(0, users, (rows,), generator=gen)
    with torch.inference_mode():
        shared = model.forward_shared(u, i, index)
        whole = model.forward_rows(u, i, index)
        dispatched = model(u, i, index)
    torch.testing.assert_close(shared, whole, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(dispatched, shared if users < rows else whole)


def test_onnx_runtime_and_torch_give_the_same_scores_on_the_same_rows() -> None:
    model = _model()
    onnx = NeuralScorer(model, "cpu", runtime=ONNXRUNTIME)
    eager = NeuralScorer(model, "cpu", runtime=TORCH)
    assert (onnx.runtime, eager.runtime, onnx.onnx_failures) == (ONNXRUNTIME, TORCH, 0)
    for sizes in ([500], [3, 200, 1], [1]):  # one request, a merged batch of three, one row
        jobs = _jobs(sizes)
        got, want = onnx.score_batch(jobs), eager.score_batch(jobs)
        assert [len(x) for x in got] == sizes
        for g, w in zip(got, want, strict=True):
            assert g.dtype == np.float32
            np.testing.assert_allclose(g, w, atol=1e-5, rtol=0)


def test_the_runtime_is_onnx_on_the_cpu_torch_on_cuda_and_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(accel.RUNTIME_ENV, raising=False)
    assert ranker_runtime("cpu") == ONNXRUNTIME
    assert ranker_runtime("cuda") == TORCH
    assert plan_for("cpu").describe().startswith("cpu: DCN fp32 on onnxruntime")
    assert plan_for("cpu", TORCH).ranker_runtime == TORCH  # what a scorer whose export failed runs
    monkeypatch.setenv(accel.RUNTIME_ENV, "torch")
    assert ranker_runtime("cpu") == TORCH
    assert NeuralScorer(_model(), "cpu").runtime == TORCH


def test_without_onnxruntime_the_scorer_runs_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(accel.RUNTIME_ENV, raising=False)
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import fails, find_spec says absent
    assert ranker_runtime("cpu") == TORCH
    scorer = NeuralScorer(_model(), "cpu", runtime=ONNXRUNTIME)  # asked for, cannot: torch
    assert (scorer.runtime, scorer.onnx_failures) == (TORCH, 1)
    jobs = _jobs([50])
    np.testing.assert_allclose(
        scorer.score_batch(jobs)[0], NeuralScorer(_model(), "cpu", TORCH).score_batch(jobs)[0]
    )


def _failing_export(*_args: Any, **_kw: Any) -> OnnxRanker:
    raise RuntimeError("exporter: unsupported operator")


def test_a_failed_export_is_counted_and_torch_scores(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(OnnxRanker, "export", classmethod(_failing_export))
    scorer = NeuralScorer(_model(), "cpu", runtime=ONNXRUNTIME)
    assert (scorer.runtime, scorer.onnx_failures) == (TORCH, 1)
    assert (
        "no ONNX Runtime session (RuntimeError: exporter: unsupported operator); scoring with torch"
        in caplog.text
    )
    assert np.isfinite(scorer.score_batch(_jobs([20]))[0]).all()


class _BrokenSession:
    def run(self, *_args: Any) -> Any:
        raise RuntimeError("onnxruntime: bad allocation")


def test_a_failing_onnx_call_is_rescored_by_torch_and_dropped_after_repeated_failures() -> None:
    model = _model()
    scorer = NeuralScorer(model, "cpu", runtime=ONNXRUNTIME)
    assert scorer.onnx is not None
    scorer.onnx.session = _BrokenSession()
    jobs = _jobs([30, 5])
    want = NeuralScorer(model, "cpu", runtime=TORCH).score_batch(jobs)
    for call in range(1, ONNX_FAILURES_TO_DROP + 2):
        got = scorer.score_batch(jobs)
        for g, w in zip(got, want, strict=True):
            np.testing.assert_array_equal(g, w)
        assert scorer.onnx_failures == min(call, ONNX_FAILURES_TO_DROP)
    assert scorer.runtime == TORCH  # no longer tried after ONNX_FAILURES_TO_DROP failures in a row


def test_weights_changed_in_place_reach_the_session_after_compile() -> None:
    scorer = NeuralScorer(_model(), "cpu", runtime=ONNXRUNTIME)
    with torch.no_grad():
        for p in scorer.model.parameters():
            p.fill_(float("nan"))
    scorer.compile()
    with pytest.raises(FloatingPointError, match="non-finite scores"):
        scorer.score_batch(_jobs([4]))


def test_the_service_answers_with_the_neural_model_when_onnx_runtime_fails() -> None:
    # 2 user slots, 3 item slots (2 item columns + popularity)
    torch.manual_seed(0)
    scorer = NeuralScorer(DCNRanker(2, 3, embed_dim=2, cross_layers=1, deep=(4,)), "cpu", runtime=ONNXRUNTIME)
    assert scorer.onnx is not None
    scorer.onnx.session = _BrokenSession()
    art = type("A", (), {"version": "abc123abc123"})()
    loaded = LoadedModels(scorer, art, None, None, "cpu")
    with TestClient(
        create_app(ServingConfig(item_cache_ttl_s=0.0), REGISTRY, four_item_store(), loaded)
    ) as c:
        response = c.post("/v1/rank", json={"user_id": "u1", "candidates": ITEMS, "k": 3})
        health = c.get("/health").json()
    assert response.status_code == 200, response.text
    out = response.json()
    assert (out["fallback"], out["model_version"]) == (None, "abc123abc123")
    assert (health["ranker_runtime"], health["ranker_runtime_failures"]) == (ONNXRUNTIME, 1)
