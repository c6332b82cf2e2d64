"""Redis Cluster against a single Redis for the ranking read: 1 user + 500 items, in one run.

Run: ``.venv/bin/python bench/bench_store_cluster.py``. The benchmark starts a private Redis
Cluster (infra/redis-cluster.sh, 3 primaries + 3 replicas, its own ports and state folder) and
a private single redis-server, writes the same vectors to both (2 user views and 3 item views
of 32 slots, as the ranking service reads them), then times ``read_many`` of 1 user + 500 items,
alternating the two stores round by round so machine load hits both alike. Prints a table and
writes ``bench/results/store_cluster.json``; stops what it started.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import subprocess
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from headwater.pipelines.store import OnlineStore, ViewLayout

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "store_cluster.json"
D = 32
T0 = 1_760_000_000_000
USER_VIEWS = ("user_a", "user_b")
ITEM_VIEWS = ("item_a", "item_b", "item_c")


def free_base(start: int) -> int:
    """Return a base port whose 6 node ports and their cluster-bus ports (+10000) are free."""
    for base in range(start, start + 5000, 100):
        ports = [p + d for p in range(base, base + 6) for d in (0, 10000)]
        if all(socket.socket().connect_ex(("127.0.0.1", p)) != 0 for p in ports):
            return base
    msg = "no free port range for the private Redis Cluster"
    raise SystemExit(msg)


def layout(view: str) -> ViewLayout:
    entity = "user" if view.startswith("user") else "item"
    features = tuple(f"f{i:02d}" for i in range(D))
    return ViewLayout(view=view, entity=entity, features=features, ttl_s=3600, version="vbench")


def fill(store: OnlineStore, items: int) -> None:
    rng = np.random.default_rng(5)
    for view in USER_VIEWS:
        ids = [f"user-{i}" for i in range(100)]
        store.write_batch(layout(view), ids, rng.random((100, D), dtype=np.float32), T0)
    for view in ITEM_VIEWS:
        ids = [f"item-{i}" for i in range(items)]
        store.write_batch(layout(view), ids, rng.random((items, D), dtype=np.float32), T0)


def read_once(store: OnlineStore, rng: np.random.Generator, items: int, candidates: int) -> float:
    user = f"user-{rng.integers(100)}"
    picked = [f"item-{i}" for i in rng.choice(items, candidates, replace=False)]
    requests = [(layout(v), [user]) for v in USER_VIEWS] + [(layout(v), picked) for v in ITEM_VIEWS]
    start = time.perf_counter()
    results = store.read_many(requests)
    elapsed = time.perf_counter() - start
    if not all(r.found.all() for r in results):
        msg = "a read missed rows that were written: the benchmark's stores are not what it filled"
        raise SystemExit(msg)
    return elapsed


def figures(samples: list[float]) -> dict[str, float]:
    ms = np.array(samples) * 1000
    return {k: round(float(np.percentile(ms, q)), 3) for k, q in (("p50_ms", 50), ("p99_ms", 99))} | {
        "mean_ms": round(float(ms.mean()), 3),
        "reads": len(ms),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--items", type=int, default=20_000)
    parser.add_argument("--candidates", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=2_000)
    args = parser.parse_args()
    state = Path(tempfile.mkdtemp(prefix="headwater-bench-cluster-"))
    base = free_base(22000)
    env = {**os.environ, "HEADWATER_SERVICES_DIR": str(state), "HEADWATER_REDIS_CLUSTER_PORT": str(base)}
    single_port = free_base(base + 100)
    single_dir = state / "single"
    single_dir.mkdir()
    script = str(ROOT / "infra" / "redis-cluster.sh")
    subprocess.run(["bash", script, "start"], env=env, check=True)
    single = subprocess.Popen(
        ["redis-server", "--bind", "127.0.0.1", "--port", str(single_port), "--dir", str(single_dir),
         "--save", "", "--appendonly", "yes", "--appendfsync", "everysec"],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        time.sleep(1.0)
        stores = {
            "single": OnlineStore.from_url(f"redis://127.0.0.1:{single_port}/0", namespace="hwb"),
            "cluster": OnlineStore.from_url(f"redis-cluster://127.0.0.1:{base}", namespace="hwb"),
        }
        for store in stores.values():
            fill(store, args.items)
        rng = np.random.default_rng(9)
        samples: dict[str, list[float]] = {name: [] for name in stores}
        for _ in range(200):  # warm-up: connections, the cluster's slot map
            for store in stores.values():
                read_once(store, rng, args.items, args.candidates)
        for _ in range(args.rounds):
            for name, store in stores.items():
                samples[name].append(read_once(store, rng, args.items, args.candidates))
        cluster = stores["cluster"].client
        primaries = {cluster.get_node_from_key(f"{{{v}}}").name for v in USER_VIEWS + ITEM_VIEWS}
        report: dict[str, Any] = {
            "benchmark": "store_cluster",
            "when": datetime.now(UTC).isoformat(timespec="seconds"),
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
            "load_avg_1m_at_end": round(os.getloadavg()[0], 2),
            "read": (
                f"1 user ({len(USER_VIEWS)} views) + {args.candidates} items ({len(ITEM_VIEWS)} views),"
                f" {D} slots"
            ),
            "views_on_primaries": len(primaries),
            "single": figures(samples["single"]),
            "cluster": figures(samples["cluster"]),
        }
        for store in stores.values():
            store.close()
    finally:
        single.terminate()
        single.wait(30)
        subprocess.run(["bash", script, "wipe"], env=env, check=False)
    print(f"read of {report['read']}, views on {report['views_on_primaries']} cluster primaries")
    print(f"{'store':<9} {'p50 ms':>8} {'p99 ms':>8} {'mean ms':>8}")
    for name in ("single", "cluster"):
        f = report[name]
        print(f"{name:<9} {f['p50_ms']:>8.3f} {f['p99_ms']:>8.3f} {f['mean_ms']:>8.3f}")
    print(f"load average (1 min) at the end: {report['load_avg_1m_at_end']}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
