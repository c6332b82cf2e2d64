"""The DCN's forward for one /v1/rank-sized job: torch against ONNX Runtime, CPU per call and agreement.

Usage: .venv/bin/python bench/bench_dcn_onnx.py [--work DIR] [--rows 500] [--calls 400]

``--work``: a ``bench_recommend.py --work`` folder (its ``state`` and trained ``models``): the
service's own DCN; without it a DCN of the registry's shape with its initial weights (the time is
the same, the weights do not change the work). The model is exported with torch's ONNX exporter
(``onnx`` must be installed: ``pip install --no-deps onnx==1.17.0`` keeps protobuf 5, which
grpcio-tools and apache-beam need) and run with one intra-op thread in both runtimes, as the
service runs torch (``configure_torch_threads`` on 2 cores). The scores must agree to 1e-5.
Writes bench/results/bench_dcn_onnx.json. ONNX Runtime is not a dependency of the project: the
script says so and stops when it is missing.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_serve import ROOT, apply_registry

from headwater.serving.config import ServingConfig
from headwater.serving.model import DCNRanker, NeuralScorer
from headwater.serving.registry import load_registry


def cpu_per_call(fn: Any, calls: int) -> float:
    """Mean CPU seconds (this process, all threads) of ``fn()`` over ``calls`` calls after 20 warm-ups."""
    for _ in range(20):
        fn()
    t0 = time.process_time()
    for _ in range(calls):
        fn()
    return (time.process_time() - t0) / calls


def main() -> None:
    """Load or build the DCN, time both runtimes, compare the scores, write the JSON."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, default=None)
    ap.add_argument("--rows", type=int, default=500)
    ap.add_argument("--calls", type=int, default=400)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "bench_dcn_onnx.json")
    args = ap.parse_args()
    try:
        import onnxruntime as ort
    except ImportError:
        raise SystemExit("onnxruntime is not installed: pip install onnxruntime==1.31.1") from None
    torch.set_num_threads(1)
    source = "initial weights"
    if args.work is not None and (args.work / "models" / "latest.json").exists():
        from headwater.serving.runtime import load_models

        registry = load_registry(args.work / "state", ServingConfig().popularity)
        loaded = load_models(args.work / "models", registry, "cpu")
        if loaded.neural is None:
            raise SystemExit(f"no DCN in {args.work / 'models'}")
        scorer = loaded.neural
        source = f"trained {loaded.models().neural_version}"
    else:
        state = Path("/tmp") / "headwater-bench-dcn-state"
        if not state.exists():
            apply_registry(state)
        registry = load_registry(state, ServingConfig().popularity)
        scorer = NeuralScorer(DCNRanker(registry.user.dim, registry.item.dim), "cpu")
    model = scorer.model
    rng = np.random.default_rng(0)
    user = rng.normal(size=(1, model.user_dim)).astype(np.float32)
    items = rng.normal(size=(args.rows, model.item_dim)).astype(np.float32)
    index = np.zeros(args.rows, dtype=np.int64)
    buf = io.BytesIO()
    torch.onnx.export(
        model, (torch.from_numpy(user), torch.from_numpy(items), torch.from_numpy(index)), buf,
        dynamo=False, input_names=["users", "items", "index"], output_names=["logits"],
        dynamic_axes={"users": {0: "u"}, "items": {0: "n"}, "index": {0: "n"}, "logits": {0: "n"}},
    )  # fmt: skip
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(buf.getvalue(), options, providers=["CPUExecutionProvider"])
    feeds = {"users": user, "items": items, "index": index}

    def with_ort() -> np.ndarray:
        logits = session.run(None, feeds)[0]
        return 1.0 / (1.0 + np.exp(-logits))

    def with_torch() -> np.ndarray:
        return scorer.score_batch([(user[0], items)])[0]

    diff = float(np.abs(with_ort().reshape(-1) - with_torch().reshape(-1)).max())
    torch_s = cpu_per_call(with_torch, args.calls)
    ort_s = cpu_per_call(with_ort, args.calls)
    result = {
        "benchmark": "dcn_onnx",
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "model": source,
        "rows": args.rows,
        "user_dim": model.user_dim,
        "item_dim": model.item_dim,
        "torch": torch.__version__,
        "onnxruntime": ort.__version__,
        "torch_cpu_ms_per_call": round(torch_s * 1000, 4),
        "onnxruntime_cpu_ms_per_call": round(ort_s * 1000, 4),
        "max_abs_score_diff": diff,
        "agree_1e-5": diff <= 1e-5,
        "load_avg_1m": round(os.getloadavg()[0], 2),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
    }
    print(json.dumps(result, indent=2))
    args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
