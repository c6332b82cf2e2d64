"""The ranking models: a DCN-v2 style network and the logistic-regression fallback.

Both score (user, item) pairs from the user view's vector and the item view's vector. Inputs
are standardised with the training set's means and scales, which live in the model's state
(buffers), so an artifact is self-contained; a missing value (NaN) becomes the training mean.
Count inputs (a per-column mask, ``user_log`` / ``item_log``, also in the state; chosen at training
by :func:`headwater.ranking.train.count_columns`) enter as ``log(1 + x)`` before standardising:
counts grow with the stream, so a holdout's lie past the training rows', and on a log scale an item
with 3,000 impressions is not 40 standard deviations from one with 70. An artifact saved before
the masks existed loads with no column logged and scores as it did.

DCN-v2 (Wang et al., 2021): ``x0 = [user, item, e_u * e_i, <e_u, e_i>]`` where ``e_u`` and
``e_i`` are learned embeddings of the two vectors in one space (their elementwise product and
dot product are the user x item crosses); a cross network ``x_{l+1} = x0 * (W_l x_l + b_l) +
x_l`` runs beside a deep MLP over ``x0``, and a linear head reads both.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
from torch import Tensor, nn

from headwater.ranking.accel import precision, ranker_runtime
from headwater.ranking.onnx_scorer import OnnxBacked, OnnxRanker

CLAMP = 8.0
"""Standardised inputs are clamped to +-CLAMP so one outlier cannot dominate a score."""


LOG_MASKS = ("user_log", "item_log")
"""State entries of the count-input masks (bool per column; absent from artifacts saved before them)."""


def _standardize(x: Tensor, mean: Tensor, scale: Tensor) -> Tensor:
    z = (x - mean) / scale
    return torch.nan_to_num(z, nan=0.0).clamp_(-CLAMP, CLAMP)


def log_counts(x: Tensor, mask: Tensor) -> Tensor:
    """``log(1 + x)`` in the columns where ``mask`` (bool, per column) is set, ``x`` elsewhere.

    A negative value in a count column counts as 0; NaN (missing) stays NaN.
    """
    return torch.where(mask, torch.log1p(x.clamp(min=0.0)), x)


def log_counts_np(x: npt.NDArray[np.float32], mask: npt.NDArray[np.bool_] | None) -> npt.NDArray[np.float32]:
    """:func:`log_counts` in numpy (``mask`` None: ``x`` unchanged)."""
    if mask is None or not mask.any():
        return x
    out: npt.NDArray[np.float32] = np.where(mask, np.log1p(np.maximum(x, 0.0)), x).astype(np.float32)
    return out


class DCNRanker(nn.Module):
    """DCN-v2 style ranker over a user vector, an item vector and their crosses; returns logits."""

    user_mean: Tensor
    user_scale: Tensor
    item_mean: Tensor
    item_scale: Tensor
    user_log: Tensor
    item_log: Tensor

    def __init__(
        self,
        user_dim: int,
        item_dim: int,
        embed_dim: int = 16,
        cross_layers: int = 3,
        deep: Sequence[int] = (256, 128),
    ) -> None:
        super().__init__()
        self.user_dim, self.item_dim = user_dim, item_dim
        self.register_buffer("user_mean", torch.zeros(user_dim))
        self.register_buffer("user_scale", torch.ones(user_dim))
        self.register_buffer("item_mean", torch.zeros(item_dim))
        self.register_buffer("item_scale", torch.ones(item_dim))
        self.register_buffer("user_log", torch.zeros(user_dim, dtype=torch.bool))
        self.register_buffer("item_log", torch.zeros(item_dim, dtype=torch.bool))
        self._logged = (False, False)
        """Whether each side has a logged column: set where the masks change (outside any trace)."""
        self.user_embed = nn.Linear(user_dim, embed_dim)
        self.item_embed = nn.Linear(item_dim, embed_dim)
        d0 = user_dim + item_dim + embed_dim + 1
        self.cross = nn.ModuleList(nn.Linear(d0, d0) for _ in range(cross_layers))
        layers: list[nn.Module] = []
        width = d0
        for size in deep:
            layers += [nn.Linear(width, size), nn.ReLU()]
            width = size
        self.deep = nn.Sequential(*layers)
        self.head = nn.Linear(d0 + width, 1)

    def set_normalization(
        self,
        user_mean: npt.ArrayLike,
        user_scale: npt.ArrayLike,
        item_mean: npt.ArrayLike,
        item_scale: npt.ArrayLike,
        user_log: npt.ArrayLike | None = None,
        item_log: npt.ArrayLike | None = None,
    ) -> None:
        """Set the input means and scales (from the training set) and the count-input masks.

        The means and scales are those of the inputs as the model sees them: after ``log(1 + x)``
        in the masked columns. A mask left None logs no column of its side.
        """
        for name, value in (
            ("user_mean", user_mean),
            ("user_scale", user_scale),
            ("item_mean", item_mean),
            ("item_scale", item_scale),
        ):
            getattr(self, name).copy_(torch.as_tensor(np.asarray(value, dtype=np.float32)))
        for name, mask in (("user_log", user_log), ("item_log", item_log)):
            buffer = getattr(self, name)
            if mask is None:
                buffer.fill_(False)
            else:
                buffer.copy_(torch.as_tensor(np.asarray(mask, dtype=bool)))
        self._logged = self._log_sides()

    def _load_from_state_dict(
        self,
        state_dict: dict[str, Any],
        prefix: str,
        local_metadata: dict[str, Any],
        strict: bool,
        missing_keys: list[str],
        unexpected_keys: list[str],
        error_msgs: list[str],
    ) -> None:
        """Load as nn.Module does; an artifact saved before the count masks existed logs no column."""
        for name in LOG_MASKS:
            key = prefix + name
            if key not in state_dict:  # load_state_dict passes its own copy: the artifact is not changed
                state_dict[key] = torch.zeros_like(getattr(self, name))
        super()._load_from_state_dict(
            state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
        )
        self._logged = self._log_sides()

    def _log_sides(self) -> tuple[bool, bool]:
        """Return whether each side's mask has a set column."""
        return bool(self.user_log.any()), bool(self.item_log.any())

    def forward(self, users: Tensor, items: Tensor, user_index: Tensor) -> Tensor:
        """Logits (B,) for items (B, item_dim); row b belongs to user ``users[user_index[b]]``.

        ``users`` (R, user_dim) holds each distinct user once, so a batch merged from several
        requests computes each user's part once. With fewer users than rows (serving: one user and
        hundreds of candidates) the first cross layer's and the first deep layer's user share is
        computed per user, not per row (:meth:`forward_shared`): the same logits to float rounding.
        """
        if users.shape[0] < items.shape[0]:
            return self.forward_shared(users, items, user_index)
        return self.forward_rows(users, items, user_index)

    def _inputs(self, users: Tensor, items: Tensor, user_index: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Standardised users (R, U) and the row parts of x0: the user's columns per row and the rest."""
        log_users, log_items = self._logged  # no op at all for a model without count masks
        if log_users:
            users = log_counts(users, self.user_log)
        if log_items:
            items = log_counts(items, self.item_log)
        u = _standardize(users, self.user_mean, self.user_scale)
        i = _standardize(items, self.item_mean, self.item_scale)
        e_u = self.user_embed(u).index_select(0, user_index)
        e_i = self.item_embed(i)
        prod = e_u * e_i
        rest = torch.cat([i, prod, prod.sum(dim=1, keepdim=True)], dim=1)
        return u, u.index_select(0, user_index), rest

    def forward_rows(self, users: Tensor, items: Tensor, user_index: Tensor) -> Tensor:
        """Run the network as written: every layer over every row's whole x0 (training: one user a row)."""
        _, u_rows, rest = self._inputs(users, items, user_index)
        x0 = torch.cat([u_rows, rest], dim=1)
        x = x0
        for layer in self.cross:
            x = x0 * layer(x) + x
        logits: Tensor = self.head(torch.cat([x, self.deep(x0)], dim=1))
        return logits.squeeze(1)

    def forward_shared(self, users: Tensor, items: Tensor, user_index: Tensor) -> Tensor:
        """Return the same logits with the first layers' user share computed once per user.

        x0 = [u, rest], so ``W x0 + b = (W_u u + b) + W_r rest``: the first cross layer and the first
        deep layer take ``W_u u + b`` per user (R rows), gathered to the B rows, plus ``W_r rest``
        per row. The user's ~100 of ~135 columns are then multiplied once a request, not once a
        candidate (about a third of the DCN's multiply-adds at 500 candidates).
        """
        u, u_rows, rest = self._inputs(users, items, user_index)
        dim = self.user_dim
        x0 = torch.cat([u_rows, rest], dim=1)
        first = self.cross[0]
        assert isinstance(first, nn.Linear)
        pre = _split_linear(first, u, rest, user_index, dim)
        x = x0 * pre + x0
        for layer in list(self.cross)[1:]:
            x = x0 * layer(x) + x
        deep0 = self.deep[0]
        assert isinstance(deep0, nn.Linear)
        h = _split_linear(deep0, u, rest, user_index, dim)
        for layer in list(self.deep)[1:]:
            h = layer(h)
        logits: Tensor = self.head(torch.cat([x, h], dim=1))
        return logits.squeeze(1)


def _split_linear(layer: nn.Linear, users: Tensor, rest: Tensor, user_index: Tensor, dim: int) -> Tensor:
    """``layer([users[user_index], rest])`` with the users' share computed once per user."""
    per_user = nn.functional.linear(users, layer.weight[:, :dim], layer.bias).index_select(0, user_index)
    return torch.addmm(per_user, rest, layer.weight[:, dim:].t())


class LinearRanker:
    """Logistic regression on the same inputs: ``u.w_u + i.w_i + u^T W_c i + b`` (standardised u, i).

    Scoring needs numpy only: ``W_c^T u`` is computed once per request, then one matrix-vector
    product scores all candidates. Count columns (``user_log`` / ``item_log`` in the state, as in
    :class:`DCNRanker`; absent: none) enter as ``log(1 + x)``.
    """

    def __init__(self, state: dict[str, npt.NDArray[np.float32]]) -> None:
        self.user_mean, self.user_scale = state["user_mean"], state["user_scale"]
        self.item_mean, self.item_scale = state["item_mean"], state["item_scale"]
        self.user_log, self.item_log = (_mask(state.get(name)) for name in LOG_MASKS)
        self.w_user, self.w_item, self.w_cross = state["w_user"], state["w_item"], state["w_cross"]
        self.bias = float(state["bias"].reshape(-1)[0])

    @property
    def user_dim(self) -> int:
        """Width of the user vector."""
        return int(self.w_user.shape[0])

    @property
    def item_dim(self) -> int:
        """Width of the item vector."""
        return int(self.w_item.shape[0])

    def score(self, user: npt.NDArray[np.float32], items: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        """Logits (n,) of ``items`` (n, item_dim) for one ``user`` (user_dim,)."""
        user, items = log_counts_np(user, self.user_log), log_counts_np(items, self.item_log)
        u = np.clip(np.nan_to_num((user - self.user_mean) / self.user_scale, nan=0.0), -CLAMP, CLAMP)
        i = np.clip(np.nan_to_num((items - self.item_mean) / self.item_scale, nan=0.0), -CLAMP, CLAMP)
        item_weights = self.w_item + self.w_cross.T @ u
        logits: npt.NDArray[np.float32] = (i @ item_weights + (float(u @ self.w_user) + self.bias)).astype(
            np.float32
        )
        return logits


def _mask(values: npt.NDArray[Any] | None) -> npt.NDArray[np.bool_] | None:
    """Return a state's count mask as bool (artifacts store numbers), or None when absent or empty."""
    if values is None:
        return None
    mask = np.asarray(values).astype(bool)
    return mask if mask.any() else None


def linear_logits(state: dict[str, Tensor], users: Tensor, items: Tensor) -> Tensor:
    """Training-time logits of the linear model for row-aligned standardised users and items."""
    cross = torch.einsum("bu,ui,bi->b", users, state["w_cross"], items)
    return users @ state["w_user"] + items @ state["w_item"] + cross + state["bias"]


class NeuralScorer(OnnxBacked[OnnxRanker]):
    """Runs a :class:`DCNRanker` for batches of (user vector, item matrix) jobs.

    On the CPU the forward runs on ONNX Runtime when it is installed (exported at construction from
    the model's weights, :mod:`headwater.ranking.onnx_scorer`), else and on CUDA on torch (``runtime``
    overrides :func:`~headwater.ranking.accel.ranker_runtime`). A failed export, or a failed ORT call,
    is logged and counted in ``onnx_failures`` and the job is scored by torch: never an error answer.
    """

    onnx_module = "ranking model"
    onnx_torch_does = "scoring with torch"

    def __init__(self, model: DCNRanker, device: str, runtime: str | None = None) -> None:
        self.device = torch.device(device)
        self.model = model.to(self.device).eval()
        self._onnx_init(runtime or ranker_runtime(str(self.device)))
        self.compile()

    def compile(self) -> None:
        """(Re)build the ONNX Runtime session from the model's current weights, when ORT is the runtime.

        Call it after changing the weights in place (the session holds a copy of them).
        """
        self._onnx_build(lambda: OnnxRanker.export(self.model, threads=torch.get_num_threads()))

    def score_batch(
        self, jobs: Sequence[tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]]
    ) -> list[npt.NDArray[np.float32]]:
        """Scores (sigmoid of the logits) per job, from one forward over all jobs' rows."""
        users = np.stack([user for user, _ in jobs]).astype(np.float32, copy=False)
        sizes = [len(items) for _, items in jobs]
        items = np.concatenate([items for _, items in jobs]).astype(np.float32, copy=False)
        index = np.repeat(np.arange(len(jobs), dtype=np.int64), sizes)
        scores = self._onnx_call(lambda session: session.scores(users, items, index))
        if scores is None:
            scores = self._torch_scores(users, items, index)
        if not np.isfinite(scores).all():
            msg = f"the ranking model produced {int((~np.isfinite(scores)).sum())} non-finite scores"
            raise FloatingPointError(msg)
        return np.split(scores, np.cumsum(sizes)[:-1])

    def _torch_scores(
        self, users: npt.NDArray[np.float32], items: npt.NDArray[np.float32], index: npt.NDArray[np.int64]
    ) -> npt.NDArray[np.float32]:
        with torch.inference_mode(), precision(self.device):  # fp16 autocast on CUDA (ranking/accel.py)
            logits = self.model(
                torch.from_numpy(users).to(self.device),
                torch.from_numpy(items).to(self.device),
                torch.from_numpy(index).to(self.device),
            )
            scores: npt.NDArray[np.float32] = torch.sigmoid(logits).float().cpu().numpy()
        return scores


def pick_device(requested: str | None = None) -> str:
    """Return ``requested`` if given, else ``cuda`` when a GPU is visible, else ``cpu``."""
    if requested:
        return requested
    return "cuda" if torch.cuda.is_available() else "cpu"


def gpu_memory_used_percent(device: str) -> float | None:
    """Share of the GPU's memory in use (all processes), or None on the CPU."""
    if not device.startswith("cuda") or not torch.cuda.is_available():
        return None
    free, total = torch.cuda.mem_get_info(torch.device(device))
    return round(100.0 * (total - free) / total, 2)
