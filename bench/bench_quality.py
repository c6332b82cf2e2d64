"""Ranking quality with a ceiling (issue 15 item 2): every ranker and baseline on one time holdout.

Oracle, DCN variants (``--variants``: the default, warm-started from the linear fallback with a mixed
loss and log(1 + x) of the count inputs; ``dcn_cold``, a random start at 2e-3 with half listwise;
listwise, pointwise, pairwise, early stopping, without the position offsets, without the user x
category inputs, without the collaborative neighbour inputs, without the log of the counts), linear,
popularity, ALS and the best single input feature. Every model is trained as ``headwater model
train`` trains: the user side of each slate as of its first row, the fallback's L2 chosen on the
latest training slates (``serving.train.choose_linear_l2``).

    nice -n 19 .venv/bin/python bench/bench_quality.py --stream-only 80000 --seeds 0,1,2   # Python sets
    .venv/bin/python bench/bench_quality.py                   # offline tier (Spark): synthetic + MovieLens

Data. ``--stream-only N`` (ranking/quality_sets.py, no Spark): the behaviour generator's stream of N
emissions (generator seed 11, 2,000 users, 1,000 items) with point-in-time user, item and pair
(user x the item's category) features, the generator's true click probability per impression as
the ``oracle`` and ``oracle_relevance`` (the same without the position factor: the ceiling of a
score that does not see the position), and the collaborative neighbour inputs (what users who
clicked what this user clicked did with the item, point-in-time); and MovieLens 100k, every
rating a row of the ``events`` source through the import path's reader, ``to-now`` time shift and
row checker, the films' first genre as their category (the ``recbole`` 1.2.1 wheel ships the
files: an installed copy, else ``pip download --no-deps`` into --cache and the two files are read
out of the wheel). Without
``--stream-only`` (cached under --cache, see bench/quality_data.py): the same two through the
offline tier (import into bronze, every view, labels, the training-set join).

Every model trains on the earlier 80% of slates and is judged on the latest 20%
(``serving.train.split_by_time``), the split ``headwater model train`` uses. AUC over all holdout
rows, NDCG@10 within slates (tied rows get their expected discount). ``dcn`` is the served score
(no position); ``dcn_at_position`` adds the per-slot offsets fitted on the training rows (the click
probability where each row was shown: the figure to hold against the oracle, which knows the
slot). ``best_feature`` is the input feature with the best holdout NDCG@10 used alone as a score
(sign from the training rows), an upper bound of the single-feature baselines (its ``training_pick``:
the input best on the training rows, and its holdout figures). ``als`` is implicit's
AlternatingLeastSquares on the training rows' clicks (user x item), a user's dot product with each
item; unseen users or items score 0. ``within_slate_linear_fit_on_holdout`` is no model but a ceiling:
a slate-softmax regression over the item inputs and every user x item product, fitted on the holdout
it scores (its NDCG@10 bounds any linear within-slate order of these inputs). Training runs on one
torch thread. Writes bench/results/bench_quality.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # one thread (shared machine); set before numpy loads
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np
import numpy.typing as npt
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import quality_data

from headwater.ranking.inputs import input_norm, split_by_time, standardized
from headwater.ranking.losses import fit_position_bias, slate_softmax_loss
from headwater.ranking.model import linear_logits
from headwater.ranking.quality_sets import NEIGHBOUR_FEATURES, generator_set
from headwater.ranking.train import (
    TrainOptions,
    _score_dcn,
    at_position,
    choose_linear_l2,
    holdout_metrics,
    train_linear,
    train_ranker,
)
from headwater.ranking.trainset import TrainingSet, read_parquet

RESULTS = Path(__file__).resolve().parent / "results" / "bench_quality.json"
VARIANTS: dict[str, dict[str, Any]] = {
    "dcn": {"loss": "mixed"},
    "dcn_cold": {"loss": "mixed", "warm_start": False, "listwise_weight": 0.5},
    "dcn_cold_pointwise": {"loss": "pointwise", "warm_start": False},
    "dcn_listwise": {"loss": "listwise"},
    "dcn_pointwise": {"loss": "pointwise"},
    "dcn_joint_position_bias": {"loss": "mixed", "position_bias": "joint"},
    "dcn_no_category": {"loss": "mixed", "pair": False},
    "dcn_no_neighbour": {"loss": "mixed", "drop": NEIGHBOUR_FEATURES},
    "dcn_raw_counts": {"loss": "mixed", "log_counts": "none"},
    "dcn_pairwise": {"loss": "mixed", "pairwise_weight": 0.5},
    "dcn_early_stopping": {"loss": "mixed", "early_stopping": 0.1, "epochs": 20},
}
"""DCN variants: TrainOptions fields, ``pair: False`` to leave out every pair (user x item) input and
``drop`` to leave out the named ones (``dcn_no_neighbour``: the collaborative inputs).
Every variant takes log(1 + x) of its count inputs (``TrainOptions.log_counts="auto"``, the default:
on these sets the user's and the item's clicks and impressions) unless it says ``log_counts: "none"``
(``dcn_raw_counts``, the models before; ``linear_raw_counts`` is the fallback on the same inputs).
``dcn_pairwise`` adds a within-slate RankNet term (weight 0.5); ``dcn_early_stopping`` trains up to 20
epochs and keeps the best on the latest 10% of the training slates (not trained on)."""
DEFAULT_VARIANTS = "dcn,dcn_pairwise,dcn_no_neighbour,dcn_no_category,dcn_raw_counts"


def als_scores(train: TrainingSet, test: TrainingSet, seed: int) -> npt.NDArray[np.float64]:
    """Return implicit ALS scores of the test rows, fitted on the training rows' clicks."""
    import implicit
    from scipy.sparse import csr_matrix

    users = {u: j for j, u in enumerate(np.unique(train.user_ids))}
    items = {i: j for j, i in enumerate(np.unique(train.item_ids))}
    clicked = train.label > 0.5
    rows = np.asarray([users[u] for u in train.user_ids[clicked]])
    cols = np.asarray([items[i] for i in train.item_ids[clicked]])
    matrix = csr_matrix((np.ones(len(rows), np.float32), (rows, cols)), shape=(len(users), len(items)))
    model = implicit.als.AlternatingLeastSquares(
        factors=32, regularization=0.05, iterations=20, random_state=seed, use_gpu=False, num_threads=1
    )
    from threadpoolctl import threadpool_limits

    with threadpool_limits(1, "blas"):  # implicit's own threads; OpenBLAS threads under it thrash
        model.fit(matrix, show_progress=False)
    uf, itf = np.asarray(model.user_factors), np.asarray(model.item_factors)
    out = np.zeros(len(test), np.float64)
    for r, (u, i) in enumerate(zip(test.user_ids.tolist(), test.item_ids.tolist(), strict=True)):
        if u in users and i in items:
            out[r] = float(uf[users[u]] @ itf[items[i]])
    return out


def within_slate_bound(fit_on: TrainingSet, norm: tuple[Any, ...]) -> npt.NDArray[np.float64]:
    """Return the scores of ``fit_on`` by a slate-softmax regression fitted on ``fit_on`` itself.

    The inputs are the standardised item inputs and every user x item product (all a linear ranker
    can use within a slate); fitted to convergence (L-BFGS) on the rows it then scores, so its NDCG@10
    bounds what any linear combination of these inputs can reach on them: a ceiling, not a model.
    """
    users, items = standardized(fit_on, norm)
    x = torch.cat([items, (users[:, :, None] * items[:, None, :]).reshape(len(fit_on), -1)], dim=1)
    _, slate = np.unique(fit_on.group, return_inverse=True)
    slates, labels = torch.from_numpy(slate.astype(np.int64)), torch.from_numpy(fit_on.label)
    w = torch.zeros(x.shape[1], requires_grad=True)
    optimizer = torch.optim.LBFGS([w], max_iter=200, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        loss = slate_softmax_loss(x @ w, labels, slates) + 1e-4 * (w**2).sum()
        torch.autograd.backward(loss)
        return loss

    optimizer.step(closure)  # type: ignore[no-untyped-call]
    out: npt.NDArray[np.float64] = (x @ w).detach().numpy().astype(np.float64)
    return out


def evaluate(ts: TrainingSet, seed: int, epochs: int, variants: list[str]) -> dict[str, Any]:
    """Train every model with ``seed`` on the earlier slates; holdout metrics of all of them.

    ``ts`` still holds its pair (on-demand) features apart: each variant takes them as item inputs
    (:meth:`TrainingSet.for_ranker`, what ``headwater model train`` does) unless it says not to.
    """
    ts = ts.user_at_slate_start()  # what ``model train`` does (a no-op on the Python sets: built so)
    train_rows, test_rows = split_by_time(ts, 0.2)
    scores: dict[str, Any] = {}
    seconds: dict[str, float] = {}
    for name in variants:
        spec = dict(VARIANTS[name])
        drop = set(spec.pop("drop", ()))
        kept = ts if spec.pop("pair", True) else replace(ts, pair={})
        full = replace(kept, pair={k: v for k, v in kept.pair.items() if k not in drop}).for_ranker()
        train, test = full.take(train_rows), full.take(test_rows)
        started = time.process_time()
        opts = TrainOptions(seed=seed, device="cpu", **{"epochs": epochs, **spec})
        opts, _ = choose_linear_l2(train, opts)  # as ``model train`` does
        norm = input_norm(train, opts.log_counts)
        model, bias = train_ranker(train, opts, "cpu", norm)
        seconds[name] = round(time.process_time() - started, 1)
        scores[name] = _score_dcn(model, test)
        if bias is not None:
            scores[f"{name}_at_position"] = at_position(scores[name], bias, test)
    linears = {"linear": "auto"}
    if any(VARIANTS[v].get("log_counts") == "none" for v in variants):
        linears["linear_raw_counts"] = "none"
    full = ts.for_ranker()
    for name, mode in linears.items():
        train, test = full.take(train_rows), full.take(test_rows)
        norm = input_norm(train, mode)
        started = time.process_time()
        chosen, _ = choose_linear_l2(train, TrainOptions(seed=seed, log_counts=mode))
        state = train_linear(train, chosen, norm)
        seconds[name] = round(time.process_time() - started, 1)
        scores[name] = linear_logits(state, *standardized(test, norm)).detach().numpy()
        if train.position is not None:  # the same per-slot offsets on the linear model's logits
            fitted = linear_logits(state, *standardized(train, norm)).detach().numpy()
            bias = fit_position_bias(fitted, train.position, train.label)
            scores[f"{name}_at_position"] = at_position(scores[name], bias, test)
    train, test = full.take(train_rows), full.take(test_rows)
    # the ceiling of any linear within-slate order of these inputs: fitted on the holdout itself
    scores["within_slate_linear_fit_on_holdout"] = within_slate_bound(test, input_norm(train))
    started = time.process_time()
    scores["als"] = als_scores(train, test, seed)
    seconds["als"] = round(time.process_time() - started, 1)
    metrics = holdout_metrics(train, test, scores)
    metrics["cpu_seconds"] = seconds
    metrics["rows"] = {
        "train": len(train),
        "holdout": len(test),
        "positive_rate": round(float(ts.label.mean()), 4),
    }
    return metrics


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean and standard deviation of each model's AUC and NDCG@10 over the seeds."""
    out: dict[str, Any] = {}
    for name, first in runs[0].items():
        if not isinstance(first, dict) or "auc" not in first:
            continue
        entry: dict[str, Any] = {}
        for metric in ("auc", "ndcg@10"):
            values = np.asarray([r[name][metric] for r in runs], dtype=np.float64)
            entry[metric] = round(float(values.mean()), 4)
            entry[f"{metric}_sd"] = round(float(values.std()), 4)
        if "name" in first:
            entry["names"] = sorted({r[name]["name"] for r in runs})
        out[name] = entry
    return out


def table(title: str, summary: dict[str, Any]) -> str:
    """Return the summary as a text table, best AUC first."""
    labels = {n: n if "names" not in e else f"{n} ({','.join(e['names'])})" for n, e in summary.items()}
    width = max(len(label) for label in labels.values()) + 2
    lines = [title, f"{'model':<{width}}{'AUC':>8}{'sd':>7}{'NDCG@10':>10}{'sd':>7}"]
    for name, e in sorted(summary.items(), key=lambda kv: -kv[1]["auc"]):
        label = labels[name]
        lines.append(
            f"{label:<{width}}{e['auc']:>8.4f}{e['auc_sd']:>7.4f}{e['ndcg@10']:>10.4f}{e['ndcg@10_sd']:>7.4f}"
        )
    return "\n".join(lines)


def run_set(
    name: str,
    built: quality_data.Built,
    seeds: list[int],
    epochs: int,
    variants: list[str],
    ts: TrainingSet | None = None,
) -> dict[str, Any]:
    """Evaluate every model on one data set (``ts``, else ``built.path``) per seed; print a table."""
    ts = ts if ts is not None else read_parquet(built.path)
    runs = []
    for seed in seeds:
        runs.append(evaluate(ts, seed, epochs, variants))
        print(f"  seed {seed} done (load {os.getloadavg()[0]:.1f})", flush=True)
    summary = summarize(runs)
    print(table(f"\n{name}: {built.rows} rows, {built.positives} clicks, seeds {seeds}", summary), flush=True)
    return {
        "data": {
            "rows": built.rows,
            "positives": built.positives,
            "build_seconds": round(built.seconds),
            **built.info,
        },
        "user_features": list(ts.user_features),
        "item_features": list(ts.item_features),
        "pair_features": list(ts.pair),
        "position": ts.position is not None,
        "summary": summary,
        "runs": runs,
    }


def main() -> None:
    """Build (or reuse) the data sets, evaluate, print the tables, write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cache", type=Path, default=Path("/tmp/headwater-bench-quality"))
    parser.add_argument("--events", type=int, default=150_000, help="generator emissions (synthetic set)")
    parser.add_argument("--days", type=int, default=3, help="days the synthetic stream spans")
    parser.add_argument("--generator-seed", type=int, default=11)
    parser.add_argument("--seeds", default="0,1,2", help="training seeds")
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--movielens", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--synthetic", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument(
        "--stream-only",
        type=int,
        default=0,
        metavar="EVENTS",
        help="skip the offline tier (Spark): Python point-in-time sets (ranking/quality_sets.py), the"
        " generator's stream of this many emissions and MovieLens 100k through the import path's checks",
    )
    parser.add_argument(
        "--variants", default=DEFAULT_VARIANTS, help=f"DCN variants, of {', '.join(VARIANTS)}"
    )
    parser.add_argument(
        "--movielens-variants",
        default=DEFAULT_VARIANTS,
        help="DCN variants on MovieLens (its sets have no display position: no position bias)",
    )
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    variants = [v for v in args.variants.split(",") if v]
    ml_variants = [v for v in args.movielens_variants.split(",") if v]
    unknown = sorted(set(variants + ml_variants) - set(VARIANTS))
    if unknown:
        parser.error(f"unknown variants {unknown}; choose from {', '.join(VARIANTS)}")
    torch.set_num_threads(1)  # one core: the machine is shared, and results do not depend on threads
    args.cache.mkdir(parents=True, exist_ok=True)
    load = {"before": os.getloadavg()[0]}
    result: dict[str, Any] = {
        "command": " ".join(["bench/bench_quality.py", *sys.argv[1:]]),
        "python": platform.python_version(),
        "torch_threads": torch.get_num_threads(),
        "seeds": seeds,
        "epochs": args.epochs,
        "sets": {},
    }
    if args.stream_only:
        if args.synthetic:
            started = time.monotonic()
            ts = generator_set(args.stream_only, args.generator_seed)
            info = {
                "events": args.stream_only,
                "generator_seed": args.generator_seed,
                "users": 2000,
                "items": 1000,
            }
            built = quality_data.Built(
                Path("-"), len(ts), int(ts.label.sum()), time.monotonic() - started, info
            )
            title = "synthetic stream set (Python point-in-time features, oracle = true click probability)"
            result["sets"]["stream"] = run_set(title, built, seeds, args.epochs, variants, ts)
        if args.movielens:
            started = time.monotonic()
            ts, info = quality_data.movielens_stream_set(args.cache)
            built = quality_data.Built(
                Path("-"), len(ts), int(ts.label.sum()), time.monotonic() - started, info
            )
            title = "MovieLens 100k (all ratings, rating >= 4 = click; import path's checks, Python features)"
            result["sets"]["movielens"] = run_set(title, built, seeds, args.epochs, ml_variants, ts)
        return finish(result, args.out, load)
    if args.synthetic:
        synthetic = quality_data.synthetic(
            args.cache, args.events, args.days, args.generator_seed, 5000, 2000
        )
        result["sets"]["synthetic"] = run_set(
            "synthetic (generator, oracle = true click probability)", synthetic, seeds, args.epochs, variants
        )
    if args.movielens:
        movielens = quality_data.movielens(args.cache)
        result["sets"]["movielens"] = run_set(
            "MovieLens 100k (last 7 weeks, rating >= 4 = click)", movielens, seeds, args.epochs, ml_variants
        )
    finish(result, args.out, load)


def _built(ts: TrainingSet, started: float, info: dict[str, Any]) -> quality_data.Built:
    return quality_data.Built(Path("-"), len(ts), int(ts.label.sum()), time.monotonic() - started, info)


def finish(result: dict[str, Any], out: Path, load: dict[str, float]) -> None:
    """Write the JSON with the machine's load before and after."""
    load["after"] = os.getloadavg()[0]
    result["load_1min"] = load
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"\nload {load}; wrote {out}")


if __name__ == "__main__":
    main()
