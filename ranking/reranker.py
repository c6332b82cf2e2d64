"""The funnel's last model: attention over the item vectors of the user's recent clicks.

:class:`SequenceReranker` scores each of the DCN's top candidates from the candidate's item
vector, the DCN's own logit (a residual: an untrained head keeps the DCN's order) and an
attention read of the user's recent clicks (query: the candidate; keys and values: the clicked
items, plus a learned "no click" slot so a user without clicks is well defined).

Training (:func:`train_reranker`) uses the same point-in-time training set as the DCN: rows in
time order, each row's sequence is the item vectors of that user's earlier positive rows (the
newest ``max_clicks``), so no row sees its own label or a later one; the DCN's logit on each row
is an input, and the loss is pointwise log-loss with the DCN logit as the offset. Holdout
AUC/NDCG@10 of the DCN alone and of the DCN + re-ranker are in the metadata.

Artifacts: ``reranker-<version>.pt`` in the models folder, format ``headwater.reranker/1``
(content-hash versions like the ranker's), and a ``reranker`` entry in ``latest.json``.
"""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt
import torch
from torch import Tensor, nn

from headwater.ranking.accel import TORCH, ranker_runtime
from headwater.ranking.artifact import (
    ArtifactError,
    point_latest,
    read_verified,
    resolve_model_path,
    write_versioned,
)
from headwater.ranking.evaluation import auc, ndcg_at_k
from headwater.ranking.inputs import moments, split_by_time
from headwater.ranking.model import CLAMP
from headwater.ranking.onnx_scorer import OnnxBacked, OnnxReranker
from headwater.ranking.trainset import TrainingFileError, TrainingSet

FORMAT = "headwater.reranker/1"
KIND = "reranker"


class SequenceReranker(nn.Module):
    """Candidate x recent-clicks attention, added to the DCN's logit."""

    item_mean: Tensor
    item_scale: Tensor

    def __init__(self, item_dim: int, dim: int = 32, heads: int = 2) -> None:
        super().__init__()
        self.item_dim, self.dim, self.heads = item_dim, dim, heads
        self.register_buffer("item_mean", torch.zeros(item_dim))
        self.register_buffer("item_scale", torch.ones(item_dim))
        self.embed = nn.Sequential(nn.Linear(item_dim, dim), nn.ReLU(), nn.Linear(dim, dim))
        self.null = nn.Parameter(torch.zeros(1, 1, dim))
        self.attention = nn.MultiheadAttention(dim, heads, batch_first=True)
        last = nn.Linear(dim, 1)
        nn.init.zeros_(last.weight)  # starts as the DCN's order exactly
        nn.init.zeros_(last.bias)
        self.head = nn.Sequential(nn.Linear(3 * dim + 1, dim), nn.ReLU(), last)

    def _embed(self, x: Tensor) -> Tensor:
        z = torch.nan_to_num((x - self.item_mean) / self.item_scale, nan=0.0).clamp(-CLAMP, CLAMP)
        out: Tensor = self.embed(z)
        return out

    def forward(self, candidates: Tensor, base: Tensor, clicks: Tensor, padding: Tensor) -> Tensor:
        """Logits (B, C) from candidates (B, C, F), DCN logits (B, C), clicks (B, L, F), padding (B, L)."""
        b = candidates.shape[0]
        query = self._embed(candidates)
        keys = torch.cat([self.null.expand(b, 1, self.dim), self._embed(clicks)], dim=1)
        pad = torch.cat([torch.zeros(b, 1, dtype=torch.bool, device=padding.device), padding], dim=1)
        context, _ = self.attention(query, keys, keys, key_padding_mask=pad, need_weights=False)
        feats = torch.cat([query, context, query * context, base.unsqueeze(-1)], dim=-1)
        out: Tensor = base + self.head(feats).squeeze(-1)
        return out

    def forward_one(self, candidates: Tensor, base: Tensor, clicks: Tensor) -> Tensor:
        """:meth:`forward` for one request without padding: (C, F), (C,), (L, F) to logits (C,).

        The attention is written out with the module's own weights, so that an ONNX export keeps the
        candidate and click counts dynamic (``nn.MultiheadAttention`` traces them as constants).
        """
        att, d, h = self.attention, self.dim, self.heads
        query = self._embed(candidates)
        keys = torch.cat([self.null[0], self._embed(clicks)], dim=0)
        w, b = att.in_proj_weight, att.in_proj_bias
        q = (query @ w[:d].T + b[:d]).reshape(-1, h, d // h).transpose(0, 1)
        k = (keys @ w[d : 2 * d].T + b[d : 2 * d]).reshape(-1, h, d // h).transpose(0, 1)
        v = (keys @ w[2 * d :].T + b[2 * d :]).reshape(-1, h, d // h).transpose(0, 1)
        weights = torch.softmax(q @ k.transpose(1, 2) / math.sqrt(d // h), dim=-1)
        context = att.out_proj((weights @ v).transpose(0, 1).reshape(-1, d))
        feats = torch.cat([query, context, query * context, base.unsqueeze(-1)], dim=-1)
        out: Tensor = base + self.head(feats).squeeze(-1)
        return out


@dataclass
class Reranker(OnnxBacked[OnnxReranker]):
    """A loaded re-ranker: its version, the item slots it reads (in order) and the module.

    Torch runs it until :meth:`compile` (the service loads it so): from then on, on the CPU, ONNX Runtime
    runs it when it is the ranker's runtime (:func:`~headwater.ranking.accel.ranker_runtime`), with
    torch behind it (a failed export or call is counted in ``onnx_failures`` and torch scores).
    """

    version: str
    item_features: tuple[str, ...]
    model: SequenceReranker
    max_clicks: int
    metadata: dict[str, Any] = field(default_factory=dict)
    onnx_module: ClassVar[str] = "re-ranker"
    onnx_torch_does: ClassVar[str] = "re-ranking with torch"

    def __post_init__(self) -> None:
        self.device = next(self.model.parameters()).device
        self._onnx_init(TORCH)

    def compile(self, runtime: str | None = None) -> None:
        """Export to ONNX Runtime where it is to run (``runtime``: default the ranker's); idempotent."""
        self.requested_runtime = runtime or ranker_runtime(str(self.device))
        self._onnx_build(lambda: OnnxReranker.export(self.model, self.model.item_dim))

    def warm(self) -> None:
        """Run one forward so the first request pays no set-up (torch's per-thread one, ORT's first run)."""
        dim = self.model.item_dim
        self.score(
            np.zeros((2, dim), np.float32), np.full(2, 0.5, np.float32), np.zeros((1, dim), np.float32)
        )

    def score(
        self,
        candidates: npt.NDArray[np.float32],
        base_prob: npt.NDArray[np.float32],
        clicks: npt.NDArray[np.float32],
    ) -> npt.NDArray[np.float32]:
        """Scores (probabilities) of one request's candidates given the DCN's and the click vectors."""
        p = np.clip(np.asarray(base_prob, dtype=np.float64), 1e-6, 1 - 1e-6)
        logit = np.log(p / (1 - p)).astype(np.float32)
        clicks = clicks[-self.max_clicks :] if len(clicks) else np.zeros((0, candidates.shape[1]), np.float32)
        candidates = np.ascontiguousarray(candidates, dtype=np.float32)
        clicks = np.ascontiguousarray(clicks, dtype=np.float32)
        fast = self._onnx_call(lambda session: session.scores(candidates, logit, clicks))
        if fast is not None:
            return fast
        with torch.inference_mode():
            out = self.model(
                torch.from_numpy(np.ascontiguousarray(candidates, dtype=np.float32))[None],
                torch.from_numpy(logit)[None],
                torch.from_numpy(np.ascontiguousarray(clicks, dtype=np.float32))[None],
                torch.zeros(1, len(clicks), dtype=torch.bool),
            )
            scores: npt.NDArray[np.float32] = torch.sigmoid(out[0]).numpy()
        return scores


@dataclass(frozen=True)
class RerankOptions:
    """Hyper-parameters of :func:`train_reranker`."""

    dim: int = 32
    heads: int = 2
    max_clicks: int = 20
    epochs: int = 3
    batch_size: int = 256
    learning_rate: float = 2e-3
    holdout: float = 0.2
    seed: int = 0
    threads: int | None = None


def click_sequences(ts: TrainingSet, max_clicks: int) -> npt.NDArray[np.intp]:
    """For each row, the rows of that user's ``max_clicks`` newest earlier positives (-1 = padding).

    Rows are visited in time order and a positive joins the user's sequence only after every row of
    its own time, so a row never sees its own label or a simultaneous one.
    """
    order = np.argsort(ts.event_time_ms, kind="mergesort")
    out = np.full((len(ts), max_clicks), -1, dtype=np.intp)
    history: dict[str, deque[int]] = {}
    pending: list[int] = []
    last_time: int | None = None
    for row in order.tolist():
        t = int(ts.event_time_ms[row])
        if last_time is not None and t != last_time:
            for p in pending:
                history.setdefault(str(ts.user_ids[p]), deque(maxlen=max_clicks)).append(p)
            pending = []
        last_time = t
        seq = history.get(str(ts.user_ids[row]))
        if seq:
            out[row, max_clicks - len(seq) :] = list(seq)  # oldest first, newest last
        if ts.label[row] > 0:
            pending.append(row)
    return out


def _logit(p: npt.NDArray[np.floating[Any]]) -> npt.NDArray[np.float32]:
    q = np.clip(np.asarray(p, dtype=np.float64), 1e-6, 1 - 1e-6)
    return np.log(q / (1 - q)).astype(np.float32)


def _forward(
    model: SequenceReranker, ts: TrainingSet, seqs: npt.NDArray[np.intp], base: npt.NDArray[np.float32],
    rows: npt.NDArray[np.intp],
) -> Tensor:  # fmt: skip
    idx = seqs[rows]
    pad = idx < 0
    clicks = ts.item[np.where(pad, 0, idx)]
    return model(  # type: ignore[no-any-return]
        torch.from_numpy(ts.item[rows][:, None, :]),
        torch.from_numpy(base[rows][:, None]),
        torch.from_numpy(clicks),
        torch.from_numpy(pad),
    )[:, 0]


def train_reranker(
    ts: TrainingSet, base_prob: npt.NDArray[np.floating[Any]], opts: RerankOptions | None = None
) -> tuple[SequenceReranker, dict[str, Any]]:
    """Fit the re-ranker on ``ts`` given the DCN's score (probability) of each row; returns it and metrics.

    Raises:
        TrainingFileError: no positive rows in the training part (nothing to learn a sequence from).
    """
    opts = opts or RerankOptions()
    started = time.perf_counter()
    if opts.threads:
        torch.set_num_threads(opts.threads)
    torch.manual_seed(opts.seed)
    train_rows, test_rows = split_by_time(ts, opts.holdout)
    if not (ts.label[train_rows] > 0).any():
        msg = "training set: no positive row in the training part; the re-ranker needs clicks to learn from"
        raise TrainingFileError(msg)
    seqs = click_sequences(ts, opts.max_clicks)
    base = _logit(base_prob)
    model = SequenceReranker(ts.item.shape[1], opts.dim, opts.heads)
    mean, scale = moments(ts.item[train_rows])
    model.item_mean.copy_(torch.from_numpy(mean))
    model.item_scale.copy_(torch.from_numpy(scale))
    optimizer = torch.optim.Adam(model.parameters(), lr=opts.learning_rate)
    loss_fn = nn.BCEWithLogitsLoss()
    labels = torch.from_numpy(ts.label.astype(np.float32))
    rng = np.random.default_rng(opts.seed)
    model.train()
    for _ in range(opts.epochs):
        perm = train_rows[rng.permutation(len(train_rows))]
        for s in range(0, len(perm), opts.batch_size):
            rows = perm[s : s + opts.batch_size]
            loss = loss_fn(_forward(model, ts, seqs, base, rows), labels[torch.from_numpy(rows)])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
    model.eval()
    with torch.inference_mode():
        reranked = _forward(model, ts, seqs, base, test_rows).numpy()
    test = ts.take(test_rows)
    metrics: dict[str, Any] = {
        "rows": {"train": len(train_rows), "holdout": len(test_rows)},
        "rows_with_clicks": int((seqs[test_rows] >= 0).any(axis=1).sum()),
        "holdout": {
            "dcn": {"auc": round(auc(test.label, base[test_rows]), 4),
                    "ndcg@10": round(ndcg_at_k(test.group, test.label, base[test_rows]), 4)},
            "dcn+reranker": {"auc": round(auc(test.label, reranked), 4),
                             "ndcg@10": round(ndcg_at_k(test.group, test.label, reranked), 4)},
        },
        "seconds": round(time.perf_counter() - started, 2),
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }  # fmt: skip
    return model, metrics


def save_reranker(
    out_dir: Path, model: SequenceReranker, ts: TrainingSet, metrics: dict[str, Any], max_clicks: int
) -> Reranker:
    """Write ``reranker-<version>.pt`` and point ``latest.json``'s ``reranker`` entry at it."""
    state = {k: v.detach().to("cpu").contiguous().clone() for k, v in model.state_dict().items()}
    meta: dict[str, Any] = {
        "kind": KIND,
        "registry_version": ts.registry_version,
        "item_features": list(ts.item_features),
        "hyperparameters": {"dim": model.dim, "heads": model.heads, "max_clicks": max_clicks},
        "training": {k: v for k, v in metrics.items() if k not in ("created_at", "seconds")},
        "created_at": metrics.get("created_at", ""),
    }
    path = write_versioned(out_dir, KIND, FORMAT, meta, state)
    point_latest(out_dir, KIND, path)
    return Reranker(meta["model_version"], tuple(ts.item_features), model.eval(), max_clicks, meta)


def load_reranker(path: Path) -> Reranker:
    """Load ``path`` (a file, or a models folder whose ``latest.json`` names a ``reranker``).

    Raises:
        ArtifactError: missing, unreadable, of another format, modified, or not fitting its metadata.
    """
    path = resolve_model_path(path, KIND, "headwater funnel train-reranker")
    meta, state = read_verified(path, FORMAT, "re-ranker artifact", "run `headwater funnel train-reranker`")
    try:
        hyper = meta["hyperparameters"]
        model = SequenceReranker(len(meta["item_features"]), int(hyper["dim"]), int(hyper["heads"]))
        model.load_state_dict(state)
        max_clicks = int(hyper["max_clicks"])
    except (KeyError, TypeError, ValueError, RuntimeError) as exc:
        msg = f"re-ranker artifact {path}: does not fit its metadata ({type(exc).__name__}: {exc}); retrain"
        raise ArtifactError(msg) from exc
    return Reranker(str(meta["model_version"]), tuple(meta["item_features"]), model.eval(), max_clicks, meta)
