"""The models' inputs: the time split, which columns are counts, and the one input scaling.

Both the DCN and its linear fallback read a training set's user and item columns the same way:
counts taken as ``log(1 + x)`` (:func:`count_columns`), then standardised with moments fitted on
the training rows (:func:`input_norm`, :func:`standardized`). The masks and moments travel in both
artifacts, so the service scales a request exactly as training did.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from headwater.ranking.model import log_counts, log_counts_np
from headwater.ranking.trainset import TrainingSet

LOG_COUNTS = ("auto", "none")


COUNT_MIN_MAX = 10.0
"""A count column reaches at least this in the training rows (a 0/1 flag or a share is no count)."""


COUNT_MIN_SKEW = 2.0
"""A non-whole non-negative column (a sum of amounts) is logged when its skewness is at least this
and its 99th percentile at least :data:`COUNT_MIN_MAX`."""


def split_by_time(ts: TrainingSet, holdout: float) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.intp]]:
    """(train rows, holdout rows): whole slates, the latest ``holdout`` share of them held out."""
    groups, first = np.unique(ts.group, return_index=True)
    order = groups[np.argsort(ts.event_time_ms[first], kind="mergesort")]
    cut = round(len(order) * (1.0 - holdout))
    test_groups = order[cut:]
    is_test = np.isin(ts.group, test_groups)
    return np.flatnonzero(~is_test), np.flatnonzero(is_test)


def moments(x: npt.NDArray[np.float32]) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]:
    """Return per-column mean and scale of model inputs (NaN-aware), the one input scaling of every model."""
    with warnings.catch_warnings():  # an all-NaN column (a feature never set) gets mean 0, scale 1
        warnings.simplefilter("ignore", RuntimeWarning)
        mean = np.nanmean(x, axis=0)
        std = np.nanstd(x, axis=0)
    mean = np.where(np.isfinite(mean), mean, 0.0)
    std = np.where(np.isfinite(std) & (std > 1e-6), std, 1.0)
    return mean.astype(np.float32), std.astype(np.float32)


def count_columns(x: npt.NDArray[np.float32]) -> npt.NDArray[np.bool_]:
    """Return which columns of ``x`` (training rows) are counts, to be taken as ``log(1 + x)``.

    Decided from the data, not the registry (a training set carries slot names only, and the
    quality sets have no registry): a column is a count when its known values are all non-negative
    and either all whole numbers reaching at least :data:`COUNT_MIN_MAX` (a ``count``,
    ``distinct_count`` or a sum of whole amounts), or heavy-tailed (skewness at least
    :data:`COUNT_MIN_SKEW` and 99th percentile at least :data:`COUNT_MIN_MAX`: a sum of amounts).
    Rates, shares and COEC-like ratios stay as they are. On the quality sets this picks exactly
    the user's and the item's clicks and impressions.
    """
    mask = np.zeros(x.shape[1], dtype=bool)
    for j in range(x.shape[1]):
        v = x[:, j][np.isfinite(x[:, j])].astype(np.float64)
        if len(v) == 0 or v.min() < 0.0 or v.max() < COUNT_MIN_MAX:
            continue
        if np.all(v == np.round(v)):
            mask[j] = True
            continue
        sd = v.std()
        skew = float(((v - v.mean()) ** 3).mean() / sd**3) if sd > 0 else 0.0
        mask[j] = skew >= COUNT_MIN_SKEW and float(np.quantile(v, 0.99)) >= COUNT_MIN_MAX
    return mask


def input_norm(train: TrainingSet, mode: str = "auto") -> tuple[npt.NDArray[Any], ...]:
    """Return ``(user_mean, user_scale, item_mean, item_scale, user_log, item_log)`` for ``train``.

    The masks are :func:`count_columns` (``mode="auto"``) or all False (``none``); the
    moments are those of the inputs after ``log(1 + x)`` in the masked columns, what the models
    standardise. Every function taking a ``norm`` also takes the 4 moments alone (no column logged).
    """
    if mode not in LOG_COUNTS:
        msg = f"log_counts: expected one of {LOG_COUNTS}, found {mode!r}"
        raise ValueError(msg)
    auto = mode == "auto"
    user_log = count_columns(train.user) if auto else np.zeros(train.user.shape[1], bool)
    item_log = count_columns(train.item) if auto else np.zeros(train.item.shape[1], bool)
    user = log_counts_np(train.user, user_log)
    item = log_counts_np(train.item, item_log)
    return (*moments(user), *moments(item), user_log, item_log)


def standardized(ts: TrainingSet, norm: tuple[Any, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """Return ``ts``'s inputs as the models see them: counts logged (6-entry ``norm``), standardised."""
    u_mean, u_scale, i_mean, i_scale = (torch.as_tensor(a) for a in norm[:4])
    user, item = torch.from_numpy(ts.user), torch.from_numpy(ts.item)
    if len(norm) == 6:
        user = log_counts(user, torch.as_tensor(np.asarray(norm[4], dtype=bool)))
        item = log_counts(item, torch.as_tensor(np.asarray(norm[5], dtype=bool)))
    users = torch.nan_to_num((user - u_mean) / u_scale).clamp(-8.0, 8.0)
    items = torch.nan_to_num((item - i_mean) / i_scale).clamp(-8.0, 8.0)
    return users, items
