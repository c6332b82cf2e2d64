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

from headwater.serving.retrieval.index import ItemIndexLike
from headwater.serving.retrieval.towers import TwoTowerModel


class Retriever(Protocol):
    """Candidates for one user from the whole catalog."""

    def retrieve(
        self, user_vector: npt.NDArray[np.float32], n: int, exclude: Collection[str] = ()
    ) -> tuple[list[str], npt.NDArray[np.float32]]:
        """Return the ``n`` best item ids for ``user_vector`` and their scores, best first, no ``exclude``."""
        ...


class TwoTowerRetriever:
    """User tower, then a maximum-inner-product search of the item index."""

    def __init__(
        self,
        model: TwoTowerModel,
        index: ItemIndexLike,
        user_columns: npt.NDArray[np.intp] | None = None,
    ) -> None:
        """``user_columns``: the model's user inputs as columns of the registry's vector, or None."""
        self.model = model
        self.index = index
        self.user_columns = user_columns

    def retrieve(
        self, user_vector: npt.NDArray[np.float32], n: int, exclude: Collection[str] = ()
    ) -> tuple[list[str], npt.NDArray[np.float32]]:
        """Return the ``n`` best items by the towers' inner product (a cosine in [-1, 1])."""
        user = np.asarray(user_vector, dtype=np.float32).reshape(1, -1)
        if self.user_columns is not None:
            user = user[:, self.user_columns]
        query = self.model.embed_users(user)[0]
        return self.index.search(query, n, exclude)
