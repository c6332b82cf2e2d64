"""The retrieval stage's interface and its two-tower implementation.

A :class:`Retriever` narrows the whole catalog to ``n`` candidates for one user:
``retrieve(user_vector, n, exclude) -> (ids, scores)``, best first. The two-tower retriever
embeds the user's vector (the registry's user views, as the ranker reads them) with the user
tower and searches the item index kept fresh by :class:`~headwater.serving.retrieval.refresh.IndexRefresher`.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from typing import Protocol

import numpy as np
import numpy.typing as npt
import torch

from headwater.serving.accel import ONNXRUNTIME, TORCH, ranker_runtime
from headwater.serving.onnx_scorer import OnnxTower
from headwater.serving.retrieval.index import ItemIndexLike
from headwater.serving.retrieval.towers import TwoTowerModel

log = logging.getLogger(__name__)
ONNX_FAILURES_TO_DROP = 3
"""Failed ORT calls in a row after which the user tower stays on torch (as the DCN's scorer does)."""


class Retriever(Protocol):
    """Candidates for one user from the whole catalog."""

    def retrieve(
        self, user_vector: npt.NDArray[np.float32], n: int, exclude: Collection[str] = ()
    ) -> tuple[list[str], npt.NDArray[np.float32]]:
        """Return the ``n`` best item ids for ``user_vector`` and their scores, best first, no ``exclude``."""
        ...


class TwoTowerRetriever:
    """User tower, then a maximum-inner-product search of the item index.

    On the CPU the user tower runs on ONNX Runtime when it is installed (exported from the loaded
    weights at construction, :class:`~headwater.serving.onnx_scorer.OnnxTower`), else and on CUDA on
    torch (``runtime`` overrides :func:`~headwater.serving.accel.ranker_runtime`, so
    ``HEADWATER_RANKER_RUNTIME=torch`` sets both models). A failed export or ORT call is logged and
    counted in ``onnx_failures`` and torch embeds the user; after 3 failed calls in a row it stays on torch.
    """

    def __init__(
        self,
        model: TwoTowerModel,
        index: ItemIndexLike,
        user_columns: npt.NDArray[np.intp] | None = None,
        runtime: str | None = None,
    ) -> None:
        """``user_columns``: the model's user inputs as columns of the registry's vector, or None."""
        self.model = model
        self.index = index
        self.user_columns = user_columns
        self.device = next(model.parameters()).device
        self.requested_runtime = runtime or ranker_runtime(str(self.device))
        self.onnx: OnnxTower | None = None
        self.onnx_failures = 0
        self._failing = 0
        self.compile()

    @property
    def runtime(self) -> str:
        """What embeds the next user: ``onnxruntime`` or ``torch``."""
        return ONNXRUNTIME if self.onnx is not None else TORCH

    def compile(self) -> None:
        """(Re)build the ONNX Runtime session of the user tower from its current weights, when ORT runs it."""
        self.onnx = None
        self._failing = 0
        if self.requested_runtime != ONNXRUNTIME or self.device.type != "cpu":
            return
        try:
            self.onnx = OnnxTower.export(self.model.user_tower, self.model.user_dim, torch.get_num_threads())
        except Exception as exc:  # any export or session failure: torch embeds
            self.onnx_failures += 1
            log.warning(
                "user tower: no ONNX Runtime session (%s: %s); embedding with torch", type(exc).__name__, exc
            )

    def embed_user(self, user: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        """Unit-norm embeddings of raw user vectors (n, user_dim) in the model's column order."""
        session = self.onnx
        if session is not None:
            try:
                out = session.embed(user)
            except Exception as exc:  # a failed call is embedded by torch, never an error answer
                self.onnx_failures += 1
                self._failing += 1
                log.warning(
                    "user tower: ONNX Runtime failed (%s: %s); embedded by torch", type(exc).__name__, exc
                )
                if self._failing >= ONNX_FAILURES_TO_DROP:
                    log.error(
                        "user tower: ONNX Runtime failed %d times in a row; staying on torch", self._failing
                    )
                    self.onnx = None
            else:
                self._failing = 0
                return out
        return self.model.embed_users(user)

    def retrieve(
        self, user_vector: npt.NDArray[np.float32], n: int, exclude: Collection[str] = ()
    ) -> tuple[list[str], npt.NDArray[np.float32]]:
        """Return the ``n`` best items by the towers' inner product (a cosine in [-1, 1])."""
        user = np.asarray(user_vector, dtype=np.float32).reshape(1, -1)
        if self.user_columns is not None:
            user = user[:, self.user_columns]
        query = self.embed_user(user)[0]
        return self.index.search(query, n, exclude)
