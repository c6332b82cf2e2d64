"""Approximate-nearest-neighbour libraries compared for the retrieval index (issue 15 item 3).

Run: ``.venv/bin/python bench/bench_ann.py`` (default N = 100,000 and 1,000,000 items, dim 32 and
64; ``--sizes 100000 --dims 32`` for a quick run). Prints a table and writes
``bench/results/bench_ann.json``.

What is measured, per (N, dim, library):

* build time (wall, with every core of the machine: ``--build-threads``, default all);
* memory: the resident-set growth of a fresh worker process while it builds the index (the item
  matrix is loaded before the first reading, so only the index's own memory counts);
* recall@100 of 1,000 queries against exact search (faiss ``IndexFlatIP``, checked against numpy on a
  sample), for each search setting of a sweep;
* query latency p50/p99, one query at a time, single-threaded (every library is told one thread).

Under load (other agents share the 2 cores) wall times measure the queue for a core as much as the
library, so each build also reports its process CPU seconds (``build_cpu_s``) and each query its
thread CPU time (``cpu_p50_us``/``cpu_p99_us``, ``CLOCK_THREAD_CPUTIME_ID``): what a query costs,
whatever the load.

Data: synthetic embeddings clustered like real ones: 1,024 clusters of Zipf-distributed sizes, on
an anisotropic basis (a decaying spectrum, as trained embeddings have), unit-normalised; the
queries are drawn from the same mixture (like a user embedding near the items it likes). The
metric is the inner product (cosine on unit vectors), the two-tower score.

Each library builds in its own subprocess, so one's allocator cannot hide or inflate another's
memory. The machine's load (``uptime``) is written next to the figures: other agents share the CPUs.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

RESULTS = Path(__file__).resolve().parent / "results" / "bench_ann.json"
K = 100
CLUSTERS = 1024
BACKENDS = ("faiss_hnsw", "faiss_ivf", "hnswlib", "usearch")
HNSW_M = 16
HNSW_EF_CONSTRUCTION = 128
EF_SWEEP = (100, 160, 256, 400)
NPROBE_SWEEP = (8, 16, 32, 64)


def clustered(n: int, d: int, seed: int = 7) -> npt.NDArray[np.float32]:
    """``n`` unit vectors of dim ``d`` from a Zipf-weighted Gaussian mixture on an anisotropic basis."""
    rng = np.random.default_rng(seed)
    spectrum = np.arange(1, d + 1, dtype=np.float64) ** -0.5
    basis = rng.standard_normal((d, d)) * spectrum[:, None]
    centers = rng.standard_normal((CLUSTERS, d)) @ basis
    weights = 1.0 / np.arange(1, CLUSTERS + 1) ** 0.8
    weights /= weights.sum()
    out = np.empty((n, d), dtype=np.float32)
    step = 100_000
    for start in range(0, n, step):
        m = min(step, n - start)
        assign = rng.choice(CLUSTERS, m, p=weights)
        x = centers[assign] + 0.6 * (rng.standard_normal((m, d)) @ basis)
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        out[start : start + m] = x
    return out


def rss_mb() -> float:
    """Resident set of this process in MiB (Linux ``/proc``)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024.0
    return float("nan")


def exact_top_k(items: npt.NDArray[np.float32], queries: npt.NDArray[np.float32]) -> npt.NDArray[np.int64]:
    """Exact top-K by inner product (faiss flat), checked against numpy on the first queries."""
    import faiss

    flat = faiss.IndexFlatIP(items.shape[1])
    flat.add(items)
    _, ids = flat.search(queries, K)
    sample = queries[:5] @ items.T
    for row in range(5):
        top = np.argpartition(-sample[row], K)[:K]
        # Ties at the K-th score can swap members; the sets must agree but for those.
        if len(set(top.tolist()) & set(ids[row].tolist())) < K - 1:
            msg = f"faiss flat and numpy disagree on query {row}'s top {K}"
            raise AssertionError(msg)
    return np.asarray(ids, dtype=np.int64)


def recall(found: npt.NDArray[np.int64], truth: npt.NDArray[np.int64]) -> float:
    """Mean share of the true top-K that ``found`` holds."""
    hits = sum(len(set(f.tolist()) & set(t.tolist())) for f, t in zip(found, truth, strict=True))
    return hits / float(truth.size)


# ---------------------------------------------------------------- workers (one process per build)


def _build(backend: str, items: npt.NDArray[np.float32], threads: int) -> Any:
    n, d = items.shape
    if backend == "faiss_hnsw":
        import faiss

        faiss.omp_set_num_threads(threads)
        index = faiss.IndexHNSWFlat(d, HNSW_M, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = HNSW_EF_CONSTRUCTION
        index.add(items)
        return index
    if backend == "faiss_ivf":
        import faiss

        faiss.omp_set_num_threads(threads)
        nlist = round(4 * np.sqrt(n))
        index = faiss.IndexIVFFlat(faiss.IndexFlatIP(d), d, nlist, faiss.METRIC_INNER_PRODUCT)
        sample = items[np.random.default_rng(0).permutation(n)[: min(n, 64 * nlist)]]
        index.train(sample)
        index.add(items)
        return index
    if backend == "hnswlib":
        import hnswlib

        index = hnswlib.Index(space="ip", dim=d)
        index.init_index(max_elements=n, M=HNSW_M, ef_construction=HNSW_EF_CONSTRUCTION, random_seed=1)
        index.add_items(items, np.arange(n), num_threads=threads)
        return index
    if backend == "usearch":
        from usearch.index import Index

        index = Index(
            ndim=d, metric="ip", dtype="f32", connectivity=HNSW_M, expansion_add=HNSW_EF_CONSTRUCTION
        )
        index.add(np.arange(n, dtype=np.uint64), items, threads=threads)
        return index
    msg = f"unknown backend {backend!r}; expected one of {BACKENDS}"
    raise ValueError(msg)


def _searcher(backend: str, index: Any, setting: int) -> Any:
    """Return a one-query search function at ``setting`` (ef or nprobe), single-threaded."""
    if backend.startswith("faiss"):
        import faiss

        faiss.omp_set_num_threads(1)
        if backend == "faiss_hnsw":
            index.hnsw.efSearch = setting
        else:
            index.nprobe = setting
        return lambda q: index.search(q[None, :], K)[1][0]
    if backend == "hnswlib":
        index.set_ef(setting)
        return lambda q: index.knn_query(q, k=K, num_threads=1)[0][0]
    index.expansion_search = setting
    return lambda q: index.search(q, K, threads=1).keys


def worker(backend: str, data: Path, threads: int) -> dict[str, Any]:
    """Build one index over ``data``'s items, sweep its search setting; returns the figures."""
    items = np.load(data / "items.npy")
    queries = np.load(data / "queries.npy")
    truth = np.load(data / "truth.npy")
    gc.collect()
    before = rss_mb()
    start, cpu_start = time.perf_counter(), time.process_time()
    index = _build(backend, items, threads)
    build_s, build_cpu_s = time.perf_counter() - start, time.process_time() - cpu_start
    memory = rss_mb() - before
    sweep = []
    for setting in NPROBE_SWEEP if backend == "faiss_ivf" else EF_SWEEP:
        search = _searcher(backend, index, setting)
        for q in queries[:20]:  # warm-up
            search(q)
        found = np.empty((len(queries), K), dtype=np.int64)
        lat, cpu = np.empty(len(queries)), np.empty(len(queries))
        for row, q in enumerate(queries):
            t, c = time.perf_counter_ns(), time.thread_time_ns()
            got = search(q)
            lat[row] = (time.perf_counter_ns() - t) / 1000.0
            cpu[row] = (time.thread_time_ns() - c) / 1000.0
            found[row, : len(got)] = got
            found[row, len(got) :] = -1
        sweep.append(
            {
                "setting": setting,
                "recall_at_100": round(recall(found, truth), 4),
                "p50_us": round(float(np.percentile(lat, 50)), 1),
                "p99_us": round(float(np.percentile(lat, 99)), 1),
                "cpu_p50_us": round(float(np.percentile(cpu, 50)), 1),
                "cpu_p99_us": round(float(np.percentile(cpu, 99)), 1),
            }
        )
    return {
        "backend": backend,
        "setting_name": "nprobe" if backend == "faiss_ivf" else "ef",
        "build_s": round(build_s, 2),
        "build_cpu_s": round(build_cpu_s, 2),
        "build_threads": threads,
        "memory_mb": round(memory, 1),
        "raw_vectors_mb": round(items.nbytes / 2**20, 1),
        "sweep": sweep,
    }


# ---------------------------------------------------------------- retrieval end to end


def retrieval(n_items: int, n_queries: int) -> dict[str, Any]:
    """Measure the chosen index behind the two-tower model, fed from a private Redis through the store.

    Item vectors of the example registry's item views are written through the online store into a
    redis-server of this run only; the refresher builds the index from them, then refreshes it after
    1% of the items change (one view's slots) and 0.1% are deleted. Recall@100 is measured against
    exact search over the same embeddings; retrieve() latency includes the user tower.
    """
    import torch

    from headwater.pipelines.store import OnlineStore
    from headwater.pipelines.store.testing import OwnRedis
    from headwater.ranking.features import registry_from_repo
    from headwater.ranking.synthetic import make_world, training_set, write_world
    from headwater.serving.config import ServingConfig
    from headwater.serving.retrieval import (
        ExactIndex,
        IndexRefresher,
        ItemIndex,
        StoreItemSource,
        TowerOptions,
        TwoTowerRetriever,
        recall_at_k,
        train_two_tower,
    )
    from headwater.serving.store import OnlineStoreReader, now_ms

    registry = registry_from_repo(
        Path(__file__).resolve().parents[1] / "features", ServingConfig().popularity
    )
    world = make_world(registry, users=2_000, items=n_items, seed=21)
    started = time.perf_counter()
    model = train_two_tower(
        training_set(registry, world, slates=5_000, seed=21), TowerOptions(threads=1)
    ).model
    out: dict[str, Any] = {"items": n_items, "train_s": round(time.perf_counter() - started, 1)}
    with tempfile.TemporaryDirectory(prefix="bench_ret_") as tmp:
        server = OwnRedis(Path(tmp))
        server.start()
        try:
            import redis

            store = OnlineStore(redis.Redis(port=server.port, socket_timeout=60))
            started = time.perf_counter()
            write_world(OnlineStoreReader(store), registry, world, now_ms())
            out["write_s"] = round(time.perf_counter() - started, 1)
            index = ItemIndex(model.embed_dim)
            refresher = IndexRefresher(StoreItemSource(store, registry.item), model, index, "bench")
            rss0 = rss_mb()
            full = refresher.refresh()
            out["full_build"] = {
                "seconds": full.seconds,
                "added": full.added,
                "rss_growth_mb": round(rss_mb() - rss0, 1),
            }
            out["index_memory_mb"] = round(index.memory_bytes / 2**20, 1)
            exact = ExactIndex(model.embed_dim)
            exact.upsert(world.item_ids, model.embed_items(world.items))
            users = world.users[np.random.default_rng(3).integers(0, len(world.users), n_queries)]
            out["recall_at_100"] = round(recall_at_k(index, exact, model.embed_users(users), 100), 4)
            default_ef = index.expansion_search
            out["recall_at_100_by_ef"] = {}
            for ef in (100, 160, 256, 400):
                index.expansion_search = ef
                out["recall_at_100_by_ef"][ef] = round(
                    recall_at_k(index, exact, model.embed_users(users), 100), 4
                )
            index.expansion_search = default_ef
            retriever = TwoTowerRetriever(model, index)
            torch.set_num_threads(1)  # single-threaded queries, as the ANN runs
            lat, cpu = [], []
            for u in users:
                t, c = time.perf_counter_ns(), time.thread_time_ns()
                retriever.retrieve(u, 100)
                lat.append((time.perf_counter_ns() - t) / 1000.0)
                cpu.append((time.thread_time_ns() - c) / 1000.0)
            out["retrieve_100_us"] = {
                "p50": round(float(np.percentile(lat, 50)), 1),
                "p99": round(float(np.percentile(lat, 99)), 1),
            }
            out["retrieve_100_cpu_us"] = {
                "p50": round(float(np.percentile(cpu, 50)), 1),
                "p99": round(float(np.percentile(cpu, 99)), 1),
            }
            rng = np.random.default_rng(4)
            changed = rng.choice(n_items, n_items // 100, replace=False)
            deleted = rng.choice(np.setdiff1d(np.arange(n_items), changed), n_items // 1000, replace=False)
            layout = registry.item.layouts[-1]
            lo, hi = registry.item.offsets[-2], registry.item.offsets[-1]
            ids = [world.item_ids[j] for j in changed.tolist()]
            store.write_batch(layout, ids, world.items[changed][:, lo:hi] * 1.5, now_ms() + 1000)
            for lay in registry.item.layouts:
                gone = [f"{store.namespace}:{{{lay.view}}}:{world.item_ids[j]}" for j in deleted.tolist()]
                store.client.delete(*gone)
            step = refresher.refresh()
            out["incremental"] = {
                "seconds": step.seconds,
                "updated": step.updated,
                "removed": step.removed,
                "unchanged": step.unchanged,
            }
            store.close()
        finally:
            server.stop()
    return out


# ---------------------------------------------------------------- driver


def cheapest_at(entry: dict[str, Any], target: float) -> dict[str, Any] | None:
    """Return the fastest (p99) sweep point whose recall reaches ``target``."""
    ok = [s for s in entry["sweep"] if s["recall_at_100"] >= target]
    return min(ok, key=lambda s: s["p99_us"]) if ok else None


def versions() -> dict[str, str]:
    out = {}
    for name in ("faiss", "hnswlib", "usearch"):
        try:
            module = __import__(name)
            out[name] = str(getattr(module, "__version__", "unknown"))
        except ImportError:
            out[name] = "not installed"
    return out


def run(
    sizes: list[int], dims: list[int], n_queries: int, backends: list[str], threads: int, append: bool = False
) -> dict[str, Any]:
    """Measure every (size, dim, backend); with ``append``, keep the JSON's runs of other combinations."""
    earlier: list[dict[str, Any]] = []
    kept: dict[str, Any] = {}
    if append and RESULTS.exists():
        wanted = {(n, d, b) for n in sizes for d in dims for b in backends}
        old = json.loads(RESULTS.read_text(encoding="utf-8"))
        earlier = [r for r in old.get("runs", []) if (r["n"], r["dim"], r["backend"]) not in wanted]
        kept = {k: old[k] for k in ("retrieval", "choice") if k in old}
    report: dict[str, Any] = {
        "benchmark": "ann",
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), **versions()},
        "k": K,
        "hnsw": {"M": HNSW_M, "ef_construction": HNSW_EF_CONSTRUCTION},
        "data": f"{CLUSTERS} Zipf-sized clusters on an anisotropic basis, unit vectors, inner product",
        "queries": n_queries,
        "runs": earlier,
        **kept,
    }
    for n in sizes:
        for d in dims:
            with tempfile.TemporaryDirectory(prefix="bench_ann_") as tmp:
                data = Path(tmp)
                allv = clustered(n + n_queries, d)
                items, queries = allv[:n], allv[n:]
                np.save(data / "items.npy", items)
                np.save(data / "queries.npy", queries)
                np.save(data / "truth.npy", exact_top_k(items, queries))
                del allv, items, queries
                for backend in backends:
                    load = Path("/proc/loadavg").read_text().split()[:3]
                    cmd = [sys.executable, __file__, "--worker", backend, "--data", tmp, "--build-threads",
                           str(threads)]  # fmt: skip
                    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
                    if proc.returncode != 0:
                        print(f"!! {backend} n={n} d={d} failed:\n{proc.stderr[-2000:]}", file=sys.stderr)
                        continue
                    entry = {"n": n, "dim": d, "load_avg_before": load, **json.loads(proc.stdout)}
                    report["runs"].append(entry)
                    print_row(entry)
                    RESULTS.parent.mkdir(parents=True, exist_ok=True)
                    RESULTS.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    report["finished_at"] = datetime.now(UTC).isoformat(timespec="seconds")
    RESULTS.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return report


def print_row(e: dict[str, Any]) -> None:
    best = cheapest_at(e, 0.95)
    points = "  ".join(
        f"{e['setting_name']}={s['setting']}: r={s['recall_at_100']:.3f} p50={s['p50_us']:.0f}us"
        f" p99={s['p99_us']:.0f}us"
        for s in e["sweep"]
    )
    at = f"{e['setting_name']}={best['setting']} p99={best['p99_us']:.0f}us" if best else "never >= 0.95"
    print(
        f"n={e['n']:>8} d={e['dim']:>3} {e['backend']:<10} build {e['build_s']:7.1f}s"
        f" mem {e['memory_mb']:7.1f}MiB  >=0.95 at {at}  load {' '.join(e['load_avg_before'])}\n    {points}",
        flush=True,
    )


def main() -> None:
    global RESULTS  # --out: one switch for the whole run
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="100000,1000000")
    parser.add_argument("--dims", default="32,64")
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--build-threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--append", action="store_true", help="keep the JSON's runs of other sizes/dims")
    parser.add_argument("--out", type=Path, default=RESULTS, help="the JSON to write [default: %(default)s]")
    parser.add_argument(
        "--retrieval", type=int, metavar="N", help="only the end-to-end retrieval run, N items"
    )
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    args = parser.parse_args()
    RESULTS = args.out
    if args.retrieval:
        load = Path("/proc/loadavg").read_text().split()[:3]
        result = {"load_avg_before": load, **retrieval(args.retrieval, 500)}
        print(json.dumps(result, indent=2))
        report = json.loads(RESULTS.read_text(encoding="utf-8")) if RESULTS.exists() else {"runs": []}
        report.setdefault("retrieval", {})[str(args.retrieval)] = result
        RESULTS.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
        return
    if args.worker:
        print(json.dumps(worker(args.worker, Path(args.data), args.build_threads)))
        return
    run(
        [int(s) for s in args.sizes.split(",")],
        [int(s) for s in args.dims.split(",")],
        args.queries,
        args.backends.split(","),
        args.build_threads,
        args.append,
    )


if __name__ == "__main__":
    main()
