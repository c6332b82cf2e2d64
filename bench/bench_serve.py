"""Closed-loop load test of the ranking service on loopback: 500 candidates per request.

One command: ``.venv/bin/python bench/bench_serve.py``. It

1. trains a small model into a temporary directory (unless ``--model`` is given),
2. writes features for ``--users`` users and ``--items`` items into Redis under a key
   namespace of its own (removed at the end),
3. starts ``headwater serve`` as a subprocess on a free loopback port,
4. runs a closed loop (each of C connections sends its next request when the previous answer
   arrived) at each concurrency C for ``--seconds`` after a warm-up, with a minimal asyncio
   HTTP/1.1 client (keep-alive, pre-encoded bodies) so the client costs little CPU,
5. prints p50/p99 latency, QPS, errors and fallbacks per level, the highest QPS with p99 under
   20 ms and the device from ``/health``, and writes ``bench/results/serve.json``.

The same script runs on a GPU machine: the service picks CUDA when it is present.
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
from headwater.serving.config import ServingConfig
from headwater.serving.demo import demo_rows
from headwater.serving.store import OnlineStoreReader, now_ms

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "serve.json"
P99_TARGET_MS = 20.0
HEADWATER = str(Path(sys.executable).with_name("headwater"))
_LENGTH = re.compile(rb"content-length:\s*(\d+)", re.IGNORECASE)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def train_model(out: Path) -> None:
    cmd = [HEADWATER, "model", "train", "--out", str(out), "--events", "150000",
           "--epochs", "2"]  # fmt: skip
    subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)


def write_features(
    reader: OnlineStoreReader, config: ServingConfig, users: int, items: int, seed: int
) -> None:
    """``users`` and ``items`` vectors resampled from the demo world (ids b-u*/b-i*)."""
    base = demo_rows(events=100_000, seed=seed)
    rng = np.random.default_rng(seed)
    t = now_ms()
    user_ids = [f"b-u{i}" for i in range(users)]
    item_ids = [f"b-i{i}" for i in range(items)]
    u = base.users[rng.integers(0, len(base.users), users)]
    i_rows = rng.integers(0, len(base.items), items)
    for start in range(0, users, 5000):
        reader.write(config.user_view, user_ids[start : start + 5000], u[start : start + 5000], t)
    for start in range(0, items, 5000):
        sl = slice(start, start + 5000)
        reader.write(config.item_view, item_ids[sl], base.items[i_rows][sl], t)
        reader.write(config.popularity_view, item_ids[sl], base.popularity[i_rows][sl], t)


def encode(body: dict[str, Any]) -> bytes:
    payload = json.dumps(body, separators=(",", ":")).encode()
    head = f"POST /v1/rank HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
    return head.encode() + payload


async def connection(
    port: int, bodies: list[bytes], until: float, out: dict[str, list[Any]], offset: int
) -> None:
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


async def level(
    port: int, bodies: list[bytes], concurrency: int, seconds: float, warmup: float
) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    scratch: dict[str, list[Any]] = {"latency": [], "errors": [], "fallbacks": []}
    await asyncio.gather(
        *[connection(port, bodies, loop.time() + warmup, scratch, c * 7) for c in range(concurrency)]
    )
    out: dict[str, list[Any]] = {"latency": [], "errors": [], "fallbacks": []}
    start = loop.time()
    await asyncio.gather(
        *[connection(port, bodies, start + seconds, out, c * 13) for c in range(concurrency)]
    )
    elapsed = loop.time() - start
    lat = np.asarray(out["latency"]) * 1000.0
    return {
        "concurrency": concurrency,
        "requests": len(lat),
        "qps": round(len(lat) / elapsed, 1),
        "p50_ms": round(float(np.percentile(lat, 50)), 2) if len(lat) else None,
        "p99_ms": round(float(np.percentile(lat, 99)), 2) if len(lat) else None,
        "errors": len(out["errors"]),
        "fallbacks": len(out["fallbacks"]),
    }


def wait_healthy(port: int, proc: subprocess.Popen[bytes], timeout: float = 120.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the service exited with code {proc.returncode} before answering /health")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
                return dict(json.loads(r.read()))
        except OSError:
            time.sleep(0.3)
    raise SystemExit(f"the service did not answer /health on port {port} within {timeout} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--users", type=int, default=5000)
    ap.add_argument("--items", type=int, default=20000)
    ap.add_argument("--candidates", type=int, default=500)
    ap.add_argument("--concurrency", default="1,2,4,8,16,32")
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--warmup", type=float, default=2.0)
    ap.add_argument(
        "--model", type=Path, default=None, help="Model directory/file; default: train a small one."
    )
    ap.add_argument("--redis-url", default=Settings.from_env().redis_url)
    ap.add_argument("--seed", type=int, default=11)
    args = ap.parse_args()

    config = ServingConfig()
    namespace = f"hwbench-serve-{uuid.uuid4().hex[:6]}"
    tmp = Path(tempfile.mkdtemp(prefix="headwater-bench-serve-"))
    model = args.model
    if model is None:
        print("training a small model ...", flush=True)
        train_model(tmp / "models")
        model = tmp / "models"
    reader = OnlineStoreReader.from_url(args.redis_url, namespace=namespace, timeout_s=5.0)
    print(f"writing {args.users} users and {args.items} items under namespace {namespace} ...", flush=True)
    write_features(reader, config, args.users, args.items, args.seed)
    rng = random.Random(args.seed)
    items = [f"b-i{i}" for i in range(args.items)]
    bodies = [
        encode({"user_id": f"b-u{rng.randrange(args.users)}", "candidates": rng.sample(items, args.candidates),
                "k": 20, "priority": "normal"})
        for _ in range(256)
    ]  # fmt: skip
    port = free_port()
    cmd = [HEADWATER, "serve", "--port", str(port), "--model", str(model),
           "--redis-url", args.redis_url, "--namespace", namespace, "--log-level", "warning"]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        health = wait_healthy(port, proc)
        levels = []
        for c in (int(x) for x in args.concurrency.split(",")):
            result = asyncio.run(level(port, bodies, c, args.seconds, args.warmup))
            levels.append(result)
            print(f"  concurrency {c:>3}: {result['qps']:>7} qps  p50 {result['p50_ms']} ms  p99 {result['p99_ms']} ms"
                  f"  errors {result['errors']}  fallbacks {result['fallbacks']}", flush=True)  # fmt: skip
        health = wait_healthy(port, proc)
    finally:
        proc.terminate()
        proc.wait(20)
        client = redis.Redis.from_url(args.redis_url)
        keys = list(client.scan_iter(match=f"{namespace}:*", count=1000))
        for start in range(0, len(keys), 1000):
            client.delete(*keys[start : start + 1000])
        client.close()
        reader.close()
    ok = [r for r in levels if r["p99_ms"] is not None and r["p99_ms"] < P99_TARGET_MS and r["errors"] == 0]
    best = max(ok, key=lambda r: r["qps"]) if ok else None
    report = {
        "benchmark": "serve",
        "candidates_per_request": args.candidates,
        "k": 20,
        "users": args.users,
        "items": args.items,
        "seconds_per_level": args.seconds,
        "device": health["device"],
        "model_version": health["model_version"],
        "inference_latency_p99_ms": health["inference_latency_p99_ms"],
        "gpu_memory_used_percent": health["gpu_memory_used_percent"],
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "levels": levels,
        "max_qps_p99_under_20ms": best["qps"] if best else None,
        "at_concurrency": best["concurrency"] if best else None,
        "total_errors": sum(r["errors"] for r in levels),
    }
    print()
    print(f"{'conc':>5} {'qps':>8} {'p50 ms':>8} {'p99 ms':>8} {'errors':>7} {'fallbk':>7}")
    for r in levels:
        print(
            f"{r['concurrency']:>5} {r['qps']:>8} {r['p50_ms']:>8} {r['p99_ms']:>8} {r['errors']:>7} {r['fallbacks']:>7}"
        )
    print(f"device {report['device']}; highest QPS with p99 < {P99_TARGET_MS:.0f} ms: {report['max_qps_p99_under_20ms']}"
          f" (concurrency {report['at_concurrency']}); errors {report['total_errors']}")  # fmt: skip
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
