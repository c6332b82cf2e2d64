"""The accelerator plan: what each model and the index run on, on a GPU and on the CPU.

One place decides the service's numeric path per device, so the engine, the funnel and the benchmarks
agree and a CPU run can say what a GPU run would do (issue 15: "GPU path ready"):

- **The DCN and the two towers** run their forward under fp16 autocast on CUDA (matmuls in half, the
  sums and the sigmoid in fp32: autocast keeps reductions in fp32, which a blanket ``.half()`` would
  not), fp32 on the CPU, where fp16 matmuls are slower than fp32 ones.
- **The DCN's runtime on the CPU** is ONNX Runtime when it is installed (the model is exported to ONNX
  at load, in memory; -44% of the DCN's CPU per call against torch, ``bench/bench_dcn_onnx.py``), torch
  otherwise and on CUDA. ``HEADWATER_RANKER_RUNTIME=torch`` forces torch. A failed export or a failed
  ORT call falls back to torch (logged and counted, never an error answer): ``ranking/onnx_scorer.py``.
- **The re-ranker** stays in fp32 on the device of the service: it sees 50 rows a request, so half
  precision saves nothing measurable and its attention softmax is the part fp16 rounds worst.
- **The ANN index** stays in host memory: usearch, chosen by the measured comparison (README), has no
  GPU index. A GPU index (faiss-gpu or cuVS CAGRA) would pay off at batch search, not at one user
  vector a request; the plan names it so the choice is visible, not silent.

:func:`precision` is the context every forward of the DCN and the towers runs in.
"""

from __future__ import annotations

import importlib.util
import os
from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict, dataclass
from typing import Any

import torch

INDEX_BACKEND = "usearch (host memory; it has no GPU index)"
"""Where the retrieval index lives on every device."""

ONNXRUNTIME = "onnxruntime"
TORCH = "torch"
RUNTIME_ENV = "HEADWATER_RANKER_RUNTIME"
"""Set to ``torch`` to keep the DCN on torch on the CPU (``onnxruntime`` is the default when installed)."""


@dataclass(frozen=True)
class AcceleratorPlan:
    """The numeric path of the service's models on ``device``."""

    device: str
    ranker: str
    """The DCN's forward: ``fp16 autocast`` or ``fp32``."""
    ranker_runtime: str
    """What runs the DCN: ``onnxruntime`` (CPU, when installed) or ``torch``."""
    towers: str
    """The two-tower forward (user embedding per request, item embeddings at index refresh)."""
    reranker: str
    index: str

    def as_dict(self) -> dict[str, Any]:
        """Return the plan as JSON-ready fields (benchmarks write it next to their figures)."""
        return asdict(self)

    def describe(self) -> str:
        """Return one line: the device and each part's path."""
        return (
            f"{self.device}: DCN {self.ranker} on {self.ranker_runtime}, towers {self.towers}, "
            f"re-ranker {self.reranker}, index {self.index}"
        )


def uses_half(device: str) -> bool:
    """Return whether the DCN and the towers run under fp16 autocast on ``device`` (CUDA only)."""
    return torch.device(device).type == "cuda"


def onnx_available() -> bool:
    """Return whether ONNX Runtime and the ``onnx`` package (torch's exporter needs it) are installed."""
    return all(importlib.util.find_spec(name) is not None for name in ("onnxruntime", "onnx"))


def ranker_runtime(device: str) -> str:
    """Return what runs the DCN on ``device``: ONNX Runtime on the CPU when installed, else torch.

    On CUDA torch stays (fp16 autocast; ORT's CUDA provider is not installed).
    ``HEADWATER_RANKER_RUNTIME=torch`` forces torch on the CPU too.
    """
    if uses_half(device) or os.environ.get(RUNTIME_ENV, "").strip().lower() == TORCH:
        return TORCH
    return ONNXRUNTIME if onnx_available() else TORCH


def plan_for(device: str, runtime: str | None = None) -> AcceleratorPlan:
    """Return the plan of ``device`` (``cpu``, ``cuda``, ``cuda:N``), whether or not one is present.

    ``runtime``: what actually runs the DCN (a scorer whose export failed runs torch); default: what
    :func:`ranker_runtime` would choose here.
    """
    half = "fp16 autocast" if uses_half(device) else "fp32"
    return AcceleratorPlan(
        device=device,
        ranker=half,
        ranker_runtime=runtime or ranker_runtime(device),
        towers=half,
        reranker="fp32",
        index=INDEX_BACKEND,
    )


def precision(device: str | torch.device) -> AbstractContextManager[Any]:
    """Return the context a DCN or tower forward runs in on ``device``: fp16 autocast on CUDA, else none."""
    dev = torch.device(device)
    if dev.type == "cuda":
        return torch.autocast(device_type="cuda", dtype=torch.float16)
    return nullcontext()


def accelerator_report(device: str, runtime: str | None = None) -> dict[str, Any]:
    """Return what the service uses on ``device`` and, on a CPU, what it would use on a GPU.

    ``{"device", "gpu_present", "plan", "on_gpu"}``: ``on_gpu`` is the CUDA plan when this run is on the
    CPU (a benchmark on a machine without a GPU says what the same run would do with one), else null.
    """
    on_cpu = not uses_half(device)
    return {
        "device": device,
        "gpu_present": torch.cuda.is_available(),
        "plan": plan_for(device, runtime).as_dict(),
        "on_gpu": plan_for("cuda").as_dict() if on_cpu else None,
    }
