"""Online store benchmark: write rows/s, batched read latency, and Feast on the same data.

Run: ``.venv/bin/python bench/bench_store.py`` (Redis from ``HEADWATER_REDIS_URL`` or loopback;
the benchmark uses DB 14 and its own key namespace / Feast project, and deletes them at the end).
Prints a table and writes ``bench/results/store.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import redis

from headwater.pipelines.settings import Settings
from headwater.pipelines.store import OnlineStore, ViewLayout
from headwater.pipelines.store.feast_yaml import online_store_section
from headwater.pipelines.store.store import DEFAULT_CHUNK_ROWS

RESULTS = Path(__file__).resolve().parent / "results" / "store.json"
D = 32
FEATURES = tuple(f"f{i:02d}" for i in range(D))
T0 = 1_760_000_000_000


def percentiles(samples_s: list[float]) -> dict[str, float]:
    ms = np.array(samples_s) * 1000.0
    return {
        "p50_ms": float(np.percentile(ms, 50)),
        "p99_ms": float(np.percentile(ms, 99)),
        "mean_ms": float(ms.mean()),
        "iterations": len(ms),
    }


def timed(fn: Callable[[int], object], iterations: int, warmup: int) -> dict[str, float]:
    for i in range(warmup):
        fn(i)
    samples = []
    for i in range(iterations):
        start = time.perf_counter()
        fn(i)
        samples.append(time.perf_counter() - start)
    return percentiles(samples)


def bench_writes(store: OnlineStore, rows: int) -> dict[str, Any]:
    layout = ViewLayout(view="bench_items", entity="item", features=FEATURES, ttl_s=3600, version="bench")
    ids = [f"item-{i}" for i in range(rows)]
    values = np.random.default_rng(0).standard_normal((rows, D)).astype(np.float32)
    out: dict[str, Any] = {"rows": rows, "features": D, "chunk_rows": store.chunk_rows}
    for name, event_ms in (("new_keys", T0), ("overwrite_newer", T0 + 1), ("replay_unchanged", T0 + 1)):
        start = time.perf_counter()
        result = store.write_batch(layout, ids, values, np.full(rows, event_ms))
        elapsed = time.perf_counter() - start
        out[name] = {
            "rows_per_s": rows / elapsed,
            "seconds": elapsed,
            "written": result.written,
            "unchanged": result.unchanged,
            "stale": result.stale,
        }
    stale_start = time.perf_counter()
    stale = store.write_batch(layout, ids, values, np.full(rows, T0))
    out["stale_rejected"] = {"rows_per_s": rows / (time.perf_counter() - stale_start), "stale": stale.stale}
    return out


def feast_repo(root: Path, project: str, online_store: dict[str, Any], frame: Any) -> Any:
    """Build a Feast repo with one item view of 32 Float32 features over ``frame`` (written as parquet)."""
    import yaml
    from feast import Entity, FeatureStore, FeatureView, Field, FileSource, ValueType
    from feast.types import Float32

    root.mkdir(parents=True)
    frame.to_parquet(root / "items.parquet")
    config = {
        "project": project,
        "registry": str(root / "registry.db"),
        "provider": "local",
        "online_store": online_store,
        "offline_store": {"type": "file"},
        "entity_key_serialization_version": 3,
    }
    (root / "feature_store.yaml").write_text(yaml.safe_dump(config))
    item = Entity(name="item", join_keys=["item_id"], value_type=ValueType.STRING)
    source = FileSource(path=str(root / "items.parquet"), timestamp_field="event_timestamp")
    schema = [Field(name=f, dtype=Float32) for f in FEATURES]
    view = FeatureView(name="bench_items", entities=[item], schema=schema, source=source)
    fs = FeatureStore(repo_path=str(root))
    fs.apply([item, view])
    return fs


def bench_reads(store: OnlineStore, redis_url: str, args: argparse.Namespace) -> dict[str, Any]:
    import pandas as pd

    items = ViewLayout(view="bench_read_items", entity="item", features=FEATURES, ttl_s=3600, version="bench")
    users = ViewLayout(view="bench_read_users", entity="user", features=FEATURES, ttl_s=3600, version="bench")
    pool = [f"item-{i}" for i in range(args.pool)]
    values = np.random.default_rng(1).standard_normal((args.pool, D)).astype(np.float32)
    store.write_batch(items, pool, values, np.full(args.pool, T0))
    store.write_batch(users, ["user-1"], values[:1], [T0])
    rng = np.random.default_rng(2)
    samples = [[pool[j] for j in rng.choice(args.pool, args.candidates, replace=False)] for _ in range(64)]

    out: dict[str, Any] = {"candidates": args.candidates, "features": D, "pool": args.pool}
    out["headwater_user_plus_items"] = timed(
        lambda i: store.read_many([(users, ["user-1"]), (items, samples[i % 64])]), args.iterations, 100
    )
    out["headwater_items_only"] = timed(
        lambda i: store.read_batch(items, samples[i % 64]), args.iterations, 100
    )

    frame = pd.DataFrame({"item_id": pool, "event_timestamp": datetime.fromtimestamp(T0 / 1000, tz=UTC)})
    for j, name in enumerate(FEATURES):
        frame[name] = values[:, j]
    host_port, db = redis_url.split("://", 1)[1].rsplit("/", 1)
    with tempfile.TemporaryDirectory(prefix="hw-bench-feast-") as tmp:
        project = f"hwbench{uuid.uuid4().hex[:8]}"
        feast_store = {"type": "redis", "connection_string": f"{host_port},db={db}"}
        feast_redis = feast_repo(Path(tmp) / "redis", project, feast_store, frame)
        start = time.perf_counter()
        feast_redis.write_to_online_store("bench_items", frame)
        out["feast_write_to_online_store_rows_per_s"] = args.pool / (time.perf_counter() - start)
        refs = [f"bench_items:{f}" for f in FEATURES]
        rows = [[{"item_id": e} for e in s] for s in samples]
        check = feast_redis.get_online_features(features=refs, entity_rows=rows[0]).to_dict()
        direct = store.read_batch(items, samples[0]).values
        out["same_values"] = bool(
            np.array_equal(np.array([check[f] for f in FEATURES], np.float32).T, direct)
        )
        feast_call = lambda i: feast_redis.get_online_features(features=refs, entity_rows=rows[i % 64])  # noqa: E731
        out["feast_redis_get_online_features"] = timed(feast_call, args.feast_iterations, 5)
        plugin_store = online_store_section(redis_url, namespace=store.namespace)
        plugin = feast_repo(Path(tmp) / "plugin", project + "p", plugin_store, frame)
        plugin_call = lambda i: plugin.get_online_features(features=refs, entity_rows=rows[i % 64])  # noqa: E731
        out["feast_headwater_plugin_get_online_features"] = timed(plugin_call, args.feast_iterations, 5)
        feast_redis.teardown()
    ours, feast = out["headwater_user_plus_items"], out["feast_redis_get_online_features"]
    out["speedup_p50"] = feast["p50_ms"] / ours["p50_ms"]
    out["speedup_p99"] = feast["p99_ms"] / ours["p99_ms"]
    return out


def print_table(result: dict[str, Any]) -> None:
    w, r = result["write"], result["read"]
    n = r["candidates"]

    def row(label: str, value: str) -> None:
        print(f"{label:60} {value:>16}")

    print(f"\nonline store benchmark ({result['redis_url']}, {result['cpus']} CPUs)")
    row("metric", "value")
    for name in ("new_keys", "overwrite_newer", "replay_unchanged", "stale_rejected"):
        row(f"write {w['rows']} rows x {D} float32, {name} (rows/s)", f"{w[name]['rows_per_s']:,.0f}")
    for name, label in (
        ("headwater_user_plus_items", f"headwater read 1 user + {n} items"),
        ("headwater_items_only", f"headwater read {n} items"),
        ("feast_redis_get_online_features", f"Feast (redis store) get_online_features {n}"),
        ("feast_headwater_plugin_get_online_features", f"Feast (headwater plugin) get_online_features {n}"),
    ):
        s = r[name]
        row(f"{label}, p50/p99 ms (n={s['iterations']})", f"{s['p50_ms']:.2f} / {s['p99_ms']:.2f}")
    row("Feast write_to_online_store (rows/s)", f"{r['feast_write_to_online_store_rows_per_s']:,.0f}")
    row("speed-up vs Feast redis store, p50 / p99", f"{r['speedup_p50']:.0f}x / {r['speedup_p99']:.0f}x")
    row("Feast returned the same values as the direct read", str(r["same_values"]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--pool", type=int, default=5_000, help="items readable by both stores")
    parser.add_argument("--candidates", type=int, default=500)
    parser.add_argument("--iterations", type=int, default=2_000)
    parser.add_argument("--feast-iterations", type=int, default=60)
    parser.add_argument("--chunk-rows", type=int, default=DEFAULT_CHUNK_ROWS)
    args = parser.parse_args()
    os.environ.setdefault("FEAST_USAGE", "False")
    base = Settings.from_env().redis_url.rsplit("/", 1)[0]
    redis_url = os.environ.get("HEADWATER_BENCH_REDIS_URL", f"{base}/14")
    client = redis.Redis.from_url(redis_url)
    namespace = f"hwbench-{uuid.uuid4().hex[:8]}"
    store = OnlineStore(client, namespace=namespace, chunk_rows=args.chunk_rows)
    try:
        result = {
            "redis_url": redis_url,
            "redis_version": client.info("server")["redis_version"],
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "measured_at": datetime.now(tz=UTC).isoformat(timespec="seconds"),
            "write": bench_writes(store, args.rows),
            "read": bench_reads(store, redis_url, args),
        }
    finally:
        for view in ("bench_items", "bench_read_items", "bench_read_users"):
            store.delete_view(view)
    print_table(result)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwrote {RESULTS}")


if __name__ == "__main__":
    main()
