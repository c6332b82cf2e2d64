"""Tiled offline runs side by side: a 30-day view's daily run from bronze against the run from its tiles.

Usage: .venv/bin/python -u bench/bench_offline_tiles.py [--events-per-day N] [--entities E] [--days D]
           [--reps R] [--bronze DIR]
       .venv/bin/python -u bench/bench_offline_tiles.py --events-per-day 3000 --reps 1   (a quick look)
Needs no service (Spark local, Delta in a temporary lake). Writes bench/results/offline_tiles.json
(``--out``) and prints a table.

The stream: ``--days`` days (default 33: day D, the last, and the 31 days before it that a 30-day
window plus its 1-day slide reaches) of synthetic behaviour events, ``--events-per-day`` a day
(default 100,000) over ``--entities`` users (default: one per 5 events a day, the issue's 1M
events/day over 200,000 users), uniform over users and the day; ~87 % impressions, clicks,
purchases, a category on most, a price on most, 1-3 sessions a user and day. Written to a bronze
Delta table (``append_table``: what landing writes), partitioned by date.

The view (built here, every window whole days, slide 1 d: tiled): count, sum of price, distinct
sessions and the top 3 categories over 30 days, plus clicks and distinct items over 7 days. Two
copies with the same features and different names: one computed the way the daily job computed
every view before tiles (``daily_values`` from the window's bronze, the Delta write, the Z-order:
``run_view``'s non-tiled path), one the tiled way (``run_view``: tile the new day, merge the tiles).

In one Spark session, untimed first: the tiles of every day before D (``run_view`` of day D-1) and a
warm-up run of each path. Then ``--reps`` rounds, each: the run of day D from bronze, then the run
of day D from the tiles with day D re-tiled (its fingerprint dropped from the manifest, so every
round tiles the new day as a real daily run does). Each run: CPU seconds of this process tree
(``job.tree_cpu_s``: the driver, the local Spark JVM, its Python workers) and wall seconds, the
1-minute load average after it. The two runs' rows of day D must be equal (exit 1 otherwise).

Where the time goes: one more tiled run of day D split into its steps (re-tile the day; merge the
tiles and write the day; Z-order), each step's CPU and wall; and the Spark stages of the timed runs
(the status store's executor run and CPU time per stage: what the Spark UI shows). The same split of
a 7-day twin of the view (same columns, 9 days of tiles read instead of 32, its tiles built untimed
too) gives the merge's CPU per further tile row, its fixed part cancelled out: the cost model's
``tile_row_us`` (``registry/calibration/offline.json``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import tempfile
import time
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from headwater.registry.plans import PlanSource, PlanView

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from bench_calibrate import machine  # noqa: E402

RESULT = ROOT / "bench" / "results" / "offline_tiles.json"
D0 = date(2026, 1, 1)
DAY_MS = 86_400_000
SEED = 35
EVENTS_PER_ENTITY_DAY = 5
"""The issue's 1M events a day over the example budget's 200,000 users: what the default entities keep."""
KINDS = np.array(["impression", "click", "purchase", "dwell", "like"])
KIND_WEIGHTS = np.array([0.87, 0.06, 0.01, 0.05, 0.01])
CATEGORIES = np.array([f"cat{i:02d}" for i in range(20)] + [None], dtype=object)
DEVICES = np.array(["web", "ios", "android"])
ITEMS = 5_000


def bench_view(name: str, long: str = "30d") -> PlanView:
    """Return the bench's view (every window whole days, slide 1 d: tiled); ``long``: its long window."""
    from headwater.pipelines.offline.testing import feature, view

    return view(name, "user", "user_id", [
        feature("events_long", "count", long, dtype="int64"),
        feature("spend_long", "sum", long, field="price", filter_="event_type = 'purchase'"),
        feature("sessions_long", "distinct_count", long, field="session_id", dtype="int64"),
        feature("top_categories_long", "top_k", long, field="category", k=3, filter_="category is not null"),
        feature("clicks_7d", "count", "7d", filter_="event_type = 'click'", dtype="int64"),
        feature("items_7d", "distinct_count", "7d", field="item_id", dtype="int64"),
    ])  # fmt: skip


def day_table(source: PlanSource, day: int, n: int, entities: int, rng: np.random.Generator) -> pa.Table:
    """Return ``n`` bronze rows of day ``day`` (0: :data:`D0`), vectorised (no per-event Python dicts)."""
    from headwater.pipelines.offline.source_columns import bronze_schema

    start = (datetime(D0.year, D0.month, D0.day, tzinfo=UTC) + timedelta(days=day)).timestamp()
    users = rng.integers(0, entities, n)
    kinds = KINDS[rng.choice(len(KINDS), n, p=KIND_WEIGHTS)]
    priced = rng.random(n) < 0.92
    columns: dict[str, Any] = {
        "event_id": [f"e{day:03d}-{i:08d}" for i in range(n)],
        "user_id": [f"u{u:07d}" for u in users],
        "item_id": [f"i{i:05d}" for i in rng.integers(0, ITEMS, n)],
        "event_type": kinds.tolist(),
        "event_time": (int(start * 1000) + rng.integers(0, DAY_MS, n)).tolist(),
        "session_id": [f"s{u}-{day}-{k}" for u, k in zip(users, rng.integers(0, 3, n), strict=True)],
        "category": CATEGORIES[rng.integers(0, len(CATEGORIES), n)].tolist(),
        "price": np.where(priced, np.round(rng.uniform(1, 200, n), 2), np.nan).tolist(),
        "dwell_ms": None,
        "query": None,
        "position": None,
        "device": DEVICES[rng.integers(0, len(DEVICES), n)].tolist(),
        "arm": None,
        "late": [False] * n,
    }
    columns["price"] = [None if math.isnan(p) else p for p in columns["price"]]
    schema = bronze_schema(source)
    arrays = [pa.array(columns[f.name] if columns.get(f.name) is not None else [None] * n, type=f.type)
              for f in schema]  # fmt: skip
    return pa.Table.from_arrays(arrays, schema=schema)


def write_bronze(spark: SparkSession, source: PlanSource, lake: Path, args: argparse.Namespace) -> int:
    """Write ``args.days`` days of events to the bronze table of ``lake``; return the events written."""
    from headwater.pipelines.offline.bronze import append_table
    from headwater.pipelines.offline.lake import bronze_path

    rng = np.random.default_rng(SEED)
    per_append = max(1, 2_000_000 // args.events_per_day)  # days per Delta commit: ~2M rows at a time
    total = 0
    for lo in range(0, args.days, per_append):
        tables = [day_table(source, d, args.events_per_day, args.entities, rng)
                  for d in range(lo, min(args.days, lo + per_append))]  # fmt: skip
        table = pa.concat_tables(tables)
        append_table(spark, source, table, bronze_path(lake, source.name))
        total += table.num_rows
        print(f"bronze: days {lo}..{lo + len(tables) - 1} written ({total:,} events)", flush=True)
    return total


def load() -> float:
    """Return the 1-minute load average."""
    return float(Path("/proc/loadavg").read_text().split()[0])


def stage_ids(spark: SparkSession) -> set[int]:
    """Return the ids of the stages the session has run so far."""
    return {s["stage"] for s in stages(spark)}


def stages(spark: SparkSession) -> list[dict[str, Any]]:
    """Return each completed stage's name, tasks and executor run/CPU ms (the status store the UI reads).

    The status store is kept with the UI off; it is Spark-internal, so a Spark that hides it gives
    no stages (an empty list) rather than a failed bench.
    """
    try:
        jvm: Any = spark.sparkContext._jvm
        store = spark.sparkContext._jsc.sc().statusStore()
        defaults = [getattr(store, f"stageList$default${i}")() for i in (4, 5)]  # py4j: no Scala defaults
        listed = jvm.scala.jdk.javaapi.CollectionConverters.asJava(
            store.stageList(None, False, False, *defaults)
        )
        out = []
        for s in listed:
            if str(s.status().toString()) != "COMPLETE":
                continue
            out.append({"stage": int(s.stageId()), "name": str(s.name()), "tasks": int(s.numTasks()),
                        "run_ms": int(s.executorRunTime()), "cpu_ms": round(s.executorCpuTime() / 1e6),
                        "input_bytes": int(s.inputBytes()),
                        "shuffle_read_bytes": int(s.shuffleReadBytes())})  # fmt: skip
        return out
    except Exception as exc:  # an internal API: no stages is a reported gap, not a failure
        print(f"note: no Spark stage figures ({type(exc).__name__}: {exc})", flush=True)
        return []


def stage_summary(runs: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Per stage name (its call site), the mean over ``runs`` of tasks and executor ms, biggest first."""
    by: dict[str, list[int]] = {}
    for run in runs:
        seen: dict[str, list[int]] = {}
        for s in run:
            acc = seen.setdefault(s["name"], [0, 0, 0, 0])
            acc[0] += 1
            acc[1] += s["tasks"]
            acc[2] += s["run_ms"]
            acc[3] += s["cpu_ms"]
        for name, acc in seen.items():
            total = by.setdefault(name, [0, 0, 0, 0])
            for i in range(4):
                total[i] += acc[i]
    n = max(1, len(runs))
    rows = [{"call_site": name, "stages": round(v[0] / n, 1), "tasks": round(v[1] / n, 1),
             "executor_run_s": round(v[2] / n / 1000, 2), "executor_cpu_s": round(v[3] / n / 1000, 2)}
            for name, v in by.items()]  # fmt: skip
    return sorted(rows, key=lambda r: -r["executor_run_s"])


class Timer:
    """CPU (process tree) and wall seconds of a block, and the Spark stages it ran."""

    def __init__(self, spark: SparkSession) -> None:
        """Bind to the session whose stages are listed."""
        self.spark = spark
        self.cpu_s = self.wall_s = 0.0
        self.stages: list[dict[str, Any]] = []

    def __enter__(self) -> Timer:
        """Start the clocks."""
        from headwater.pipelines.offline.job import tree_cpu_s

        self._before = stage_ids(self.spark)
        self._cpu, self._wall = tree_cpu_s() or 0.0, time.monotonic()
        return self

    def __exit__(self, *exc: object) -> None:
        """Stop the clocks; keep the stages run in between."""
        from headwater.pipelines.offline.job import tree_cpu_s

        self.wall_s = time.monotonic() - self._wall
        self.cpu_s = (tree_cpu_s() or 0.0) - self._cpu
        self.stages = [s for s in stages(self.spark) if s["stage"] not in self._before]


def run_from_bronze(spark: SparkSession, bronze: Any, view: PlanView, source: PlanSource, lake: Path,
                    day: date) -> None:  # fmt: skip
    """Run day ``day`` as before tiles (``run_view``'s non-tiled path): values from the window's bronze."""
    from headwater.pipelines.offline.job import daily_values, optimize, write_days
    from headwater.pipelines.offline.lake import feature_path

    table = feature_path(lake, view.name)
    write_days(daily_values(bronze, view, source, day, day), table, day, day)
    optimize(spark, table, view.join_key, day, day)


def forget_tiles_of(lake: Path, view: PlanView, day: date) -> None:
    """Drop ``day``'s fingerprint from the view's tile manifest: the next run re-tiles it (a new day)."""
    from headwater.pipelines.offline.lake import tiles_path
    from headwater.pipelines.offline.tile_table import read_manifest, write_manifest

    table = tiles_path(lake, view.name, view.version)
    write_manifest(table, {d: f for d, f in read_manifest(table).items() if d != str(day)})


def day_rows(spark: SparkSession, lake: Path, view: PlanView, day: date) -> dict[str, dict[str, Any]]:
    """Return the rows of ``day`` of the view's feature table, per entity."""
    from pyspark.sql import functions as F

    from headwater.pipelines.offline.lake import feature_path

    frame = spark.read.format("delta").load(str(feature_path(lake, view.name)))
    return {
        r["user_id"]: r.asDict(recursive=True) for r in frame.where(F.col("date") == F.lit(day)).collect()
    }


def differences(got: dict[str, dict[str, Any]], want: dict[str, dict[str, Any]], view: PlanView) -> list[str]:
    """Return what differs between two days' rows (float sums to rounding, top_k shares too)."""
    out = [f"entity {e!r}: a row in one run only" for e in sorted(set(got) ^ set(want))[:10]]
    for entity in sorted(set(got) & set(want)):
        for f in view.features:
            a, b = got[entity][f.name], want[entity][f.name]
            if f.agg == "top_k":
                same = [x["value"] for x in a or []] == [x["value"] for x in b or []] and all(
                    math.isclose(x["share"], y["share"], rel_tol=1e-9)
                    for x, y in zip(a or [], b or [], strict=True)
                )
            elif isinstance(a, float) and isinstance(b, float):
                same = math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9) or (math.isnan(a) and math.isnan(b))
            else:
                same = a == b
            if not same:
                out.append(f"entity {entity!r} feature {f.name}: tiled {a!r}, from bronze {b!r}")
        if len(out) >= 10:
            break
    return out


def split_run(spark: SparkSession, bronze: Any, view: PlanView, source: PlanSource, lake: Path,
              day: date) -> dict[str, Any]:  # fmt: skip
    """Run ``view``'s tiled day ``day`` step by step (what ``run_view`` does); each step's CPU and wall.

    Steps: re-tile the day (its fingerprint dropped first: a new day), merge the window's tiles and
    write the day, Z-order it. Also returns the tile rows the merge read (``tile_rows_read``).
    """
    from headwater.pipelines.offline.job import day_boundaries, feature_rows, optimize, write_days
    from headwater.pipelines.offline.lake import feature_path, tiles_path
    from headwater.pipelines.offline.tile_table import needed_days, retile, tiled_values

    tiles, table = tiles_path(lake, view.name, view.version), feature_path(lake, view.name)
    forget_tiles_of(lake, view, day)
    with Timer(spark) as t1:
        retile(spark, bronze, view, source, tiles, needed_days(view, day, day))
    with Timer(spark) as t2:
        frame = feature_rows(tiled_values(spark, view, tiles, day_boundaries(day, day), day), view)
        write_days(frame, table, day, day)
    with Timer(spark) as t3:
        optimize(spark, table, view.join_key, day, day)
    steps = {name: {"cpu_s": round(t.cpu_s, 2), "wall_s": round(t.wall_s, 2)}
             for name, t in (("retile_day", t1), ("merge_and_write", t2), ("zorder", t3))}  # fmt: skip
    first = needed_days(view, day, day)[0]
    read = spark.read.format("delta").load(str(tiles)).where(f"date >= '{first}' AND date <= '{day}'").count()
    return {"steps": steps, "tile_rows_read": read}


def parse_args() -> argparse.Namespace:
    """Command-line options."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--events-per-day", type=int, default=100_000, help="Events a day (default 100,000).")
    ap.add_argument("--entities", type=int, default=None,
                    help=f"Users (default: events per day / {EVENTS_PER_ENTITY_DAY}).")  # fmt: skip
    ap.add_argument("--days", type=int, default=33, help="Days of bronze; day D is the last (at least 33).")
    ap.add_argument("--reps", type=int, default=3, help="Timed rounds (each: one run of each path).")
    ap.add_argument("--bronze", type=Path, default=None,
                    help="Keep (or reuse) the lake in this folder, not a temporary one.")  # fmt: skip
    ap.add_argument("--gen-only", action="store_true",
                    help="With --bronze: write the bronze table, stop (a later run reuses it).")  # fmt: skip
    ap.add_argument("--out", type=Path, default=RESULT, help=f"Result file (default {RESULT}).")
    args = ap.parse_args()
    if args.days < 33:
        ap.error("--days must be at least 33: day D and the 32 days of bronze its 30-day window reaches")
    if args.gen_only and args.bronze is None:
        ap.error("--gen-only needs --bronze DIR (where the table is kept)")
    if args.events_per_day < 1 or args.reps < 1:
        ap.error("--events-per-day and --reps must be at least 1")
    args.entities = args.entities or max(1, args.events_per_day // EVENTS_PER_ENTITY_DAY)
    return args


def summary(runs: list[dict[str, float]]) -> dict[str, float]:
    """Median and min of each run's CPU and wall seconds."""
    cpu, wall = [r["cpu_s"] for r in runs], [r["wall_s"] for r in runs]
    return {"cpu_s_median": round(float(np.median(cpu)), 2), "cpu_s_min": round(min(cpu), 2),
            "wall_s_median": round(float(np.median(wall)), 2), "wall_s_min": round(min(wall), 2)}  # fmt: skip


def main() -> None:
    args = parse_args()
    from headwater.pipelines.offline.job import read_bronze, run_view
    from headwater.pipelines.offline.lake import bronze_path, is_delta_table, tiles_path
    from headwater.pipelines.offline.session import offline_session
    from headwater.pipelines.offline.testing import behaviour
    from headwater.pipelines.offline.tiles import view_tiled

    source = behaviour()
    tiled, full = bench_view("bench_tiled_30d"), bench_view("bench_full_30d")
    week = bench_view("bench_tiled_7d", long="7d")  # the 30-day view's twin: the merge's slope per row
    if not (view_tiled(tiled) and view_tiled(week)):
        raise SystemExit("the bench views must be tiled (every window whole days)")
    lake = args.bronze or Path(tempfile.mkdtemp(prefix="bench-tiles-"))
    day_d = D0 + timedelta(days=args.days - 1)
    spark = offline_session("bench-offline-tiles")
    started = time.monotonic()
    try:
        if not is_delta_table(bronze_path(lake, source.name)):
            write_bronze(spark, source, lake, args)
        if args.gen_only:
            return
        bronze = read_bronze(spark, lake, source)
        print(f"bronze: {args.days} days x {args.events_per_day:,} events over {args.entities:,} users; "
              f"day D = {day_d}", flush=True)  # fmt: skip

        # untimed: the tiles of every day before D, and a warm-up run of each path
        built = run_view(spark, bronze, tiled, source, lake, [day_d - timedelta(days=1)])[0]
        print(f"tiles built for {len(built.retiled)} days ({built.cpu_s or 0:.1f} CPU s)", flush=True)
        run_view(spark, bronze, week, source, lake, [day_d - timedelta(days=1)])
        run_from_bronze(spark, bronze, full, source, lake, day_d - timedelta(days=1))

        rounds: list[dict[str, Any]] = []
        full_stages: list[list[dict[str, Any]]] = []
        tiled_stages: list[list[dict[str, Any]]] = []
        for rep in range(args.reps):
            with Timer(spark) as tf:
                run_from_bronze(spark, bronze, full, source, lake, day_d)
            load_full = load()
            forget_tiles_of(lake, tiled, day_d)
            with Timer(spark) as tt:
                run = run_view(spark, bronze, tiled, source, lake, [day_d])[0]
            if run.retiled != (day_d,) or not run.tiled:
                msg = f"the tiled run re-tiled {run.retiled} (tiled: {run.tiled}); expected day D only"
                raise SystemExit(msg)
            full_run = {"cpu_s": round(tf.cpu_s, 2), "wall_s": round(tf.wall_s, 2), "load_1m": load_full}
            tiled_run = {"cpu_s": round(tt.cpu_s, 2), "wall_s": round(tt.wall_s, 2), "load_1m": load()}
            rounds.append({"full": full_run, "incremental": tiled_run})
            full_stages.append(tf.stages)
            tiled_stages.append(tt.stages)
            print(f"round {rep + 1}: from bronze {tf.cpu_s:.1f} CPU s / {tf.wall_s:.1f} s wall; "
                  f"from tiles {tt.cpu_s:.1f} CPU s / {tt.wall_s:.1f} s wall; load {load():.2f}",
                  flush=True)  # fmt: skip

        diff = differences(day_rows(spark, lake, tiled, day_d), day_rows(spark, lake, full, day_d), tiled)
        entities_d = len(day_rows(spark, lake, full, day_d))
        if diff:
            print("FAIL: the tiled run's values differ from the run from bronze:\n  " + "\n  ".join(diff))
            raise SystemExit(1)
        print(f"values: day D's {entities_d:,} rows equal in both runs", flush=True)

        # where the tiled run's time goes: the same run split into its steps, for the 30-day view and
        # its 7-day twin (same columns, 9 days of tiles instead of 32): the merge's CPU per tile row
        # is the difference of the two over the difference of their rows (same session, same load)
        split = {v.name: split_run(spark, bronze, v, source, lake, day_d) for v in (tiled, week)}
        steps, window_rows = split[tiled.name]["steps"], split[tiled.name]["tile_rows_read"]
        week_steps, week_rows = split[week.name]["steps"], split[week.name]["tile_rows_read"]
        slope_us = (
            (steps["merge_and_write"]["cpu_s"] - week_steps["merge_and_write"]["cpu_s"])
            * 1e6
            / max(window_rows - week_rows, 1)
        )
        tile_rows = spark.read.format("delta").load(str(tiles_path(lake, tiled.name, tiled.version))).count()
    finally:
        spark.stop()
        if args.bronze is None:
            shutil.rmtree(lake, ignore_errors=True)

    full_s, inc_s = summary([r["full"] for r in rounds]), summary([r["incremental"] for r in rounds])
    ratio_cpu = full_s["cpu_s_median"] / max(inc_s["cpu_s_median"], 1e-9)
    ratio_wall = full_s["wall_s_median"] / max(inc_s["wall_s_median"], 1e-9)
    merge_us = steps["merge_and_write"]["cpu_s"] * 1e6 / max(window_rows, 1)
    out = {
        "benchmark": "offline_tiles",
        "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": " ".join(["bench/bench_offline_tiles.py", *sys.argv[1:]]),
        "machine": machine(),
        "ci_running": bool(os.popen("pgrep -f '.ci/run'").read().strip()),
        "load_1m_at_end": load(),
        "stream": {
            "days": args.days,
            "events_per_day": args.events_per_day,
            "entities": args.entities,
            "day_d": str(day_d),
            "seed": SEED,
            "rows_of_day_d": entities_d,
        },
        "view": {"features": [f"{f.name}: {f.agg} {f.window}" for f in tiled.features], "slide": "1d"},
        "rounds": rounds,
        "from_bronze": full_s,
        "from_tiles": inc_s,
        "ratio_cpu": round(ratio_cpu, 2),
        "ratio_wall": round(ratio_wall, 2),
        "values_equal": True,
        "tiled_run_steps": steps,
        "tile_rows": {
            "table": tile_rows,
            "read_by_day_d": window_rows,
            "merge_and_write_us_per_tile_row": round(merge_us, 2),
        },
        "stages": {"from_bronze": stage_summary(full_stages), "from_tiles": stage_summary(tiled_stages)},
        "elapsed_s": round(time.monotonic() - started, 1),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")
    print(f"\n{'run of day D':<24} {'CPU s (median)':>15} {'wall s (median)':>16}")
    print(f"{'from bronze (31 days)':<24} {full_s['cpu_s_median']:>15.1f} {full_s['wall_s_median']:>16.1f}")
    print(f"{'from tiles (1 day)':<24} {inc_s['cpu_s_median']:>15.1f} {inc_s['wall_s_median']:>16.1f}")
    print(f"ratio full / incremental: {ratio_cpu:.2f}x CPU, {ratio_wall:.2f}x wall "
          f"({args.events_per_day:,} events/day, {args.entities:,} users, load {load():.2f})")  # fmt: skip
    print(f"tiled run steps: {steps}; {window_rows:,} tile rows read, {merge_us:.2f} us CPU per tile row "
          f"to merge and write; against the 7-day twin ({week_rows:,} rows, {week_steps}): "
          f"{slope_us:.2f} us CPU per further tile row")  # fmt: skip
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
