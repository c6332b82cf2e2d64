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
import datetime
import json
import os
import platform
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
import loadgen
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
from headwater.ranking.accel import TORCH, accelerator_report, plan_for
from headwater.ranking.features import BoundRegistry, load_registry
from headwater.ranking.synthetic import _zscore, make_world, training_set, write_world
from headwater.ranking.trainset import write_parquet
from headwater.serving.config import ServingConfig
from headwater.serving.funnel.recent import RedisRecentItems
from headwater.serving.store import OnlineStoreReader, now_ms

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
    cpu_before, load_before, client_before = cpu_seconds(pid), os.getloadavg()[0], time.process_time()
    start = loop.time()
    await asyncio.gather(
        *[connection(port, bodies, start + seconds, out, c * 13) for c in range(concurrency)]
    )
    elapsed = loop.time() - start
    cpu_after, client_cpu = cpu_seconds(pid), time.process_time() - client_before
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
        "client_cpu_ms_per_request": round(client_cpu * 1000.0 / n, 3) if n else None,
        "stages": stages,
        "load_avg_1m": round((load_before + os.getloadavg()[0]) / 2.0, 2),
    }


BUCKETS = (
    ("rerank (ONNX Runtime or torch)", ("(ranking/reranker.py",)),
    ("DCN forward (ONNX Runtime or torch)", ("NeuralScorer.score_batch",)),
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
    ap.add_argument(
        "--concurrency", default=None,
        help="Closed-loop connection counts (default 1,2,4,8; none with --rates unless given).",
    )  # fmt: skip
    ap.add_argument(
        "--rates", default=None, metavar="R1,R2,...",
        help="Open loop (bench/loadgen.py): offer these request rates a second in turn, latency from each"
        " request's intended send time, each endpoint until the first saturated rate.",
    )  # fmt: skip
    ap.add_argument("--arrivals", choices=("constant", "poisson"), default="constant")
    ap.add_argument(
        "--max-connections", type=int, default=64, help="Open loop: keep-alive connections, at most."
    )
    ap.add_argument(
        "--saturation-p99-ms", type=float, default=1000.0, help="Open loop: a p99 over this is saturated."
    )
    ap.add_argument(
        "--lag-bound-ms", type=float, default=10.0,
        help="Open loop: a dispatch lag p99 over this marks the generator as behind (the sweep stops).",
    )  # fmt: skip
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--warmup", type=float, default=2.0)
    ap.add_argument("--no-rank", action="store_true", help="Skip the /v1/rank phase.")
    ap.add_argument("--idle", type=float, default=0.0, help="Measure the idle service's CPU this long.")
    ap.add_argument("--profile-variants", default="base,current", help="Variants --profile records.")
    ap.add_argument("--profile", type=float, default=0.0, help="py-spy the service for this many seconds.")
    ap.add_argument(
        "--redis-url", default=None,
        help="Default: a private redis-server on a free port, stopped (and its data gone) at the end.",
    )  # fmt: skip
    ap.add_argument(
        "--variants", default="current",
        help=f"Comma list of service variants run one after another on the same data: {', '.join(VARIANTS)}.",
    )  # fmt: skip
    ap.add_argument(
        "--work", type=Path, default=None,
        help="Keep the state and the trained models here, reused by the next run (default: a temp dir).",
    )  # fmt: skip
    ap.add_argument(
        "--deadline-ms", type=float, default=None,
        help="deadline_ms of every request (default: the service's 100 ms). A long one keeps a loaded"
        " machine's slow requests on the full path, so CPU per request is the full path's.",
    )  # fmt: skip
    ap.add_argument("--base", type=Path, default=None, help="PYTHONPATH of the 'base' variant's code.")
    ap.add_argument(
        "--probe-staleness", type=float, default=0.0, metavar="S",
        help="After the levels, write one item's row of the item view with the longest freshness SLA under"
        " it and time how long until the service's in-memory item rows hold it (its /health item_mirror"
        " version moves), polling at most S seconds: the staleness the mirror adds to a write.",
    )  # fmt: skip
    ap.add_argument(
        "--hold-until", default=None, metavar="HH:MM",
        help="Once the first variant's service is up (the catalog written, the index built), wait until this"
        " UTC time before measuring, then give the benchmark, its redis-server and the service (every"
        " thread) nice 0: load and build at nice 19 before a measurement window, measure in it.",
    )  # fmt: skip
    ap.add_argument("--write-chunk", type=int, default=20_000, help="Rows per pipelined write to Redis.")
    ap.add_argument(
        "--item-writes", type=int, default=0, metavar="N",
        help="While measuring, write N random items a second to the item view with the shortest freshness"
        " SLA (the realtime tier's load on the index refresher and the item mirror).",
    )  # fmt: skip
    ap.add_argument("--bootstrap", default=Settings.from_env().kafka_bootstrap)
    ap.add_argument("--no-feedback", action="store_true", help="Impressions not sent to Kafka.")
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument(
        "--quality-users", type=int, default=0,
        help="Before the timed levels, ask each variant for these users' top k once (no impressions logged)"
        " and score the answers with the synthetic world's planted signal: the mean true logit of the k"
        " items, against the catalog's best k (the ceiling) and the first variant's overlap@k.",
    )  # fmt: skip
    ap.add_argument(
        "--out", type=Path, default=None, help="Default: bench/results/bench_recommend_<items>.json"
    )
    args = ap.parse_args()
    try:
        args.rate_list = loadgen.parse_rates(args.rates) if args.rates is not None else []
    except ValueError as e:
        ap.error(str(e))
    if args.concurrency is None:
        args.concurrency = "" if args.rates is not None else "1,2,4,8"
    return args


def open_loop_curve(
    args: argparse.Namespace, port: int, pid: int, bodies: list[bytes], label: str
) -> dict[str, Any]:
    """Run the open-loop sweep of one endpoint (``args.rate_list``) with the service's CPU per request."""

    def server_cpu() -> Any:
        before, load_before = cpu_seconds(pid), os.getloadavg()[0]

        def finish(result: loadgen.LoadResult) -> dict[str, Any]:
            after = cpu_seconds(pid)
            n = result.answers_total  # every answer of the run, warm-up and drain included: the CPU's too
            return {
                "server_cpu_ms_per_request": round((after - before) * 1000.0 / n, 3)
                if n and before is not None and after is not None
                else None,
                "load_avg_1m": round((load_before + os.getloadavg()[0]) / 2.0, 2),
            }

        return finish

    async def at(rate: float) -> loadgen.LoadResult:
        return await loadgen.open_loop(
            port, bodies, rate, args.seconds, warmup=args.warmup, arrivals=args.arrivals, seed=args.seed,
            max_connections=args.max_connections, lag_bound_ms=args.lag_bound_ms,
        )  # fmt: skip

    curve = asyncio.run(
        loadgen.sweep(args.rate_list, at, p99_bound_ms=args.saturation_p99_ms, probe=server_cpu)
    )
    print(f"{label} open loop ({args.arrivals} arrivals, {args.seconds:g} s a rate):", flush=True)
    print(loadgen.table(curve, [("server CPU ms/req", "server_cpu_ms_per_request")]), flush=True)
    return curve


VARIANTS: dict[str, tuple[list[str], dict[str, Any], dict[str, str]]] = {
    "current": ([], {}, {}),
    "base": ([], {}, {}),
    "kafka-python": ([], {}, {"HEADWATER_FEEDBACK_CLIENT": "kafka-python"}),
    "no-kafka": (["--no-feedback"], {}, {}),
    "scan-refresh": ([], {"funnel": {"index_full_scan_s": 30.0}}, {}),
    "switch5": ([], {"gil_switch_interval_ms": 5.0}, {}),
    "switch02": ([], {"gil_switch_interval_ms": 0.2}, {}),
    "torch": ([], {}, {"HEADWATER_RANKER_RUNTIME": "torch"}),
    "retrieve200": ([], {"funnel": {"retrieve_n": 200}}, {}),
    "retrieve300": ([], {"funnel": {"retrieve_n": 300}}, {}),
    "no-mirror": ([], {"funnel": {"item_mirror_sla_share": None}}, {}),
    "no-feed": ([], {"funnel": {"index_feed_s": None}}, {}),
    "io1": ([], {"io_threads": 1}, {}),
    "io2": ([], {"io_threads": 2}, {}),
    "restart": ([], {}, {}),
    "feed05": ([], {"funnel": {"index_feed_s": 0.5}}, {}),
    "feed2": ([], {"funnel": {"index_feed_s": 2.0}}, {}),
}
"""Service variants run on the same data: extra ``headwater serve`` options, a serving config (YAML) and
environment. ``base`` is another checkout of the code (``--base``: a folder holding a ``headwater``
package of symlinks to that checkout's folders, put first on PYTHONPATH), the levers' "before";
``kafka-python`` the impressions producer's previous client; ``no-kafka`` what Kafka still costs;
``scan-refresh`` the refresher of the previous round (a SCAN of the whole catalog's write times every 30
s instead of the change-log test); ``switch5`` the interpreter's default thread switch interval (5 ms)
instead of the service's 1 ms, ``switch02`` 0.2 ms (each usearch search, and each item a usearch add,
waits up to one interval for the GIL while the event loop runs Python); ``torch`` the DCN on torch
instead of ONNX Runtime (the user's share computed once either way); ``retrieve200`` and ``retrieve300``
200 and 300 retrieved candidates instead of 500 (``--quality-users`` says what that costs in quality);
``no-mirror`` every item view read from Redis per request (through the item cache) instead of the index
refresher's in-memory rows; ``no-feed`` the refresher without its change-feed reads (only the 30-s
freshness-log look and the full refresh); ``io1`` and ``io2`` one and two I/O threads instead of 4 (what
the hops to the pool cost in hand-offs); ``restart`` the current service started again after another
variant: it loads the item index that one saved at stop (``serving/retrieval/snapshot.py``) instead of
building it from Redis, so its ``service_start_s`` is a restart's; ``feed05`` the change feeds read
every 0.5 s instead of 2 s (the in-memory item rows then stay within the 1-s bound of the 10-s realtime
item view, which is otherwise read from Redis whenever they are over 1 s old); ``feed2`` the previous
default, 2 s (with ``--item-writes``: what the shorter period costs under writes)."""


class PrivateRedis:
    """A redis-server of the benchmark's own on a free port, no persistence; its folder goes at stop."""

    def __init__(self, folder: Path) -> None:
        self.port = free_port()
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        cmd = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
               "--appendonly", "no", "--dir", str(folder), "--protected-mode", "no"]  # fmt: skip
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.url = f"redis://127.0.0.1:{self.port}/0"
        import redis

        deadline = time.monotonic() + 30
        while True:
            try:
                redis.Redis.from_url(self.url).ping()
                break
            except redis.RedisError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise SystemExit(f"private redis-server on port {self.port} did not start") from None
                time.sleep(0.1)

    def stop(self) -> None:
        """Stop the server and delete its folder."""
        self.proc.terminate()
        self.proc.wait(30)
        shutil.rmtree(self.folder, ignore_errors=True)


def wait_saved(port: int, proc: subprocess.Popen[bytes], timeout_s: float = 600.0) -> dict[str, Any]:
    """Wait until the service saved its index snapshot (not measured: it holds the index lock a moment)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        snap = wait_healthy(port, proc).get("index_snapshot") or {}
        if snap.get("saved_version") or snap.get("save_failures"):
            return dict(snap)
        time.sleep(1.0)
    return {}


def hold_until(hhmm: str, pids: list[int]) -> None:
    """Sleep until ``hhmm`` UTC today (at once if past), then set nice 0 on every thread of ``pids``.

    Linux keeps a nice value per thread: the service's I/O, model and refresh threads are set one by
    one. Lowering a nice value needs root (CAP_SYS_NICE); without it the processes stay as they are.
    """
    now = datetime.datetime.now(datetime.UTC)
    hour, minute = (int(x) for x in hhmm.split(":"))
    at = now.replace(hour=hour, minute=minute, second=0, microsecond=0)
    wait = (at - now).total_seconds()
    if wait > 0:
        print(f"holding {wait:.0f} s until {hhmm} UTC before measuring", flush=True)
        time.sleep(wait)
    changed = 0
    for pid in pids:
        for task in Path(f"/proc/{pid}/task").glob("*"):
            try:
                os.setpriority(os.PRIO_PROCESS, int(task.name), 0)
                changed += 1
            except OSError as exc:
                print(f"nice 0 for thread {task.name} of {pid} refused: {exc}", flush=True)
    print(f"nice 0 on {changed} threads of {len(pids)} processes; load {os.getloadavg()[0]:.2f}", flush=True)


class ItemWriter:
    """Writes ``rate`` random items a second to the item view with the shortest SLA, in 1-s batches.

    The load a realtime item view puts on the service: every write is named in the view's change feed,
    so the refresher re-reads, re-embeds and re-mirrors those items while requests are served.
    """

    def __init__(self, url: str, namespace: str, state_dir: Path, items: int, rate: int) -> None:
        registry = load_registry(state_dir, ServingConfig().popularity)
        side = registry.item
        j = min(range(len(side.layouts)), key=lambda k: side.freshness_s[k] if side.freshness_s else 0.0)
        self.layout, self.items, self.rate = side.layouts[j], items, rate
        self.reader = OnlineStoreReader.from_url(url, namespace=namespace, timeout_s=30.0)
        self.written = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="item-writer", daemon=True)

    def start(self) -> None:
        """Start writing (a daemon thread)."""
        self._thread.start()

    def _run(self) -> None:
        rng = np.random.default_rng(7)
        while not self._stop.wait(1.0):
            ids = [f"b-i{i:06d}" for i in rng.choice(self.items, self.rate, replace=False).tolist()]
            values = rng.gamma(2.0, 2.0, size=(self.rate, self.layout.dim)).astype(np.float32)
            self.reader.store.write_batch(self.layout, ids, values, now_ms())
            self.written += self.rate

    def stop(self) -> dict[str, Any]:
        """Stop writing; return what was written."""
        self._stop.set()
        self._thread.join(10.0)
        self.reader.close()
        return {"view": self.layout.view, "rows_per_s": self.rate, "written": self.written}


def probe_staleness(port: int, url: str, namespace: str, state_dir: Path, timeout_s: float) -> dict[str, Any]:
    """Write one item's row and time until the service's item mirror holds it (its version moves)."""
    config = ServingConfig()
    registry = load_registry(state_dir, config.popularity)
    side = registry.item
    j = max(range(len(side.layouts)), key=lambda k: side.freshness_s[k] if side.freshness_s else 0.0)
    layout = side.layouts[j]

    def mirror() -> dict[str, Any]:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10) as r:
            return dict(json.loads(r.read())["item_mirror"])

    before = mirror()
    reader = OnlineStoreReader.from_url(url, namespace=namespace, timeout_s=30.0)
    written = time.perf_counter()
    reader.store.write_batch(layout, ["b-i000000"], np.full((1, layout.dim), 1.5, np.float32), now_ms())
    reader.close()
    seen_s = None
    ages = [before["age_s"]]
    while time.perf_counter() - written < timeout_s:
        now = mirror()
        ages.append(now["age_s"])
        if now["version"] != before["version"]:
            seen_s = round(time.perf_counter() - written, 2)
            break
        time.sleep(0.2)
    return {"view": layout.view, "write_visible_after_s": seen_s, "timeout_s": timeout_s,
            "age_s_before": before["age_s"], "max_age_s_seen": max(a for a in ages if a is not None),
            "views_from_memory": before["views_from_memory"]}  # fmt: skip


def forget_seen(url: str, namespace: str) -> None:
    """Delete the funnel's seen sets of the benchmark's users."""
    import redis

    client = redis.Redis.from_url(url)
    keys = list(client.scan_iter(match=f"{namespace}:funnel:seen:*", count=1000))
    for start in range(0, len(keys), 1000):
        client.delete(*keys[start : start + 1000])
    client.close()


def idle_cpu(pid: int, seconds: float) -> dict[str, Any]:
    """Service CPU while no request comes: the background threads (index refresh, producers)."""
    before = cpu_seconds(pid)
    time.sleep(seconds)
    after = cpu_seconds(pid)
    used = (after - before) if before is not None and after is not None else None
    return {"seconds": seconds, "cpu_s": None if used is None else round(used, 3),
            "cores": None if used is None else round(used / seconds, 4),
            "load_avg_1m": round(os.getloadavg()[0], 2)}  # fmt: skip


def quality_answers(port: int, args: argparse.Namespace) -> dict[str, list[str]]:
    """Each of the first ``--quality-users`` users' top k, asked once, with no impression logged."""
    out: dict[str, list[str]] = {}
    for n in range(args.quality_users):
        user = f"b-u{n:06d}"
        body = orjson.dumps({"user_id": user, "k": args.k, "log_impressions": False, "deadline_ms": 3000})
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/recommend", body, {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            answer = orjson.loads(response.read())
        out[user] = [x["item_id"] for x in answer["items"]]
    return out


def quality_table(world: Any, results: list[dict[str, Any]], k: int) -> dict[str, Any]:
    """Score each variant's answers with the world's planted signal (the labels' true logit).

    The training world and this one are drawn with the same seed, so they share the planted ``taste``
    the models learned; the z-scores are this world's, as ``training_set`` computes them.
    """
    zu, zi = _zscore(world.users), _zscore(world.items)
    scale = np.sqrt(np.count_nonzero(world.taste))
    user_at = {u: j for j, u in enumerate(world.user_ids)}
    item_at = {i: j for j, i in enumerate(world.item_ids)}
    runs = [(r["variant"], r["quality_answers"]) for r in results if r.get("quality_answers")]
    if not runs:
        return {}
    first = runs[0][1]
    users = sorted(first)
    ceiling, catalog = [], []
    means: dict[str, list[float]] = {name: [] for name, _ in runs}
    overlap: dict[str, list[float]] = {name: [] for name, _ in runs}
    for u in users:
        true = (zu[user_at[u]] @ world.taste @ zi.T) / scale  # every item's true logit for u
        ceiling.append(float(np.sort(true)[-k:].mean()))
        catalog.append(float(true.mean()))
        for name, got in runs:
            if got.get(u):
                means[name].append(float(true[[item_at[i] for i in got[u]]].mean()))
            overlap[name].append(len(set(got.get(u, [])) & set(first[u])) / k)
    table: dict[str, Any] = {
        "users": len(users),
        "k": k,
        "ceiling_mean_true_logit": round(float(np.mean(ceiling)), 4),
        "catalog_mean_true_logit": round(float(np.mean(catalog)), 4),
    }
    for name, _ in runs:
        table[name] = {
            "mean_true_logit": round(float(np.mean(means[name])), 4),
            "overlap_at_k_with_first": round(float(np.mean(overlap[name])), 4),
        }
    return table


def run_variant(
    name: str, args: argparse.Namespace, work: Path, models: Path, state_dir: Path, redis_url: str,
    namespace: str, bodies: tuple[list[bytes], list[bytes]],
) -> dict[str, Any]:  # fmt: skip
    """Start ``headwater serve`` as the variant asks, measure every level, stop it."""
    extra, overrides, env = VARIANTS[name]
    if name == "base":
        if args.base is None:
            raise SystemExit("--variants base needs --base FOLDER (see VARIANTS)")
        env = {"PYTHONPATH": str(args.base)}
    config = ServingConfig.model_validate(overrides)
    forget_seen(redis_url, namespace)  # each variant starts with empty seen sets (same retrieval sizes)
    cfg_path = work / f"serving-{name}.yaml"
    cfg_path.write_text(json.dumps(overrides) + "\n", encoding="utf-8")  # JSON is YAML
    topic = f"hwbench-rec-{namespace[-6:]}-{name}"
    feedback = "--no-feedback" not in extra and not args.no_feedback and create_topic(args.bootstrap, topic)
    port = free_port()
    cmd = [HEADWATER, "serve", "--no-auth", "--port", str(port), "--model", str(models),
           "--redis-url", redis_url,
           "--namespace", namespace, "--state-dir", str(state_dir), "--log-level", "warning",
           "--config", str(cfg_path)]  # fmt: skip
    cmd += ["--bootstrap", args.bootstrap, "--feedback-topic", topic] if feedback else ["--no-feedback"]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1", **env})
    levels: list[dict[str, Any]] = []
    rank_levels: list[dict[str, Any]] = []
    profile: dict[str, Any] | None = None
    rec_curve: dict[str, Any] | None = None
    rank_curve: dict[str, Any] | None = None
    idle: dict[str, Any] | None = None
    probe: dict[str, Any] | None = None
    rec_bodies, rank_bodies = bodies
    try:
        health = wait_healthy(port, proc, timeout=7200.0)
        start_s = round(time.perf_counter() - t0, 1)
        snap = health.get("index_snapshot") or {}
        how = (
            f"index {snap['loaded_version']} loaded from its snapshot in {snap['load_s']} s, then refreshed"
            if snap.get("loaded_version")
            else "index built from Redis"
        )
        print(f"[{name}] service up in {start_s} s ({how})", flush=True)
        if snap and not snap.get("loaded_version"):  # a build is saved at the refresh thread's first look
            saved = wait_saved(port, proc)
            size = saved.get("save_bytes")
            print(f"[{name}] index saved in {saved.get('save_s')} s ({size} bytes)", flush=True)
        if args.hold_until:
            hold_until(args.hold_until, [os.getpid(), proc.pid, *getattr(args, "extra_pids", [])])
            args.hold_until = None  # the next variants run at once
        writer = None
        if args.item_writes > 0:
            writer = ItemWriter(redis_url, namespace, state_dir, args.items, args.item_writes)
            writer.start()
            print(f"[{name}] writing {args.item_writes} items/s to {writer.layout.view}", flush=True)
        answers = quality_answers(port, args) if args.quality_users > 0 else None
        runtime = health.get("ranker_runtime") or TORCH  # a service without the field predates ONNX Runtime
        print(f"[{name}] runs on {plan_for(health['device'], runtime).describe()}", flush=True)
        if accelerator_report(health["device"])["on_gpu"] is not None:
            print(f"[{name}] no GPU here; with one it would run {plan_for('cuda').describe()}", flush=True)
        concurrencies = [int(x) for x in args.concurrency.split(",") if x.strip()]
        for c in concurrencies:
            r = asyncio.run(recommend_level(port, proc.pid, rec_bodies, c, args.seconds, args.warmup))
            levels.append(r)
            stages = "  ".join(
                f"{s} {v['mean_ms']}ms/{v['candidates_mean']:g}" for s, v in r["stages"].items()
            )
            print(f"[{name}] recommend c={c:>2} {r['qps']:>6} qps p50 {r['p50_ms']} p99 {r['p99_ms']} ms"
                  f" cpu/req {r['server_cpu_ms_per_request']} ms (client {r['client_cpu_ms_per_request']})"
                  f" errors {r['errors']} load {r['load_avg_1m']}"
                  f" | {stages} | fallbacks {r['fallbacks']}", flush=True)  # fmt: skip
        if args.rate_list:
            rec_curve = open_loop_curve(args, port, proc.pid, rec_bodies, f"[{name}] /v1/recommend")
            if not args.no_rank:
                rank_curve = open_loop_curve(args, port, proc.pid, rank_bodies, f"[{name}] /v1/rank")
        if not args.no_rank:
            for c in concurrencies:
                r = asyncio.run(level(port, proc.pid, rank_bodies, c, args.seconds, args.warmup))
                rank_levels.append(r)
                print(f"[{name}] rank      c={c:>2} {r['qps']:>6} qps p50 {r['p50_ms']} p99 {r['p99_ms']} ms"
                      f" cpu/req {r['server_cpu_ms_per_request']} ms errors {r['errors']}"
                      f" load {r['load_avg_1m']}", flush=True)  # fmt: skip
        if args.probe_staleness > 0 and health.get("item_mirror"):
            probe = probe_staleness(port, redis_url, namespace, state_dir, args.probe_staleness)
            print(f"[{name}] staleness probe: {json.dumps(probe)}", flush=True)
        if args.idle > 0:
            idle = idle_cpu(proc.pid, args.idle)
            print(f"[{name}] idle {args.idle:g} s: {idle['cpu_s']} CPU-s ({idle['cores']} cores)", flush=True)
        if args.profile > 0 and name in args.profile_variants.split(","):
            profile = run_profile(args, port, proc.pid, rec_bodies, work, max(concurrencies, default=4), name)
        item_writes = writer.stop() if writer is not None else None
        health = wait_healthy(port, proc)
        if health.get("item_mirror"):
            print(f"[{name}] item mirror: {json.dumps(health['item_mirror'])}", flush=True)
    finally:
        proc.terminate()
        proc.wait(60)
        if feedback:
            delete_topics(args.bootstrap, [topic])
    return {
        "variant": name,
        "serve_options": extra,
        "env": env,
        "config": overrides,
        "funnel": config.funnel.model_dump(),
        "impressions_loop": {"kafka": feedback, "seen_set": True},
        "service_start_s": start_s,
        "device": health["device"],
        "accelerator": accelerator_report(health["device"], health.get("ranker_runtime") or TORCH),
        "ranker_runtime_failures": health.get("ranker_runtime_failures"),
        "retrieval_runtime": health.get("retrieval_runtime"),
        "retrieval_runtime_failures": health.get("retrieval_runtime_failures"),
        "item_mirror": health.get("item_mirror"),
        "index_snapshot": health.get("index_snapshot"),
        "item_writes": item_writes,
        "model_version": health["model_version"],
        "feedback": health["feedback"],
        "recommend": levels,
        "rank": rank_levels,
        "recommend_open_loop": rec_curve,
        "rank_open_loop": rank_curve,
        "quality_answers": answers,
        "staleness_probe": probe,
        "idle": idle,
        "profile": profile,
    }


def main() -> None:
    """Set up once, run each variant of the service on the same data, print and write the report."""
    args = parse_args()
    unknown = [v for v in args.variants.split(",") if v not in VARIANTS]
    if unknown:
        raise SystemExit(f"--variants: unknown {unknown}; known: {', '.join(VARIANTS)}")
    out_path = args.out or RESULTS / f"bench_recommend_{args.items}.json"
    config = ServingConfig()
    namespace = f"hwbench-rec-{uuid.uuid4().hex[:6]}"
    keep = args.work is not None
    work = args.work or Path(tempfile.mkdtemp(prefix="headwater-bench-recommend-"))
    work.mkdir(parents=True, exist_ok=True)
    state_dir, models = work / "state", work / "models"
    timings: dict[str, Any] = {}
    if not state_dir.exists():
        apply_registry(state_dir)
    registry = load_registry(state_dir, config.popularity)
    t0 = time.perf_counter()
    if not (models / "latest.json").exists():
        print(f"training the DCN, the two-tower model and the re-ranker for {registry.registry_version} ...",
              flush=True)  # fmt: skip
        train_models(models, registry, args.seed)
        timings["train_s"] = round(time.perf_counter() - t0, 1)
    else:
        print(f"reusing the models in {models}", flush=True)
    private = PrivateRedis(work / "redis") if args.redis_url is None else None
    redis_url = private.url if private is not None else args.redis_url
    args.extra_pids = [private.proc.pid] if private is not None else []
    results: list[dict[str, Any]] = []
    kept_world = None
    try:
        reader = OnlineStoreReader.from_url(redis_url, namespace=namespace, timeout_s=30.0)
        t0 = time.perf_counter()
        print(f"writing {args.users} users and {args.items} items under namespace {namespace}"
              f" ({'private redis ' + redis_url if private else redis_url}) ...", flush=True)  # fmt: skip
        world = make_world(
            registry, users=args.users, items=args.items, seed=args.seed, prefixes=("b-u", "b-i")
        )
        write_world(reader, registry, world, now_ms(), chunk=args.write_chunk)
        recent = RedisRecentItems(reader.store.client, namespace)
        recent.put_categories({item: f"c{j % args.categories:02d}" for j, item in enumerate(world.item_ids)})
        timings["write_s"] = round(time.perf_counter() - t0, 1)
        print(f"written in {timings['write_s']} s", flush=True)
        kept_world = world if args.quality_users > 0 else None
        del world
        rng = random.Random(args.seed)
        extra: dict[str, Any] = {} if args.deadline_ms is None else {"deadline_ms": args.deadline_ms}
        rec_bodies = [
            encode("/v1/recommend", {"user_id": f"b-u{rng.randrange(args.users):06d}", "k": args.k, **extra})
            for _ in range(512)
        ]
        items = [f"b-i{i:06d}" for i in range(args.items)]
        rank_bodies = [
            encode("/v1/rank", {"user_id": f"b-u{rng.randrange(args.users):06d}",
                                "candidates": rng.sample(items, args.candidates), "k": args.k, **extra})
            for _ in range(256)
        ]  # fmt: skip
        del items
        for name in args.variants.split(","):
            results.append(
                run_variant(
                    name, args, work, models, state_dir, redis_url, namespace, (rec_bodies, rank_bodies)
                )
            )
        reader.close()
    finally:
        if private is not None:
            private.stop()
        else:
            drop_namespace(redis_url, namespace)
        if not keep:
            shutil.rmtree(work, ignore_errors=True)
    quality = quality_table(kept_world, results, args.k) if args.quality_users > 0 and results else None
    if quality:
        print(
            f"quality of the answers (planted signal, {quality['users']} users): {json.dumps(quality)}",
            flush=True,
        )
    first = results[0] if results else {}
    result = {
        "benchmark": "recommend",
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "catalog_items": args.items,
        "users": args.users,
        "k": args.k,
        "rank_candidates": args.candidates,
        "deadline_ms": args.deadline_ms,
        "redis": "private redis-server" if private is not None else redis_url,
        "setup": timings,
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        # The first variant's figures at the top level (the shape of the previous round's JSON).
        "funnel": first.get("funnel"),
        "impressions_loop": first.get("impressions_loop"),
        "recommend": first.get("recommend"),
        "rank": first.get("rank"),
        "profile": first.get("profile"),
        "quality": quality,
        "variants": results,
    }
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {out_path}")


def run_profile(
    args: argparse.Namespace,
    port: int,
    pid: int,
    bodies: list[bytes],
    work: Path,
    concurrency: int,
    name: str = "current",
) -> dict[str, Any] | None:
    """py-spy the service under recommend load; returns the summary (None if py-spy cannot attach)."""
    raw = work / f"profile-{name}.txt"
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
    (RESULTS / f"bench_recommend_{args.items}_{name}_profile.txt").write_text(
        raw.read_text(), encoding="utf-8"
    )
    print(f"profile: {summary['samples']} samples (100/s, all threads); by thread:", flush=True)
    for name, share in summary["threads"]:
        print(f"  {share:7.2%}  {name}", flush=True)
    print("by bucket:", flush=True)
    for name, share in summary["buckets"]:
        print(f"  {share:7.2%}  {name}", flush=True)
    return summary


if __name__ == "__main__":
    main()
