"""Late events healed: the corrected values of a ``late: heal`` view, beside the served ones.

The served table of a view (``features/<view>``) drops the rows landed ``late``, as the streaming
tiers do, so it holds what was served and the as-served training set reads it. A ``late: heal``
view also keeps ``features_healed/<view>`` (same columns: entity, ``event_time`` T, ``date``, the
features; its tiles in ``tiles_healed/``), computed with the late rows counted: what the values
would have been had every event arrived in time. ``training-set --values as-corrected`` reads it.

Each ``headwater run offline`` of such a view, after the served days (:func:`heal_view`):

1. finds the bronze days whose files changed since the last healed run (fingerprints per bronze
   day in ``_headwater_bronze.json`` beside the healed table, the tiles' rule,
   :func:`~headwater.pipelines.offline.tile_table.day_fingerprints`); no record yet: none;
2. adds every day already healed whose window reaches a changed day (:func:`touched_days`: a late
   event of day C changes the values of days C .. C + reach), so an old day is healed when its
   late events land, without ``--backfill``;
3. computes the run's days and those in runs of consecutive days (``run_view(healed=True)``);
4. records the fingerprints, after the writes (a crash before it only recomputes those days again).

:func:`heal_online` writes the newest healed day to the online store through the store's write
(write.lua): a key holding a newer event time keeps its value (``kept``: never an older value over
a newer one), a key at the same T with another value is rewritten (``healed``), the same value is
``unchanged``. The entities written are those with a row on the newest healed day, i.e. with an
event in the view's longest window: the ones the daily job keeps live.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import date, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from headwater.pipelines.offline.job import DayRun, computed_days, reach_days, run_view
from headwater.pipelines.offline.lake import healed_path, is_delta_table
from headwater.pipelines.offline.materialize import MaterializeError, write_latest
from headwater.pipelines.offline.tile_table import day_fingerprints, read_fingerprints, write_fingerprints
from headwater.pipelines.store import OnlineStore
from headwater.registry.plans import PlanSource, PlanView

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

HEAL = "heal"
BRONZE_MANIFEST = "_headwater_bronze.json"
"""Beside the healed table: the bronze fingerprint of each day as of the last healed run."""


def heals(view: PlanView) -> bool:
    """Whether ``view`` declares ``late: heal`` (it keeps healed values)."""
    return view.late == HEAL


def changed_days(current: Mapping[date, str], recorded: Mapping[str, str] | None) -> set[date]:
    """Return the bronze days whose fingerprint differs from the record (no record: none changed)."""
    if recorded is None:
        return set()
    seen = {date.fromisoformat(d) for d in recorded} | set(current)
    return {d for d in seen if current.get(d, "") != recorded.get(str(d), "")}


def touched_days(changed: Iterable[date], computed: Iterable[date], reach: int) -> list[date]:
    """Return the days of ``computed`` whose values read a ``changed`` day (``D - reach <= C <= D``)."""
    hit = set(changed)
    return sorted(d for d in set(computed) if any(d - timedelta(days=r) in hit for r in range(reach + 1)))


def consecutive(days: Iterable[date]) -> list[list[date]]:
    """Split ``days`` (any order, duplicates allowed) into sorted runs of consecutive days."""
    runs: list[list[date]] = []
    for d in sorted(set(days)):
        if runs and d - runs[-1][-1] == timedelta(days=1):
            runs[-1].append(d)
        else:
            runs.append([d])
    return runs


def read_record(table: Path) -> dict[str, str] | None:
    """Return the recorded bronze fingerprints (None: no record, or unreadable: nothing counts as changed)."""
    return read_fingerprints(table / BRONZE_MANIFEST)


def write_record(table: Path, current: Mapping[date, str]) -> None:
    """Record the fingerprints (atomically: a torn file would make every day look changed)."""
    write_fingerprints(table / BRONZE_MANIFEST, {str(d): fp for d, fp in current.items()})


@dataclass(frozen=True)
class HealRun:
    """One healed run of a view: the days the run asked for, those healed again, what was written."""

    view: str
    days: tuple[date, ...]
    rehealed: tuple[date, ...]
    """Days computed before whose window a changed bronze day reaches (late events landed since)."""
    runs: tuple[DayRun, ...]

    @property
    def rows(self) -> int:
        """Rows written to the healed table."""
        return sum(r.rows for r in self.runs)


def heal_view(
    spark: SparkSession,
    bronze: DataFrame,
    view: PlanView,
    source: PlanSource,
    lake: Path,
    days: Sequence[date],
    chunk_days: int = 7,
    zorder: bool = True,
    full: bool = False,
) -> HealRun:
    """Compute the healed values of ``view`` for ``days`` and every healed day a late event reached.

    Steps 1-4 of the module docstring; ``full``: from bronze, the healed tiles rebuilt.
    """
    table = healed_path(lake, view.name)
    # Step 1: fingerprints of the bronze this run reads, against the last healed run's
    current = day_fingerprints(bronze)
    exists = is_delta_table(table)
    changed = changed_days(current, read_record(table) if exists else None)
    # Step 2: days healed before whose window reaches a changed day
    before = computed_days(spark, table) if exists else set()
    again = [d for d in touched_days(changed, before, reach_days(view)) if d not in set(days)]
    # Step 3: every day, in runs of consecutive days
    runs: list[DayRun] = []
    for group in consecutive([*days, *again]):
        runs += run_view(spark, bronze, view, source, lake, group, chunk_days, zorder, full=full, healed=True)
    # Step 4: after the writes
    write_record(table, current)
    return HealRun(view.name, tuple(days), tuple(again), tuple(runs))


@dataclass(frozen=True)
class Healed:
    """The newest healed day of a view written to the online store, with what each key did."""

    view: str
    date: date | None
    rows: int
    healed: int
    """Keys rewritten with the healed value (the stored one was older, or at the same T but other)."""
    kept: int
    """Keys that keep their stored value: it has a newer event time (never overwritten by an older)."""
    unchanged: int
    """Keys that already hold the healed value."""
    seconds: float


def heal_online(spark: SparkSession, store: OnlineStore, view: PlanView, lake: Path) -> Healed:
    """Write the newest healed day of ``view`` to the online store; count healed, kept and unchanged keys.

    Raises:
        MaterializeError: ``view`` is not ``late: heal``, or has no healed table yet.
    """
    path = healed_path(lake, view.name)
    if not heals(view):
        msg = (f"view {view.name} ({view.defined_at}) has late: {view.late}; only a late: heal view has "
               "healed values (set late: heal in its YAML and `headwater apply`)")  # fmt: skip
        raise MaterializeError(msg)
    if not is_delta_table(path):
        msg = f"view {view.name}: no healed values at {path}; compute them with `headwater run offline`"
        raise MaterializeError(msg)
    e = write_latest(spark, store, view, lake, path)  # materialize's path: retries, dictionary, chunks
    c = e.counts
    return Healed(view.name, e.date, e.rows, c.written, c.stale, c.unchanged, e.seconds)
