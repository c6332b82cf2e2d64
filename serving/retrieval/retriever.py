"""The retrieval stage's interface and its two-tower implementation.

A :class:`Retriever` narrows the whole catalog to ``n`` candidates for one user:
``retrieve(user_vector, n, exclude) -> (ids, scores)``, best first. The two-tower retriever
embeds the user's vector (the registry's user views, as the ranker reads them) with the user
tower and searches the item index kept fresh by :class:`~headwater.serving.retrieval.refresh.IndexRefresher`.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Protocol

import numpy as np
import numpy.typing as npt
import torch

from headwater.ranking.accel import ranker_runtime
from headwater.ranking.onnx_scorer import OnnxBacked, OnnxTower
from headwater.ranking.towers import TwoTowerModel
from headwater.serving.retrieval.index import ItemIndexLike


class Retriever(Protocol):
    """Candidates for one user from the whole catalog."""

    def retrieve(
        self, user_vector: npt.NDArray[np.float32], n: int, exclude: Collection[str] = ()
    ) -> tuple[list[str], npt.NDArray[np.float32]]:
        """Return the ``n`` best item ids for ``user_vector`` and their scores, best first, no ``exclude``."""
        ...


class TwoTowerRetriever(OnnxBacked[OnnxTower]):
    """User tower, then a maximum-inner-product search of the item index.

    On the CPU the user tower runs on ONNX Runtime when it is installed (exported from the loaded
    weights at construction, :class:`~headwater.ranking.onnx_scorer.OnnxTower`), else and on CUDA on
    torch (``runtime`` overrides :func:`~headwater.ranking.accel.ranker_runtime`, so
    ``HEADWATER_RANKER_RUNTIME=torch`` sets both models). A failed export or ORT call is logged and
    counted in ``onnx_failures`` and torch embeds the user; after 3 failed calls in a row it stays on torch.
    """

    onnx_module = "user tower"
    onnx_torch_does = "embedding with torch"

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
        self._onnx_init(runtime or ranker_runtime(str(self.device)))
        self.compile()

    def compile(self) -> None:
        """(Re)build the ONNX Runtime session of the user tower from its current weights, when ORT runs it."""
        tower, dim = self.model.user_tower, self.model.user_dim
        self._onnx_build(lambda: OnnxTower.export(tower, dim, torch.get_num_threads()))

    def embed_user(self, user: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        """Unit-norm embeddings of raw user vectors (n, user_dim) in the model's column order."""
        out = self._onnx_call(lambda session: session.embed(user))
        return self.model.embed_users(user) if out is None else out

    def retrieve(
        self, user_vector: npt.NDArray[np.float32], n: int, exclude: Collection[str] = ()
    ) -> tuple[list[str], npt.NDArray[np.float32]]:
        """Return the ``n`` best items by the towers' inner product (a cosine in [-1, 1])."""
        user = np.asarray(user_vector, dtype=np.float32).reshape(1, -1)
        if self.user_columns is not None:
            user = user[:, self.user_columns]
        query = self.embed_user(user)[0]
        return self.index.search(query, n, exclude)
