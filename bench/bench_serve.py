"""Closed-loop load test of the ranking service on loopback: 500 candidates per request.

One command: ``.venv/bin/python bench/bench_serve.py``. It

1. applies ``features/`` to a temporary state directory (the registry the service binds to),
   writes a synthetic training set in the ``headwater training-set`` format for it and trains
   a small model with ``headwater model train --training-set`` (unless ``--model`` is given),
2. writes vectors of every user and item view for ``--users`` users and ``--items`` items into
   Redis under a key namespace of its own (removed at the end),
3. starts ``headwater serve`` as a subprocess on a free loopback port; the impressions it serves
   go to a Kafka topic of the benchmark's own (deleted at the end; ``--no-feedback`` turns the
   loop off),
4. runs a closed loop (each of C connections sends its next request when the previous answer
   arrived) at each concurrency C for ``--seconds`` after a warm-up, with a minimal asyncio
   HTTP/1.1 client (keep-alive, pre-encoded bodies) so the client costs little CPU,
5. repeats the sweep ``--runs`` times and takes per-level medians (other processes share the
   CPU; the load average and the service's CPU milliseconds per request are reported with each
   level, the latter being the figure least disturbed by neighbours),
6. prints p50/p99 latency, QPS, errors and fallbacks per level, the highest QPS with p99 under
   20 ms and zero errors, and the device from ``/health``; writes ``bench/results/serve.json``.

The same script runs unchanged on a GPU machine: the trainer and the service pick CUDA when it
is present, and the report names the device the service used.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import redis

from headwater.pipelines.settings import Settings
from headwater.ranking.features import BoundRegistry, load_registry
from headwater.ranking.synthetic import make_world, training_set, write_world
from headwater.ranking.trainset import write_parquet
from headwater.serving.config import load_config
from headwater.serving.store import OnlineStoreReader, now_ms

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "serve.json"
P99_TARGET_MS = 20.0
K = 20
HEADWATER = str(Path(sys.executable).with_name("headwater"))
_LENGTH = re.compile(rb"content-length:\s*(\d+)", re.IGNORECASE)


def free_port() -> int:
    """Return a free loopback TCP port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def apply_registry(state_dir: Path, repo: Path = ROOT / "features") -> None:
    """Apply ``repo`` to ``state_dir`` (plans only, no Feast): the registry the service binds to."""
    cmd = [HEADWATER, "apply", str(repo), "--state-dir", str(state_dir), "--no-feast"]
    subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)


def train_model(out: Path, registry: BoundRegistry, seed: int = 11) -> None:
    """Train a small model from a synthetic training set in the registry's shape (CUDA when present)."""
    data = out.parent / "train.parquet"
    world = make_world(registry, users=2_000, items=2_000, seed=seed)
    write_parquet(training_set(registry, world, slates=8_000, seed=seed), data)
    cmd = [HEADWATER, "model", "train", "--training-set", str(data), "--out", str(out), "--epochs", "2"]
    subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)


def write_features(
    reader: OnlineStoreReader, registry: BoundRegistry, users: int, items: int, seed: int
) -> None:
    """Write every user and item view for ``users`` and ``items`` (ids b-u*/b-i*, 6 digits)."""
    world = make_world(registry, users=users, items=items, seed=seed, prefixes=("b-u", "b-i"))
    write_world(reader, registry, world, now_ms())


def create_topic(bootstrap: str, topic: str, partitions: int = 1) -> bool:
    """Create ``topic`` (and wait for it); False when Kafka cannot be reached."""
    from kafka.admin import KafkaAdminClient, NewTopic
    from kafka.errors import KafkaError, TopicAlreadyExistsError

    try:
        admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10_000)
    except KafkaError as exc:
        print(f"Kafka at {bootstrap} unreachable ({exc})", flush=True)
        return False
    try:
        admin.create_topics([NewTopic(topic, partitions, 1)])
    except TopicAlreadyExistsError:
        pass
    finally:
        admin.close()
    return True


def delete_topics(bootstrap: str, topics: list[str]) -> None:
    """Delete the benchmark's topics (best effort: a failure is printed)."""
    from kafka.admin import KafkaAdminClient
    from kafka.errors import KafkaError

    try:
        admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10_000)
        admin.delete_topics(topics)
        admin.close()
    except KafkaError as exc:
        print(f"could not delete topics {topics}: {exc}", flush=True)


def encode(body: dict[str, Any]) -> bytes:
    """Return one pre-encoded ``POST /v1/rank`` HTTP/1.1 request."""
    payload = json.dumps(body, separators=(",", ":")).encode()
    head = (
        "POST /v1/rank HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\n\r\n"
    )
    return head.encode() + payload


async def connection(
    port: int, bodies: list[bytes], until: float, out: dict[str, list[Any]], offset: int
) -> None:
    """Send requests on one keep-alive connection until ``until`` (loop time), one at a time."""
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
            match = _LENGTH.search(head)
            body = await reader.readexactly(int(match.group(1)) if match else 0)
            out["latency"].append(time.perf_counter() - started)
            status = int(head[9:12])
            if status != 200:
                out["errors"].append(status)
            elif b'"fallback":null' not in body:
                out["fallbacks"].append(1)
    finally:
        writer.close()


def cpu_seconds(pid: int) -> float | None:
    """CPU time (user + system, all threads) of process ``pid``; None where /proc is missing."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def level(
    port: int, pid: int, bodies: list[bytes], concurrency: int, seconds: float, warmup: float
) -> dict[str, Any]:
    """Run one concurrency level: a warm-up, then ``seconds`` of measured closed-loop load."""
    loop = asyncio.get_running_loop()
    scratch: dict[str, list[Any]] = {"latency": [], "errors": [], "fallbacks": []}
    await asyncio.gather(
        *[connection(port, bodies, loop.time() + warmup, scratch, c * 7) for c in range(concurrency)]
    )
    out: dict[str, list[Any]] = {"latency": [], "errors": [], "fallbacks": []}
    cpu_before, load_before, client_before = cpu_seconds(pid), os.getloadavg()[0], time.process_time()
    start = loop.time()
    await asyncio.gather(
        *[connection(port, bodies, start + seconds, out, c * 13) for c in range(concurrency)]
    )
    elapsed = loop.time() - start
    cpu_after, client_cpu = cpu_seconds(pid), time.process_time() - client_before
    lat = np.asarray(out["latency"]) * 1000.0
    n = len(lat)
    cpu_ms = None
    if cpu_before is not None and cpu_after is not None and n:
        cpu_ms = round((cpu_after - cpu_before) * 1000.0 / n, 3)
    return {
        "concurrency": concurrency,
        "requests": n,
        "qps": round(n / elapsed, 1),
        "p50_ms": round(float(np.percentile(lat, 50)), 2) if n else None,
        "p99_ms": round(float(np.percentile(lat, 99)), 2) if n else None,
        "errors": len(out["errors"]),
        "fallbacks": len(out["fallbacks"]),
        "server_cpu_ms_per_request": cpu_ms,
        "client_cpu_ms_per_request": round(client_cpu * 1000.0 / n, 3) if n else None,
        "load_avg_1m": round((load_before + os.getloadavg()[0]) / 2.0, 2),
    }


def wait_healthy(port: int, proc: subprocess.Popen[bytes], timeout: float = 180.0) -> dict[str, Any]:
    """Poll ``/health`` until it answers; exit if the service dies or stays silent."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            msg = f"the service exited with code {proc.returncode} before answering /health"
            raise SystemExit(msg)
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
                return dict(json.loads(r.read()))
        except OSError:
            time.sleep(0.3)
    msg = f"the service did not answer /health on port {port} within {timeout} s"
    raise SystemExit(msg)


def median_level(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-field median of one concurrency level over the runs (errors and fallbacks: the sum)."""

    def med(key: str) -> float | None:
        values = [r[key] for r in runs if r[key] is not None]
        return round(statistics.median(values), 3) if values else None

    return {
        "concurrency": runs[0]["concurrency"],
        "runs": len(runs),
        "requests": sum(r["requests"] for r in runs),
        "qps": med("qps"),
        "p50_ms": med("p50_ms"),
        "p99_ms": med("p99_ms"),
        "errors": sum(r["errors"] for r in runs),
        "fallbacks": sum(r["fallbacks"] for r in runs),
        "server_cpu_ms_per_request": med("server_cpu_ms_per_request"),
        "client_cpu_ms_per_request": med("client_cpu_ms_per_request"),
        "load_avg_1m": med("load_avg_1m"),
    }


def print_level(r: dict[str, Any], prefix: str = "") -> None:
    """Print one level on one line."""
    print(
        f"{prefix}c={r['concurrency']:>3} {r['qps']:>7} qps  p50 {r['p50_ms']} ms  p99 {r['p99_ms']} ms"
        f"  errors {r['errors']}  fallbacks {r['fallbacks']}  cpu/req {r['server_cpu_ms_per_request']} ms"
        f" (client {r['client_cpu_ms_per_request']} ms)"
        f"  load {r['load_avg_1m']}",
        flush=True,
    )


def parse_args() -> argparse.Namespace:
    """Command-line options."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--users", type=int, default=5000)
    ap.add_argument("--items", type=int, default=20000)
    ap.add_argument("--candidates", type=int, default=500)
    ap.add_argument("--concurrency", default="1,2,4,6,8,16")
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--warmup", type=float, default=1.5)
    ap.add_argument("--runs", type=int, default=3, help="Sweeps to run; the report gives per-level medians.")
    ap.add_argument("--model", type=Path, default=None, help="Model directory/file; default: train one.")
    ap.add_argument("--config", type=Path, default=None, help="Serving config YAML passed to the service.")
    ap.add_argument("--redis-url", default=Settings.from_env().redis_url)
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--bootstrap", default=Settings.from_env().kafka_bootstrap)
    ap.add_argument("--no-feedback", action="store_true", help="Serve without sending impressions to Kafka.")
    ap.add_argument(
        "--quick", action="store_true", help="One short sweep at concurrency 1,2,4 (a smoke run)."
    )
    ap.add_argument("--out", type=Path, default=RESULTS, help="Where to write the JSON report.")
    ap.add_argument(
        "--http-stack",
        action="store_true",
        help="Only the in-process HTTP stack: CPU per /v1/rank and /v1/recommend request through FastAPI's"
        " routing against the lean routes (serving/rest.py FastRoutes), no server, no store; writes"
        " bench/results/http_stack.json.",
    )
    return ap.parse_args()


def sweep(args: argparse.Namespace, port: int, pid: int, bodies: list[bytes]) -> list[list[dict[str, Any]]]:
    """Run every concurrency level ``args.runs`` times; returns the runs of each level."""
    concurrencies = [int(x) for x in args.concurrency.split(",")]
    per_level: list[list[dict[str, Any]]] = [[] for _ in concurrencies]
    for run in range(args.runs):
        for slot, c in enumerate(concurrencies):
            result = asyncio.run(level(port, pid, bodies, c, args.seconds, args.warmup))
            per_level[slot].append(result)
            print_level(result, f"  run {run + 1}/{args.runs} ")
    return per_level


def drop_namespace(url: str, namespace: str) -> None:
    """Delete the benchmark's keys."""
    client = redis.Redis.from_url(url)
    keys = list(client.scan_iter(match=f"{namespace}:*", count=1000))
    for start in range(0, len(keys), 1000):
        client.delete(*keys[start : start + 1000])
    client.close()


class _ConstantScorer:
    """The neural step at almost no cost (the first item column): the HTTP stack is what is timed."""

    def score_batch(self, jobs: list[tuple[Any, Any]]) -> list[Any]:
        return [np.nan_to_num(items[:, 0]).astype(np.float32) for _, items in jobs]


async def _asgi_rounds(
    apps: dict[str, Any], requests: list[tuple[str, bytes]], calls: int, rounds: int
) -> dict[str, dict[str, list[float]]]:
    """CPU ms per request of each app and path, in interleaved rounds (the apps' lifespans run throughout)."""
    out: dict[str, dict[str, list[float]]] = {name: {path: [] for path, _ in requests} for name in apps}
    statuses: dict[str, set[int]] = {}

    async def call(app: Any, path: str, body: bytes) -> int:
        scope = {
            "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
            "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
            "headers": [(b"host", b"bench"), (b"content-type", b"application/json"),
                        (b"content-length", str(len(body)).encode())],
            "client": ("127.0.0.1", 40000), "server": ("127.0.0.1", 8000),
        }  # fmt: skip
        sent = False
        status = 0

        async def receive() -> dict[str, Any]:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            await asyncio.sleep(3600)
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]

        await app(scope, receive, send)
        return status

    for _ in range(rounds):
        for name, app in apps.items():
            for path, body in requests:
                for _ in range(20):
                    statuses.setdefault(f"{name} {path}", set()).add(await call(app, path, body))
                t0 = time.process_time()
                for _ in range(calls):
                    await call(app, path, body)
                out[name][path].append((time.process_time() - t0) * 1000.0 / calls)
    print(f"statuses: {statuses}", flush=True)
    return out


async def _with_lifespans(apps: dict[str, Any], work: Any) -> Any:
    """Run ``work()`` with every app's lifespan started (the engine, the batcher) and stopped after."""
    stops = []
    for app in apps.values():
        inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        started = asyncio.Event()

        async def send(message: dict[str, Any], started: asyncio.Event = started) -> None:
            if message["type"].startswith("lifespan.startup"):
                started.set()

        await inbox.put({"type": "lifespan.startup"})
        task = asyncio.create_task(app({"type": "lifespan", "asgi": {"version": "3.0"}}, inbox.get, send))
        await started.wait()
        stops.append((inbox, task))
    try:
        return await work()
    finally:
        for inbox, task in stops:
            await inbox.put({"type": "lifespan.shutdown"})
            await task


def http_stack(args: argparse.Namespace, calls: int = 300, rounds: int = 6) -> None:
    """CPU per request of the HTTP stack alone: FastAPI's routing against the lean routes, same answers."""
    from headwater.ranking.model import LinearRanker
    from headwater.ranking.synthetic import small_registry
    from headwater.serving.app import create_app
    from headwater.serving.config import ServingConfig
    from headwater.serving.runtime import LoadedModels
    from headwater.serving.store import InMemoryFeatureStore

    registry = small_registry({"u": ["a", "b"]}, {"i": ["x", "y"], "p": ["clicks"]}, "p.clicks")
    store = InMemoryFeatureStore()
    items = [f"item-{n:05d}" for n in range(args.candidates)]
    rng = np.random.default_rng(args.seed)
    now = int(time.time() * 1000)
    user_view, item_view, popularity = registry.user.layouts[0], *registry.item.layouts
    store.write(user_view, ["u1"], np.ones((1, 2), np.float32), now)
    store.write(item_view, items, rng.normal(size=(len(items), 2)).astype(np.float32), now)
    store.write(popularity, items, rng.uniform(0, 100, (len(items), 1)).astype(np.float32), now)
    f32 = np.float32
    weights = {
        "user_mean": np.zeros(2, f32), "user_scale": np.ones(2, f32), "item_mean": np.zeros(3, f32),
        "item_scale": np.ones(3, f32), "w_user": np.zeros(2, f32), "w_item": np.ones(3, f32),
        "w_cross": np.zeros((2, 3), f32), "bias": np.zeros(1, f32),
    }  # fmt: skip
    linear = LinearRanker(weights)
    version = type("A", (), {"version": "bench"})()
    config = ServingConfig(item_cache_ttl_s=60.0)

    def app(fast: bool) -> Any:
        loaded = LoadedModels(_ConstantScorer(), version, linear, version, "cpu")  # type: ignore[arg-type]
        return create_app(config, registry, store, loaded, fast_routes=fast)

    apps = {"fastapi": app(False), "lean": app(True)}
    rank = json.dumps({"user_id": "u1", "candidates": items, "k": K, "log_impressions": False}).encode()
    recommend = json.dumps({"user_id": "u1", "k": K, "log_impressions": False}).encode()
    requests = [("/v1/rank", rank), ("/v1/recommend", recommend)]
    load0 = os.getloadavg()[0]
    got = asyncio.run(_with_lifespans(apps, lambda: _asgi_rounds(apps, requests, calls, rounds)))
    summary = {
        name: {
            path: {"min_ms": round(min(v), 4), "median_ms": round(statistics.median(v), 4)}
            for path, v in by.items()
        }
        for name, by in got.items()
    }
    result = {
        "benchmark": "http_stack",
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "note": "in-process ASGI calls, no server and no socket; the neural step is a constant scorer and the"
        " store is in memory, so the difference between the two apps is the HTTP stack. /v1/recommend runs"
        " without the funnel (answers 404 after validation): its figure is the framework's cost only.",
        "candidates": args.candidates,
        "cpu_ms_per_request": summary,
        "load_avg_1m": round((load0 + os.getloadavg()[0]) / 2.0, 2),
        "cpu_count": os.cpu_count(),
    }
    print(json.dumps(result, indent=2))
    out = ROOT / "bench" / "results" / "http_stack.json"
    out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")


def main() -> None:
    """Set up, run the sweeps, print and write the report."""
    args = parse_args()
    if args.http_stack:
        http_stack(args)
        return
    if args.quick:
        args.concurrency, args.seconds, args.runs, args.warmup = "1,2,4", 3.0, 1, 1.0
    config = load_config(args.config)
    namespace = f"hwbench-serve-{uuid.uuid4().hex[:6]}"
    work = Path(tempfile.mkdtemp(prefix="headwater-bench-serve-"))
    state_dir = work / "state"
    apply_registry(state_dir)
    registry = load_registry(state_dir, config.popularity)
    model = args.model
    if model is None:
        print(f"training a small model for registry {registry.registry_version} ...", flush=True)
        model = work / "models"
        train_model(model, registry, args.seed)
    reader = OnlineStoreReader.from_url(args.redis_url, namespace=namespace, timeout_s=5.0)
    print(f"writing {args.users} users and {args.items} items under namespace {namespace} ...", flush=True)
    write_features(reader, registry, args.users, args.items, args.seed)
    topic = f"hwbench-serve-{namespace[-6:]}"
    feedback = not args.no_feedback and create_topic(args.bootstrap, topic)
    rng = random.Random(args.seed)
    items = [f"b-i{i:06d}" for i in range(args.items)]
    bodies = [
        encode(
            {
                "user_id": f"b-u{rng.randrange(args.users):06d}",
                "candidates": rng.sample(items, args.candidates),
                "k": K,
                "priority": "normal",
            }
        )
        for _ in range(256)
    ]
    port = free_port()
    cmd = [
        HEADWATER,
        "serve",
        "--no-auth",  # loopback: explicit (issue 32)
        "--port",
        str(port),
        "--model",
        str(model),
        "--redis-url",
        args.redis_url,
        "--namespace",
        namespace,
        "--state-dir",
        str(state_dir),
        "--log-level",
        "warning",
    ]
    cmd += ["--bootstrap", args.bootstrap, "--feedback-topic", topic] if feedback else ["--no-feedback"]
    if args.config is not None:
        cmd += ["--config", str(args.config)]
    proc = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        health = wait_healthy(port, proc)
        per_level = sweep(args, port, proc.pid, bodies)
        health = wait_healthy(port, proc)
    finally:
        proc.terminate()
        proc.wait(20)
        drop_namespace(args.redis_url, namespace)
        reader.close()
        if feedback:
            delete_topics(args.bootstrap, [topic])
    report(args, health, per_level)


def report(args: argparse.Namespace, health: dict[str, Any], per_level: list[list[dict[str, Any]]]) -> None:
    """Print the per-level medians and write the JSON report."""
    levels = [median_level(runs) for runs in per_level]
    ok = [r for r in levels if r["p99_ms"] is not None and r["p99_ms"] < P99_TARGET_MS and r["errors"] == 0]
    best = max(ok, key=lambda r: r["qps"]) if ok else None
    result = {
        "benchmark": "serve",
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "candidates_per_request": args.candidates,
        "k": K,
        "users": args.users,
        "items": args.items,
        "seconds_per_level": args.seconds,
        "runs": args.runs,
        "device": health["device"],
        "registry_version": health["registry_version"],
        "feedback": health["feedback"],
        "model_version": health["model_version"],
        "inference_latency_p99_ms": health["inference_latency_p99_ms"],
        "gpu_memory_used_percent": health["gpu_memory_used_percent"],
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "levels": levels,
        "runs_per_level": per_level,
        "max_qps_p99_under_20ms": best["qps"] if best else None,
        "at_concurrency": best["concurrency"] if best else None,
        "total_errors": sum(r["errors"] for r in levels),
    }
    print(f"\nmedians over {args.runs} run(s):")
    columns = ("conc", "qps", "p50 ms", "p99 ms", "errors", "fallbk", "srv cpu", "cli cpu", "load")
    keys = (
        "concurrency",
        "qps",
        "p50_ms",
        "p99_ms",
        "errors",
        "fallbacks",
        "server_cpu_ms_per_request",
        "client_cpu_ms_per_request",
        "load_avg_1m",
    )
    widths = (5, 8, 8, 8, 7, 7, 8, 8, 6)
    print(" ".join(f"{c:>{w}}" for c, w in zip(columns, widths, strict=True)))
    for r in levels:
        print(" ".join(f"{r[k]!s:>{w}}" for k, w in zip(keys, widths, strict=True)))
    print(
        f"device {result['device']}; highest QPS with p99 < {P99_TARGET_MS:.0f} ms and no errors:"
        f" {result['max_qps_p99_under_20ms']} (concurrency {result['at_concurrency']});"
        f" errors {result['total_errors']}; inference p99 {result['inference_latency_p99_ms']} ms"
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
