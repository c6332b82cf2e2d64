"""The daily (and backfill) job: each view of a tier plan computed per day into its Delta table.

For day D the row of an entity holds the view's values AS OF the end of D (T = D + 1 at 00:00
UTC, each feature at its own boundary ``floor(T / S) * S``), with ``event_time`` = T, in the
partition ``date = D``. A run replaces the partitions of its days (``replaceWhere``), so a rerun
writes the same rows again and changes nothing; then ``OPTIMIZE ... ZORDER BY (<entity id>)``
compacts those partitions and clusters them by entity.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import date, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from headwater.pipelines.offline.aggregate import BOUNDARY, Progression
from headwater.pipelines.offline.compute import attach_window_ms, compute_view, view_events
from headwater.pipelines.offline.lake import (
    DAY_MS,
    FEATURE_TIME,
    bronze_path,
    day_start_ms,
    feature_path,
    healed_path,
    healed_tiles_path,
    is_delta_table,
    tiles_path,
)
from headwater.pipelines.offline.source_columns import time_between
from headwater.registry.errors import HeadwaterError
from headwater.registry.plans import PlanSource, PlanView

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


COMPUTED = "headwater_days"
"""Key of the commit metadata that records the days a write computed (empty days have no rows)."""


def computed_days(spark: SparkSession, table: Path) -> set[date]:
    """Return the days the job computed into ``table`` (from its commits' metadata)."""
    from delta.tables import DeltaTable

    from headwater.pipelines.offline.lake import days

    out: set[date] = set()
    history = DeltaTable.forPath(spark, str(table)).history().select("userMetadata").collect()
    for row in history:
        meta = json.loads(row["userMetadata"]) if row["userMetadata"] else {}
        if isinstance(meta, dict) and COMPUTED in meta:
            first, last = meta[COMPUTED]
            out.update(days(date.fromisoformat(first), date.fromisoformat(last)))
    return out


class OfflineJobError(HeadwaterError, RuntimeError):
    """The job cannot run (no bronze table, unknown view); the message says what to do."""


class NoBronzeError(OfflineJobError):
    """A source has no bronze table yet: nothing of it was landed or imported.

    ``headwater run offline`` and ``materialize`` skip the views of such a source with one warning
    (:func:`skip_warning`) instead of failing the whole run; a view asked for by name still fails.
    """

    def __init__(self, message: str, source: str) -> None:
        """Keep the source's name beside the message (the CLI's skip warning names it)."""
        super().__init__(message)
        self.source = source


def skip_warning(view: str, source: str) -> str:
    """Return the one warning of a view skipped because its source has no data yet (view, source, fixes)."""
    return (
        f"warning: skipping view {view}: its source {source!r} has no data yet (no bronze table). "
        f"Produce events (`headwater events produce --source {source}`) and land them (`headwater run "
        f"landing`), or import a history (`headwater events import --source {source}`); "
        f"or name only the views that have data with --view"
    )


@dataclass(frozen=True)
class DayRun:
    """One view over one chunk of days: what was written and how long it took."""

    view: str
    first: date
    last: date
    rows: int
    seconds: float
    cpu_s: float | None = None
    """CPU seconds of this process and its children over the chunk (:func:`tree_cpu_s`; None: no /proc)."""
    tiled: bool = False
    """Whether the values were merged from the view's daily tiles (else computed from bronze)."""
    retiled: tuple[date, ...] = ()
    """The days whose tiles this chunk (re)built from bronze: new days, late days, all with ``--full``."""


def read_bronze(spark: SparkSession, lake: Path, source: PlanSource) -> DataFrame:
    """Return the bronze table of ``source``.

    Raises:
        NoBronzeError: no table yet (run ``headwater run landing`` or ``headwater events import`` first).
    """
    path = bronze_path(lake, source.name)
    if not is_delta_table(path):
        msg = (f"no bronze table of source {source.name!r} at {path}; land its events first with "
               f"`headwater run landing` (or import a history with `headwater events import --source "
               f"{source.name}`)")  # fmt: skip
        raise NoBronzeError(msg, source.name)
    return spark.read.format("delta").load(str(path))


class BronzeTables:
    """The bronze table of each source of a plan, opened when first asked for."""

    def __init__(self, spark: SparkSession, lake: Path, sources: Sequence[PlanSource]) -> None:
        """Bind to the lake and the plan's sources (nothing is read yet)."""
        self.spark = spark
        self.lake = lake
        self.sources = {s.name: s for s in sources}
        self._frames: dict[str, DataFrame] = {}

    def source(self, name: str) -> PlanSource:
        """Return the plan source ``name``.

        Raises:
            OfflineJobError: the plan declares no such source.
        """
        found = self.sources.get(name)
        if found is None:
            msg = (f"source {name!r} is not in the applied plan (sources: {sorted(self.sources)}); "
                   "run `headwater apply`")  # fmt: skip
            raise OfflineJobError(msg)
        return found

    def table(self, name: str) -> DataFrame:
        """Return the bronze table of source ``name`` (see :func:`read_bronze`)."""
        if name not in self._frames:
            self._frames[name] = read_bronze(self.spark, self.lake, self.source(name))
        return self._frames[name]

    def has_data(self, name: str) -> bool:
        """Whether source ``name`` has a bronze table (something of it was landed or imported)."""
        return is_delta_table(bronze_path(self.lake, name))

    def for_view(self, view: PlanView) -> tuple[DataFrame, PlanSource]:
        """Return the bronze table ``view`` reads and its source.

        Raises:
            NoBronzeError: the view's source has no bronze table yet.
            OfflineJobError: the plan declares no such source.
        """
        try:
            source = self.source(view.source)
        except OfflineJobError as exc:
            msg = f"view {view.name} ({view.defined_at}): {exc}"
            raise OfflineJobError(msg) from None
        return self.table(source.name), source


def reach_days(view: PlanView) -> int:
    """How many days before day D the events of D's values may lie (what :func:`events_for` reads)."""
    return -(-attach_window_ms(view) // DAY_MS)


def events_for(
    bronze: DataFrame, view: PlanView, source: PlanSource, first: date, last: date, with_late: bool = False
) -> DataFrame:
    """Return the events that can reach the view's values for days ``first..last`` (partition-pruned).

    ``with_late``: the ``late`` rows too (:func:`~headwater.pipelines.offline.compute.view_events`).
    """
    from pyspark.sql import functions as F

    reach = attach_window_ms(view)
    lo_ms, hi_ms = day_start_ms(first + timedelta(days=1)) - reach, day_start_ms(last + timedelta(days=1))
    lo_day = first - timedelta(days=reach_days(view))
    scoped = bronze.where((F.col("date") >= F.lit(lo_day)) & (F.col("date") <= F.lit(last)))
    return view_events(scoped.where(time_between(source, lo_ms, hi_ms)), view, source, with_late)


def day_boundaries(first: date, last: date) -> Progression:
    """Return the boundaries T of days ``first..last`` (each day's end)."""
    return Progression(day_start_ms(first + timedelta(days=1)), DAY_MS, (last - first).days + 1)


def daily_values(
    bronze: DataFrame, view: PlanView, source: PlanSource, first: date, last: date, with_late: bool = False
) -> DataFrame:
    """Return the view's rows for ``first..last``: entity, :data:`FEATURE_TIME` (T), ``date``, features."""
    at = day_boundaries(first, last)
    events = events_for(bronze, view, source, first, last, with_late)
    return feature_rows(compute_view(events, view, at), view)


def feature_rows(values: DataFrame, view: PlanView) -> DataFrame:
    """Return computed values (per entity and T) as feature-table rows: entity, T, ``date``, features."""
    from pyspark.sql import functions as F

    t = F.col(BOUNDARY)
    return values.select(
        view.join_key,
        F.timestamp_millis(t).alias(FEATURE_TIME),
        F.to_date(F.timestamp_millis(t - F.lit(1))).alias("date"),
        *[F.col(f"`{f.name}`") for f in view.features],
    )


def write_days(frame: DataFrame, table: Path, first: date, last: date) -> None:
    """Replace the partitions ``first..last`` of ``table`` with ``frame``."""
    (
        frame.write.format("delta")
        .mode("overwrite")
        .partitionBy("date")
        .option("replaceWhere", f"date >= '{first}' AND date <= '{last}'")
        .option("userMetadata", json.dumps({COMPUTED: [str(first), str(last)]}))
        .save(str(table))
    )


def optimize(spark: SparkSession, table: Path, key: str, first: date, last: date) -> None:
    """Compact the partitions ``first..last`` and Z-order them by ``key``."""
    spark.sql(f"OPTIMIZE delta.`{table}` WHERE date >= '{first}' AND date <= '{last}' ZORDER BY (`{key}`)")


def run_view(
    spark: SparkSession,
    bronze: DataFrame,
    view: PlanView,
    source: PlanSource,
    lake: Path,
    days: Sequence[date],
    chunk_days: int = 7,
    zorder: bool = True,
    progress: Callable[[DayRun], None] | None = None,
    full: bool = False,
    healed: bool = False,
) -> list[DayRun]:
    """Compute and write ``view`` for ``days`` (consecutive), ``chunk_days`` at a time.

    A tiled view (:func:`~headwater.pipelines.offline.tiles.view_tiled`) first tiles the days its
    window needs whose bronze is new or changed (:func:`~headwater.pipelines.offline.tile_table.retile`),
    then merges its values from the tiles; ``full``: values computed from ``bronze`` and every needed
    day re-tiled. Other views are always computed from ``bronze``. ``healed``: the healed values of a
    ``late: heal`` view (late rows counted), into its healed table and tiles (:mod:`.heal`).
    """
    from headwater.pipelines.offline.tile_table import needed_days, retile, tiled_values
    from headwater.pipelines.offline.tiles import view_tiled

    table = healed_path(lake, view.name) if healed else feature_path(lake, view.name)
    tiles = (healed_tiles_path if healed else tiles_path)(lake, view.name, view.version)
    tiled = view_tiled(view)
    done: set[date] = set()  # days re-tiled by this run (a --full backfill tiles each day once)
    runs: list[DayRun] = []
    for s in range(0, len(days), chunk_days):
        chunk = days[s : s + chunk_days]
        started, cpu0 = time.monotonic(), tree_cpu_s()
        retiled: list[date] = []
        if tiled:
            needed = [d for d in needed_days(view, chunk[0], chunk[-1]) if d not in done]
            retiled = retile(spark, bronze, view, source, tiles, needed, full, with_late=healed)
            done.update(retiled if full else ())
        if tiled and not full:
            at = day_boundaries(chunk[0], chunk[-1])
            frame = feature_rows(tiled_values(spark, view, tiles, at, chunk[0]), view)
        else:
            frame = daily_values(bronze, view, source, chunk[0], chunk[-1], with_late=healed)
        write_days(frame, table, chunk[0], chunk[-1])
        if zorder:
            optimize(spark, table, view.join_key, chunk[0], chunk[-1])
        rows = _rows_written(spark, table)
        cpu1 = tree_cpu_s()
        cpu = cpu1 - cpu0 if cpu0 is not None and cpu1 is not None else None
        run = DayRun(
            view.name, chunk[0], chunk[-1], rows, time.monotonic() - started, cpu, tiled, tuple(retiled)
        )
        runs.append(run)
        if progress is not None:
            progress(run)
    return runs


REPORTED_RUNS = 30
"""The runs of a view its reported-cost file keeps (the newest)."""


def record_cpu(folder: Path, run: DayRun) -> Path | None:
    """Add ``run``'s CPU to ``folder/<view>.json`` (``headwater costs`` reads it as the view's reported cost).

    The file keeps the newest :data:`REPORTED_RUNS` runs: days computed, CPU and wall seconds, when.
    A run without a CPU figure (no /proc) is not recorded (None).
    """
    from datetime import UTC, datetime

    if run.cpu_s is None:
        return None
    path = folder / f"{run.view}.json"
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        runs = list(doc["runs"]) if isinstance(doc, dict) and isinstance(doc.get("runs"), list) else []
    except (OSError, ValueError):  # none yet, or unreadable: start over
        runs = []
    runs.append({
        "first": str(run.first), "last": str(run.last), "days": (run.last - run.first).days + 1,
        "cpu_s": round(run.cpu_s, 3), "seconds": round(run.seconds, 3),
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
    })  # fmt: skip
    folder.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(
        json.dumps({"view": run.view, "runs": runs[-REPORTED_RUNS:]}, indent=1) + "\n", encoding="utf-8"
    )
    tmp.replace(path)
    return path


def tree_cpu_s() -> float | None:
    """Return the CPU seconds (user + system) of this process and every process below it (None: no /proc).

    In a local session the Spark JVM and its Python workers are this driver's descendants, so a
    chunk's delta is the view's whole cost; on a cluster the executors run elsewhere and only the
    driver's share is seen. The views run one after the other, so each delta is one view's.
    """
    import os

    proc = Path("/proc")
    if not (proc / "self" / "stat").is_file():
        return None
    tick = os.sysconf("SC_CLK_TCK")
    parent: dict[int, int] = {}
    cpu: dict[int, float] = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # the process ended meanwhile
            continue
        parent[int(entry.name)] = int(fields[1])
        cpu[int(entry.name)] = (int(fields[11]) + int(fields[12])) / tick
    mine, total = {os.getpid()}, 0.0
    grew = True
    while grew:
        grew = False
        for pid, ppid in parent.items():
            if ppid in mine and pid not in mine:
                mine.add(pid)
                grew = True
    for pid in mine:
        total += cpu.get(pid, 0.0)
    return total


def _rows_written(spark: SparkSession, table: Path) -> int:
    """Rows added by the table's last write (from the Delta log's operation metrics)."""
    from delta.tables import DeltaTable

    history = DeltaTable.forPath(spark, str(table)).history()
    row = history.where(history.operation == "WRITE").orderBy(history.version.desc()).limit(1).collect()
    metrics = row[0]["operationMetrics"] if row else None
    return int(metrics.get("numOutputRows", 0)) if metrics else 0
