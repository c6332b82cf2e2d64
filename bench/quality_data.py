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
import subprocess
import sys
import uuid
import zipfile
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
RECBOLE = "recbole==1.2.1"
"""The wheel that ships MovieLens 100k (``recbole/dataset_example/ml-100k``)."""
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
    from headwater.ranking.training_set import build_training_set
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


def movielens_files(cache: Path) -> tuple[Path, Path]:
    """Return ml-100k's ratings and films: from an installed ``recbole``, else from its wheel.

    Without the package, ``pip download --no-deps recbole==1.2.1`` fetches the wheel (a zip) into
    ``cache`` and the two files are extracted from it: recbole's dependencies (torch versions, ray,
    ...) are never installed.
    """
    try:
        inter = movielens_file()
        return inter, inter.with_suffix(".item")
    except FileNotFoundError:
        pass
    folder = cache / "ml-100k"
    inter, item = folder / "ml-100k.inter", folder / "ml-100k.item"
    if inter.is_file() and item.is_file():
        return inter, item
    wheels = cache / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(wheels), RECBOLE],
        check=True,
    )
    wheel = next(wheels.glob("recbole-*.whl"))
    folder.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as archive:
        for target in (inter, item):
            target.write_bytes(archive.read(f"recbole/dataset_example/ml-100k/{target.name}"))
    return inter, item


def movielens_stream_set(cache: Path) -> tuple[Any, dict[str, Any]]:
    """MovieLens 100k as a Python point-in-time training set, through the import path's checks.

    All 100,000 ratings (:func:`headwater.ranking.quality_sets.movielens_rows`), written as a file
    of the ``events`` source and read back by ``events produce --from``'s reader, its ``to-now``
    time shift (the newest rating lands on :data:`ML_END`) and the source's row checker. The films'
    first genre is their category. No display position exists (a slate is 10 ratings in the order
    entered): the set has none, so the ranker learns no position bias on it.
    """
    from dataclasses import replace

    from headwater.ranking.quality_sets import events_source, events_training_set, import_rows, movielens_rows

    inter, item = movielens_files(cache)
    rows = movielens_rows(inter, item)
    end_ms = int(datetime(ML_END.year, ML_END.month, ML_END.day, 23, 0, tzinfo=UTC).timestamp() * 1000)
    imported = import_rows(rows, cache / "movielens-import", events_source(FEATURES), "to-now", end_ms)
    events = sorted(imported.events, key=lambda e: e["event_time"])
    ts = events_training_set(events, name="movielens-100k")
    info = {
        "file": str(inter),
        "ratings": sum(r["event_type"] == "impression" for r in rows),
        "rows_imported": len(imported.events),
        "rejected": imported.rejected,
        "time_shift_days": round(imported.shift_ms / 86_400_000, 1),
    }
    return replace(ts, position=None), info


def stream_set(events: int, seed: int, users: int = 2000, items: int = 1000) -> Any:
    """Return the generator's stream as a Python point-in-time set (see ranking/quality_sets.py)."""
    from headwater.ranking.quality_sets import generator_set

    return generator_set(events, seed, users, items)
