"""The two-tower retrieval model: a user tower and an item tower into one unit-norm space.

Both towers read the same vectors as the ranker (the registry's user and item views, the
point-in-time training set's ``user.<slot>``/``item.<slot>`` columns), standardised with the
training set's means and scales kept as buffers (a missing value, NaN, is the training mean), so
an artifact is self-contained. A tower is an MLP whose output is L2-normalised; the score of a
(user, item) pair is the inner product of the two embeddings (a cosine), so retrieval is a
maximum-inner-product search over the item embeddings (see :mod:`.index`).

Training (:func:`train_two_tower`) uses the clicked rows only: each click is a positive pair, the
other clicks' items in the same batch are its negatives (in-batch sampled softmax, temperature
``tau``), with the log-frequency correction of Yi et al. (RecSys 2019, "Sampling-bias-corrected
neural modeling"): popular items appear as in-batch negatives more often than uniform sampling
would make them, so their logits are lowered by ``log q(item)``. An item that appears twice in a
batch is not a negative of itself.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
from torch import Tensor, nn

from headwater.ranking.accel import precision
from headwater.ranking.model import CLAMP, pick_device
from headwater.ranking.trainset import TrainingFileError, TrainingSet

MIN_POSITIVES = 32
"""Fewer clicks than this cannot train a retrieval model (a batch of negatives needs many)."""


def _standardize(x: Tensor, mean: Tensor, scale: Tensor) -> Tensor:
    return torch.nan_to_num((x - mean) / scale, nan=0.0).clamp(-CLAMP, CLAMP)


class Tower(nn.Module):
    """Standardise, MLP, L2-normalise: one side's vector into the shared embedding space."""

    mean: Tensor
    scale: Tensor

    def __init__(self, in_dim: int, hidden: Sequence[int], embed_dim: int) -> None:
        super().__init__()
        self.register_buffer("mean", torch.zeros(in_dim))
        self.register_buffer("scale", torch.ones(in_dim))
        layers: list[nn.Module] = []
        width = in_dim
        for size in hidden:
            layers += [nn.Linear(width, size), nn.ReLU()]
            width = size
        layers.append(nn.Linear(width, embed_dim))
        self.mlp = nn.Sequential(*layers)

    def forward(self, x: Tensor) -> Tensor:
        """Unit-norm embeddings (B, embed_dim) of raw vectors (B, in_dim)."""
        out: Tensor = nn.functional.normalize(self.mlp(_standardize(x, self.mean, self.scale)), dim=1)
        return out


class TwoTowerModel(nn.Module):
    """A user tower and an item tower; ``score = <user_tower(u), item_tower(i)>``."""

    def __init__(
        self, user_dim: int, item_dim: int, embed_dim: int = 32, hidden: Sequence[int] = (128, 64)
    ) -> None:
        super().__init__()
        self.user_dim, self.item_dim, self.embed_dim = user_dim, item_dim, embed_dim
        self.hidden = tuple(hidden)
        self.user_tower = Tower(user_dim, hidden, embed_dim)
        self.item_tower = Tower(item_dim, hidden, embed_dim)

    def set_normalization(
        self, user: tuple[npt.ArrayLike, npt.ArrayLike], item: tuple[npt.ArrayLike, npt.ArrayLike]
    ) -> None:
        """Set each tower's input means and scales (from the training rows)."""
        for tower, (mean, scale) in ((self.user_tower, user), (self.item_tower, item)):
            tower.mean.copy_(torch.as_tensor(np.asarray(mean, dtype=np.float32)))
            tower.scale.copy_(torch.as_tensor(np.asarray(scale, dtype=np.float32)))

    def embed_users(self, users: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        """Unit-norm user embeddings of raw user vectors (n, user_dim), float32 numpy."""
        return self._embed(self.user_tower, users, self.user_dim, "user")

    def embed_items(self, items: npt.NDArray[np.float32], batch: int = 65_536) -> npt.NDArray[np.float32]:
        """Unit-norm item embeddings of raw item vectors (n, item_dim), in batches of ``batch`` rows."""
        parts = [
            self._embed(self.item_tower, items[s : s + batch], self.item_dim, "item")
            for s in range(0, len(items), batch)
        ]
        return np.concatenate(parts) if parts else np.empty((0, self.embed_dim), dtype=np.float32)

    def _embed(
        self, tower: Tower, x: npt.NDArray[np.float32], dim: int, side: str
    ) -> npt.NDArray[np.float32]:
        x = np.asarray(x, dtype=np.float32)
        if x.ndim != 2 or x.shape[1] != dim:
            msg = f"two-tower model: {side} vectors must have shape (n, {dim}); got {x.shape}"
            raise ValueError(msg)
        device = next(self.parameters()).device
        with torch.inference_mode(), precision(device):  # fp16 autocast on CUDA (ranking/accel.py)
            out: npt.NDArray[np.float32] = tower(torch.from_numpy(x).to(device)).float().cpu().numpy()
        return out


@dataclass(frozen=True)
class TowerOptions:
    """Hyper-parameters of one two-tower training run."""

    seed: int = 0
    epochs: int = 20
    batch_size: int = 512
    learning_rate: float = 3e-3
    embed_dim: int = 32
    hidden: tuple[int, ...] = (128, 64)
    temperature: float = 0.05
    holdout: float = 0.2
    device: str | None = None
    threads: int | None = None
    """CPU threads for torch during training (None: torch's default). On a loaded 2-core machine one
    thread trained 15x faster than the default (5 s against 68-91 s): the threads spin on each other."""


@dataclass
class TowerReport:
    """A trained model and its holdout metrics."""

    model: TwoTowerModel
    metrics: dict[str, Any] = field(default_factory=dict)


def _moments(x: npt.NDArray[np.float32]) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]:
    from headwater.ranking.inputs import moments

    return moments(x)


def in_batch_loss(
    user_emb: Tensor, item_emb: Tensor, item_codes: Tensor, log_q: Tensor, tau: float
) -> Tensor:
    """Return the sampled-softmax loss over the batch's items with the log-frequency correction.

    Row b's positive is column b; a column holding the same item as row b's (a duplicate in the
    batch) is masked out, not counted as a negative.
    """
    logits = user_emb @ item_emb.T / tau - log_q[None, :]
    same = item_codes[:, None] == item_codes[None, :]
    same.fill_diagonal_(False)
    logits = logits.masked_fill(same, float("-inf"))
    target = torch.arange(len(user_emb), device=user_emb.device)
    return nn.functional.cross_entropy(logits, target)


def train_two_tower(ts: TrainingSet, opts: TowerOptions | None = None) -> TowerReport:
    """Train on ``ts``'s clicks (time holdout as the ranker's), report holdout recall@K vs popularity.

    Steps:

    1. Split by time (whole slates; :func:`headwater.ranking.train.split_by_time`).
    2. Keep the clicked rows of the training part; fit the input scaling on every training row.
    3. Epochs of shuffled batches: in-batch sampled softmax with the log-frequency correction.
    4. Holdout: for each clicked row, rank the catalog (every item of the set, its latest vector)
       by the model and by training-click popularity; recall@10/100 of the clicked item.
    """
    opts = opts or TowerOptions()
    threads = torch.get_num_threads()
    if opts.threads:
        torch.set_num_threads(opts.threads)
    try:
        return _train(ts, opts)
    finally:
        torch.set_num_threads(threads)


def _train(ts: TrainingSet, opts: TowerOptions) -> TowerReport:
    from headwater.ranking.inputs import split_by_time

    started = time.perf_counter()
    device = pick_device(opts.device)
    # Step 1, 2
    train_rows, test_rows = split_by_time(ts, opts.holdout)
    train, test = ts.take(train_rows), ts.take(test_rows)
    pos = np.flatnonzero(train.label > 0.5)
    if len(pos) < MIN_POSITIVES:
        msg = (
            f"training set: {len(pos)} clicked rows in the training part, the two-tower model needs at"
            f" least {MIN_POSITIVES}; build a training set over a longer span (`headwater training-set`)"
        )
        raise TrainingFileError(msg)
    torch.manual_seed(opts.seed)
    model = TwoTowerModel(len(ts.user_features), len(ts.item_features), opts.embed_dim, opts.hidden)
    model.set_normalization(_moments(train.user), _moments(train.item))
    model.to(device).train()
    _, codes = np.unique(train.item_ids[pos], return_inverse=True)
    freq = np.bincount(codes).astype(np.float64) / len(codes)
    users = torch.from_numpy(train.user[pos]).to(device)
    items = torch.from_numpy(train.item[pos]).to(device)
    item_codes = torch.from_numpy(codes.astype(np.int64)).to(device)
    log_q = torch.from_numpy(np.log(freq[codes]).astype(np.float32)).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=opts.learning_rate)
    rng = np.random.default_rng(opts.seed)
    # Step 3
    for _ in range(opts.epochs):
        perm = rng.permutation(len(pos))
        for s in range(0, len(perm), opts.batch_size):
            b = torch.from_numpy(perm[s : s + opts.batch_size]).to(device)
            if len(b) < 2:
                continue
            loss = in_batch_loss(
                model.user_tower(users[b]),
                model.item_tower(items[b]),
                item_codes[b],
                log_q[b],
                opts.temperature,
            )
            optimizer.zero_grad(set_to_none=True)
            torch.autograd.backward(loss)
            optimizer.step()
    model = model.eval().cpu()
    # Step 4
    metrics = {
        "rows": {"train": len(train), "train_clicks": len(pos), "holdout": len(test)},
        "holdout": holdout_recall(model, ts, train, test),
        "seconds": round(time.perf_counter() - started, 2),
        "device": device,
        "options": asdict(opts),
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    return TowerReport(model, metrics)


def holdout_recall(
    model: TwoTowerModel,
    full: TrainingSet,
    train: TrainingSet,
    test: TrainingSet,
    ks: Sequence[int] = (10, 100),
) -> dict[str, Any]:
    """Recall@k of each holdout click's item over the set's catalog: the model vs popularity."""
    clicks = np.flatnonzero(test.label > 0.5)
    order = np.argsort(full.event_time_ms, kind="mergesort")
    catalog, last = np.unique(full.item_ids[order][::-1], return_index=True)  # each item's latest row
    vectors = full.item[order][::-1][last]
    if not len(clicks):
        return {"clicks": 0, "catalog": len(catalog)}
    target = np.searchsorted(catalog, test.item_ids[clicks])
    item_emb = model.embed_items(vectors)
    users = model.embed_users(test.user[clicks])
    popular = np.zeros(len(catalog))
    clicked, counts = np.unique(train.item_ids[train.label > 0.5], return_counts=True)
    popular[np.searchsorted(catalog, clicked)] = counts
    out: dict[str, Any] = {"clicks": len(clicks), "catalog": len(catalog)}
    # Rank = items scored above the clicked one; in chunks of clicks so memory stays ~chunk x catalog.
    model_rank = np.empty(len(clicks), dtype=np.int64)
    chunk = max(1, 2**24 // max(1, len(catalog)))
    for s in range(0, len(clicks), chunk):
        scores = users[s : s + chunk] @ item_emb.T
        own = scores[np.arange(len(scores)), target[s : s + chunk]]
        model_rank[s : s + chunk] = (scores > own[:, None]).sum(axis=1)
    ordered = np.sort(popular)
    pop_rank = len(ordered) - np.searchsorted(ordered, popular[target], side="right")
    for k in ks:
        out[f"two_tower_recall@{k}"] = round(float(np.mean(model_rank < k)), 4)
        out[f"popularity_recall@{k}"] = round(float(np.mean(pop_rank < k)), 4)
    return out
