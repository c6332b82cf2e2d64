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

from __future__ import annotations

import importlib
from typing import Any

# Exports load on first use: `headwater --help` imports this package for its `retrieval` command
# and must not pay for torch and usearch (about 2 s) unless a retrieval command runs.
_HOME = {
    "TowerArtifact": "artifact", "load_towers": "artifact", "save_towers": "artifact",
    "ExactIndex": "index", "ItemIndex": "index", "ItemIndexError": "index", "recall_at_k": "index",
    "IndexRefresher": "refresh", "RefreshReport": "refresh", "StoreItemSource": "refresh",
    "Retriever": "retriever", "TwoTowerRetriever": "retriever",
    "RetrievalRuntime": "runtime", "load_retrieval": "runtime",
    "TowerOptions": "towers", "TowerReport": "towers", "TwoTowerModel": "towers",
    "train_two_tower": "towers",
}  # fmt: skip


def __getattr__(name: str) -> Any:
    module = _HOME.get(name)
    if module is None:
        msg = f"module {__name__!r} has no attribute {name!r}"
        raise AttributeError(msg)
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


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
