"""The service's edge in one run: REST vs gRPC, then per-class latency and throttling under load.

One command: ``.venv/bin/python bench/bench_edge.py`` (``--quick`` for a smoke run). It

1. applies ``features/``, trains a small model and writes users and items to Redis under a
   namespace of its own, as ``bench/bench_serve.py`` does (its helpers are reused);
2. starts ``headwater serve --grpc-port`` (no admission) and, for 100 and 500 candidates (k 20),
   runs the same closed loop at the same concurrency over REST (a minimal keep-alive HTTP/1.1
   client, pre-encoded JSON bodies) and over gRPC (``grpc.aio``, pre-serialised messages),
   interleaved, ``--runs`` times; reports request and response payload bytes (JSON body vs
   protobuf message; REST's HTTP/1.1 head is counted apart), p50/p99, QPS and the service's CPU
   milliseconds per request, per-level medians;
3. offers an open-loop load above the regular quota (default vip 30/s, regular 40/s, new
   10/s, arrivals evenly spaced, each request on its own task, the class in ``X-User-Class``) to
   a service with admission off, on (the default quotas vip 50/s, regular 20/s, new 5/s and the
   default gate), and on with other gates (``--gates``), ``--class-runs`` times in rotating
   order; reports per class p50/p99 of the answered requests and the throttled share;
4. prints both tables with the load average and writes ``bench/results/bench_edge.json``
   (``--parts classes`` reruns one part and keeps the other's figures from the file).

Other processes share the CPUs: read the figures next to the load average printed with them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import grpc
import numpy as np
from bench_serve import (  # same folder: the serving benchmark's set-up helpers
    _LENGTH,
    HEADWATER,
    ROOT,
    apply_registry,
    cpu_seconds,
    drop_namespace,
    encode,
    free_port,
    train_model,
    wait_healthy,
    write_features,
)

from headwater.client.proto.headwater.v1 import ranking_pb2 as pb
from headwater.client.transport import RANK_METHOD
from headwater.pipelines.settings import Settings
from headwater.ranking.features import load_registry
from headwater.serving.config import DEFAULT_POPULARITY, ServingConfig
from headwater.serving.store import OnlineStoreReader

RESULTS = ROOT / "bench" / "results" / "bench_edge.json"
K = 20


def parse_args() -> argparse.Namespace:
    """Command-line options."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--users", type=int, default=5000)
    ap.add_argument("--items", type=int, default=20000)
    ap.add_argument("--candidates", default="100,500")
    ap.add_argument("--concurrency", type=int, default=4, help="Closed-loop connections, both protocols.")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--warmup", type=float, default=1.0)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--rates", default="vip=30,regular=40,new=10", help="Offered requests/s per class.")
    ap.add_argument("--class-seconds", type=float, default=15.0)
    ap.add_argument("--class-candidates", type=int, default=500)
    ap.add_argument("--class-runs", type=int, default=2, help="Runs of each admission scenario.")
    ap.add_argument("--gates", default="8,64", help="Other max_in_flight values to run admission with.")
    ap.add_argument(
        "--parts", default="protocols,classes",
        help="Parts to run; a part not run keeps its figures from the existing --out file.",
    )  # fmt: skip
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--redis-url", default=Settings.from_env().redis_url)
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--quick", action="store_true", help="One short run of each part (a smoke run).")
    ap.add_argument("--out", type=Path, default=RESULTS)
    return ap.parse_args()


def start(args: argparse.Namespace, ctx: dict[str, Any], *extra: str) -> tuple[subprocess.Popen[bytes], int]:
    """Start ``headwater serve`` with ``extra`` flags; return the process and its REST port."""
    port = free_port()
    cmd = [HEADWATER, "serve", "--no-auth", "--port", str(port), "--model", str(ctx["model"]), "--redis-url",
           args.redis_url, "--namespace", ctx["namespace"], "--state-dir", str(ctx["state"]),
           "--log-level", "warning", "--no-feedback", *extra]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    return proc, port


def stop(proc: subprocess.Popen[bytes]) -> None:
    """Terminate the service and wait for it."""
    proc.terminate()
    proc.wait(30)


# --- part 1: REST vs gRPC ----------------------------------------------------------------------


async def rest_conn(port: int, bodies: list[bytes], until: float, out: dict[str, list[Any]], i: int) -> None:
    """One keep-alive HTTP/1.1 connection in a closed loop until ``until``."""
    loop = asyncio.get_running_loop()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        while loop.time() < until:
            request = bodies[i % len(bodies)]
            i += 1
            began = time.perf_counter()
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            match = _LENGTH.search(head)
            body = await reader.readexactly(int(match.group(1)) if match else 0)
            out["latency"].append(time.perf_counter() - began)
            if int(head[9:12]) != 200:
                out["errors"].append(1)
            elif b'"fallback":null' not in body:
                out["fallbacks"].append(1)
            out["response_bytes"].append(len(body))
            out["head_bytes"].append(len(head))
    finally:
        writer.close()


async def grpc_conn(
    call: Any, messages: list[bytes], until: float, out: dict[str, list[Any]], i: int
) -> None:
    """One closed loop of unary calls on a shared channel until ``until``."""
    loop = asyncio.get_running_loop()
    while loop.time() < until:
        request = messages[i % len(messages)]
        i += 1
        began = time.perf_counter()
        try:
            raw = await call(request, timeout=30)
        except grpc.RpcError:
            out["errors"].append(1)
            continue
        out["latency"].append(time.perf_counter() - began)
        if pb.RankResponse.FromString(raw).HasField("fallback"):
            out["fallbacks"].append(1)
        out["response_bytes"].append(len(raw))


async def protocol_level(
    protocol: str, port: int, target: str, pid: int, payloads: list[bytes], args: argparse.Namespace
) -> dict[str, Any]:
    """One closed-loop level over one protocol: a warm-up, then ``args.seconds`` measured."""
    loop = asyncio.get_running_loop()
    c = args.concurrency
    channel = grpc.aio.insecure_channel(target) if protocol == "grpc" else None
    call = (
        channel.unary_unary(RANK_METHOD, request_serializer=None, response_deserializer=None)
        if channel is not None
        else None
    )

    def loops(until: float, out: dict[str, list[Any]]) -> list[Any]:
        if call is not None:
            return [grpc_conn(call, payloads, until, out, n * 13) for n in range(c)]
        return [rest_conn(port, payloads, until, out, n * 13) for n in range(c)]

    scratch: dict[str, list[Any]] = {"latency": [], "errors": [], "fallbacks": [], "response_bytes": [],
                                     "head_bytes": []}  # fmt: skip
    await asyncio.gather(*loops(loop.time() + args.warmup, scratch))
    out: dict[str, list[Any]] = {k: [] for k in scratch}
    cpu_before, load_before = cpu_seconds(pid), os.getloadavg()[0]
    began = loop.time()
    await asyncio.gather(*loops(began + args.seconds, out))
    elapsed = loop.time() - began
    cpu_after = cpu_seconds(pid)
    if channel is not None:
        await channel.close()
    lat = np.asarray(out["latency"]) * 1000.0
    n = len(lat)
    return {
        "requests": n,
        "qps": round(n / elapsed, 1),
        "p50_ms": round(float(np.percentile(lat, 50)), 2) if n else None,
        "p99_ms": round(float(np.percentile(lat, 99)), 2) if n else None,
        "errors": len(out["errors"]),
        "fallbacks": len(out["fallbacks"]),
        "server_cpu_ms_per_request": (
            round((cpu_after - cpu_before) * 1000.0 / n, 3) if n and cpu_before and cpu_after else None
        ),
        "response_bytes": round(statistics.mean(out["response_bytes"])) if out["response_bytes"] else None,
        "http_head_bytes": round(statistics.mean(out["head_bytes"])) if out["head_bytes"] else None,
        "load_avg_1m": round((load_before + os.getloadavg()[0]) / 2.0, 2),
    }


def request_bodies(args: argparse.Namespace, candidates: int, seed: int) -> list[dict[str, Any]]:
    """Rank requests of ``candidates`` random items for random users (no impressions logged)."""
    rng = random.Random(seed)
    items = [f"b-i{i:06d}" for i in range(args.items)]
    return [
        {
            "user_id": f"b-u{rng.randrange(args.users):06d}",
            "candidates": rng.sample(items, candidates),
            "k": K,
            "log_impressions": False,
        }
        for _ in range(128)
    ]


def median(runs: list[dict[str, Any]], key: str) -> float | None:
    """Median of ``key`` over the runs that have it."""
    values = [r[key] for r in runs if r[key] is not None]
    return round(statistics.median(values), 3) if values else None


def part_protocols(args: argparse.Namespace, ctx: dict[str, Any]) -> list[dict[str, Any]]:
    """REST vs gRPC on one service at each candidate count; per-level medians over the runs."""
    grpc_port = free_port()
    proc, port = start(args, ctx, "--grpc-port", str(grpc_port))
    rows: list[dict[str, Any]] = []
    try:
        wait_healthy(port, proc)
        target = f"127.0.0.1:{grpc_port}"
        sizes = [int(x) for x in args.candidates.split(",")]
        bodies = {n: request_bodies(args, n, args.seed + n) for n in sizes}
        rest = {n: [encode(b) for b in bodies[n]] for n in sizes}
        msgs = {n: [pb.RankRequest(**b).SerializeToString() for b in bodies[n]] for n in sizes}
        runs: dict[tuple[int, str], list[dict[str, Any]]] = {
            (n, p): [] for n in sizes for p in ("rest", "grpc")
        }
        for run in range(args.runs):
            for n in sizes:
                order = ("rest", "grpc") if run % 2 == 0 else ("grpc", "rest")
                for protocol in order:
                    payloads = rest[n] if protocol == "rest" else msgs[n]
                    got = asyncio.run(protocol_level(protocol, port, target, proc.pid, payloads, args))
                    runs[(n, protocol)].append(got)
                    print(f"  run {run + 1}/{args.runs} {n} candidates {protocol:>4}: {got}", flush=True)
        for n in sizes:
            json_bytes = statistics.mean(len(json.dumps(b, separators=(",", ":"))) for b in bodies[n])
            proto_bytes = statistics.mean(len(m) for m in msgs[n])
            for protocol in ("rest", "grpc"):
                r = runs[(n, protocol)]
                rows.append(
                    {
                        "candidates": n,
                        "protocol": protocol,
                        "concurrency": args.concurrency,
                        "runs": len(r),
                        "requests": sum(x["requests"] for x in r),
                        "request_bytes": round(json_bytes if protocol == "rest" else proto_bytes),
                        "response_bytes": median(r, "response_bytes"),
                        "http_head_bytes": median(r, "http_head_bytes"),
                        "qps": median(r, "qps"),
                        "p50_ms": median(r, "p50_ms"),
                        "p99_ms": median(r, "p99_ms"),
                        "server_cpu_ms_per_request": median(r, "server_cpu_ms_per_request"),
                        "errors": sum(x["errors"] for x in r),
                        "fallbacks": sum(x["fallbacks"] for x in r),
                        "load_avg_1m": median(r, "load_avg_1m"),
                    }
                )
    finally:
        stop(proc)
    return rows


# --- part 2: per-class latency and throttling --------------------------------------------------


async def offered_load(
    port: int, rates: dict[str, float], seconds: float, bodies: list[dict[str, Any]]
) -> dict[str, dict[str, Any]]:
    """Open loop: each class's requests at evenly spaced arrivals, each on its own task.

    Requests are pre-encoded HTTP/1.1 with the class in ``X-User-Class``, sent on keep-alive
    connections taken from an idle pool (a new one when none is idle), so the client costs little.
    """
    loop = asyncio.get_running_loop()
    seen: dict[str, dict[str, list[float]]] = {c: {"ok": [], "throttled": [], "other": []} for c in rates}
    wire = {c: [with_class(encode(b), c) for b in bodies] for c in rates}
    idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    opened: list[asyncio.StreamWriter] = []

    async def one(user_class: str, request: bytes) -> None:
        began = time.perf_counter()
        code = 0
        for attempt in range(2):  # a pooled connection the server closed (keep-alive timeout): a new one
            fresh = attempt == 1 or not idle
            if fresh:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                opened.append(writer)
            else:
                reader, writer = idle.pop()
            try:
                writer.write(request)
                head = await reader.readuntil(b"\r\n\r\n")
                match = _LENGTH.search(head)
                await reader.readexactly(int(match.group(1)) if match else 0)
            except (OSError, asyncio.IncompleteReadError):
                writer.close()
                if fresh:
                    break
                began = time.perf_counter()
                continue
            idle.append((reader, writer))
            code = int(head[9:12])
            break
        took = (time.perf_counter() - began) * 1000.0
        kind = "ok" if code == 200 else "throttled" if code == 429 else "other"
        seen[user_class][kind].append(took)

    async def arrivals(user_class: str, rate: float, offset: int) -> None:
        start, n, tasks = loop.time(), 0, []
        while (at := start + n / rate) < start + seconds:
            await asyncio.sleep(max(0.0, at - loop.time()))
            request = wire[user_class][(offset + n) % len(bodies)]
            tasks.append(asyncio.create_task(one(user_class, request)))
            n += 1
        await asyncio.gather(*tasks)

    await asyncio.gather(*(arrivals(c, r, i * 31) for i, (c, r) in enumerate(rates.items())))
    for writer in opened:
        writer.close()
    out: dict[str, dict[str, Any]] = {}
    for user_class, got in seen.items():
        ok, throttled = np.asarray(got["ok"]), got["throttled"]
        total = len(got["ok"]) + len(throttled) + len(got["other"])
        out[user_class] = {
            "offered_per_s": rates[user_class],
            "sent": total,
            "answered": len(ok),
            "throttled": len(throttled),
            "other_errors": len(got["other"]),
            "throttled_share": round(len(throttled) / total, 4) if total else None,
            "p50_ms": round(float(np.percentile(ok, 50)), 2) if len(ok) else None,
            "p99_ms": round(float(np.percentile(ok, 99)), 2) if len(ok) else None,
            "throttled_p50_ms": round(float(np.percentile(throttled, 50)), 2) if throttled else None,
        }
    return out


def with_class(request: bytes, user_class: str) -> bytes:
    """Add the ``X-User-Class`` header to a pre-encoded request."""
    return request.replace(b"\r\n\r\n", f"\r\nX-User-Class: {user_class}\r\n\r\n".encode(), 1)


def part_classes(args: argparse.Namespace, ctx: dict[str, Any]) -> list[dict[str, Any]]:
    """Offer the same load to each admission scenario, ``args.class_runs`` times in rotating order.

    Scenarios: admission off; on with the default quotas and gate; on with each other gate of
    ``args.gates`` in flight (waiting happens at the gate, where VIP goes first).
    Returns per scenario and class the summed counts and the median p50/p99 over the runs.
    """
    rates = {k: float(v) for k, v in (pair.split("=") for pair in args.rates.split(","))}
    bodies = request_bodies(args, args.class_candidates, args.seed + 7)
    default_gate = ServingConfig().admission.max_in_flight
    scenarios = {"off": ["--no-admission"], f"on, gate {default_gate} (default)": ["--admission"]}
    for gate in (int(g) for g in args.gates.split(",") if g):
        gate_config = ctx["work"] / f"gate{gate}.yaml"
        gate_config.write_text(f"admission:\n  enabled: true\n  max_in_flight: {gate}\n")
        scenarios[f"on, gate {gate}"] = ["--config", str(gate_config)]
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in scenarios}
    names = list(scenarios)
    for run in range(args.class_runs):
        for name in names[run % len(names) :] + names[: run % len(names)]:
            proc, port = start(args, ctx, *scenarios[name])
            try:
                wait_healthy(port, proc)
                asyncio.run(offered_load(port, {"vip": 20.0}, 2.0, bodies))  # warm-up (model's first calls)
                time.sleep(1.5)  # the vip bucket refills
                load_before = os.getloadavg()[0]
                got = asyncio.run(offered_load(port, rates, args.class_seconds, bodies))
                load = round((load_before + os.getloadavg()[0]) / 2.0, 2)
            finally:
                stop(proc)
            runs[name].append({"load_avg_1m": load, "classes": got})
            print(
                f"  run {run + 1}/{args.class_runs} admission {name}: load {load} {json.dumps(got)}",
                flush=True,
            )
    out = []
    for name, got in runs.items():
        classes = {}
        for user_class in rates:
            per = [r["classes"][user_class] for r in got]
            sent, throttled = sum(c["sent"] for c in per), sum(c["throttled"] for c in per)
            classes[user_class] = {
                "offered_per_s": rates[user_class],
                "sent": sent,
                "answered": sum(c["answered"] for c in per),
                "throttled": throttled,
                "other_errors": sum(c["other_errors"] for c in per),
                "throttled_share": round(throttled / sent, 4) if sent else None,
                "p50_ms": median(per, "p50_ms"),
                "p99_ms": median(per, "p99_ms"),
                "throttled_p50_ms": median(per, "throttled_p50_ms"),
            }
        out.append({"admission": name, "runs": len(got), "load_avg_1m": median(got, "load_avg_1m"),
                    "classes": classes})  # fmt: skip
    return out


def main() -> None:
    """Set up once, run both parts, print the tables and write the JSON."""
    args = parse_args()
    if args.quick:
        args.runs, args.seconds, args.warmup, args.class_seconds, args.class_runs = 1, 2.0, 0.5, 4.0, 1
    namespace = f"hwbench-edge-{uuid.uuid4().hex[:6]}"
    work = Path(tempfile.mkdtemp(prefix="headwater-bench-edge-"))
    state = work / "state"
    apply_registry(state)
    registry = load_registry(state, DEFAULT_POPULARITY)
    model = args.model
    if model is None:
        print(f"training a small model for registry {registry.registry_version} ...", flush=True)
        model = work / "models"
        train_model(model, registry, args.seed)
    reader = OnlineStoreReader.from_url(args.redis_url, namespace=namespace, timeout_s=5.0)
    print(f"writing {args.users} users and {args.items} items under namespace {namespace} ...", flush=True)
    write_features(reader, registry, args.users, args.items, args.seed)
    ctx = {"model": model, "namespace": namespace, "state": state, "work": work}
    parts = set(args.parts.split(","))
    before = json.loads(args.out.read_text()) if args.out.exists() else {}
    try:
        protocols = part_protocols(args, ctx) if "protocols" in parts else before.get("protocols", [])
        classes = part_classes(args, ctx) if "classes" in parts else before.get("classes", [])
    finally:
        drop_namespace(args.redis_url, namespace)
        reader.close()
    report(args, protocols, classes)


def report(args: argparse.Namespace, protocols: list[dict[str, Any]], classes: list[dict[str, Any]]) -> None:
    """Print both tables and write the JSON report."""
    print(f"\nREST vs gRPC, concurrency {args.concurrency}, k {K}, medians of {args.runs} runs")
    print(f"{'cand':>5} {'proto':>5} {'req B':>7} {'resp B':>7} {'qps':>7} {'p50 ms':>8} {'p99 ms':>8}"
          f" {'cpu/req':>8} {'load':>6}")  # fmt: skip
    for r in protocols:
        print(f"{r['candidates']:>5} {r['protocol']:>5} {r['request_bytes']:>7} {r['response_bytes']:>7}"
              f" {r['qps']:>7} {r['p50_ms']:>8} {r['p99_ms']:>8} {r['server_cpu_ms_per_request']:>8}"
              f" {r['load_avg_1m']:>6}")  # fmt: skip
    for scenario in classes:
        state, load = scenario["admission"], scenario["load_avg_1m"]
        runs = scenario["runs"]
        print(f"\nper class, {args.class_candidates} candidates, admission {state}, load {load}"
              f" (medians of {runs} runs; quotas when on: vip 50/s, regular 20/s, new 5/s)")  # fmt: skip
        print(f"{'class':>8} {'offered/s':>9} {'sent':>6} {'200':>6} {'429':>6} {'throttled':>9}"
              f" {'p50 ms':>8} {'p99 ms':>8}")  # fmt: skip
        for name, c in scenario["classes"].items():
            print(f"{name:>8} {c['offered_per_s']:>9} {c['sent']:>6} {c['answered']:>6} {c['throttled']:>6}"
                  f" {c['throttled_share']:>9} {c['p50_ms']!s:>8} {c['p99_ms']!s:>8}")  # fmt: skip
    result = {
        "benchmark": "bench_edge",
        "command": "python bench/bench_edge.py" + (" --quick" if args.quick else ""),
        "k": K,
        "concurrency": args.concurrency,
        "seconds_per_level": args.seconds,
        "runs": args.runs,
        "protocols": protocols,
        "class_candidates": args.class_candidates,
        "class_seconds": args.class_seconds,
        "class_rates_offered": args.rates,
        "parts_run": args.parts,
        "load_note": "2 shared cores; load_avg_1m beside each figure (other agents' jobs)",
        "classes": classes,
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "grpc": grpc.__version__,
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
