"""The daily tiles of a view in Delta: built from one day of bronze, merged into a day's values.

A tiled view (:func:`headwater.pipelines.offline.tiles.view_tiled`) keeps, per (entity, UTC day),
its partial aggregates (:mod:`.tiles` is the algebra; these are the same partials as Spark columns,
:func:`headwater.pipelines.offline.compute.scalar_partials`, plus one ``map<value, count>`` per
counted column) in ``tiles/<view>/<version>``, partitioned by ``date``. Beside the table,
``_headwater_tiles.json`` records, per tiled day, a fingerprint of the bronze files of that day
(the Delta snapshot's active files of partition ``date=D``): a day whose bronze changed since it
was tiled (rows landed late for an old day) is re-tiled, and that day only.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from datetime import date, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from headwater.pipelines.offline.aggregate import EVENT_MS, Progression, pane_ms
from headwater.pipelines.offline.compute import (
    attach_window_ms,
    combine_partials,
    counted_columns,
    pane_value_counts,
    scalar_partials,
    view_events,
)
from headwater.pipelines.offline.lake import DAY_MS, day_of_ms, day_start_ms, is_delta_table
from headwater.registry.plans import PlanSource, PlanView, PlanWhere

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

MANIFEST = "_headwater_tiles.json"
FIRST_PANE, LAST_PANE = "__first_pane", "__last_pane"
"""A tile's first and last pane (of the view's pane width) holding an event: the rows rule (see
:func:`tiled_values`)."""


def counted(prefix: str) -> str:
    """Return the tile column of a counted column's per-value counts."""
    return f"{prefix}__values"


def day_fingerprints(bronze: DataFrame) -> dict[date, str]:
    """Per ``date`` partition of a bronze table, a hash of its active files (the Delta log only)."""
    files: dict[date, list[str]] = {}
    for path in bronze.inputFiles():
        part = next((p for p in path.split("/") if p.startswith("date=")), None)
        if part is not None:
            files.setdefault(date.fromisoformat(part[5:]), []).append(path.rsplit("/", 1)[-1])
    return {d: hashlib.sha1("\n".join(sorted(names)).encode()).hexdigest() for d, names in files.items()}


def read_fingerprints(file: Path) -> dict[str, str] | None:
    """Return the per-day fingerprints recorded in ``file`` (None: no file, or not a record of them)."""
    try:
        doc = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    days = doc.get("days") if isinstance(doc, dict) else None
    return {str(k): str(v) for k, v in days.items()} if isinstance(days, dict) else None


def write_fingerprints(file: Path, days: Mapping[str, str]) -> None:
    """Record per-day fingerprints in ``file`` atomically (a torn file would read as no record)."""
    tmp = file.with_name(file.name + ".tmp")
    tmp.write_text(json.dumps({"days": dict(sorted(days.items()))}, indent=1) + "\n", encoding="utf-8")
    tmp.replace(file)


def read_manifest(table: Path) -> dict[str, str]:
    """Return the recorded fingerprint of each tiled day (none yet, unreadable: empty: all re-tiled)."""
    return read_fingerprints(table / MANIFEST) or {}


def write_manifest(table: Path, days: dict[str, str]) -> None:
    """Record the fingerprints (atomically: a crash before it only re-tiles those days again)."""
    write_fingerprints(table / MANIFEST, days)


def needed_days(view: PlanView, first: date, last: date) -> list[date]:
    """Return the days whose tiles the values of ``first..last`` read (longest window plus its slide)."""
    # a day's last pane may be attached up to reach after it: one day more than the events' reach
    lo = day_of_ms(day_start_ms(first + timedelta(days=1)) - attach_window_ms(view)) - timedelta(days=1)
    return [lo + timedelta(days=i) for i in range((last - lo).days + 1)]


def build_tiles(events: DataFrame, view: PlanView) -> DataFrame:
    """Return the tiles of ``events`` (:func:`view_events`): one row per (entity, day) with an event."""
    from pyspark.sql import functions as F

    key, pane = view.join_key, pane_ms(view)
    days = events.withColumn("pane_start", F.floor(F.col(EVENT_MS) / F.lit(DAY_MS)) * F.lit(DAY_MS))
    own_pane = F.floor(F.col(EVENT_MS) / F.lit(pane)) * F.lit(pane)
    tiles = days.groupBy(key, "pane_start").agg(
        *scalar_partials(view), F.min(own_pane).alias(FIRST_PANE), F.max(own_pane).alias(LAST_PANE)
    )
    for prefix, field, where in counted_columns(view):
        per_value = pane_value_counts(days, key, field, where)
        maps = per_value.groupBy(key, "pane_start").agg(
            F.map_from_entries(F.collect_list(F.struct("value", "c"))).alias(counted(prefix))
        )
        tiles = tiles.join(maps, [key, "pane_start"], "left")
    return tiles.withColumn("date", F.to_date(F.timestamp_millis(F.col("pane_start"))))


def retile(
    spark: SparkSession, bronze: DataFrame, view: PlanView, source: PlanSource, table: Path,
    days: Sequence[date], full: bool = False, with_late: bool = False,
) -> list[date]:  # fmt: skip
    """Tile the days among ``days`` whose bronze changed since tiled (``full``: all of them); return them.

    ``with_late``: the tiles count the ``late`` rows too (the healed tiles of a ``late: heal`` view).
    """
    from pyspark.sql import functions as F

    current = day_fingerprints(bronze)
    recorded = read_manifest(table) if is_delta_table(table) else {}
    stale = [d for d in days if full or recorded.get(str(d)) != current.get(d, "")]
    if not stale:
        return []
    scoped = bronze.where(F.col("date").isin([F.lit(d) for d in stale]))
    events = view_events(scoped, view, source, with_late)
    in_days = F.floor(F.col(EVENT_MS) / F.lit(DAY_MS)).isin([day_start_ms(d) // DAY_MS for d in stale])
    frame = build_tiles(events.where(in_days), view)
    listed = ", ".join(f"'{d}'" for d in stale)
    (
        frame.write.format("delta")
        .mode("overwrite")
        .partitionBy("date")
        .option("replaceWhere", f"date IN ({listed})")
        .save(str(table))
    )
    write_manifest(table, {**recorded, **{str(d): current.get(d, "") for d in stale}})
    return stale


def tiled_values(spark: SparkSession, view: PlanView, table: Path, at: Progression, first: date) -> DataFrame:
    """Values of ``view`` per (entity, T) at the boundaries ``at`` (days ``first..``), merged from its tiles.

    A row exists where the full computation has one: the entity has a pane (of the view's width)
    attached to T, i.e. ``first pane + pane <= T <= last pane + reach`` for one of its tiles.
    """
    from pyspark.sql import functions as F

    last = day_of_ms(at.last_ms - 1)
    wanted = needed_days(view, first, last)
    tiles = spark.read.format("delta").load(str(table))
    tiles = tiles.where((F.col("date") >= F.lit(wanted[0])) & (F.col("date") <= F.lit(wanted[-1])))
    key, pane, reach = view.join_key, pane_ms(view), attach_window_ms(view)

    def counts(prefix: str, field: str | None, where: PlanWhere | None) -> DataFrame:
        return tiles.select(key, "pane_start", F.explode(F.col(counted(prefix))).alias("value", "c"))

    t = F.col("event_time_ms")
    live = (F.col(FIRST_PANE) + F.lit(pane) <= t) & (t <= F.col(LAST_PANE) + F.lit(reach))
    return combine_partials(tiles, counts, view, DAY_MS, at, live, reach + DAY_MS)
