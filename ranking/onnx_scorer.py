"""The DCN on ONNX Runtime: exported from the loaded torch model, in memory, when the service loads it.

On the CPU ONNX Runtime runs the DCN's forward with about 40% less CPU than torch for a 500-row job
(``bench/bench_dcn_onnx.py``: fewer framework calls per operator, constant-folded weight slices).
The export is done at model load from the weights in the artifact, so every artifact ever trained
stays loadable and nothing new is stored beside it; it takes a fraction of a second.

The exported graph is :meth:`DCNRanker.forward_shared` followed by the sigmoid: the user's share of
the first cross and deep layers is computed once per user (a merged batch holds each user once), and
the output is the score. Inputs: ``users`` (R, user_dim) float32, ``items`` (B, item_dim) float32,
``index`` (B,) int64 (the row's user); output ``scores`` (B,).

torch's exporter (TorchScript, ``dynamo=False``) needs the ``onnx`` package even for a model without
custom functions (torch 2.15 imports it to merge onnxscript functions into the proto); ``onnx==1.17.0``
is the newest that accepts protobuf 5 (1.23 wants protobuf >= 6.31, which grpcio-tools and
apache-beam refuse).
"""

from __future__ import annotations

import io
import logging
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

import numpy as np
import numpy.typing as npt
import torch
from torch import Tensor, nn

from headwater.ranking.accel import ONNXRUNTIME, TORCH

if TYPE_CHECKING:  # model.py and funnel/reranker.py import this module
    from headwater.ranking.model import DCNRanker
    from headwater.ranking.reranker import SequenceReranker

INPUTS = ("users", "items", "index")
OPSET = 17
ONNX_FAILURES_TO_DROP = 3
"""After this many failed ONNX Runtime calls in a row, torch runs the module from then on."""

log = logging.getLogger(__name__)
S = TypeVar("S")
T = TypeVar("T")


class OnnxBacked(Generic[S]):
    """A module run by ONNX Runtime on the CPU, with torch behind it: what runs it, what a failure costs.

    The ranker (:class:`~headwater.ranking.model.NeuralScorer`) and the retrieval user tower
    (:class:`~headwater.serving.retrieval.retriever.TwoTowerRetriever`) are both. ORT runs the module
    when it is the requested runtime (``HEADWATER_RANKER_RUNTIME``,
    :func:`~headwater.ranking.accel.ranker_runtime`) and the device is a CPU; torch on CUDA. A failed
    export or call is logged and counted in ``onnx_failures`` (``/health`` shows it) and torch runs
    instead, so a failure is never an error answer; after :data:`ONNX_FAILURES_TO_DROP` failed calls
    in a row the session is dropped and torch runs from then on.
    """

    onnx_module: ClassVar[str]
    """The module's name in the log."""
    onnx_torch_does: ClassVar[str]
    """What torch does instead, for the log."""
    device: torch.device

    def _onnx_init(self, requested_runtime: str) -> None:
        self.requested_runtime = requested_runtime
        self.onnx: S | None = None
        self.onnx_failures = 0
        self._onnx_failing = 0

    @property
    def runtime(self) -> str:
        """What runs the next call: ``onnxruntime`` or ``torch``."""
        return ONNXRUNTIME if self.onnx is not None else TORCH

    def _onnx_build(self, export: Callable[[], S]) -> None:
        """Drop the session, then export a new one when ORT is the runtime (requested, on a CPU)."""
        self.onnx = None
        self._onnx_failing = 0
        if self.requested_runtime != ONNXRUNTIME or self.device.type != "cpu":
            return
        try:
            self.onnx = export()
        except Exception as exc:  # any exporter or session error: torch runs the module
            self.onnx_failures += 1
            log.warning("%s: no ONNX Runtime session (%s: %s); %s", self.onnx_module, type(exc).__name__, exc,
                        self.onnx_torch_does)  # fmt: skip

    def _onnx_call(self, run: Callable[[S], T]) -> T | None:
        """Return ``run(session)``, or None when torch must run it (no session, or this call failed)."""
        session = self.onnx
        if session is None:
            return None
        try:
            out = run(session)
        except Exception as exc:  # the caller runs torch; dropped after repeated failures
            self.onnx_failures += 1
            self._onnx_failing += 1
            log.warning("%s: ONNX Runtime failed (%s: %s); %s", self.onnx_module, type(exc).__name__, exc,
                        self.onnx_torch_does)  # fmt: skip
            if self._onnx_failing >= ONNX_FAILURES_TO_DROP:
                log.error("%s: ONNX Runtime failed %d times in a row; staying on torch", self.onnx_module,
                          self._onnx_failing)  # fmt: skip
                self.onnx = None
            return None
        self._onnx_failing = 0
        return out


class _Scores(nn.Module):
    """What is exported: the DCN's per-user-shared forward and the sigmoid."""

    def __init__(self, model: DCNRanker) -> None:
        super().__init__()
        self.model = model

    def forward(self, users: Tensor, items: Tensor, index: Tensor) -> Tensor:
        return torch.sigmoid(self.model.forward_shared(users, items, index))


class OnnxRanker:
    """An ONNX Runtime session of a :class:`~headwater.ranking.model.DCNRanker`'s scores."""

    def __init__(self, session: Any, size_bytes: int) -> None:
        self.session = session
        self.size_bytes = size_bytes

    @classmethod
    def export(cls, model: DCNRanker, threads: int = 1) -> OnnxRanker:
        """Export ``model`` (a DCNRanker on the CPU) and open a session with ``threads`` intra-op threads.

        Raises:
            ImportError: onnxruntime or onnx is not installed.
            Exception: whatever the exporter or the session raises (the caller falls back to torch).
        """
        import onnxruntime as ort

        user_dim, item_dim = int(model.user_dim), int(model.item_dim)
        example = (torch.zeros(1, user_dim), torch.zeros(2, item_dim), torch.zeros(2, dtype=torch.int64))
        axes = {"users": {0: "users"}, "items": {0: "rows"}, "index": {0: "rows"}, "scores": {0: "rows"}}
        data = _export(_Scores(model), example, list(INPUTS), "scores", axes)
        return cls(_session(ort, data, threads), len(data))

    def scores(
        self, users: npt.NDArray[np.float32], items: npt.NDArray[np.float32], index: npt.NDArray[np.int64]
    ) -> npt.NDArray[np.float32]:
        """Scores (B,) of ``items`` for ``users[index]``."""
        out = self.session.run(None, {"users": users, "items": items, "index": index})[0]
        return np.asarray(out, dtype=np.float32).reshape(-1)


def _export(
    module: nn.Module,
    example: tuple[Tensor, ...],
    inputs: list[str],
    output: str,
    axes: dict[str, dict[int, str]],
) -> bytes:
    """Return ``module`` (in eval mode, on the CPU) as an ONNX model, with the ``axes`` left dynamic."""
    buf = io.BytesIO()
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation and tracer notices
        torch.onnx.export(
            module.eval(),
            example,
            buf,  # type: ignore[arg-type]  # a file object works; the stub names paths only
            dynamo=False,
            opset_version=OPSET,
            input_names=inputs,
            output_names=[output],
            dynamic_axes=axes,
        )
    return buf.getvalue()


def _session(ort: Any, data: bytes, threads: int) -> Any:
    """Open an ONNX Runtime CPU session of ``data`` with ``threads`` intra-op threads, none spinning."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = max(1, threads)
    options.inter_op_num_threads = 1
    options.log_severity_level = 3  # errors only: the session's info lines would flood the service log
    # the service's cores are shared with the event loop: no busy-waiting pool threads
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])


class OnnxTower:
    """An ONNX Runtime session of one two-tower tower: raw vectors (n, in_dim) to unit-norm embeddings.

    The retrieval stage embeds one user per request; torch spends ~0.19 ms of framework calls on that
    one-row MLP, ONNX Runtime ~0.05 ms (same embeddings to 1e-7; ``tests/unit/serving/retrieval``).
    """

    def __init__(self, session: Any, size_bytes: int) -> None:
        self.session = session
        self.size_bytes = size_bytes

    @classmethod
    def export(cls, tower: nn.Module, in_dim: int, threads: int = 1) -> OnnxTower:
        """Export ``tower`` (on the CPU) and open a session; raises what the exporter or ORT raises."""
        import onnxruntime as ort

        axes = {"vectors": {0: "rows"}, "embeddings": {0: "rows"}}
        data = _export(tower, (torch.zeros(1, in_dim),), ["vectors"], "embeddings", axes)
        return cls(_session(ort, data, threads), len(data))

    def embed(self, vectors: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        """Embeddings (n, embed_dim) of raw ``vectors`` (n, in_dim)."""
        out = self.session.run(None, {"vectors": np.ascontiguousarray(vectors, dtype=np.float32)})[0]
        return np.asarray(out, dtype=np.float32)


class _Rerank(nn.Module):
    """What is exported of the re-ranker: ``SequenceReranker.forward_one`` and the sigmoid."""

    def __init__(self, model: SequenceReranker) -> None:
        super().__init__()
        self.model = model

    def forward(self, candidates: Tensor, logit: Tensor, clicks: Tensor) -> Tensor:
        return torch.sigmoid(self.model.forward_one(candidates, logit, clicks))


class OnnxReranker:
    """An ONNX Runtime session of the funnel's sequence re-ranker for one request.

    The re-rank stage runs on the event loop for ~50 candidates and up to 20 clicks; torch spends most
    of its ~0.5 ms there on framework calls (the attention module's Python), ONNX Runtime a fraction
    and releases the GIL meanwhile (same scores to 1e-5; ``tests/unit/serving/funnel``).
    Inputs: ``candidates`` (C, F), ``logit`` (C,) the DCN's logits, ``clicks`` (L, F); output (C,).
    """

    def __init__(self, session: Any, size_bytes: int) -> None:
        self.session = session
        self.size_bytes = size_bytes

    @classmethod
    def export(cls, model: SequenceReranker, item_dim: int, threads: int = 1) -> OnnxReranker:
        """Export ``model`` (a SequenceReranker on the CPU); raises what the exporter or ORT raises."""
        import onnxruntime as ort

        example = (torch.zeros(3, item_dim), torch.zeros(3), torch.zeros(2, item_dim))
        axes = {
            "candidates": {0: "rows"},
            "logit": {0: "rows"},
            "clicks": {0: "clicks"},
            "scores": {0: "rows"},
        }
        data = _export(_Rerank(model), example, ["candidates", "logit", "clicks"], "scores", axes)
        return cls(_session(ort, data, threads), len(data))

    def scores(
        self,
        candidates: npt.NDArray[np.float32],
        logit: npt.NDArray[np.float32],
        clicks: npt.NDArray[np.float32],
    ) -> npt.NDArray[np.float32]:
        """Probabilities (C,) of one request's candidates."""
        feed = {"candidates": candidates, "logit": logit, "clicks": clicks}
        return np.asarray(self.session.run(None, feed)[0], dtype=np.float32).reshape(-1)
