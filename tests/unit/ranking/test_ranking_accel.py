"""The accelerator plan: fp16 autocast for the DCN and the towers on CUDA only, and fp16 keeps the ranking.

No GPU is needed: the fp16 test runs the same autocast policy on the CPU (``torch.autocast("cpu",
float16)``) through the scorer's own ``precision`` hook, so it checks that the DCN's numerics survive
half precision (standardised inputs clamped to +-8, no overflow) and that the order barely moves.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from headwater.ranking import model as model_module
from headwater.ranking.accel import accelerator_report, plan_for, precision, uses_half
from headwater.ranking.model import DCNRanker, NeuralScorer


def test_the_plan_uses_fp16_autocast_on_cuda_only() -> None:
    assert (plan_for("cpu").ranker, plan_for("cpu").towers) == ("fp32", "fp32")
    for device in ("cuda", "cuda:1"):
        plan = plan_for(device)
        assert (plan.ranker, plan.towers, plan.reranker) == ("fp16 autocast", "fp16 autocast", "fp32")
        assert uses_half(device)
    assert "usearch" in plan_for("cuda").index
    assert plan_for("cuda").describe().startswith("cuda: DCN fp16 autocast")


def test_a_cpu_run_reports_what_it_would_use_on_a_gpu() -> None:
    report = accelerator_report("cpu")
    assert report["plan"]["ranker"] == "fp32"
    assert report["on_gpu"] is not None
    assert report["on_gpu"]["ranker"] == "fp16 autocast"
    assert accelerator_report("cuda")["on_gpu"] is None


def test_precision_is_no_context_on_the_cpu() -> None:
    with precision("cpu"):
        assert not torch.is_autocast_enabled("cpu")


def _scores(monkeypatch: pytest.MonkeyPatch, half: bool, jobs: list[Any]) -> list[np.ndarray]:
    torch.manual_seed(0)
    dcn = DCNRanker(user_dim=6, item_dim=5)
    if half:
        monkeypatch.setattr(model_module, "precision", lambda _d: torch.autocast("cpu", dtype=torch.float16))
    return NeuralScorer(dcn, "cpu", runtime="torch").score_batch(jobs)  # autocast is a torch path


def test_the_dcn_under_fp16_autocast_keeps_scores_and_order(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(3)
    users = rng.normal(0, 1, (4, 6)).astype(np.float32)
    jobs = [(user, rng.normal(0, 1, (500, 5)).astype(np.float32)) for user in users]
    jobs[0][1][:5] = 1e6  # outliers: standardisation clamps them, fp16 must not overflow
    full = _scores(monkeypatch, False, jobs)
    half = _scores(monkeypatch, True, jobs)
    for f, h in zip(full, half, strict=True):
        assert np.isfinite(h).all()
        np.testing.assert_allclose(h, f, atol=5e-3)
        top_f, top_h = set(np.argsort(-f)[:50]), set(np.argsort(-h)[:50])
        assert len(top_f & top_h) >= 45  # fp16 rounding may swap near-ties at the edge, no more
