"""Retrieval: from the whole catalog to a few hundred candidates for the ranker (issue 15 item 3).

* :mod:`headwater.ranking.towers`: the two-tower model (user tower, item tower, one unit-norm space)
  trained from the ranker's point-in-time training set with in-batch sampled softmax (re-exported here).
* :mod:`headwater.ranking.tower_artifact`: its versioned, pickle-free artifact
  (``two_tower-<content hash>.pt``; re-exported here).
* :mod:`.index`: the item-embedding index (usearch HNSW, chosen by ``bench/bench_ann.py``) and an
  exact index for recall checks.
* :mod:`.refresh`: the index built from the online item vectors in Redis and refreshed
  incrementally (only items whose write time changed are re-embedded; gone items are removed).
* :mod:`.retriever`: the ``Retriever`` interface, ``retrieve(user_vector, n, exclude)``.
* :mod:`.runtime`: all of it loaded and bound to the applied registry in one call, refreshed on a
  background thread (what ``/v1/recommend`` will hold).
"""

from __future__ import annotations

import importlib
from typing import Any

# Exports load on first use: `headwater --help` imports this package for its `retrieval` command
# and must not pay for torch and usearch (about 2 s) unless a retrieval command runs.
_HOME = {
    "TowerArtifact": "headwater.ranking.tower_artifact", "load_towers": "headwater.ranking.tower_artifact",
    "save_towers": "headwater.ranking.tower_artifact",
    "ExactIndex": "index", "ItemIndex": "index", "ItemIndexError": "index", "recall_at_k": "index",
    "IndexRefresher": "refresh", "RefreshReport": "refresh", "StoreItemSource": "refresh",
    "Retriever": "retriever", "TwoTowerRetriever": "retriever",
    "RetrievalRuntime": "runtime", "load_retrieval": "runtime",
    "TowerOptions": "headwater.ranking.towers", "TowerReport": "headwater.ranking.towers",
    "TwoTowerModel": "headwater.ranking.towers", "train_two_tower": "headwater.ranking.towers",
}  # fmt: skip


def __getattr__(name: str) -> Any:
    module = _HOME.get(name)
    if module is None:
        msg = f"module {__name__!r} has no attribute {name!r}"
        raise AttributeError(msg)
    path = module if module.startswith("headwater.") else f"{__name__}.{module}"
    return getattr(importlib.import_module(path), name)


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
