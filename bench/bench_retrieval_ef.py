"""The serving index's search settings against exact search, on the two-tower model's own embeddings.

Usage: .venv/bin/python bench/bench_retrieval_ef.py [--items 100000] [--queries 300]
       [--connectivity 16,8] [--wants 100,300,500] [--efs 64,128,256]

What the funnel asks: ``retrieve(user, retrieve_n + seen)`` (``want`` ids), and usearch searches with
``ef = max(expansion_search, want)``. For each index connectivity (M) and each (want, ef) this reports,
over ``--queries`` user embeddings of the same synthetic world ``bench_recommend.py`` serves (a tower
trained as it trains it, ``make_world`` users and items):

* recall@100: the share of the exact top 100 among the index's first 100 (the issue's >= 0.95);
* recall@want: the share of the exact top ``want`` among the index's ``want`` (what the ranker sees);
* search CPU per query (thread CPU time, one thread: what a request pays whatever the load), p50/p99;
* build CPU seconds and the index's memory.

Writes bench/results/bench_retrieval_ef.json. Note the machine load next to the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    """Train the towers, embed the catalog, build each index, sweep the search settings."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--items", type=int, default=100_000)
    ap.add_argument("--queries", type=int, default=300)
    ap.add_argument("--connectivity", default="16,8")
    ap.add_argument("--wants", default="100,300,500")
    ap.add_argument("--efs", default="64,128,256")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "bench_retrieval_ef.json")
    args = ap.parse_args()

    import torch

    from headwater.ranking.features import registry_from_repo
    from headwater.ranking.synthetic import make_world, training_set
    from headwater.serving.config import ServingConfig
    from headwater.serving.retrieval import ExactIndex, ItemIndex, TowerOptions, train_two_tower

    torch.set_num_threads(1)
    registry = registry_from_repo(ROOT / "features", ServingConfig().popularity)
    small = make_world(registry, users=2_000, items=2_000, seed=args.seed)
    report = train_two_tower(
        training_set(registry, small, slates=8_000, seed=args.seed), TowerOptions(epochs=5, threads=1)
    )
    model = report.model
    world = make_world(registry, users=5_000, items=args.items, seed=args.seed, prefixes=("b-u", "b-i"))
    items = model.embed_items(world.items)
    queries = model.embed_users(world.users[: args.queries])
    wants = [int(w) for w in args.wants.split(",")]
    exact = ExactIndex(model.embed_dim)
    exact.upsert(world.item_ids, items)
    truth = {w: [exact.search(q, w)[0] for q in queries] for w in sorted({100, *wants})}

    runs: list[dict[str, Any]] = []
    for m in (int(c) for c in args.connectivity.split(",")):
        index = ItemIndex(model.embed_dim, connectivity=m, threads=1)
        c0 = time.process_time()
        index.upsert(world.item_ids, items)
        build_cpu = time.process_time() - c0
        for want in wants:
            for ef in sorted({max(int(e), want) for e in args.efs.split(",")}):  # ef < want: want
                index.expansion_search = ef
                cpu: list[float] = []
                r100 = rwant = 0.0
                for j, q in enumerate(queries):
                    t0 = time.thread_time()
                    got, _ = index.search(q, want)
                    cpu.append(time.thread_time() - t0)
                    r100 += len(set(got[:100]) & set(truth[100][j])) / 100
                    rwant += len(set(got) & set(truth[want][j])) / want
                row = {
                    "connectivity": m, "want": want, "ef": ef,
                    "recall_at_100": round(r100 / len(queries), 4),
                    "recall_at_want": round(rwant / len(queries), 4),
                    "search_cpu_p50_us": round(float(np.percentile(cpu, 50)) * 1e6, 1),
                    "search_cpu_p99_us": round(float(np.percentile(cpu, 99)) * 1e6, 1),
                    "build_cpu_s": round(build_cpu, 1), "memory_mb": round(index.memory_bytes / 2**20, 1),
                    "load_avg_1m": round(os.getloadavg()[0], 2),
                }  # fmt: skip
                runs.append(row)
                print(json.dumps(row), flush=True)
        del index
    out = {
        "benchmark": "retrieval_ef",
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "items": args.items,
        "queries": args.queries,
        "embed_dim": model.embed_dim,
        "cpu_count": os.cpu_count(),
        "runs": runs,
    }
    args.out.write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
