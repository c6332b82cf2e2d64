"""Ranking quality with a ceiling (issue 15 item 2): every ranker and baseline on one time holdout.

Oracle, DCN (listwise+pointwise, pointwise only, listwise only), linear, popularity, ALS and the
best single input feature.

    .venv/bin/python bench/bench_quality.py                   # synthetic (with the oracle) + MovieLens
    .venv/bin/python bench/bench_quality.py --no-movielens --seeds 0,1,2

Data (built once, cached under --cache, see bench/quality_data.py): the behaviour generator's
stream through the offline tier, with the generator's true click probability per impression as
the ``oracle`` (and ``oracle_relevance``: the same without the position factor, the ceiling of a
ranker that does not see the position); MovieLens 100k (the copy the ``recbole`` wheel ships:
``.venv/bin/pip install --no-deps recbole==1.2.1``) through the source import path.

Every model trains on the earlier 80% of slates and is judged on the latest 20%
(``serving.train.split_by_time``), the split ``headwater model train`` uses. AUC over all holdout
rows, NDCG@10 within slates (tied rows get their expected discount). ``best_feature`` is the input
feature with the best holdout NDCG@10 used alone as a score (sign from the training rows), an
upper bound of the single-feature baselines. ``als`` is implicit's AlternatingLeastSquares on the
training rows' clicks (user x item), a user's dot product with each item; unseen users or items
score 0. Writes bench/results/bench_quality.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

sys.path.insert(0, str(Path(__file__).resolve().parent))

import quality_data

from headwater.serving.model import linear_logits
from headwater.serving.train import (
    TrainOptions,
    _score_dcn,
    _standardized,
    holdout_metrics,
    moments,
    split_by_time,
    train_dcn,
    train_linear,
)
from headwater.serving.trainset import TrainingSet, read_parquet

RESULTS = Path(__file__).resolve().parent / "results" / "bench_quality.json"
LOSSES = {"dcn": "mixed", "dcn_pointwise": "pointwise", "dcn_listwise": "listwise"}


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
        factors=32, regularization=0.05, iterations=20, random_state=seed, use_gpu=False
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


def evaluate(ts: TrainingSet, seed: int, epochs: int) -> dict[str, Any]:
    """Train every model with ``seed`` on the earlier slates; holdout metrics of all of them."""
    train_rows, test_rows = split_by_time(ts, 0.2)
    train, test = ts.take(train_rows), ts.take(test_rows)
    norm = (*moments(train.user), *moments(train.item))
    scores: dict[str, Any] = {}
    seconds: dict[str, float] = {}
    for name, loss in LOSSES.items():
        started = time.process_time()
        model = train_dcn(train, TrainOptions(seed=seed, epochs=epochs, loss=loss, device="cpu"), "cpu", norm)
        seconds[name] = round(time.process_time() - started, 1)
        scores[name] = _score_dcn(model, test)
    started = time.process_time()
    state = train_linear(train, TrainOptions(seed=seed), norm)
    seconds["linear"] = round(time.process_time() - started, 1)
    scores["linear"] = linear_logits(state, *_standardized(test, norm)).detach().numpy()
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
    name: str, built: quality_data.Built, seeds: list[int], epochs: int, ts: TrainingSet | None = None
) -> dict[str, Any]:
    """Evaluate every model on one data set (``ts``, else ``built.path``) per seed; print a table."""
    ts = ts if ts is not None else read_parquet(built.path)
    ts = ts.for_ranker() if hasattr(ts, "for_ranker") else ts
    runs = [evaluate(ts, seed, epochs) for seed in seeds]
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
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--movielens", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument(
        "--stream-only",
        type=int,
        default=0,
        metavar="EVENTS",
        help="skip the offline tier: only the Python stream set of this many emissions (stream_set)",
    )
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    args.cache.mkdir(parents=True, exist_ok=True)
    load = {"before": os.getloadavg()[0]}
    result: dict[str, Any] = {
        "command": " ".join(["bench/bench_quality.py", *sys.argv[1:]]),
        "python": platform.python_version(),
        "seeds": seeds,
        "epochs": args.epochs,
        "sets": {},
    }
    if args.stream_only:
        started = time.monotonic()
        ts = quality_data.stream_set(args.stream_only, args.generator_seed)
        built = quality_data.Built(
            Path("-"), len(ts), int(ts.label.sum()), time.monotonic() - started, {"events": args.stream_only}
        )
        title = "synthetic stream set (Python point-in-time features, oracle = true click probability)"
        result["sets"]["stream"] = run_set(title, built, seeds, args.epochs, ts)
        return finish(result, args.out, load)
    synthetic = quality_data.synthetic(args.cache, args.events, args.days, args.generator_seed, 5000, 2000)
    result["sets"]["synthetic"] = run_set(
        "synthetic (generator, oracle = true click probability)", synthetic, seeds, args.epochs
    )
    if args.movielens:
        movielens = quality_data.movielens(args.cache)
        result["sets"]["movielens"] = run_set(
            "MovieLens 100k (last 7 weeks, rating >= 4 = click)", movielens, seeds, args.epochs
        )
    finish(result, args.out, load)


def finish(result: dict[str, Any], out: Path, load: dict[str, float]) -> None:
    """Write the JSON with the machine's load before and after."""
    load["after"] = os.getloadavg()[0]
    result["load_1min"] = load
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"\nload {load}; wrote {out}")


if __name__ == "__main__":
    main()
