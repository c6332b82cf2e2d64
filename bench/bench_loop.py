"""The feedback loop, end to end: click -> Kafka -> realtime tier -> Redis -> a changed ranking.

One command: ``.venv/bin/python bench/bench_loop.py`` (``--quick`` for a short smoke run). For
each out-of-orderness in ``--ooo`` (default: the registry's 5 s, then 1 s) it

1. copies ``features/`` with the source's ``max_out_of_orderness`` set to that value and applies
   it to a state directory of its own (plans only), so the realtime job and the service share
   one registry version;
2. creates a topic (and its DLQ) of its own, and a Redis key namespace of its own;
3. trains a small model bound to that registry (synthetic training set in the
   ``headwater training-set`` format) and writes the nearline/offline user and item vectors of
   the benchmark's users and candidates (as if those tiers had materialized them);
4. starts light background traffic (``headwater events produce --rate R``), the realtime tier
   (``headwater run realtime``) and the ranking service (``headwater serve``, impressions and
   feedback to the benchmark's topic), and waits until the job writes (start-up: 20-60 s);
5. runs ``--workers`` click loops, each over its own users: rank for a user (the baseline),
   post a click on the top item (``POST /v1/feedback``), then rank again every ``--poll-ms``
   until the answer reflects the click: the user's ``user_session_realtime`` value is for a
   window boundary past the click (``user_feature_event_ms``) and the scores differ from the
   baseline's. Click-to-changed-ranking latency = that answer's arrival - the click's post;
6. stops everything it started, deletes its topics and keys, and writes p50/p99/max per
   out-of-orderness with the load average to ``bench/results/loop.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import redis

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_serve import (
    HEADWATER,
    ROOT,
    create_topic,
    delete_topics,
    drop_namespace,
    free_port,
    train_model,
    wait_healthy,
)

from headwater.pipelines.settings import Settings
from headwater.ranking.features import BoundRegistry, load_registry
from headwater.ranking.synthetic import make_world, write_world
from headwater.serving.store import OnlineStoreReader, now_ms

RESULTS = ROOT / "bench" / "results" / "loop.json"
VIEW = "user_session_realtime"
POPULARITY = "item_popularity_offline.item_clicks_1d"
TARGET_P99_S = 3.0


def parse_args() -> argparse.Namespace:
    """Command-line options."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ooo", default="5,1", help="Out-of-orderness values (seconds) to run, in order.")
    ap.add_argument("--clicks", type=int, default=60, help="Clicks measured per out-of-orderness.")
    ap.add_argument("--workers", type=int, default=4, help="Concurrent click loops (each has its own users).")
    ap.add_argument("--users-per-worker", type=int, default=3)
    ap.add_argument("--candidates", type=int, default=50)
    ap.add_argument("--rate", type=float, default=50.0, help="Background events per second.")
    ap.add_argument("--poll-ms", type=float, default=100.0)
    ap.add_argument("--click-timeout", type=float, default=60.0, help="Give a click up after this long.")
    ap.add_argument("--start-timeout", type=float, default=300.0, help="Wait this long for the job's writes.")
    ap.add_argument("--model", type=Path, default=None, help="Model directory; default: train one.")
    ap.add_argument("--redis-url", default=Settings.from_env().redis_url)
    ap.add_argument("--bootstrap", default=Settings.from_env().kafka_bootstrap)
    ap.add_argument("--warmup-clicks", type=int, default=20, help="At most this many unmeasured clicks.")
    ap.add_argument("--quick", action="store_true", help="10 clicks, 1 s out-of-orderness only.")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    if args.quick:
        args.ooo, args.clicks = "1", 10
    return args


def registry_copy(work: Path, ooo_s: float) -> Path:
    """Apply ``features/`` with ``max_out_of_orderness: <ooo_s>s`` to ``work/state``; return the state dir."""
    repo = work / "features"
    shutil.copytree(ROOT / "features", repo)
    sources = repo / "sources.yaml"
    text, n = re.subn(
        r"(max_out_of_orderness:\s*)\S+", rf"\g<1>{ooo_s:g}s", sources.read_text(encoding="utf-8")
    )
    if n != 1:
        msg = f"{sources}: expected one max_out_of_orderness line, found {n}"
        raise SystemExit(msg)
    sources.write_text(text, encoding="utf-8")
    state = work / "state"
    cmd = [HEADWATER, "apply", str(repo), "--state-dir", str(state), "--no-feast"]
    subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    return state


def slide_ms(state: Path) -> int:
    """Return the pane slide of the watched view (its value's event time is a multiple of it)."""
    plan = json.loads((state / "plans" / "realtime.json").read_text(encoding="utf-8"))
    view = next(v for v in plan["views"] if v["name"] == VIEW)
    return int(min(f["slide_s"] for f in view["features"]) * 1000)


def start(cmd: list[str], log: Path) -> subprocess.Popen[bytes]:
    """Start a child process with its output in ``log``."""
    handle = log.open("wb")
    return subprocess.Popen(
        cmd, cwd=ROOT, stdout=handle, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"}
    )


def stop(proc: subprocess.Popen[bytes]) -> None:
    """Stop one child we started (terminate, then kill after 20 s)."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def wait_for_job(url: str, namespace: str, job: subprocess.Popen[bytes], timeout: float, log: Path) -> float:
    """Wait until the realtime job has written a value of the watched view; return the seconds waited."""
    client = redis.Redis.from_url(url)
    started = time.monotonic()
    try:
        while time.monotonic() - started < timeout:
            if job.poll() is not None:
                tail = log.read_text(errors="replace")[-3000:]
                msg = f"the realtime job exited with code {job.returncode} before writing:\n{tail}"
                raise SystemExit(msg)
            if next(client.scan_iter(match=f"{namespace}:{{{VIEW}}}:*", count=1000), None) is not None:
                return time.monotonic() - started
            time.sleep(1.0)
    finally:
        client.close()
    msg = f"the realtime job wrote nothing to {VIEW} within {timeout:g} s; see {log}"
    raise SystemExit(msg)


def scores(answer: dict[str, Any]) -> dict[str, float]:
    """Item -> score of one ranking answer."""
    return {x["item_id"]: x["score"] for x in answer["items"]}


async def click_loop(
    client: httpx.AsyncClient,
    users: list[str],
    candidates: list[str],
    clicks: int,
    slide: int,
    args: argparse.Namespace,
    out: list[dict[str, Any]],
) -> None:
    """Click, then poll the ranking until it reflects the click; ``clicks`` times over ``users``."""
    for n in range(clicks):
        user = users[n % len(users)]
        body = {
            "user_id": user,
            "candidates": candidates,
            "k": 10,
            "log_impressions": False,
            "deadline_ms": 2000,
        }
        # The ranking the user clicks in logs its impressions: feedback is accepted only for an item
        # served to that user (serving/served.py); the polls below log none.
        base = (await client.post("/v1/rank", json={**body, "log_impressions": True})).json()
        top = base["items"][0]["item_id"]
        posted = time.perf_counter()
        fb = await client.post(
            "/v1/feedback",
            json={"user_id": user, "item_id": top, "event_type": "click", "request_id": base["request_id"],
                  "position": 1},
        )  # fmt: skip
        fb.raise_for_status()
        boundary = (fb.json()["event_time_ms"] // slide + 1) * slide  # first value that counts the click
        record: dict[str, Any] = {"user": user, "boundary_ms": boundary, "fallback": base["fallback"]}
        while True:
            await asyncio.sleep(args.poll_ms / 1000.0)
            answer = (await client.post("/v1/rank", json=body)).json()
            waited = time.perf_counter() - posted
            seen = answer["user_feature_event_ms"].get(VIEW, 0)
            if seen >= boundary and "feature_s" not in record:
                record["feature_s"] = round(waited, 3)
            if seen >= boundary and scores(answer) != scores(base):
                record["latency_s"] = round(waited, 3)
                record["fallback_after"] = answer["fallback"]
                break
            if waited > args.click_timeout:
                record["timeout"] = True
                break
        out.append(record)


async def measure(
    port: int, world_users: list[str], candidates: list[str], slide: int, args: argparse.Namespace
) -> list[dict[str, Any]]:
    """Run the click loops; returns one record per click."""
    out: list[dict[str, Any]] = []
    per_worker = -(-args.clicks // args.workers)
    k = args.users_per_worker
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10.0) as client:
        # seed: one ranking per user with impressions, so each has realtime values before its first click
        for user in world_users:
            await client.post("/v1/rank", json={"user_id": user, "candidates": candidates, "k": 10})
        # warm-up: the job first works off what queued while it started; measure once it keeps up
        settled = args.ooo_now + 5.0
        for attempt in range(args.warmup_clicks):
            probe: list[dict[str, Any]] = []
            await click_loop(client, world_users[:1], candidates, 1, slide, args, probe)
            took = probe[0].get("latency_s")
            print(f"  warm-up click {attempt + 1}: {took} s", flush=True)
            if took is not None and took < settled:
                break
        await asyncio.gather(*[
            click_loop(client, world_users[w * k : (w + 1) * k], candidates, per_worker, slide, args, out)
            for w in range(args.workers)
        ])  # fmt: skip
    return out[: args.clicks] if len(out) > args.clicks else out


def summary(records: list[dict[str, Any]]) -> dict[str, Any]:
    """p50/p99/max of the click-to-changed-ranking latencies (and of the feature's arrival)."""
    lat = np.asarray([r["latency_s"] for r in records if "latency_s" in r])
    feat = np.asarray([r["feature_s"] for r in records if "feature_s" in r])

    def pct(x: np.ndarray[Any, Any], q: float) -> float | None:
        return round(float(np.percentile(x, q)), 3) if len(x) else None

    return {
        "clicks": len(records),
        "changed": len(lat),
        "timeouts": sum(1 for r in records if r.get("timeout")),
        "p50_s": pct(lat, 50),
        "p99_s": pct(lat, 99),
        "max_s": round(float(lat.max()), 3) if len(lat) else None,
        "mean_s": round(float(lat.mean()), 3) if len(lat) else None,
        "feature_visible_p50_s": pct(feat, 50),
        "feature_visible_p99_s": pct(feat, 99),
    }


def run_one(ooo_s: float, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """One out-of-orderness end to end (steps 1-6 of the module docstring)."""
    tag = uuid.uuid4().hex[:6]
    run_dir = work / f"ooo-{ooo_s:g}"
    run_dir.mkdir()
    state = registry_copy(run_dir, ooo_s)  # Step 1
    registry: BoundRegistry = load_registry(state, POPULARITY)
    topic, namespace = f"hwbench-loop-{tag}", f"hwbench-loop-{tag}"
    model = args.model
    if model is None:  # Step 3
        model = work / "models"
        if not (model / "latest.json").exists():
            print("training a small model bound to the registry ...", flush=True)
            train_model(model, registry)
    users = args.workers * args.users_per_worker
    world = make_world(registry, users=users, items=args.candidates, seed=5, prefixes=(f"loop{tag}-u", "i"))
    port = free_port()
    with ExitStack() as stack:  # Step 4
        procs: list[subprocess.Popen[bytes]] = []
        # callbacks run last-registered first: stop the processes, then delete their topics and keys
        stack.callback(lambda: drop_namespace(args.redis_url, namespace))
        stack.callback(lambda: delete_topics(args.bootstrap, [topic, f"{topic}.dlq"]))
        stack.callback(lambda: [stop(p) for p in reversed(procs)])
        if not create_topic(args.bootstrap, topic, 2) or not create_topic(args.bootstrap, f"{topic}.dlq"):
            raise SystemExit("Kafka is needed: start it with `make services-up`")  # Step 2
        reader = OnlineStoreReader.from_url(args.redis_url, namespace=namespace, timeout_s=5.0)
        write_world(reader, registry, world, now_ms(), skip_tiers=("realtime",))
        reader.close()
        procs.append(start([
            HEADWATER, "events", "produce", "--topic", topic, "--bootstrap", args.bootstrap, "--rate",
            str(args.rate), "--duration", "7200", "--late-share", "0", "--out-of-order-share", "0",
            "--duplicate-share", "0", "--malformed-share", "0",
        ], run_dir / "produce.log"))  # fmt: skip
        job_log = run_dir / "realtime.log"
        began = time.monotonic()
        procs.append(start([
            HEADWATER, "run", "realtime", "--state-dir", str(state), "--source", "events", "--topic", topic,
            "--dlq-topic", f"{topic}.dlq", "--group-id", f"hwbench-loop-{tag}", "--namespace", namespace,
            "--checkpoint-dir", str(run_dir / "checkpoints"), "--no-restore",
        ], job_log))  # fmt: skip
        serve = start([
            HEADWATER, "serve", "--no-auth", "--port", str(port), "--model", str(model),
            "--state-dir", str(state),
            "--namespace", namespace, "--redis-url", args.redis_url, "--bootstrap", args.bootstrap,
            "--feedback-topic", topic, "--log-level", "warning",
        ], run_dir / "serve.log")  # fmt: skip
        procs.append(serve)
        health = wait_healthy(port, serve)
        print(f"[ooo {ooo_s:g} s] service up (model {health['model_version']}); waiting for the job ...",
              flush=True)  # fmt: skip
        waited = wait_for_job(args.redis_url, namespace, procs[1], args.start_timeout, job_log)
        job_start_s = round(time.monotonic() - began, 1)
        print(f"[ooo {ooo_s:g} s] job writing after {job_start_s} s; measuring {args.clicks} clicks ...",
              flush=True)  # fmt: skip
        args.ooo_now = ooo_s
        load_before = os.getloadavg()
        records = asyncio.run(measure(port, world.user_ids, world.item_ids, slide_ms(state), args))  # Step 5
        load_after = os.getloadavg()
        health = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5).read())
    result = {
        "max_out_of_orderness_s": ooo_s,
        **summary(records),
        "registry_version": registry.registry_version,
        "job_start_s": job_start_s,
        "job_first_write_wait_s": round(waited, 1),
        "background_rate": args.rate,
        "load_avg_1m": round((load_before[0] + load_after[0]) / 2.0, 2),
        "feedback": health.get("feedback"),
        "records": records,
    }
    print(
        f"[ooo {ooo_s:g} s] click -> changed ranking: p50 {result['p50_s']} s, p99 {result['p99_s']} s,"
        f" max {result['max_s']} s over {result['changed']}/{result['clicks']} clicks"
        f" (timeouts {result['timeouts']}); load {result['load_avg_1m']}",
        flush=True,
    )
    return result


def main() -> None:
    """Run each out-of-orderness, print and write the report."""
    args = parse_args()
    work = Path(tempfile.mkdtemp(prefix="headwater-bench-loop-"))
    runs = [run_one(float(x), args, work) for x in args.ooo.split(",")]
    report = {
        "benchmark": "loop",
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "metric": "click posted -> first /v1/rank answer whose user_session_realtime value counts the click"
        " and whose scores differ from the pre-click answer",
        "target_p99_s": TARGET_P99_S,
        "poll_ms": args.poll_ms,
        "workers": args.workers,
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "runs": runs,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {args.out} (work files in {work})")


if __name__ == "__main__":
    main()
