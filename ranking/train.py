"""Train the DCN-v2 ranker and its linear fallback, evaluate them on a time holdout, save artifacts.

Steps of :func:`train_and_save`:

1. Split the training set by time: the latest ``holdout`` share of slates is the holdout.
2. Choose the count inputs (:func:`count_columns`, ``opts.log_counts``: both models take
   ``log(1 + x)`` of them, the masks travel in both artifacts) and fit input means and scales on the
   training rows as the models see them (both models share them, :func:`input_norm`).
3. Fit the logistic-regression fallback on the same inputs (full-batch L-BFGS, to convergence), its
   L2 penalty chosen on the latest training slates (:func:`choose_linear_l2`).
4. Train the DCN ranker (Adam) on CUDA when present, else the CPU, by default starting from the
   fallback (``opts.warm_start``, :func:`warm_from_linear`: the DCN's first cross layer and head
   can hold the linear model exactly, so it starts at the fallback's holdout figures and
   fine-tunes at ``opts.warm_learning_rate``; from a random start at 2e-3 it ended below the
   fallback on MovieLens and tied it on the generator's stream, and at 2e-3 a warm start is
   thrown away within one epoch). Its loss is ``opts.loss``:
   ``pointwise`` (binary cross-entropy per row), ``listwise`` (softmax cross-entropy within each
   slate, :func:`slate_softmax_loss`: the order within a slate is what NDCG judges) or ``mixed``
   (``listwise_weight`` x listwise + the rest x pointwise, the default: the pointwise part keeps
   scores calibrated across slates for AUC, the listwise part orders each slate). When the set
   carries the slot each impression was shown at, a per-position logit offset
   (:class:`PositionBias`, ``opts.position_bias``) is fitted on the DCN's logits (by default
   after it trains) and never served: the service ranks by what an item is worth, not by where a
   production ranker happened to put it. Its holdout entry ``dcn_at_position`` (the click
   probability where each row was shown) is the one to compare with the oracle, which knows the
   position too; ``dcn`` (the served score) compares with ``oracle_relevance``.
5. Score the holdout with both, with the popularity baseline and with each input feature alone
   (``best_feature``: the one with the best NDCG@10); when the training set carries an ``oracle``
   column (the synthetic generator's true click probability), the oracle too: the ceiling.
6. Save ``linear-<version>.pt``, then ``dcn-<version>.pt`` naming it, the metrics JSON and
   ``latest.json`` (written last, so a reader never sees a pointer to a missing file).
"""

from __future__ import annotations

import json
import math
import platform
import time
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
from torch import nn

from headwater.ranking.artifact import Artifact, point_latest, save_artifact
from headwater.ranking.evaluation import auc, feature_scores, ndcg_at_k, popularity_scores
from headwater.ranking.inputs import (
    LOG_COUNTS,
    input_norm,
    split_by_time,
    standardized,
)
from headwater.ranking.losses import PositionBias, fit_position_bias, slate_pairwise_loss, slate_softmax_loss
from headwater.ranking.model import (
    LOG_MASKS,
    DCNRanker,
    linear_logits,
    pick_device,
)
from headwater.ranking.trainset import TrainingSet


@dataclass(frozen=True)
class TrainOptions:
    """Hyper-parameters of one training run."""

    seed: int = 0
    epochs: int = 8
    """Passes over the training rows (bench_quality, generated stream, 3 seeds: 8 against 4 lifts the
    served score's AUC / NDCG@10 by 0.0013 / 0.0023, see ``bench/results/bench_quality.json``)."""
    batch_size: int = 2048
    learning_rate: float = 2e-3
    embed_dim: int = 16
    cross_layers: int = 3
    deep: tuple[int, ...] = (256, 128)
    holdout: float = 0.2
    linear_iterations: int = 100
    """L-BFGS iterations (full batch) of the linear fallback."""
    linear_l2: float = 1e-4
    """L2 penalty on the linear fallback's weights (per-row mean loss + this x sum of squares)."""
    linear_l2_grid: tuple[float, ...] = (1e-4, 1e-3, 1e-2, 1e-1)
    """When not empty, ``train_and_save`` picks ``linear_l2`` from these (:func:`choose_linear_l2`:
    fitted on the earlier 90% of the training slates, judged on the latest 10%) before fitting the
    fallback the DCN starts from. A small set with many inputs needs more than a large one: the
    ``make demo`` set (1,552 training clicks, 142 inputs, 2,700 cross weights) picks 1e-3, which
    lifts its DCN from 0.553 / 0.531 to 0.575 / 0.552 AUC / NDCG@10; the quality sets pick 1e-3
    too, within 0.001 of 1e-4 there. Empty: ``linear_l2`` as given."""
    device: str | None = None
    loss: str = "mixed"
    """``pointwise``, ``listwise`` or ``mixed`` (see the module docstring)."""
    listwise_weight: float = 0.05
    """Share of the listwise term in the ``mixed`` loss. Small: a slate's softmax cross-entropy is
    about log(slate size) against a per-row log loss of 0.2-0.6, and with a warm start a weight of
    0.2-0.5 lowered MovieLens' AUC below the fallback's (0.732 against 0.734) without lifting its
    NDCG@10; 0.05 keeps the fallback's AUC there and lifts the stream set's NDCG@10."""
    warm_start: bool = True
    """Start the DCN at the fitted linear fallback (:func:`warm_from_linear`)."""
    warm_learning_rate: float = 2e-4
    """Adam's step when warm-starting (``learning_rate`` is the step from a random start)."""
    position_bias: str = "after"
    """When the training set carries positions, a logit offset per slot shown at
    (:class:`PositionBias`; never part of the served score): ``after`` fits the offsets on the
    trained DCN's logits (the DCN sees no position), ``joint`` trains them beside the DCN (clicks the
    slot explains are not credited to the items' features; but the slot a production ranker chose
    also carries that ranker's view of relevance, which then leaves the DCN), ``none`` skips them."""

    pairwise_weight: float = 0.0
    """Weight of a pairwise (RankNet) term within slates, :func:`slate_pairwise_loss`, added to
    ``loss``: every (clicked, not clicked) pair of rows of one slate, the clicked one to score higher."""
    early_stopping: float = 0.0
    """When > 0: this latest share of the training slates validates each epoch (holdout NDCG@10 and
    AUC, summed), and the DCN keeps its best epoch's weights (at most ``epochs``; stops after
    :data:`PATIENCE` epochs without a better one). The validation rows are not trained on."""
    log_counts: str = "auto"
    """``auto``: the models take ``log(1 + x)`` of the inputs :func:`count_columns` finds counts in
    the training rows (measured, bench_quality: generated stream at the slot 0.8348 / 0.7789 against
    0.8327 / 0.7765 AUC / NDCG@10); ``none``: every input as it is (artifacts before this option)."""

    user_at_slate_start: bool = True
    """Train and judge on each slate's first row's user inputs (:meth:`TrainingSet.user_at_slate_start`):
    the service scores a slate with one user vector, while a set joined as of each impression's own
    time lets the slot leak into counters such as ``impressions_5m``. ``False``: the rows as built."""

    def __post_init__(self) -> None:
        """Reject an unknown loss or a weight outside [0, 1], naming the option."""
        if self.log_counts not in LOG_COUNTS:
            msg = f"TrainOptions.log_counts: expected one of {LOG_COUNTS}, found {self.log_counts!r}"
            raise ValueError(msg)
        if self.loss not in LOSSES:
            msg = f"TrainOptions.loss: expected one of {LOSSES}, found {self.loss!r}"
            raise ValueError(msg)
        if self.position_bias not in POSITION_BIAS:
            msg = f"TrainOptions.position_bias: expected one of {POSITION_BIAS}, found {self.position_bias!r}"
            raise ValueError(msg)
        if not 0.0 <= self.listwise_weight <= 1.0:
            msg = f"TrainOptions.listwise_weight: expected a value in [0, 1], found {self.listwise_weight}"
            raise ValueError(msg)


LOSSES = ("pointwise", "listwise", "mixed")
POSITION_BIAS = ("after", "joint", "none")


@dataclass
class TrainReport:
    """What a run produced: artifacts and holdout metrics."""

    dcn: Artifact
    linear: Artifact
    metrics: dict[str, Any] = field(default_factory=dict)
    metrics_path: Path | None = None


LINEAR_L2_VALIDATION = 0.1
"""Latest share of the training slates that judges each of ``TrainOptions.linear_l2_grid``."""


def choose_linear_l2(train: TrainingSet, opts: TrainOptions) -> tuple[TrainOptions, dict[str, float]]:
    """Return ``opts`` with the ``linear_l2`` of its grid that validates best, and each one's figure.

    Each candidate fits the fallback on the earlier slates of ``train`` (inputs scaled on those
    rows) and scores the latest :data:`LINEAR_L2_VALIDATION` share: AUC + NDCG@10, the sum early
    stopping uses. Ties go to the smaller penalty. A grid of one value, an empty grid or a set too
    small to validate (no click or no non-click in the validation rows) returns ``opts`` as given.
    """
    grid = sorted(set(opts.linear_l2_grid))
    if len(grid) < 2:
        return opts, {}
    fit_rows, valid_rows = split_by_time(train, LINEAR_L2_VALIDATION)
    fit, valid = train.take(fit_rows), train.take(valid_rows)
    if len(fit) == 0 or not 0.0 < float(valid.label.mean() if len(valid) else 0.0) < 1.0:
        return opts, {}
    norm = input_norm(fit, opts.log_counts)
    figures: dict[str, float] = {}
    best, best_figure = opts.linear_l2, -math.inf
    for l2 in grid:
        state = train_linear(fit, replace(opts, linear_l2=l2), norm)
        scores = linear_logits(state, *standardized(valid, norm)).detach().numpy()
        figure = auc(valid.label, scores) + ndcg_at_k(valid.group, valid.label, scores)
        figures[f"{l2:g}"] = round(figure, 4)
        if figure > best_figure:
            best, best_figure = l2, figure
    return replace(opts, linear_l2=best), figures


def _batches(n: int, size: int, rng: np.random.Generator) -> list[npt.NDArray[np.intp]]:
    perm = rng.permutation(n)
    return [perm[i : i + size] for i in range(0, n, size)]


def _slate_batches(
    slate: npt.NDArray[np.intp], size: int, rng: np.random.Generator
) -> list[npt.NDArray[np.intp]]:
    """Row batches of about ``size`` rows made of whole slates (``slate``: dense slate index per row)."""
    order = np.argsort(slate, kind="stable")
    starts = np.searchsorted(slate[order], np.arange(int(slate.max()) + 1))
    ends = np.append(starts[1:], len(order))
    batches: list[npt.NDArray[np.intp]] = []
    current: list[npt.NDArray[np.intp]] = []
    rows = 0
    for g in rng.permutation(len(starts)):
        current.append(order[starts[g] : ends[g]])
        rows += ends[g] - starts[g]
        if rows >= size:
            batches.append(np.concatenate(current))
            current, rows = [], 0
    if current:
        batches.append(np.concatenate(current))
    return batches


PATIENCE = 2
"""Epochs without a better validation figure before early stopping ends training."""


def train_dcn(
    train: TrainingSet,
    opts: TrainOptions,
    device: str,
    norm: tuple[Any, ...],
    linear: dict[str, torch.Tensor] | None = None,
) -> DCNRanker:
    """Fit the DCN ranker on ``train`` with ``opts.loss`` (batches of whole slates unless pointwise)."""
    return train_ranker(train, opts, device, norm, linear)[0]


def warm_from_linear(model: DCNRanker, linear: dict[str, torch.Tensor]) -> None:
    """Set ``model``'s parameters so that its logits equal the linear fallback's ``linear`` state.

    Both models standardise their inputs the same way (the same ``norm``). With ``x0 = [u, i, ...]``
    the first cross layer gives ``x1 = x0 * (W x0 + b) + x0``; with ``W[u, i] = w_cross``,
    ``b[u] = w_user - 1`` and the rest 0, a head reading ``u`` with weight 1 and ``i`` with ``w_item``
    (plus the bias) gives ``u^T w_cross i + u.w_user + i.w_item + bias``, the linear logit. The
    later cross layers start at 0 (each passes its input on unchanged) and the head reads nothing
    else, so the deep branch and the embeddings start with no say and earn it in training.
    """
    du, di = model.user_dim, model.item_dim
    layers = [layer for layer in model.cross if isinstance(layer, nn.Linear)]
    with torch.no_grad():
        for layer in layers:
            layer.weight.zero_()
            layer.bias.zero_()
        first = layers[0]
        first.weight[:du, du : du + di] = linear["w_cross"]
        first.bias[:du] = linear["w_user"] - 1.0
        model.head.weight.zero_()
        model.head.weight[0, :du] = 1.0
        model.head.weight[0, du : du + di] = linear["w_item"]
        model.head.bias.copy_(linear["bias"].reshape(1))


def train_ranker(
    train: TrainingSet,
    opts: TrainOptions,
    device: str,
    norm: tuple[Any, ...],
    linear: dict[str, torch.Tensor] | None = None,
) -> tuple[DCNRanker, PositionBias | None]:
    """Fit the DCN and, when the set has positions and ``opts.position_bias`` is not ``none``, its offsets.

    With ``opts.warm_start`` the DCN starts at ``linear`` (the fallback fitted on the same rows and
    ``norm``; fitted here when not given) and trains at ``opts.warm_learning_rate``.
    """
    if opts.warm_start and opts.cross_layers < 1:
        msg = "TrainOptions.warm_start needs cross_layers >= 1 (the first cross layer holds the crosses)"
        raise ValueError(msg)
    full, valid = train, None
    if opts.early_stopping > 0.0:
        fit_rows, valid_rows = split_by_time(train, opts.early_stopping)
        train, valid = train.take(fit_rows), train.take(valid_rows)
        linear = None  # the start must not have seen the validation rows either
    torch.manual_seed(opts.seed)
    model = DCNRanker(
        len(train.user_features), len(train.item_features), opts.embed_dim, opts.cross_layers, opts.deep
    )
    model.set_normalization(*norm)
    if opts.warm_start:
        warm_from_linear(model, linear if linear is not None else train_linear(train, opts, norm))
    best = _Best(valid, model) if valid is not None else None
    model.to(device).train()
    users, items = torch.from_numpy(train.user).to(device), torch.from_numpy(train.item).to(device)
    labels = torch.from_numpy(train.label).to(device)
    bias = None
    if opts.position_bias == "joint" and train.position is not None:
        bias = PositionBias()
        bias.start_from(train.position, train.label)
        bias.to(device)
    positions = torch.from_numpy(train.position).to(device) if bias is not None else None
    params = list(model.parameters()) + (list(bias.parameters()) if bias is not None else [])
    step = opts.warm_learning_rate if opts.warm_start else opts.learning_rate
    optimizer = torch.optim.Adam(params, lr=step)
    loss_fn = nn.BCEWithLogitsLoss()
    rng = np.random.default_rng(opts.seed)
    weight = {"pointwise": 0.0, "listwise": 1.0, "mixed": opts.listwise_weight}[opts.loss]
    _, slate = np.unique(train.group, return_inverse=True)
    for _ in range(opts.epochs):
        batches = (
            _batches(len(train), opts.batch_size, rng)
            if weight == 0.0 and opts.pairwise_weight == 0.0
            else _slate_batches(slate, opts.batch_size, rng)
        )
        for rows in batches:
            idx = torch.from_numpy(rows).to(device)
            logits = model(users[idx], items[idx], torch.arange(len(rows), device=device))
            if bias is not None and positions is not None:
                logits = logits + bias(positions[idx])
            loss = (1.0 - weight) * loss_fn(logits, labels[idx]) if weight < 1.0 else logits.sum() * 0.0
            if weight > 0.0 or opts.pairwise_weight > 0.0:
                _, dense = np.unique(slate[rows], return_inverse=True)
                local = torch.from_numpy(dense.astype(np.int64)).to(device)
                if weight > 0.0:
                    loss = loss + weight * slate_softmax_loss(logits, labels[idx], local)
                if opts.pairwise_weight > 0.0:
                    loss = loss + opts.pairwise_weight * slate_pairwise_loss(logits, labels[idx], local)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        if best is not None and best.update(model) >= PATIENCE:
            break
    if best is not None:
        best.restore(model)
    model = model.eval().cpu()
    if opts.position_bias == "after" and full.position is not None:
        return model, fit_position_bias(_score_dcn(model, full), full.position, full.label)
    return model, (bias.eval().cpu() if bias is not None else None)


class _Best:
    """Early stopping's bookkeeping: the best validation figure so far and that epoch's weights."""

    def __init__(self, valid: TrainingSet, model: DCNRanker) -> None:
        self.valid = valid
        self.score = -math.inf
        self.state: dict[str, torch.Tensor] = {}
        self.stale = 0
        self.epochs = -1
        self.best_epoch = 0
        self.update(model)

    def update(self, model: DCNRanker) -> int:
        """Score ``model`` on the validation rows, keep its weights when better; epochs since the best."""
        model.eval()
        dev = next(model.parameters()).device
        with torch.inference_mode():
            out = model(
                torch.from_numpy(self.valid.user).to(dev),
                torch.from_numpy(self.valid.item).to(dev),
                torch.arange(len(self.valid), device=dev),
            )
        logits = out.float().cpu().numpy()
        model.train()
        figure = auc(self.valid.label, logits) + ndcg_at_k(self.valid.group, self.valid.label, logits)
        self.epochs += 1
        if figure > self.score:
            self.score, self.stale, self.best_epoch = figure, 0, self.epochs
            self.state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        else:
            self.stale += 1
        return self.stale

    def restore(self, model: DCNRanker) -> None:
        """Put the best epoch's weights back into ``model``."""
        model.load_state_dict(self.state)


def train_linear(train: TrainingSet, opts: TrainOptions, norm: tuple[Any, ...]) -> dict[str, torch.Tensor]:
    """Fit the logistic-regression fallback on ``train``: full-batch L-BFGS, L2 on every weight.

    The loss is convex, so it is minimised to convergence (deterministic for a given training set)
    rather than by a few minibatch epochs: with Adam at a fixed step from zero weights and a zero
    bias, a few hundred steps left the bias far above the base rate's log-odds and the ~400 cross
    weights mostly fitting noise, which ranked the holdout below chance.
    """
    torch.manual_seed(opts.seed + 1)
    users, items = standardized(train, norm)
    labels = torch.from_numpy(train.label)
    du, di = users.shape[1], items.shape[1]
    rate = min(max(float(labels.mean()), 1e-6), 1.0 - 1e-6)
    params = {
        "w_user": torch.zeros(du, requires_grad=True),
        "w_item": torch.zeros(di, requires_grad=True),
        "w_cross": torch.zeros(du, di, requires_grad=True),
        "bias": torch.full((1,), math.log(rate / (1.0 - rate)), requires_grad=True),
    }
    weights = [params["w_user"], params["w_item"], params["w_cross"]]
    optimizer = torch.optim.LBFGS(
        list(params.values()),
        lr=1.0,
        max_iter=opts.linear_iterations,
        history_size=20,
        tolerance_grad=1e-7,
        tolerance_change=1e-10,
        line_search_fn="strong_wolfe",
    )

    def closure() -> torch.Tensor:
        optimizer.zero_grad(set_to_none=True)
        logits = linear_logits(params, users, items)
        loss = nn.functional.binary_cross_entropy_with_logits(logits, labels)
        loss = loss + opts.linear_l2 * sum(w.pow(2).sum() for w in weights)
        torch.autograd.backward(loss)
        return loss

    optimizer.step(closure)  # type: ignore[no-untyped-call]  # torch leaves LBFGS.step untyped
    state = {k: v.detach().clone() for k, v in params.items()}
    names = ("user_mean", "user_scale", "item_mean", "item_scale", *LOG_MASKS)
    for name, value in zip(names[: len(norm)], norm, strict=True):
        state[name] = torch.as_tensor(value)
    return state


def _metrics(test: TrainingSet, scores: npt.NDArray[np.floating[Any]]) -> dict[str, float]:
    return {
        "auc": round(auc(test.label, scores), 4),
        "ndcg@10": round(ndcg_at_k(test.group, test.label, scores), 4),
    }


def _score_dcn(model: DCNRanker, ts: TrainingSet) -> npt.NDArray[np.float32]:
    with torch.inference_mode():
        logits = model(torch.from_numpy(ts.user), torch.from_numpy(ts.item), torch.arange(len(ts)))
    scores: npt.NDArray[np.float32] = logits.numpy()
    return scores


def at_position(
    scores: npt.NDArray[np.floating[Any]], bias: PositionBias, ts: TrainingSet
) -> npt.NDArray[np.float64]:
    """Return the click logit where each row was shown: ``scale x scores`` (DCN logits) + its offset."""
    if ts.position is None:
        msg = "at_position: the training set has no position column"
        raise ValueError(msg)
    with torch.no_grad():
        offsets = bias(torch.from_numpy(ts.position)).numpy().astype(np.float64)
    out: npt.NDArray[np.float64] = float(bias.scale.detach()) * np.asarray(scores, np.float64) + offsets
    return out


def holdout_metrics(
    train: TrainingSet, test: TrainingSet, models: dict[str, npt.NDArray[np.floating[Any]]]
) -> dict[str, Any]:
    """Return AUC and NDCG@10 on ``test`` of each of ``models``' scores and of the baselines.

    Baselines: popularity, the best single input feature (``best_feature``, with its ``name``;
    chosen by holdout NDCG@10, so an upper bound for the feature baselines; its ``training_pick``
    is the input with the best NDCG@10 on the training rows, and its holdout figures) and, when ``test``
    carries them, the oracle columns (``coverage``: the share of holdout rows they score; the
    metrics are over those rows).
    """
    out: dict[str, Any] = {name: _metrics(test, scores) for name, scores in models.items()}
    out["popularity"] = _metrics(test, popularity_scores(train.item_ids, train.label, test.item_ids))
    names = [f"user.{f}" for f in train.user_features] + [f"item.{f}" for f in train.item_features]
    single = feature_scores(
        np.hstack([train.user, train.item]), train.label, np.hstack([test.user, test.item])
    )
    per_feature = {name: _metrics(test, single[:, j]) for j, name in enumerate(names)}
    best = max(per_feature, key=lambda n: (np.nan_to_num(per_feature[n]["ndcg@10"], nan=-1.0), n))
    pick = _training_pick(train, names)
    out["best_feature"] = {
        **per_feature[best],
        "name": best,
        "training_pick": {**per_feature[pick], "name": pick},
    }
    for name, values in test.oracle.items():
        known = np.isfinite(values)
        if known.any():
            rows = np.flatnonzero(known)
            out[name] = {**_metrics(test.take(rows), values[rows]), "coverage": round(float(known.mean()), 4)}
    return out


def _training_pick(train: TrainingSet, names: list[str]) -> str:
    """Return the input with the best NDCG@10 on the training rows.

    A single feature chosen without the holdout: ``best_feature`` itself is chosen on the holdout,
    the maximum of many noisy figures on a small one.
    """
    x = np.hstack([train.user, train.item])
    single = feature_scores(x, train.label, x)
    figures = [
        np.nan_to_num(ndcg_at_k(train.group, train.label, single[:, j]), nan=-1.0) for j in range(len(names))
    ]
    return names[int(np.argmax(figures))]


def train_and_save(ts: TrainingSet, out_dir: Path, opts: TrainOptions) -> TrainReport:
    """Run the six steps of the module docstring; returns the artifacts and the metrics."""
    started = time.perf_counter()
    if opts.user_at_slate_start:  # one user vector per slate, as served (no slot leaks in)
        ts = ts.user_at_slate_start()
    ts = ts.for_ranker()  # on-demand (pair) features are item-side inputs of both models
    device = pick_device(opts.device)
    # Step 1
    train_rows, test_rows = split_by_time(ts, opts.holdout)
    train, test = ts.take(train_rows), ts.take(test_rows)
    # Step 2
    norm = input_norm(train, opts.log_counts)
    # Step 3, 4
    opts, l2_figures = choose_linear_l2(train, opts)
    linear_state = train_linear(train, opts, norm)
    dcn, bias = train_ranker(train, opts, device, norm, linear_state)
    # Step 5
    linear_scores = linear_logits(linear_state, *standardized(test, norm)).detach().numpy()
    scores = {"dcn": _score_dcn(dcn, test), "linear": linear_scores}
    if bias is not None:  # the click logit where each holdout row was shown: against the oracle's AUC
        scores["dcn_at_position"] = at_position(scores["dcn"], bias, test)
    holdout = holdout_metrics(train, test, scores)
    # Step 6
    base = {
        "registry_version": ts.registry_version,
        "view_versions": dict(ts.view_versions),
        "user_features": list(ts.user_features),
        "item_features": list(ts.item_features),
        "log_inputs": {
            "user": [f for f, m in zip(ts.user_features, norm[4], strict=True) if m],
            "item": [f for f, m in zip(ts.item_features, norm[5], strict=True) if m],
        },
        "training": {
            "rows": len(train),
            "holdout_rows": len(test),
            "seed": opts.seed,
            "loss": opts.loss,
            "position_bias": bias.describe(opts.position_bias) if bias is not None else None,
            "holdout": holdout,
        },
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    linear = save_artifact(out_dir, {**base, "kind": "linear"}, linear_state)
    hyper = {"embed_dim": opts.embed_dim, "cross_layers": opts.cross_layers, "deep": list(opts.deep)}
    dcn_meta = {**base, "kind": "dcn", "hyperparameters": hyper, "linear_artifact": linear.path.name}
    dcn_artifact = save_artifact(out_dir, dcn_meta, dcn.state_dict())
    metrics = {
        "model_version": dcn_artifact.version,
        "linear_version": linear.version,
        "registry_version": ts.registry_version,
        "device": device,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "rows": {
            "train": len(train),
            "holdout": len(test),
            "positive_rate": round(float(ts.label.mean()), 4),
        },
        "holdout": holdout,
        "seconds": round(time.perf_counter() - started, 2),
        "options": asdict(opts),
        "linear_l2_validation": l2_figures,
    }
    metrics_path = out_dir / f"metrics-{dcn_artifact.version}.json"
    metrics_path.write_text(json.dumps(metrics, indent=2) + "\n", encoding="utf-8")
    # Only this run's entries: the funnel's two-tower and re-ranker pointers stay (the service
    # checks a re-ranker against the DCN's item slots at load).
    for kind, path in (("dcn", dcn_artifact.path), ("linear", linear.path), ("metrics", metrics_path)):
        point_latest(out_dir, kind, path)
    return TrainReport(dcn_artifact, linear, metrics, metrics_path)
