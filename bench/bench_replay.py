"""Record a session of the ranking service, then replay it at 1x and faster.

One command: ``.venv/bin/python bench/bench_replay.py``. It

1. applies ``features/`` to a temporary state folder, trains a small model and writes vectors of
   ``--users`` users and ``--items`` items into Redis under a namespace of its own (as
   ``bench_serve.py`` does; removed at the end);
2. starts ``headwater serve`` with recording on (every request) and a two-arm experiment
   (control: the DCN; ``linear``: the chain starts at the linear model), impressions to a topic
   of its own;
3. plays a demo session against it: requests with Poisson arrivals at ``--rate`` per second for
   ``--seconds``, each user ranking ``--candidates`` items (k 20), a click on one answer in ten:
   the service records them;
4. replays the recording with ``headwater replay``'s code at each ``--speeds`` (1x = the recorded
   pacing) and reports latency p50/p95/p99, errors, fallbacks, the changed share and how many
   sends fell behind schedule, with the machine's load;
5. writes ``bench/results/replay.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_serve import (
    HEADWATER,
    ROOT,
    apply_registry,
    create_topic,
    delete_topics,
    drop_namespace,
    free_port,
    train_model,
    wait_healthy,
    write_features,
)

from headwater.pipelines.settings import Settings
from headwater.ranking.features import load_registry
from headwater.serving.config import DEFAULT_POPULARITY
from headwater.serving.recording import read_records
from headwater.serving.replay import replay
from headwater.serving.store import OnlineStoreReader

RESULTS = ROOT / "bench" / "results" / "replay.json"
K = 20


def parse_args() -> argparse.Namespace:
    """Command-line options."""
    settings = Settings.from_env()
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rate", type=float, default=20.0, help="Requests per second of the recorded session.")
    p.add_argument("--seconds", type=float, default=30.0, help="Length of the recorded session.")
    p.add_argument("--speeds", default="1,2,4", help="Replay speeds, comma-separated.")
    p.add_argument("--users", type=int, default=2_000)
    p.add_argument("--items", type=int, default=2_000)
    p.add_argument("--candidates", type=int, default=200)
    p.add_argument("--seed", type=int, default=11)
    p.add_argument("--redis-url", default=settings.redis_url)
    p.add_argument("--bootstrap", default=settings.kafka_bootstrap)
    p.add_argument("--out", type=Path, default=RESULTS)
    return p.parse_args()


async def play_session(url: str, args: argparse.Namespace) -> dict[str, Any]:
    """Send the demo session (open loop, Poisson arrivals); return what was sent and answered."""
    rng = random.Random(args.seed)
    items = [f"b-i{i:06d}" for i in range(args.items)]
    sent = answered = clicks = 0
    tasks: list[asyncio.Task[None]] = []

    async def one(client: httpx.AsyncClient, body: dict[str, Any], click: bool) -> None:
        nonlocal answered, clicks
        r = await client.post(f"{url}/v1/rank", json=body)
        if r.status_code != 200:
            return
        answered += 1
        if click:
            answer = r.json()
            item = answer["items"][0]["item_id"]
            feedback = {"user_id": body["user_id"], "item_id": item, "event_type": "click",
                        "request_id": answer["request_id"], "position": 1}  # fmt: skip
            if (await client.post(f"{url}/v1/feedback", json=feedback)).status_code == 202:
                clicks += 1

    async with httpx.AsyncClient(timeout=10.0) as client:
        loop = asyncio.get_running_loop()
        start = loop.time()
        due = 0.0
        while due < args.seconds:
            due += rng.expovariate(args.rate)
            await asyncio.sleep(max(0.0, start + due - loop.time()))
            user = f"b-u{rng.randrange(args.users):06d}"
            body = {"user_id": user, "candidates": rng.sample(items, args.candidates), "k": K,
                    "session_id": f"{user}-{int(due)}"}  # fmt: skip
            tasks.append(asyncio.create_task(one(client, body, rng.random() < 0.1)))
            sent += 1
        await asyncio.gather(*tasks)
    return {"sent": sent, "answered": answered, "clicks": clicks}


def main() -> None:
    """Set up, record the session, replay it at each speed, print and write the report."""
    args = parse_args()
    namespace = f"hwbench-replay-{uuid.uuid4().hex[:6]}"
    work = Path(tempfile.mkdtemp(prefix="headwater-bench-replay-"))
    state_dir = work / "state"
    apply_registry(state_dir)
    registry = load_registry(state_dir, DEFAULT_POPULARITY)
    print(f"training a small model for registry {registry.registry_version} ...", flush=True)
    train_model(work / "models", registry, args.seed)
    reader = OnlineStoreReader.from_url(args.redis_url, namespace=namespace, timeout_s=5.0)
    write_features(reader, registry, args.users, args.items, args.seed)
    recording = work / "recordings" / "requests.jsonl"
    config = {
        "experiment": {"name": "bench", "arms": [{"name": "control", "weight": 80},
                                                 {"name": "linear", "weight": 20, "start_at": "linear"}]},
        "recording": {"enabled": True, "path": str(recording), "sample_rate": 1.0},
    }  # fmt: skip
    (work / "serving.yaml").write_text(json.dumps(config))
    topic = f"hwbench-replay-{namespace[-6:]}"
    feedback = create_topic(args.bootstrap, topic)
    port = free_port()
    cmd = [HEADWATER, "serve", "--no-auth", "--port", str(port), "--model", str(work / "models"),
           "--redis-url", args.redis_url, "--namespace", namespace, "--state-dir", str(state_dir),
           "--config", str(work / "serving.yaml"), "--log-level", "warning"]  # fmt: skip
    cmd += ["--bootstrap", args.bootstrap, "--feedback-topic", topic] if feedback else ["--no-feedback"]
    proc = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    url = f"http://127.0.0.1:{port}"
    try:
        health = wait_healthy(port, proc)
        load_before = os.getloadavg()[0]
        print(f"recording a {args.seconds:g} s session at {args.rate:g} requests/s ...", flush=True)
        session = asyncio.run(play_session(url, args))
        time.sleep(1.0)  # the recorder's thread writes the last lines
        records = read_records([recording])
        print(f"session: {session}; {len(records)} requests recorded ({recording.stat().st_size} bytes)")
        runs = []
        for speed in (float(s) for s in args.speeds.split(",")):
            before = os.getloadavg()[0]
            result = asyncio.run(replay(records, url, speed))
            row = {**result.as_dict(), "load_avg_1m": round((before + os.getloadavg()[0]) / 2.0, 2)}
            runs.append(row)
            print(f"--- {speed:g}x (load {row['load_avg_1m']})\n{result.text()}", flush=True)
    finally:
        proc.terminate()
        proc.wait(20)
        drop_namespace(args.redis_url, namespace)
        reader.close()
        if feedback:
            delete_topics(args.bootstrap, [topic])
    report = {
        "benchmark": "replay",
        "command": "python bench/bench_replay.py " + " ".join(sys.argv[1:]),
        "device": health.get("device"),
        "session": {
            **session,
            "rate_per_s": args.rate,
            "seconds": args.seconds,
            "candidates": args.candidates,
            "k": K,
            "recorded": len(records),
            "load_avg_1m": round(load_before, 2),
        },
        "replays": runs,
        "cpus": os.cpu_count(),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
