"""Offline ranking metrics: ROC AUC and NDCG@k over slates; the popularity and single-feature baselines."""

from __future__ import annotations

import warnings
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

    Within a group rows are ranked by descending score. Tied rows share the mean discount of the
    positions they occupy: the expected DCG of a random order among them, so a score that ties a
    slate (a per-user feature, an unseen item's popularity) earns what chance earns, not the order
    the rows happen to be stored in (which is often the order they were shown in).
    """
    if len(labels) == 0:
        return float("nan")
    _, g = np.unique(groups, return_inverse=True)
    n_groups = int(g.max()) + 1
    y = np.asarray(labels, dtype=np.float64)

    def dcg(order: npt.NDArray[np.intp], keys: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        gs, ks = g[order], keys[order]
        starts = np.searchsorted(gs, np.arange(n_groups))
        pos = np.arange(len(order)) - starts[gs]
        discount = np.where(pos < k, 1.0 / np.log2(pos + 2.0), 0.0)
        new_block = np.r_[True, (gs[1:] != gs[:-1]) | (ks[1:] != ks[:-1])]
        block = np.cumsum(new_block) - 1
        shared = np.bincount(block, weights=discount) / np.bincount(block)
        gain = y[order] * shared[block]
        return np.bincount(gs, weights=gain, minlength=n_groups).astype(np.float64)

    s = np.nan_to_num(np.asarray(scores, dtype=np.float64), nan=-np.inf)
    actual = dcg(np.lexsort((-s, g)), s)
    ideal = dcg(np.lexsort((-y, g)), y)
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


def feature_scores(
    train_x: npt.NDArray[np.float32],
    train_labels: npt.NDArray[np.float32],
    test_x: npt.NDArray[np.float32],
) -> npt.NDArray[np.float64]:
    """Return each column of ``test_x`` as a score on its own, (rows, columns).

    A missing value (NaN) is the training mean, and the sign is the one whose training AUC is at
    least 0.5 (a feature that predicts no click counts as well as one that predicts a click).
    """
    with warnings.catch_warnings():
        # A column missing in every training row ("Mean of empty slice") scores as the constant 0.
        warnings.simplefilter("ignore", RuntimeWarning)
        mean = np.nanmean(np.where(np.isfinite(train_x), train_x, np.nan), axis=0)
    mean = np.where(np.isfinite(mean), mean, 0.0)
    tr = np.where(np.isfinite(train_x), train_x, mean).astype(np.float64)
    te = np.where(np.isfinite(test_x), test_x, mean).astype(np.float64)
    signs = np.asarray([1.0 if not auc(train_labels, tr[:, j]) < 0.5 else -1.0 for j in range(tr.shape[1])])
    scored: npt.NDArray[np.float64] = te * signs
    return scored
