"""Offline ranking metrics: ROC AUC and NDCG@k over slates, and a popularity baseline."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt


def auc(labels: npt.NDArray[np.float32], scores: npt.NDArray[np.floating[Any]]) -> float:
    """ROC AUC (Mann-Whitney, ties count one half); NaN when only one class is present."""
    y = labels > 0.5
    n_pos = int(y.sum())
    n_neg = len(y) - n_pos
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    order = np.argsort(scores, kind="mergesort")
    _, first, counts = np.unique(scores[order], return_index=True, return_counts=True)
    ranks = np.empty(len(y), dtype=np.float64)
    ranks[order] = np.repeat(first + (counts + 1) / 2.0, counts)
    return float((ranks[y].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def ndcg_at_k(
    groups: npt.NDArray[np.int64],
    labels: npt.NDArray[np.float32],
    scores: npt.NDArray[np.floating[Any]],
    k: int = 10,
) -> float:
    """Mean NDCG@k over the groups (slates) that hold at least one positive label.

    Within a group rows are ranked by descending score; ties keep the rows' order.
    """
    if len(labels) == 0:
        return float("nan")
    _, g = np.unique(groups, return_inverse=True)
    n_groups = int(g.max()) + 1

    def dcg(order: npt.NDArray[np.intp]) -> npt.NDArray[np.float64]:
        gs = g[order]
        starts = np.searchsorted(gs, np.arange(n_groups))
        pos = np.arange(len(order)) - starts[gs]
        gain = np.where(pos < k, labels[order] / np.log2(pos + 2.0), 0.0)
        return np.bincount(gs, weights=gain, minlength=n_groups).astype(np.float64)

    idx = np.arange(len(labels))
    actual = dcg(np.lexsort((idx, -np.asarray(scores, dtype=np.float64), g)))
    ideal = dcg(np.lexsort((idx, -labels, g)))
    keep = ideal > 0
    return float(np.mean(actual[keep] / ideal[keep])) if keep.any() else float("nan")


def popularity_scores(
    train_items: npt.NDArray[np.str_], train_labels: npt.NDArray[np.float32], items: npt.NDArray[np.str_]
) -> npt.NDArray[np.float64]:
    """Clicks of each of ``items`` in the training rows: the most-popular baseline."""
    clicked = train_items[train_labels > 0.5]
    names, counts = np.unique(clicked, return_counts=True)
    lookup = dict(zip(names.tolist(), counts.tolist(), strict=True))
    return np.asarray([lookup.get(i, 0) for i in items.tolist()], dtype=np.float64)
