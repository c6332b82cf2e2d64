"""The ranking models: a DCN-v2 style network and the logistic-regression fallback.

Both score (user, item) pairs from the user view's vector and the item view's vector. Inputs
are standardised with the training set's means and scales, which live in the model's state
(buffers), so an artifact is self-contained; a missing value (NaN) becomes the training mean.

DCN-v2 (Wang et al., 2021): ``x0 = [user, item, e_u * e_i, <e_u, e_i>]`` where ``e_u`` and
``e_i`` are learned embeddings of the two vectors in one space (their elementwise product and
dot product are the user x item crosses); a cross network ``x_{l+1} = x0 * (W_l x_l + b_l) +
x_l`` runs beside a deep MLP over ``x0``, and a linear head reads both.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import torch
from torch import Tensor, nn

from headwater.serving.accel import precision

CLAMP = 8.0
"""Standardised inputs are clamped to +-CLAMP so one outlier cannot dominate a score."""


def _standardize(x: Tensor, mean: Tensor, scale: Tensor) -> Tensor:
    z = (x - mean) / scale
    return torch.nan_to_num(z, nan=0.0).clamp_(-CLAMP, CLAMP)


class DCNRanker(nn.Module):
    """DCN-v2 style ranker over a user vector, an item vector and their crosses; returns logits."""

    user_mean: Tensor
    user_scale: Tensor
    item_mean: Tensor
    item_scale: Tensor

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
    ) -> None:
        """Set the input means and scales (from the training set)."""
        for name, value in (
            ("user_mean", user_mean),
            ("user_scale", user_scale),
            ("item_mean", item_mean),
            ("item_scale", item_scale),
        ):
            getattr(self, name).copy_(torch.as_tensor(np.asarray(value, dtype=np.float32)))

    def forward(self, users: Tensor, items: Tensor, user_index: Tensor) -> Tensor:
        """Logits (B,) for items (B, item_dim); row b belongs to user ``users[user_index[b]]``.

        ``users`` (R, user_dim) holds each distinct user once, so a batch merged from several
        requests computes each user's part once.
        """
        u = _standardize(users, self.user_mean, self.user_scale)
        i = _standardize(items, self.item_mean, self.item_scale)
        e_u = self.user_embed(u).index_select(0, user_index)
        u = u.index_select(0, user_index)
        e_i = self.item_embed(i)
        prod = e_u * e_i
        x0 = torch.cat([u, i, prod, prod.sum(dim=1, keepdim=True)], dim=1)
        x = x0
        for layer in self.cross:
            x = x0 * layer(x) + x
        logits: Tensor = self.head(torch.cat([x, self.deep(x0)], dim=1))
        return logits.squeeze(1)


class LinearRanker:
    """Logistic regression on the same inputs: ``u.w_u + i.w_i + u^T W_c i + b`` (standardised u, i).

    Scoring needs numpy only: ``W_c^T u`` is computed once per request, then one matrix-vector
    product scores all candidates.
    """

    def __init__(self, state: dict[str, npt.NDArray[np.float32]]) -> None:
        self.user_mean, self.user_scale = state["user_mean"], state["user_scale"]
        self.item_mean, self.item_scale = state["item_mean"], state["item_scale"]
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
        u = np.clip(np.nan_to_num((user - self.user_mean) / self.user_scale, nan=0.0), -CLAMP, CLAMP)
        i = np.clip(np.nan_to_num((items - self.item_mean) / self.item_scale, nan=0.0), -CLAMP, CLAMP)
        item_weights = self.w_item + self.w_cross.T @ u
        logits: npt.NDArray[np.float32] = (i @ item_weights + (float(u @ self.w_user) + self.bias)).astype(
            np.float32
        )
        return logits


def linear_logits(state: dict[str, Tensor], users: Tensor, items: Tensor) -> Tensor:
    """Training-time logits of the linear model for row-aligned standardised users and items."""
    cross = torch.einsum("bu,ui,bi->b", users, state["w_cross"], items)
    return users @ state["w_user"] + items @ state["w_item"] + cross + state["bias"]


class NeuralScorer:
    """Runs a :class:`DCNRanker` on its device for batches of (user vector, item matrix) jobs."""

    def __init__(self, model: DCNRanker, device: str) -> None:
        self.device = torch.device(device)
        self.model = model.to(self.device).eval()

    def score_batch(
        self, jobs: Sequence[tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]]
    ) -> list[npt.NDArray[np.float32]]:
        """Scores (sigmoid of the logits) per job, from one forward over all jobs' rows."""
        users = np.stack([user for user, _ in jobs]).astype(np.float32, copy=False)
        sizes = [len(items) for _, items in jobs]
        items = np.concatenate([items for _, items in jobs]).astype(np.float32, copy=False)
        index = np.repeat(np.arange(len(jobs)), sizes)
        with torch.inference_mode(), precision(self.device):  # fp16 autocast on CUDA (serving/accel.py)
            logits = self.model(
                torch.from_numpy(users).to(self.device),
                torch.from_numpy(items).to(self.device),
                torch.from_numpy(index).to(self.device),
            )
            scores = torch.sigmoid(logits).float().cpu().numpy()
        if not np.isfinite(scores).all():
            msg = f"the ranking model produced {int((~np.isfinite(scores)).sum())} non-finite scores"
            raise FloatingPointError(msg)
        return np.split(scores, np.cumsum(sizes)[:-1])


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
