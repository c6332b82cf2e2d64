"""Calibrate the offline tier's cost constants: each example offline view alone in Spark, CPU measured.

The stream: the event generator (seed 17, 5,000 users, no late/duplicate/malformed events: landing
drops those before bronze) and a payments stream, each at two rates of event time (``--rates``,
events per day) over ``--days`` days, written to bronze Delta tables (``append_events``, what
landing writes). Then each offline example view is computed alone (``pipelines.offline.job.run_view``:
the daily values, the Delta write and the Z-order, one chunk per run, into a fresh lake) over each
stream, in one local Spark session (``offline_session``, 2 shuffle partitions: local runs have 2 cores).

How the tier's CPU is isolated: the CPU seconds (user + system, ``psutil``) of this process and all
its children (the Spark driver + executor JVM, PySpark's Python workers) over ``run_view``, less
nothing: the session is started (and warmed up by one view run, discarded) before. A view's daily
job costs ``fixed_s`` (planning, Delta commit, Z-order: paid once a run, whatever the events) plus
``us`` per event; the two rates give both per view. The fit (least squares over the views, negative
terms pinned at 0): ``event_us`` per event, ``agg_us`` per aggregation (one figure for every kind:
six views do not separate eight kinds) and ``fixed_cores`` = the median ``fixed_s`` / 86,400 (one run
a day). State: the feature table's bytes (the Delta table's live Parquet files) on the table model's
terms (rows, count entropy bits, real values, top_k entries, day files' columns: :func:`state_fit`).

Accuracy: each view at both rates, the estimate (CPU-h/day at the stream's events/day) vs the
measured CPU per day of events; the table's size vs the state estimate (entities x days written).

Usage: python bench/bench_calibrate_offline.py [--days 2] [--rates 40000,160000] [--no-write]
Writes registry/calibration/offline.json and bench/results/bench_calibrate.json (``tiers.offline``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from headwater.registry.calibration import AGG_KINDS, calibration_path, parse_calibration
from headwater.registry.cost import SECONDS_PER_DAY, estimate_footprint, estimate_view, view_shape
from headwater.registry.tiers import TIERS

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from bench_calibrate import machine  # noqa: E402

SEED = 17
USERS = 5_000
ACCOUNTS = 2_000
START_MS = 1_767_225_600_000  # 2026-01-01T00:00Z
PARTIAL = ROOT / "bench/results/bench_calibrate_offline_runs.json"
"""The runs so far, written after each view (``--refit`` fits from it: a long run that stopped)."""


def tree_cpu_s() -> float:
    """CPU seconds (user + system) of this process and every child (the Spark JVM, Python workers)."""
    me = psutil.Process()
    total = 0.0
    for p in [me, *me.children(recursive=True)]:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            continue
    return total


CHUNK = 250_000
"""Events generated and appended to bronze at a time (a million-event stream does not sit in memory)."""


def behaviour_events(per_day: float, days: int) -> Iterator[list[dict[str, Any]]]:
    """Yield behaviour events at ``per_day`` a day of event time for ``days`` days, ``CHUNK`` at a time."""
    from headwater.pipelines.events.generator import EventGenerator, GeneratorConfig

    config = GeneratorConfig(
        seed=SEED, start_ms=START_MS, rate=per_day / SECONDS_PER_DAY, users=USERS, late_share=0.0,
        out_of_order_share=0.0, duplicate_share=0.0, malformed_share=0.0,
    )  # fmt: skip
    out: list[dict[str, Any]] = []
    for em in EventGenerator(config).take(int(per_day * days)):
        if em.event is not None:
            out.append(dict(em.event))
        if len(out) >= CHUNK:
            yield out
            out = []
    if out:
        yield out


def payment_events(per_day: float, days: int) -> Iterator[list[dict[str, Any]]]:
    """Yield payments at ``per_day`` a day for ``days`` days (even gaps; ``occurred_at`` in micros)."""
    rng = random.Random(SEED)
    n = int(per_day * days)
    gap_us = SECONDS_PER_DAY * 1e6 / per_day
    statuses = ["authorized", "captured", "declined", "refunded"]
    for lo in range(0, n, CHUNK):
        yield [
            {
                "payment_id": f"p{i:08d}",
                "account_id": f"acct-{rng.randrange(ACCOUNTS):05d}",
                "merchant_id": f"m-{rng.randrange(200):03d}",
                "method": rng.choice(["card", "wallet", "bank_transfer"]),
                "status": rng.choices(statuses, weights=[20, 60, 15, 5])[0],
                "amount": round(rng.uniform(1, 500), 2),
                "currency": "EUR",
                "risk_score": round(rng.random(), 4),
                "occurred_at": int(START_MS * 1000 + i * gap_us),
            }
            for i in range(lo, min(n, lo + CHUNK))
        ]


def folder_bytes(path: Path) -> int:
    """Bytes of the files under ``path`` (a Delta table: Parquet files and its log)."""
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def data_bytes(spark: Any, path: Path) -> int:
    """Bytes of the live Parquet files of a Delta table (what it holds, without its log and old files)."""
    return int(spark.sql(f"DESCRIBE DETAIL delta.`{path}`").collect()[0]["sizeInBytes"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--days", type=int, default=2)
    ap.add_argument("--rates", default="40000,160000", help="events per day of the two streams (behaviour)")
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--refit", action="store_true", help=f"fit from {PARTIAL.name} (the runs so far)")
    ap.add_argument(
        "--measure-days",
        default="",
        help="compute each of these days (1-based, comma-separated) alone, each reading its view's "
        "window of bronze (the daily job); default: every day in one run",
    )
    ap.add_argument("--bronze", default="", help="keep (or reuse) the bronze tables in this folder")
    ap.add_argument("--gen-only", action="store_true", help="with --bronze: write the bronze tables, stop")
    ap.add_argument("--no-cache", action="store_true", help="read bronze from Delta each run (the job's way)")
    args = ap.parse_args()
    command = "python bench/bench_calibrate_offline.py " + " ".join(sys.argv[1:])
    rates = [float(r) for r in args.rates.split(",")]
    started, load0 = time.monotonic(), os.getloadavg()
    if args.refit:
        saved = json.loads(PARTIAL.read_text())
        from headwater.registry.validate import check_repo

        finish(
            saved["runs"],
            check_repo(ROOT / "features"),
            args,
            f"{saved['command']} (refit)",
            rates,
            load0,
            started,
        )
        return

    from headwater.pipelines.offline.bronze import append_events
    from headwater.pipelines.offline.compute import attach_window_ms
    from headwater.pipelines.offline.job import read_bronze, run_view
    from headwater.pipelines.offline.lake import bronze_path, day_of_ms, days, feature_path
    from headwater.pipelines.offline.session import offline_session
    from headwater.registry.plans import build_plans, registry_hash
    from headwater.registry.validate import check_repo

    example = check_repo(ROOT / "features")
    plan = build_plans(example, registry_hash(example))["offline"]
    sources = {s.name: s for s in plan.sources}
    tmp = Path(tempfile.mkdtemp(prefix="bench-cal-off-"))
    kept = Path(args.bronze) if args.bronze else tmp
    measure = [int(d) for d in args.measure_days.split(",") if d]
    spark = offline_session("calibrate-offline")
    spark.conf.set("spark.sql.shuffle.partitions", "2")
    runs: dict[str, Any] = {}
    try:
        bronze: dict[tuple[str, float], Any] = {}
        counts: dict[tuple[str, float], int] = {}
        per_day: dict[tuple[str, float], dict[Any, int]] = {}
        for rate in rates:
            for name, events in (
                ("events", behaviour_events(rate, args.days)),
                ("payments", payment_events(rate / 4, args.days)),
            ):
                lake = kept / f"bronze-{name}-{rate:g}-{args.days}d"
                if not (lake / "_done").is_file():
                    shutil.rmtree(lake, ignore_errors=True)
                    for chunk in events:
                        append_events(spark, sources[name], chunk, bronze_path(lake, name))
                    (lake / "_done").write_text("done\n")
                frame = read_bronze(spark, lake, sources[name])
                bronze[(name, rate)] = frame if args.no_cache else frame.cache()
                daily = {r["date"]: r["count"] for r in frame.groupBy("date").count().collect()}
                per_day[(name, rate)], counts[(name, rate)] = daily, sum(daily.values())
                print(f"bronze {name} @ {rate:g}/day: {counts[(name, rate)]} events "
                      f"{sorted((str(d), n) for d, n in daily.items())}", flush=True)  # fmt: skip
        if args.gen_only:
            return
        all_days = days(day_of_ms(START_MS), day_of_ms(START_MS + (args.days - 1) * SECONDS_PER_DAY * 1000))
        views = sorted(plan.views, key=lambda v: v.name)
        # warm-up: a session's first jobs pay class loading and JIT (last round the per-run cost fell
        # from 25 to 5 CPU s over the first views): every view once at the first rate, not measured
        for warm in views:
            run_view(spark, bronze[(warm.source, rates[0])], warm, sources[warm.source],
                     tmp / f"warm-{warm.name}", all_days[:1], chunk_days=1)  # fmt: skip
            print(f"  warm-up {warm.name}: done (cpu so far {tree_cpu_s():.0f} s)", flush=True)
        for view in views:
            row: dict[str, Any] = {"source": view.source, "runs": []}
            reach_days = -(-attach_window_ms(view) // (SECONDS_PER_DAY * 1000))
            for rate in rates:
                key = (view.source, rate)
                # each computed day alone (the daily job: it reads the view's whole window of bronze,
                # here what the bronze holds of it), or every day in one run
                for k in measure or [0]:
                    computed = [all_days[k - 1]] if k else list(all_days)
                    lo = computed[0] - timedelta(days=reach_days)
                    read = [d for d in all_days if lo < d <= computed[-1]]
                    lake = tmp / f"lake-{view.name}-{rate:g}-{k}"
                    cpu0, t0 = tree_cpu_s(), time.monotonic()
                    done = run_view(spark, bronze[key], view, sources[view.source], lake, computed,
                                    chunk_days=len(computed))  # fmt: skip
                    cpu = tree_cpu_s() - cpu0
                    table = feature_path(lake, view.name)
                    row["runs"].append({
                        "events_per_day": counts[key] / args.days, "events": counts[key],
                        "days": len(computed),
                        "computed_day": k, "read_days": len(read), "reach_days": reach_days,
                        "events_read": sum(per_day[key].get(d, 0) for d in read),
                        "cpu_s": round(cpu, 2), "wall_s": round(time.monotonic() - t0, 2),
                        "rows": sum(r.rows for r in done), "table_bytes": data_bytes(spark, table),
                        "folder_bytes": folder_bytes(table), "load_1m": round(os.getloadavg()[0], 2),
                    })  # fmt: skip
                    shutil.rmtree(lake, ignore_errors=True)
                    print(f"  {view.name} @ {rate:g}/day day {k}: {row['runs'][-1]}", flush=True)
            runs[view.name] = row
            PARTIAL.write_text(
                json.dumps({"command": command, "runs": runs}, indent=2) + "\n", encoding="utf-8"
            )
    finally:
        spark.stop()
        shutil.rmtree(tmp, ignore_errors=True)

    finish(runs, example, args, command, rates, load0, started)


def finish(
    runs: dict[str, Any],
    example: Any,
    args: argparse.Namespace,
    command: str,
    rates: list[float],
    load0: tuple[float, float, float],
    started: float,
) -> None:
    """Fit, write offline.json (unless ``--no-write``) and the results, print the table."""
    shares, profile = stream_sample(example)
    constants, per_view = fit_offline(runs, example, shares, profile)
    accuracy = check_accuracy(runs, example, constants, shares, profile)
    path = calibration_path("offline")
    before = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    # the model's switch is a decision, not a fit: kept as the file has it (reads_window); the tile
    # merge's CPU per row is bench_offline_tiles.py's measurement, kept with its provenance
    constants["reads_window"] = before.get("constants", {}).get("reads_window", 0)
    if "tile_row_us" in before.get("constants", {}):
        constants["tile_row_us"] = before["constants"]["tile_row_us"]
    cal_data = {
        "tier": "offline",
        "model": "registry/cost.py",
        "constants": constants,
        "machine": machine(),
        "measured_at": time.strftime("%Y-%m-%d", time.gmtime()),
        "command": command,
        "where_shares": shares,
        "stream_profile": profile,
        **({"provenance": before["provenance"]} if "provenance" in before else {}),
        "isolation": "CPU seconds (user + system, psutil) of the Python driver and its children (the local "
        "Spark JVM, PySpark workers) over run_view of one view (daily values, Delta write, Z-order), "
        "the session warmed up first; two rates give each view's fixed seconds a run and us/event",
        "derivation": "least squares over every run (negative terms pinned at 0): cpu_s = fixed_cores x "
        "86,400 + run_counter_s x (a counter map) + run_window_s x distinct windows + events read x "
        "(event_us + share-weighted agg_us, one figure for the number kinds, one for the counter maps). "
        "Table: least squares of each run's Parquet bytes relative to themselves (every row as much) on "
        "rows, rows x count entropy bits, rows x real values, rows x top_k entries (the model's "
        "table_row_terms, the stream's profile, the days the lake held) and columns x day files",
        "stream": {
            "days": args.days,
            "events_per_day": rates,
            "payments_per_day": [r / 4 for r in rates],
            "users": USERS,
            "accounts": ACCOUNTS,
            "seed": SEED,
        },
        "measured": {
            name: {
                "cpu_s_per_day": [round(r["cpu_s"] / r["days"], 2) for r in row["runs"]],
                # the events each day's run read (its window of what bronze held)
                "events_per_day": [
                    r.get("events_read", r["events_per_day"]) / r["days"] for r in row["runs"]
                ],
                "state_bytes": [r["table_bytes"] for r in row["runs"]],
            }
            for name, row in runs.items()
        },
    }
    if not args.no_write:
        path.write_text(json.dumps(cal_data, indent=2) + "\n", encoding="utf-8")
        print(f"wrote {path.relative_to(ROOT)}")
    out = ROOT / "bench/results/bench_calibrate.json"
    doc = json.loads(out.read_text()) if out.is_file() else {"benchmark": "calibrate", "tiers": {}}
    doc["tiers"]["offline"] = {
        "command": command, "constants": constants, "per_view_fit": per_view, "runs": runs,
        "accuracy": accuracy, "machine": machine(), "load_average_start": [round(x, 2) for x in load0],
        "load_average_end": [round(x, 2) for x in os.getloadavg()],
        "seconds": round(time.monotonic() - started),
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "adopted": not args.no_write,
    }  # fmt: skip
    out.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    print_table(accuracy)


COUNTER_KINDS = ("distinct_count", "top_k")
"""Aggregations that keep a map of values (Spark: a collect per group); the others a number."""


def stream_shares(example: Any) -> list[dict[str, Any]]:
    """Return the share of this bench's events each example filter keeps (a day's first chunk of each)."""
    return stream_sample(example)[0]


def stream_sample(example: Any) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Return this bench's filter shares and its per-key profiles (a day's first chunk of each source).

    The profile (each tenth of the entities' share of the events) is what spreads a view's events
    over its entities in the table model (:func:`headwater.registry.cost.table_row_terms`).
    """
    import calibrate_realtime as rt

    sample = {
        "events": next(iter(behaviour_events(1_000_000, 1))),
        "payments": next(iter(payment_events(250_000, 1))),
    }
    return rt.where_shares(example, events=sample)


def agg_terms(view: Any, cal: Any) -> list[float]:
    """Return a view's share-weighted aggregations: (number-valued kinds, counter-map kinds)."""
    shape = view_shape(view.features)
    out = [0.0, 0.0]
    for (kind, filtered, _), (_, where, _) in zip(shape.aggs, shape.agg_filters, strict=True):
        out[kind in COUNTER_KINDS] += cal.share(where) if filtered else 1.0
    return out


def fit_offline(
    runs: dict[str, Any],
    example: Any,
    shares: list[dict[str, Any]] | None = None,
    profile: dict[str, Any] | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Constants from every run: a run's CPU s = its shape's fixed seconds + events read x us/event.

    cpu_s = base + run_counter_s x (a counter map) + run_window_s x distinct windows
          + events read x (event_us + sum over aggregations of share(filter) x agg_us[kind])

    one agg_us for the number-valued kinds and one for the counter maps (six views do not separate
    eight kinds), least squares over every run (negative terms pinned at 0); ``fixed_cores`` = base
    / 86,400 (one run a day). ``shares``: the stream's filter shares (:func:`stream_shares`). Each
    view's own line (fixed s, us/event read) is kept for the record.
    """
    from calibrate_realtime import _nonneg_lstsq

    from headwater.registry.cost import COUNTER_KINDS as COUNTERS

    cal0 = parse_calibration(
        "offline", {"constants": {}, "where_shares": shares or [], "measured_at": "now"}, None
    )
    per_view: dict[str, Any] = {}
    rows, cpu = [], []
    for name, row in runs.items():
        xs = np.asarray([float(r.get("events_read", r["events"])) for r in row["runs"]])
        ys = np.asarray([float(r["cpu_s"]) for r in row["runs"]])
        slope, fixed = (
            (float(c) for c in np.polyfit(xs, ys, 1)) if np.ptp(xs) > 0 else (0.0, float(ys.mean()))
        )
        view = next(v for v in example.views if v.name == name)
        shape = view_shape(view.features)
        counter = float(any(kind in COUNTERS for kind, _, _ in shape.aggs))
        windows = float(len({w for w, _, _ in shape.agg_filters}))
        terms = agg_terms(view, cal0)
        per_view[name] = {"fixed_s": round(fixed, 2), "us_per_event": round(slope * 1e6, 3),
                          "agg_terms": [round(x, 4) for x in terms], "counter_map": bool(counter),
                          "windows": int(windows)}  # fmt: skip
        for r in row["runs"]:
            m = float(r.get("events_read", r["events"])) / 1e6
            rows.append([1.0, counter, windows, m, m * terms[0], m * terms[1]])
            cpu.append(float(r["cpu_s"]))
    coef = _nonneg_lstsq(np.asarray(rows), np.asarray(cpu))
    cal_state = parse_calibration(
        "offline",
        {"constants": {}, "where_shares": shares or [], "stream_profile": profile, "measured_at": "now"},
        None,
    )
    state = state_fit(runs, example, cal_state)
    constants = {
        "event_us": round(float(coef[3]), 3),
        "agg_us": {k: round(float(coef[5] if k in COUNTER_KINDS else coef[4]), 3) for k in AGG_KINDS},
        "where_us": 0.0,
        "pane_us": 0.0,
        "selectivity": 1.0,
        "rekey_us": 0.0,
        "fixed_cores": round(float(coef[0]) / SECONDS_PER_DAY, 7),
        "run_counter_s": round(float(coef[1]), 2),
        "run_window_s": round(float(coef[2]), 2),
        **state,
    }
    return constants, per_view


def run_age_s(run: dict[str, Any]) -> float:
    """Return the event time a run's lake held: its computed day's (bronze from day 1), or every day."""
    return float(run.get("computed_day") or run["days"]) * SECONDS_PER_DAY


def state_fit(runs: dict[str, Any], example: Any, cal: Any) -> dict[str, float]:
    """Least squares of each table's Parquet bytes on the table model's terms; the constants.

    Terms (:func:`headwater.registry.cost.table_row_terms`, each run's rate, rows and the days its
    lake held): rows (key, time), rows x count entropy bits, rows x real values that are not null,
    rows x top_k entries, and the day files' columns (footer, headers, statistics, dictionaries).
    Relative least squares (each run's error counts as much, the target is relative) with negative
    terms pinned at 0; ``table_row_bytes`` (per slot) is not a term of the fit.
    """
    from calibrate_realtime import _nonneg_lstsq

    from headwater.registry.cost import table_row_terms

    a, b = [], []
    for name, row in runs.items():
        view = next(v for v in example.views if v.name == name)
        for r in row["runs"]:
            rate = r["events_per_day"] / SECONDS_PER_DAY
            entities = r["rows"] / r["days"]
            t = table_row_terms(
                view.features, rate, entities, cal, (view.source, view.join_key), run_age_s(r)
            )
            rows = float(r["rows"])
            a.append([rows, rows * t.count_bits, rows * t.values, rows * t.entries, r["days"] * t.columns])
            b.append(float(r["table_bytes"]))
    weight = 1.0 / np.maximum(np.asarray(b), 1.0)
    coef = _nonneg_lstsq(np.asarray(a) * weight[:, None], np.asarray(b) * weight)
    return {
        "state_pane_bytes": round(float(coef[0]), 3),
        "table_row_bytes": 0.0,
        "table_bit_bytes": round(float(coef[1]), 4),
        "table_value_bytes": round(float(coef[2]), 3),
        "table_entry_bytes": round(float(coef[3]), 3),
        "table_file_column_bytes": round(float(coef[4]), 1),
    }


def check_accuracy(
    runs: dict[str, Any],
    example: Any,
    constants: dict[str, Any],
    shares: list[dict[str, Any]],
    profile: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Per view and rate: estimated vs measured CPU a day; estimated vs measured table bytes."""
    cal = parse_calibration(
        "offline",
        {"constants": constants, "where_shares": shares, "stream_profile": profile, "measured_at": "now"},
        calibration_path("offline"),
    )
    tier = TIERS["offline"]
    out: dict[str, Any] = {}
    for name, row in runs.items():
        view = next(v for v in example.views if v.name == name)
        rates = []
        for r in row["runs"]:
            rate = r["events_per_day"] / SECONDS_PER_DAY
            # what the run read: its computed day's window of what bronze held (the model's days_read
            # of a steady daily job, cut to the stream's days)
            read = r.get("events_read", r["events"]) / max(1.0, r["events_per_day"]) / r["days"]
            est = estimate_view(view.features, rate, tier, False, None, cal, read_days=read)
            est_s = est.cpu_hours_per_day * 3600
            meas_s = r["cpu_s"] / r["days"]
            # the table holds one row per entity and day computed: entities = rows / days written
            entities = r["rows"] / r["days"]
            # the table of a lake that held fewer days than the window: its counts are smaller
            fp = estimate_footprint(
                view.features, rate, tier, entities, 12, cal, stream=(view.source, view.join_key),
                age_s=run_age_s(r),
            )  # fmt: skip
            days_kept = max(1, -(-view_shape(view.features).longest_window_s // SECONDS_PER_DAY))
            state_est = fp.state_bytes * r["days"] / days_kept  # the stream wrote `days` days, not the window
            rates.append({
                "events_per_day": r["events_per_day"], "computed_day": r.get("computed_day", 0),
                "read_days": round(read, 2), "estimated_cpu_s_per_day": round(est_s, 2),
                "measured_cpu_s_per_day": round(meas_s, 2), "cpu_error": round(est_s / meas_s - 1, 3),
                "state_estimate": round(state_est), "state_bytes": r["table_bytes"],
                "state_error": round(state_est / r["table_bytes"] - 1, 3) if r["table_bytes"] else None,
                "load_1m": r["load_1m"],
            })  # fmt: skip
        out[name] = {"source": view.source, "rates": rates}
    return out


def print_table(accuracy: dict[str, Any]) -> None:
    """Estimate vs measured per view and rate: CPU seconds a day, table bytes."""
    print(f"\n{'view':<28} {'events/day':>10} {'read':>4} {'est cpu s':>9} {'meas cpu s':>10} {'err':>6}  "
          f"{'state est':>10} {'state meas':>10} {'err':>6}")  # fmt: skip
    for name, row in accuracy.items():
        for r in row["rates"]:
            print(f"{name:<28} {r['events_per_day']:>10,.0f} {r.get('read_days', 1):>4g} "
                  f"{r['estimated_cpu_s_per_day']:>9.1f} "
                  f"{r['measured_cpu_s_per_day']:>10.1f} {r['cpu_error']:>+6.0%}  {r['state_estimate']:>10,} "
                  f"{r['state_bytes']:>10,} {(r['state_error'] or 0):>+6.0%}")  # fmt: skip


if __name__ == "__main__":
    main()
