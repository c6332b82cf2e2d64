"""Training sets for bench/bench_quality.py, built by the real offline path (import, views, labels).

Two data sets:

- ``synthetic``: the behaviour generator's events over ``days`` days, imported into the ``events``
  source's bronze table through :func:`~headwater.pipelines.offline.history.import_history` (the
  source import path of ``headwater events import``); every view of the registry computed by the
  offline job (streaming views as of each label's time); impressions labelled by clicks; the
  generator's truth (``EventGenerator(record_truth=True)``) joined on (user, item, event time) as
  the ``oracle`` and ``oracle_relevance`` columns.
- ``movielens``: MovieLens 100k (GroupLens; 100,000 ratings of 1,682 films by 943 users, 1997-98),
  the copy the ``recbole`` wheel ships (``recbole/dataset_example/ml-100k/ml-100k.inter``; read as a
  file, the package is never imported), its last :data:`ML_WEEKS` weeks. Each rating becomes an
  impression of the film in a session (a user's ratings within :data:`ML_SESSION_GAP_S` of each
  other, the order they were entered, at most :data:`ML_SLATE` per slate), followed by a click
  when the rating is >= 4; times are shifted so that the last rating falls on :data:`ML_END`
  (the source's ``min_event_time`` rule rejects 1998), gaps kept.

Each build is cached under ``--cache`` by its parameters (Spark on a shared 2-core machine takes
minutes).
"""

from __future__ import annotations

import importlib.util
import json
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

FEATURES = Path(__file__).resolve().parents[1] / "features"
SYNTH_START = date(2026, 1, 1)
ML_END = date(2026, 1, 31)
ML_SESSION_GAP_S = 1_800
"""A user's ratings less than 30 minutes apart are one session (one slate per 10 ratings)."""
ML_SLATE = 10
ML_WEEKS = 7
"""The last 7 weeks of ratings (about 21,000): the first week feeds the 7-day views, the other six are
labelled (the whole 7 months through Spark's as-of joins take hours on this 2-core machine)."""


@dataclass(frozen=True)
class Built:
    """A training set on disk and what it holds."""

    path: Path
    rows: int
    positives: int
    seconds: float
    info: dict[str, Any]


@contextmanager
def _world(tmp: Path) -> Iterator[tuple[Any, Any, Any, Any]]:
    """(spark, plans, registry hash, ids) for one build; the Redis dictionary namespace is removed after."""
    from headwater.pipelines.offline.session import offline_session
    from headwater.pipelines.store import OnlineStore
    from headwater.pipelines.windows import RedisDictionary
    from headwater.registry.plans import build_plans, registry_hash
    from headwater.registry.validate import check_repo

    result = check_repo(FEATURES)
    reg_hash = registry_hash(result)
    plans = build_plans(result, reg_hash)
    namespace = f"hwbench-quality-{uuid.uuid4().hex[:8]}"
    store = OnlineStore.from_url("redis://127.0.0.1:6379/0", namespace=namespace)
    spark = offline_session("bench-quality")
    try:
        yield spark, plans, reg_hash, RedisDictionary(store.client, namespace).ids
    finally:
        spark.stop()
        for key in store.client.scan_iter(match=f"{namespace}:*"):
            store.client.delete(key)
        store.close()


def _build(
    tmp: Path, rows: Sequence[dict[str, Any]], first: date, last: date, label_from: date, out: Path
) -> tuple[int, int, dict[str, Any]]:
    """Import ``rows`` into the events source, compute every view, label days label_from..last, join."""
    from headwater.pipelines.offline.history import import_history
    from headwater.pipelines.offline.job import BronzeTables, read_bronze, run_view
    from headwater.pipelines.offline.labels import derive_labels
    from headwater.pipelines.offline.lake import days
    from headwater.pipelines.offline.training import build_training_set
    from headwater.registry.tiers import TIER_NAMES

    with _world(tmp) as (spark, plans, reg_hash, ids):
        lake = tmp / "lake"
        source = next(s for s in plans["offline"].sources if s.name == "events")
        imported = import_history(spark, lake, source, rows, reject_file=tmp / "rejects.jsonl")
        bronze = read_bronze(spark, lake, source)
        for view in plans["offline"].views:
            if view.source == source.name:
                run_view(spark, bronze, view, source, lake, days(first, last), zorder=False)
        labels = derive_labels(bronze, source, label_from, last)
        views = [v for t in TIER_NAMES for v in plans[t].views if v.source == source.name]
        built = build_training_set(
            spark,
            labels,
            views,
            lake,
            out,
            reg_hash,
            ids,
            BronzeTables(spark, lake, plans["offline"].sources),
        )
    info = {"imported": imported.landed, "rejected": imported.rejected, "registry": reg_hash[:12]}
    return built.rows, built.positives, info


def synthetic(cache: Path, events: int, days_: int, seed: int, users: int, items: int) -> Built:
    """Build the generator's stream over ``days_`` days from 2026-01-01 (labels from day 2 on, the oracle)."""
    from headwater.pipelines.events.generator import EventGenerator, GeneratorConfig, base_rate_for
    from headwater.pipelines.offline.lake import day_start_ms

    key = f"synthetic-e{events}-d{days_}-s{seed}-u{users}-i{items}"
    out = cache / f"{key}.parquet"
    meta = cache / f"{key}.json"
    if out.exists() and meta.exists():
        return Built(out, **json.loads(meta.read_text()))
    started = datetime.now(UTC)
    start_ms = day_start_ms(SYNTH_START)
    end_ms = start_ms + days_ * 86_400_000 - 60_000
    config = GeneratorConfig(seed=seed, users=users, items=items, start_ms=start_ms, even_gaps=True)
    from dataclasses import replace

    config = replace(config, rate=base_rate_for(config, events + 1, start_ms, end_ms))
    generator = EventGenerator(config, record_truth=True)
    rows = [dict(e.event) for e in generator.take(events) if e.event is not None]
    truth = generator.truth or []
    tmp = cache / f"{key}-work"
    last = SYNTH_START + timedelta(days=days_ - 1)
    n, positives, info = _build(tmp, rows, SYNTH_START, last, SYNTH_START + timedelta(days=1), out)
    _attach_truth(out, truth)
    info.update({"generator": {k: v for k, v in asdict(config).items()}, "events": events})
    seconds = (datetime.now(UTC) - started).total_seconds()
    meta.write_text(json.dumps({"rows": n, "positives": positives, "seconds": seconds, "info": info}))
    return Built(out, n, positives, seconds, info)


def _attach_truth(path: Path, truth: Sequence[Any]) -> None:
    """Add ``oracle`` (p_click) and ``oracle_relevance`` columns, joined on (user_id, item_id, event_time)."""
    table = pq.read_table(path)
    lookup = {(t.user_id, t.item_id, t.event_time): (t.p_click, t.relevance) for t in truth}
    keys = zip(
        table.column("user_id").to_pylist(),
        table.column("item_id").to_pylist(),
        table.column("event_time").to_pylist(),
        strict=True,
    )
    found = [lookup.get(k, (np.nan, np.nan)) for k in keys]
    table = table.append_column("oracle", pa.array([f[0] for f in found], pa.float64()))
    table = table.append_column("oracle_relevance", pa.array([f[1] for f in found], pa.float64()))
    pq.write_table(table, path)


def movielens_file() -> Path:
    """Return the ml-100k ratings the ``recbole`` wheel ships (found without importing the package)."""
    spec = importlib.util.find_spec("recbole")
    if spec is None or not spec.submodule_search_locations:
        msg = "MovieLens 100k comes from the recbole wheel: .venv/bin/pip install 'recbole==1.2.1' --no-deps"
        raise FileNotFoundError(msg)
    path = Path(next(iter(spec.submodule_search_locations))) / "dataset_example" / "ml-100k" / "ml-100k.inter"
    if not path.is_file():
        msg = f"{path}: not in this recbole install"
        raise FileNotFoundError(msg)
    return path


def movielens_events() -> tuple[list[dict[str, Any]], date, date]:
    """Behaviour events of the ml-100k ratings (see the module docstring) and their first and last day."""
    raw = np.loadtxt(movielens_file(), skiprows=1, dtype=np.int64)  # user item rating timestamp
    raw = raw[raw[:, 3] > raw[:, 3].max() - ML_WEEKS * 7 * 86_400]
    order = np.lexsort((raw[:, 1], raw[:, 3], raw[:, 0]))
    raw = raw[order]
    shift_ms = (
        int(datetime(ML_END.year, ML_END.month, ML_END.day, 23, 0, tzinfo=UTC).timestamp() * 1000)
        - int(raw[:, 3].max()) * 1000
    )
    rows: list[dict[str, Any]] = []
    session, position, last_user, last_t = "", 0, -1, -(10**12)
    for n, (user, item, rating, ts) in enumerate(raw.tolist()):
        t = ts * 1000 + shift_ms
        if user != last_user or ts - last_t > ML_SESSION_GAP_S or position == ML_SLATE:
            session, position = f"ml-{user}-{n}", 0
        position += 1
        last_user, last_t = user, ts
        base = {"user_id": f"mlu{user}", "item_id": f"mli{item}", "session_id": session, "device": "web",
                "category": None, "price": None, "dwell_ms": None, "query": None}  # fmt: skip
        rows.append(
            {
                **base,
                "event_id": f"ml-{n}-i",
                "event_type": "impression",
                "event_time": t,
                "position": position,
            }
        )
        if rating >= 4:
            rows.append(
                {
                    **base,
                    "event_id": f"ml-{n}-c",
                    "event_type": "click",
                    "event_time": t + 1,
                    "position": position,
                }
            )
    first = datetime.fromtimestamp(rows[0]["event_time"] / 1000, UTC).date()
    last = datetime.fromtimestamp(max(r["event_time"] for r in rows) / 1000, UTC).date()
    return rows, first, last


def movielens(cache: Path) -> Built:
    """ml-100k through the import path and the offline tier; labels from its 8th day on."""
    out = cache / f"movielens-100k-w{ML_WEEKS}.parquet"
    meta = cache / f"movielens-100k-w{ML_WEEKS}.json"
    if out.exists() and meta.exists():
        return Built(out, **json.loads(meta.read_text()))
    started = datetime.now(UTC)
    rows, first, last = movielens_events()
    n, positives, info = _build(
        cache / f"movielens-w{ML_WEEKS}-work", rows, first, last, first + timedelta(days=7), out
    )
    info.update(
        {"file": str(movielens_file()), "ratings": sum(r["event_type"] == "impression" for r in rows)}
    )
    seconds = (datetime.now(UTC) - started).total_seconds()
    meta.write_text(json.dumps({"rows": n, "positives": positives, "seconds": seconds, "info": info}))
    return Built(out, n, positives, seconds, info)


def stream_set(events: int, seed: int, users: int = 2000, items: int = 1000) -> Any:
    """Return a training set computed in Python from the generator's stream (no Spark), with the oracle.

    The fallback when the offline tier cannot run (a loaded machine): per impression, point-in-time
    features from the events before it, in one pass: item impressions, clicks and click rate so far;
    user clicks so far; and ``pair_affinity``, the share of the user's clicks so far in this item's
    category (what an on-demand user x category affinity feature gives). Slates: one page of a
    session (a new one at each position-1 impression). Impressions in the last 10% of the stream's
    time are left out (their clicks may not have been emitted yet).
    """
    from collections import defaultdict

    from headwater.pipelines.events.generator import EventGenerator, GeneratorConfig
    from headwater.serving.trainset import TrainingSet

    config = GeneratorConfig(seed=seed, users=users, items=items, duplicate_share=0.0, malformed_share=0.0)
    generator = EventGenerator(config, record_truth=True)
    stream = [e.event for e in generator.take(events) if e.event is not None and not e.late]
    clicked = {(e["session_id"], e["item_id"], e["position"]) for e in stream if e["event_type"] == "click"}
    truth = {t.event_id: t for t in generator.truth or []}
    cut = config.start_ms + 0.9 * (stream[-1]["event_time"] - config.start_ms)
    item_imp: dict[str, int] = defaultdict(int)
    item_clk: dict[str, int] = defaultdict(int)
    user_clk: dict[str, int] = defaultdict(int)
    user_cat: dict[tuple[str, str], int] = defaultdict(int)
    pages: dict[str, int] = defaultdict(int)
    slates: dict[tuple[str, int], int] = {}
    rows: list[tuple[Any, ...]] = []
    for e in stream:
        user, item, kind = e["user_id"], e["item_id"] or "", e["event_type"]
        if kind == "impression":
            if e["position"] == 1:
                pages[e["session_id"]] += 1
            t = truth.get(e["event_id"])
            if t is not None and e["event_time"] < cut:
                imp, clk, uc = item_imp[item], item_clk[item], user_clk[user]
                affinity = user_cat[(user, e["category"] or "")] / uc if uc else np.nan
                rows.append((
                    slates.setdefault((e["session_id"], pages[e["session_id"]]), len(slates)), user, item,
                    e["event_time"], float((e["session_id"], item, e["position"]) in clicked),
                    float(uc), float(imp), float(clk), clk / imp if imp else np.nan, affinity,
                    t.p_click, t.relevance,
                ))  # fmt: skip
            item_imp[item] += 1
        elif kind == "click":
            item_clk[item] += 1
            user_clk[user] += 1
            user_cat[(user, e["category"] or "")] += 1
    col = list(zip(*rows, strict=True))
    return TrainingSet(
        ("clicks_so_far",),
        ("item_impressions", "item_clicks", "item_ctr", "pair_affinity"),
        "stream",
        np.asarray([col[5]], np.float32).T,
        np.asarray(col[6:10], np.float32).T,
        np.asarray(col[4], np.float32),
        np.asarray(col[0], np.int64),
        np.asarray(col[3], np.int64),
        np.asarray(col[1]),
        np.asarray(col[2]),
        oracle={"oracle": np.asarray(col[10]), "oracle_relevance": np.asarray(col[11])},
    )
