"""Retrieval: from the whole catalog to a few hundred candidates for the ranker (issue 15 item 3).

* :mod:`.towers`: the two-tower model (user tower, item tower, one unit-norm space) trained from
  the ranker's point-in-time training set with in-batch sampled softmax.
* :mod:`.artifact`: its versioned, pickle-free artifact (``two_tower-<content hash>.pt``).
* :mod:`.index`: the item-embedding index (usearch HNSW, chosen by ``bench/bench_ann.py``) and an
  exact index for recall checks.
* :mod:`.refresh`: the index built from the online item vectors in Redis and refreshed
  incrementally (only items whose write time changed are re-embedded; gone items are removed).
* :mod:`.retriever`: the ``Retriever`` interface, ``retrieve(user_vector, n, exclude)``.
* :mod:`.runtime`: all of it loaded and bound to the applied registry in one call, refreshed on a
  background thread (what ``/v1/recommend`` will hold).
"""

from headwater.serving.retrieval.artifact import TowerArtifact, load_towers, save_towers
from headwater.serving.retrieval.index import ExactIndex, ItemIndex, ItemIndexError, recall_at_k
from headwater.serving.retrieval.refresh import IndexRefresher, RefreshReport, StoreItemSource
from headwater.serving.retrieval.retriever import Retriever, TwoTowerRetriever
from headwater.serving.retrieval.runtime import RetrievalRuntime, load_retrieval
from headwater.serving.retrieval.towers import TowerOptions, TowerReport, TwoTowerModel, train_two_tower

__all__ = [
    "ExactIndex",
    "IndexRefresher",
    "ItemIndex",
    "ItemIndexError",
    "RefreshReport",
    "RetrievalRuntime",
    "Retriever",
    "StoreItemSource",
    "TowerArtifact",
    "TowerOptions",
    "TowerReport",
    "TwoTowerModel",
    "TwoTowerRetriever",
    "load_retrieval",
    "load_towers",
    "recall_at_k",
    "save_towers",
    "train_two_tower",
]
