"""The DCN for one /v1/rank-sized job: torch vs ONNX Runtime, whole rows vs the user's share once.

Usage: .venv/bin/python bench/bench_dcn_onnx.py [--work DIR] [--rows 500] [--calls 100] [--rounds 8]

``--work``: a ``bench_recommend.py --work`` folder (its ``state`` and trained ``models``): the
service's own DCN; without it a DCN of the registry's shape with its initial weights (the time is
the same, the weights do not change the work). Four ways, each timed in ``--rounds`` interleaved
rounds of ``--calls`` calls (CPU time of this process; min and median of the rounds are reported,
the machine is shared):

- ``torch_rows``: torch, the network as written (every layer over every row's whole input): before;
- ``torch_shared``: torch, the first cross and deep layers' user share once (``DCNRanker.forward_shared``);
- ``ort_rows``: ONNX Runtime, the network as written;
- ``ort_shared``: ONNX Runtime, the user's share once: what the service runs on the CPU
  (``NeuralScorer`` with ``onnxruntime``, ``ranking/onnx_scorer.py``).

All with one intra-op thread, as the service runs on 2 cores. Every way's scores must agree with
``torch_rows`` to 1e-5. Writes bench/results/bench_dcn_onnx.json.
"""

from __future__ import annotations

import argparse
import copy
import functools
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_serve import ROOT, apply_registry

from headwater.ranking.accel import ONNXRUNTIME, TORCH
from headwater.ranking.features import load_registry
from headwater.ranking.model import DCNRanker, NeuralScorer
from headwater.serving.config import ServingConfig


def _score(scorer: NeuralScorer, job: list[tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
    return scorer.score_batch(job)[0]


def cpu_rounds(fns: dict[str, Any], calls: int, rounds: int) -> dict[str, list[float]]:
    """CPU ms per call of each of ``fns``, per round; the ways interleaved so load drifts hit all alike."""
    out: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            for _ in range(5):
                fn()
            t0 = time.process_time()
            for _ in range(calls):
                fn()
            out[name].append((time.process_time() - t0) * 1000.0 / calls)
    return out


def main() -> None:
    """Load or build the DCN, time the four ways, compare the scores, write the JSON."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, default=None)
    ap.add_argument("--rows", type=int, default=500)
    ap.add_argument("--calls", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "bench_dcn_onnx.json")
    args = ap.parse_args()
    try:
        import onnxruntime as ort
    except ImportError:
        raise SystemExit(
            "onnxruntime is not installed: pip install onnxruntime==1.31.1 onnx==1.17.0"
        ) from None
    torch.set_num_threads(1)
    source = "initial weights"
    if args.work is not None and (args.work / "models" / "latest.json").exists():
        from headwater.serving.runtime import load_models

        registry = load_registry(args.work / "state", ServingConfig().popularity)
        loaded = load_models(args.work / "models", registry, "cpu")
        if loaded.neural is None:
            raise SystemExit(f"no DCN in {args.work / 'models'}")
        model = loaded.neural.model
        source = f"trained {loaded.models().neural_version}"
    else:
        state = Path("/tmp") / "headwater-bench-dcn-state"
        if not state.exists():
            apply_registry(state)
        registry = load_registry(state, ServingConfig().popularity)
        model = DCNRanker(registry.user.dim, registry.item.dim).eval()
    rng = np.random.default_rng(0)
    user = rng.normal(size=(1, model.user_dim)).astype(np.float32)
    items = rng.normal(size=(args.rows, model.item_dim)).astype(np.float32)
    # "rows": the same weights with the whole network per row (the shared path replaced by it)
    rows_model = copy.deepcopy(model)
    rows_model.forward_shared = rows_model.forward_rows  # type: ignore[method-assign]
    scorers = {
        "torch_rows": NeuralScorer(rows_model, "cpu", runtime=TORCH),
        "torch_shared": NeuralScorer(model, "cpu", runtime=TORCH),
        "ort_rows": NeuralScorer(rows_model, "cpu", runtime=ONNXRUNTIME),
        "ort_shared": NeuralScorer(model, "cpu", runtime=ONNXRUNTIME),
    }
    if scorers["ort_shared"].onnx is None or scorers["ort_rows"].onnx is None:
        raise SystemExit("the ONNX export failed (see the log above)")
    job = [(user[0], items)]
    ways: dict[str, Any] = {name: functools.partial(_score, scorer, job) for name, scorer in scorers.items()}
    torch_rows = ways["torch_rows"]
    reference = torch_rows().reshape(-1)
    diffs = {name: float(np.abs(np.asarray(fn()).reshape(-1) - reference).max()) for name, fn in ways.items()}
    rounds = cpu_rounds(ways, args.calls, args.rounds)
    summary = {
        name: {"min_ms": round(min(v), 4), "median_ms": round(statistics.median(v), 4)}
        for name, v in rounds.items()
    }
    base = summary["torch_rows"]["median_ms"]
    for v in summary.values():
        v["vs_torch_rows_median"] = f"{100.0 * (v['median_ms'] / base - 1.0):+.0f}%"
    result = {
        "benchmark": "dcn_onnx",
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "model": source,
        "rows": args.rows,
        "user_dim": model.user_dim,
        "item_dim": model.item_dim,
        "torch": torch.__version__,
        "onnxruntime": ort.__version__,
        "cpu_ms_per_call": summary,
        "max_abs_score_diff_vs_torch_rows": diffs,
        "agree_1e-5": all(d <= 1e-5 for d in diffs.values()),
        "load_avg_1m": round(os.getloadavg()[0], 2),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
    }
    print(json.dumps(result, indent=2))
    args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
