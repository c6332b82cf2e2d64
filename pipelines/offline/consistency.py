"""Online/offline consistency: online values against an offline recomputation at their own boundary.

Steps: 1. sample entity ids of each view from its own source's bronze table; 2. read their online vectors
(one ``MGET``) and keep those found, with their event time T (the boundary they were computed
for); 3. recompute the view in Spark for exactly those (entity, T) pairs; 4. pack both the same
way and compare slot by slot (NaN equals NaN; float32 tolerance).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from headwater.pipelines.offline.aggregate import BOUNDARY
from headwater.pipelines.offline.arrow_io import arrow_to_spark, spark_to_arrow, staging_dir
from headwater.pipelines.offline.compute import attach_window_ms, compute_view, view_events
from headwater.pipelines.offline.source_columns import time_between
from headwater.pipelines.offline.vectors import pack
from headwater.pipelines.store import OnlineStore
from headwater.pipelines.windows import RedisDictionary, compile_view, slot_names, view_layout
from headwater.registry.plans import PlanSource, PlanView

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

REL_TOL = 1e-4
ABS_TOL = 1e-4


@dataclass
class ViewConsistency:
    """Comparison of one view: sampled, found online, and mismatches per slot."""

    view: str
    sampled: int
    found: int
    mismatches: dict[str, int] = field(default_factory=dict)
    examples: list[str] = field(default_factory=list)

    @property
    def compared_values(self) -> int:
        """Slot values compared."""
        return self.found * len(self.mismatches)

    @property
    def mismatch_rate(self) -> float:
        """Share of compared slot values that differ."""
        total = self.compared_values
        return sum(self.mismatches.values()) / total if total else 0.0

    def slot_rates(self) -> dict[str, float]:
        """Mismatch rate per feature slot (share of the entities found online)."""
        return {slot: n / self.found if self.found else 0.0 for slot, n in self.mismatches.items()}

    def to_json(self) -> dict[str, object]:
        """Return the result as a JSON object (rates per view and per feature slot)."""
        return {"view": self.view, "sampled": self.sampled, "found": self.found,
                "mismatch_rate": self.mismatch_rate, "mismatches": self.mismatches,
                "feature_mismatch_rates": self.slot_rates(), "examples": self.examples}  # fmt: skip

    def report_lines(self) -> list[str]:
        """Human-readable lines: the view's rate, then each feature slot's rate, then examples."""
        lines = [f"{self.view}: {self.found}/{self.sampled} online, mismatch rate {self.mismatch_rate:.4%}"]
        lines += [f"  {slot}: {rate:.4%} ({self.mismatches[slot]}/{self.found})"
                  for slot, rate in self.slot_rates().items()]  # fmt: skip
        lines += [f"  e.g. {example}" for example in self.examples]
        return lines


def sample_entities(bronze: DataFrame, view: PlanView, sample: int, seed: int = 7) -> list[str]:
    """Up to ``sample`` entity ids of ``view`` seen in the bronze table's latest day."""
    from pyspark.sql import functions as F

    last = bronze.agg(F.max("date").alias("d")).collect()[0]["d"]
    ids = (
        bronze.where(F.col("date") == F.lit(last))
        .select(view.join_key)
        .where(F.col(view.join_key).isNotNull())
    )
    rows = ids.distinct().orderBy(F.xxhash64(F.col(view.join_key), F.lit(seed))).limit(sample).collect()
    return [str(r[view.join_key]) for r in rows]


def mismatched(online: npt.NDArray[np.float32], offline: npt.NDArray[np.float32]) -> npt.NDArray[np.bool_]:
    """Per value: differ beyond float32 tolerance (NaN only equals NaN)."""
    both_nan = np.isnan(online) & np.isnan(offline)
    close = np.isclose(online, offline, rtol=REL_TOL, atol=ABS_TOL)
    differ: npt.NDArray[np.bool_] = ~(both_nan | close)
    return differ


def check_view(
    spark: SparkSession,
    bronze: DataFrame,
    store: OnlineStore,
    view: PlanView,
    source: PlanSource,
    lake: Path,
    sample: int,
) -> ViewConsistency:
    """Compare ``sample`` entities of ``view`` online and offline (``bronze``: its ``source``'s table)."""
    spec = compile_view(view)
    layout = view_layout(spec)
    entities = sample_entities(bronze, view, sample)
    read = store.read_batch(layout, entities)
    result = ViewConsistency(
        view.name, len(entities), int(read.found.sum()), dict.fromkeys(slot_names(spec), 0)
    )
    if not result.found:
        return result
    found = np.flatnonzero(read.found)
    targets = pa.table({view.join_key: [entities[i] for i in found], BOUNDARY: read.event_time_ms[found]})
    lo, hi = int(targets.column(BOUNDARY).to_numpy().min()), int(targets.column(BOUNDARY).to_numpy().max())
    events = view_events(bronze.where(time_between(source, lo - attach_window_ms(view), hi)), view, source)
    with staging_dir(lake / "_staging") as folder:
        at = arrow_to_spark(spark, targets, folder / "targets")
        values = spark_to_arrow(compute_view(events, view, at), folder)
    order = {
        (str(k), int(t)): i
        for i, (k, t) in enumerate(
            zip(values.column(view.join_key).to_pylist(), values.column(BOUNDARY).to_pylist(), strict=True)
        )
    }
    rows = [order[(entities[i], int(read.event_time_ms[i]))] for i in found]
    offline = pack(spec, values.take(pa.array(rows)), RedisDictionary(store.client, store.namespace).ids)
    diff = mismatched(read.values[found], offline)
    for j, slot in enumerate(slot_names(spec)):
        result.mismatches[slot] = int(diff[:, j].sum())
    for r, j in zip(*np.nonzero(diff), strict=True):
        if len(result.examples) < 5:
            result.examples.append(
                f"{entities[found[r]]} at {int(read.event_time_ms[found[r]])}: {layout.features[j]} "
                f"online {read.values[found[r], j]} offline {offline[r, j]}"
            )
    return result
