"""Closed-loop load test of ``POST /v1/recommend`` (the funnel) and ``/v1/rank`` in the same run.

One command: ``.venv/bin/python bench/bench_recommend.py --items 100000``. It

1. applies ``features/`` to a temporary state directory, writes a synthetic training set for it and
   trains the DCN (``headwater model train``), the two-tower model (``headwater retrieval train``)
   and the re-ranker (``headwater funnel train-reranker``) into one models folder,
2. writes the vectors of ``--users`` users and a catalog of ``--items`` items into Redis under a
   namespace of its own, and each item's category (``--categories`` of them) into the funnel's
   catalog hash (all removed at the end),
3. starts ``headwater serve`` (which builds the item index from Redis before it answers), with the
   impressions loop on: every answer goes to a Kafka topic of the benchmark's own and into the
   user's seen set in Redis (``--no-feedback``: Kafka off; the seen set is always on),
4. runs closed loops of ``/v1/recommend {user_id, k}`` at each concurrency, then of ``/v1/rank``
   with ``--candidates`` candidates, reporting p50/p99, QPS, the service's CPU ms per request and,
   for recommend, each stage's mean/p50/p99 ms and candidate count from the answers,
5. with ``--profile S``, records the service with py-spy for S seconds under recommend load at the
   highest concurrency and reports where its CPU goes (inclusive share of the main functions),
6. writes ``bench/results/bench_recommend_<items>.json``.

Other processes share the CPUs: the load average is reported next to each level.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_serve import (
    HEADWATER,
    ROOT,
    apply_registry,
    cpu_seconds,
    create_topic,
    delete_topics,
    drop_namespace,
    free_port,
    level,
    wait_healthy,
)

from headwater.pipelines.settings import Settings
from headwater.serving.config import ServingConfig
from headwater.serving.funnel.recent import RedisRecentItems
from headwater.serving.registry import BoundRegistry, load_registry
from headwater.serving.store import OnlineStoreReader, now_ms
from headwater.serving.synthetic import make_world, training_set, write_world
from headwater.serving.trainset import write_parquet

RESULTS = ROOT / "bench" / "results"
STAGES = ("retrieve", "seen", "rank", "rerank", "rules")


def train_models(out: Path, registry: BoundRegistry, seed: int) -> None:
    """DCN + linear, two-tower, re-ranker from one synthetic training set, into ``out``."""
    data = out.parent / "train.parquet"
    world = make_world(registry, users=2_000, items=2_000, seed=seed)
    write_parquet(training_set(registry, world, slates=8_000, seed=seed), data)
    for cmd in (
        ["model", "train", "--epochs", "2"],
        ["retrieval", "train", "--epochs", "5", "--threads", "1"],
        ["funnel", "train-reranker", "--epochs", "1", "--threads", "1"],
    ):
        full = [HEADWATER, *cmd, "--training-set", str(data), "--out", str(out)]
        subprocess.run(full, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)


def encode(path: str, body: dict[str, Any]) -> bytes:
    """One pre-encoded HTTP/1.1 POST."""
    payload = json.dumps(body, separators=(",", ":")).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\n\r\n"
    )
    return head.encode() + payload


async def connection(port: int, bodies: list[bytes], until: float, out: dict[str, Any], offset: int) -> None:
    """One keep-alive connection sending recommend requests until ``until``; keeps each answer's stages."""
    loop = asyncio.get_running_loop()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    i = offset
    try:
        while loop.time() < until:
            request = bodies[i % len(bodies)]
            i += 1
            started = time.perf_counter()
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(
                (
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length")
                ),
                0,
            )
            body = await reader.readexactly(length)
            out["latency"].append(time.perf_counter() - started)
            if int(head[9:12]) != 200:
                out["errors"].append(int(head[9:12]))
                continue
            answer = orjson.loads(body)
            for s in answer["stages"]:
                out["stages"][s["stage"]].append((s["ms"], s["candidates"]))
                if s["fallback"] is not None:
                    out["fallbacks"][f"{s['stage']}:{s['fallback_reason']}"] += 1
            out["service_ms"].append(answer["latency_ms"])
            out["items"].append(len(answer["items"]))
    finally:
        writer.close()


async def recommend_level(
    port: int, pid: int, bodies: list[bytes], concurrency: int, seconds: float, warmup: float
) -> dict[str, Any]:
    """One concurrency level of recommend: warm-up, then ``seconds`` measured."""
    loop = asyncio.get_running_loop()

    def fresh() -> dict[str, Any]:
        return {"latency": [], "errors": [], "stages": collections.defaultdict(list),
                "fallbacks": collections.Counter(), "service_ms": [], "items": []}  # fmt: skip

    await asyncio.gather(
        *[connection(port, bodies, loop.time() + warmup, fresh(), c * 7) for c in range(concurrency)]
    )
    out = fresh()
    cpu_before, load_before = cpu_seconds(pid), os.getloadavg()[0]
    start = loop.time()
    await asyncio.gather(
        *[connection(port, bodies, start + seconds, out, c * 13) for c in range(concurrency)]
    )
    elapsed = loop.time() - start
    cpu_after = cpu_seconds(pid)
    lat = np.asarray(out["latency"]) * 1000.0
    n = len(lat)
    stages = {}
    for name in STAGES:
        got = np.asarray(out["stages"][name], dtype=np.float64).reshape(-1, 2)
        if len(got):
            stages[name] = {
                "mean_ms": round(float(got[:, 0].mean()), 3),
                "p50_ms": round(float(np.percentile(got[:, 0], 50)), 3),
                "p99_ms": round(float(np.percentile(got[:, 0], 99)), 3),
                "candidates_mean": round(float(got[:, 1].mean()), 1),
            }
    return {
        "concurrency": concurrency,
        "requests": n,
        "qps": round(n / elapsed, 1),
        "p50_ms": round(float(np.percentile(lat, 50)), 2) if n else None,
        "p99_ms": round(float(np.percentile(lat, 99)), 2) if n else None,
        "service_p50_ms": round(float(np.percentile(out["service_ms"], 50)), 2)
        if out["service_ms"]
        else None,
        "errors": len(out["errors"]),
        "fallbacks": dict(out["fallbacks"]),
        "items_mean": round(float(np.mean(out["items"])), 2) if out["items"] else None,
        "server_cpu_ms_per_request": round((cpu_after - cpu_before) * 1000.0 / n, 3)
        if n and cpu_before is not None and cpu_after is not None
        else None,
        "stages": stages,
        "load_avg_1m": round((load_before + os.getloadavg()[0]) / 2.0, 2),
    }


BUCKETS = (
    ("rerank (torch)", ("(serving/funnel/reranker.py",)),
    ("DCN forward (torch)", ("NeuralScorer.score_batch",)),
    ("retrieval: user tower + ANN search", ("TwoTowerRetriever.retrieve",)),
    ("recent-items writes (Redis)", ("RedisRecentItems._write",)),
    ("recent/categories/popular reads (Redis)", ("RedisRecentItems.",)),
    ("feature reads (Redis) + assembly", ("read_many", "Funnel._user_vector", "FeatureFetcher.")),
    ("Kafka impressions producer", ("FeedbackProducer.", "kafka/")),
    ("index refresh thread", ("IndexRefresher.", "RetrievalRuntime.")),
    ("funnel + rules (Python)", ("(serving/funnel/",)),
    ("ranking engine (Python)", ("(serving/engine.py", "(serving/batcher.py")),
    (
        "HTTP, JSON, validation (uvicorn, FastAPI, pydantic)",
        ("uvicorn/", "starlette/", "fastapi/", "pydantic"),
    ),
    ("asyncio loop", ("asyncio/",)),
)
"""Each sample goes to the first bucket (in this order) that any of its frames matches."""


def summarize_profile(raw: Path, top: int = 30) -> dict[str, Any]:
    """Shares of py-spy's raw (--threads) samples: by thread, by bucket, by function (inclusive)."""
    inclusive: collections.Counter[str] = collections.Counter()
    threads: collections.Counter[str] = collections.Counter()
    buckets: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text(encoding="utf-8", errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        total += n
        head, *frames = stack.split(";")
        name = head.split(": ", 1)[-1]
        threads["headwater-io" if name.startswith("headwater-io") else name] += n
        for frame in set(frames):
            inclusive[frame.split(" (")[0] + " (" + frame.rsplit(" (", 1)[-1].split(":")[0] + ")"] += n
        text = ";".join(frames)
        label = next((b for b, keys in BUCKETS if any(k in text for k in keys)), "other")
        buckets[label] += n

    def share(c: collections.Counter[str], k: int | None = None) -> list[tuple[str, float]]:
        return [(f, round(v / total, 4)) for f, v in c.most_common(k)]

    return {
        "samples": total,
        "threads": share(threads),
        "buckets": share(buckets),
        "inclusive": share(inclusive, top),
    }


def parse_args() -> argparse.Namespace:
    """Command-line options."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--items", type=int, default=100_000, help="Catalog size (items in Redis and the index).")
    ap.add_argument("--users", type=int, default=5_000)
    ap.add_argument("--categories", type=int, default=20)
    ap.add_argument("--k", type=int, default=20)
    ap.add_argument("--candidates", type=int, default=500, help="Candidates per /v1/rank request.")
    ap.add_argument("--concurrency", default="1,2,4,8")
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--warmup", type=float, default=2.0)
    ap.add_argument("--no-rank", action="store_true", help="Skip the /v1/rank phase.")
    ap.add_argument("--profile", type=float, default=0.0, help="py-spy the service for this many seconds.")
    ap.add_argument("--redis-url", default=Settings.from_env().redis_url)
    ap.add_argument("--bootstrap", default=Settings.from_env().kafka_bootstrap)
    ap.add_argument("--no-feedback", action="store_true", help="Impressions not sent to Kafka.")
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument(
        "--out", type=Path, default=None, help="Default: bench/results/bench_recommend_<items>.json"
    )
    return ap.parse_args()


def main() -> None:
    """Set up, run, print and write the report."""
    args = parse_args()
    out_path = args.out or RESULTS / f"bench_recommend_{args.items}.json"
    config = ServingConfig()
    namespace = f"hwbench-rec-{uuid.uuid4().hex[:6]}"
    work = Path(tempfile.mkdtemp(prefix="headwater-bench-recommend-"))
    state_dir, models = work / "state", work / "models"
    apply_registry(state_dir)
    registry = load_registry(state_dir, config.popularity)
    t0 = time.perf_counter()
    print(
        f"training the DCN, the two-tower model and the re-ranker for {registry.registry_version} ...",
        flush=True,
    )
    train_models(models, registry, args.seed)
    timings = {"train_s": round(time.perf_counter() - t0, 1)}
    reader = OnlineStoreReader.from_url(args.redis_url, namespace=namespace, timeout_s=10.0)
    t0 = time.perf_counter()
    print(f"writing {args.users} users and {args.items} items under namespace {namespace} ...", flush=True)
    world = make_world(registry, users=args.users, items=args.items, seed=args.seed, prefixes=("b-u", "b-i"))
    write_world(reader, registry, world, now_ms())
    recent = RedisRecentItems(reader.store.client, namespace)
    recent.put_categories({item: f"c{j % args.categories:02d}" for j, item in enumerate(world.item_ids)})
    timings["write_s"] = round(time.perf_counter() - t0, 1)
    del world
    topic = f"hwbench-rec-{namespace[-6:]}"
    feedback = not args.no_feedback and create_topic(args.bootstrap, topic)
    rng = random.Random(args.seed)
    rec_bodies = [
        encode("/v1/recommend", {"user_id": f"b-u{rng.randrange(args.users):06d}", "k": args.k})
        for _ in range(512)
    ]
    items = [f"b-i{i:06d}" for i in range(args.items)]
    rank_bodies = [
        encode("/v1/rank", {"user_id": f"b-u{rng.randrange(args.users):06d}",
                            "candidates": rng.sample(items, args.candidates), "k": args.k})
        for _ in range(256)
    ]  # fmt: skip
    port = free_port()
    cmd = [HEADWATER, "serve", "--port", str(port), "--model", str(models), "--redis-url", args.redis_url,
           "--namespace", namespace, "--state-dir", str(state_dir), "--log-level", "warning"]  # fmt: skip
    cmd += ["--bootstrap", args.bootstrap, "--feedback-topic", topic] if feedback else ["--no-feedback"]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    levels: list[dict[str, Any]] = []
    rank_levels: list[dict[str, Any]] = []
    profile: dict[str, Any] | None = None
    try:
        health = wait_healthy(port, proc, timeout=7200.0)
        timings["service_start_s"] = round(time.perf_counter() - t0, 1)
        print(f"service up in {timings['service_start_s']} s (index built from Redis)", flush=True)
        concurrencies = [int(x) for x in args.concurrency.split(",")]
        for c in concurrencies:
            r = asyncio.run(recommend_level(port, proc.pid, rec_bodies, c, args.seconds, args.warmup))
            levels.append(r)
            stages = "  ".join(
                f"{s} {v['mean_ms']}ms/{v['candidates_mean']:g}" for s, v in r["stages"].items()
            )
            print(f"recommend c={c:>2} {r['qps']:>6} qps p50 {r['p50_ms']} p99 {r['p99_ms']} ms"
                  f" cpu/req {r['server_cpu_ms_per_request']} ms errors {r['errors']} load {r['load_avg_1m']}"
                  f" | {stages} | fallbacks {r['fallbacks']}", flush=True)  # fmt: skip
        if not args.no_rank:
            for c in concurrencies:
                r = asyncio.run(level(port, proc.pid, rank_bodies, c, args.seconds, args.warmup))
                rank_levels.append(r)
                print(f"rank      c={c:>2} {r['qps']:>6} qps p50 {r['p50_ms']} p99 {r['p99_ms']} ms"
                      f" cpu/req {r['server_cpu_ms_per_request']} ms errors {r['errors']}"
                      f" load {r['load_avg_1m']}", flush=True)  # fmt: skip
        if args.profile > 0:
            profile = run_profile(args, port, proc.pid, rec_bodies, work, max(concurrencies))
        health = wait_healthy(port, proc)
    finally:
        proc.terminate()
        proc.wait(30)
        drop_namespace(args.redis_url, namespace)
        reader.close()
        if feedback:
            delete_topics(args.bootstrap, [topic])
    result = {
        "benchmark": "recommend",
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "catalog_items": args.items,
        "users": args.users,
        "k": args.k,
        "funnel": config.funnel.model_dump(),
        "rank_candidates": args.candidates,
        "impressions_loop": {"kafka": feedback, "seen_set": True},
        "device": health["device"],
        "model_version": health["model_version"],
        "feedback": health["feedback"],
        "setup": timings,
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "recommend": levels,
        "rank": rank_levels,
        "profile": profile,
    }
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {out_path}")


def run_profile(
    args: argparse.Namespace, port: int, pid: int, bodies: list[bytes], work: Path, concurrency: int
) -> dict[str, Any] | None:
    """py-spy the service under recommend load; returns the summary (None if py-spy cannot attach)."""
    raw = work / "profile.txt"
    spy = Path(sys.executable).with_name("py-spy")
    cmd = [str(spy), "record", "-p", str(pid), "-d", str(int(args.profile)), "-r", "100", "--format", "raw",
           "-o", str(raw), "--nonblocking", "--threads"]  # fmt: skip
    profiler = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    time.sleep(1.0)
    r = asyncio.run(recommend_level(port, pid, bodies, concurrency, args.profile, 0.5))
    _, err = profiler.communicate(timeout=args.profile + 60)
    if profiler.returncode != 0 or not raw.exists():
        print(f"py-spy could not profile the service: {err.decode(errors='replace')[-500:]}", flush=True)
        return None
    summary = summarize_profile(raw)
    summary["under"] = {
        k: r[k] for k in ("concurrency", "qps", "p50_ms", "p99_ms", "server_cpu_ms_per_request")
    }
    (RESULTS / f"bench_recommend_{args.items}_profile.txt").write_text(raw.read_text(), encoding="utf-8")
    print(f"profile: {summary['samples']} samples (100/s, all threads); by thread:", flush=True)
    for name, share in summary["threads"]:
        print(f"  {share:7.2%}  {name}", flush=True)
    print("by bucket:", flush=True)
    for name, share in summary["buckets"]:
        print(f"  {share:7.2%}  {name}", flush=True)
    return summary


if __name__ == "__main__":
    main()
