"""The cost model's constants: measured data, one JSON file per tier, read by ``check``.

``<tier>.json`` holds the constants that ``bench/bench_calibrate.py`` (``headwater calibrate``) fitted
from the CPU each tier really spent on a fixed generated stream, with the machine they were measured
on (``/proc/cpuinfo`` model name, cores), the date and the command. This module is the one loader and
the one place for defaults: a constant a file does not give takes the value in :data:`DEFAULTS`, and
the calibration says so (``defaulted``), so a report can tell a measured constant from a guess.

Constants (all per view, see :mod:`headwater.registry.cost` for the formula):

    event_us          CPU us per event the view reads (decode, rules, dedup, key, state round trip)
    agg_us            CPU us per event and feature, by aggregation kind (a ratio: its two operands)
    where_us          CPU us per event and filter evaluated
    pane_us           CPU us per event, feature and extra pane touched (window / slide - 1)
    selectivity       the fraction of events a filtered aggregation updates (not known statically)
    rekey_us          CPU us per event when the view's join key is not the topic's key
    publish_us        CPU us per entity value written at a window boundary
    fixed_cores       CPU cores one view (its operator) burns whatever the rate
    job_fixed_cores   CPU cores one job (one per source and tier: JVM, source, checkpoints) burns
                      whatever the rate and its views; shared by the job's views
    job_event_us      CPU us per event the job reads once for all its views (Kafka, decode); shared
    group_fixed_cores CPU cores one group (the views of a job keyed by one entity: one operator and
                      keyed state) burns whatever the rate; shared by the group's views
    state_pane_bytes  state bytes of one (entity, slice) record besides its aggregations (key, header)
    state_slot_bytes  state bytes of one aggregation in one (entity, slice) record, by kind
    state_dedup_id_bytes state bytes per event id kept for de-duplication (nearline)
    table_row_bytes   offline only: bytes of one row (entity, day) of a feature table per slot
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FOLDER = Path(__file__).resolve().parent
AGG_KINDS = ("count", "sum", "avg", "min", "max", "last", "distinct_count", "top_k")
SCALARS = (
    "event_us",
    "where_us",
    "pane_us",
    "selectivity",
    "rekey_us",
    "publish_us",
    "fixed_cores",
    "job_fixed_cores",
    "job_event_us",
    "group_fixed_cores",
    "state_pane_bytes",
    "state_dedup_id_bytes",
    "table_row_bytes",
)

# The first guesses, used only where a calibration file gives nothing (they say so: ``defaulted``).
DEFAULTS: dict[str, Any] = {
    "event_us": 10.0,
    "agg_us": dict.fromkeys(AGG_KINDS, 1.0),
    "where_us": 0.5,
    "pane_us": 0.0,
    "selectivity": 1.0,
    "rekey_us": 0.0,
    "publish_us": 0.0,
    "fixed_cores": 0.0,
    "job_fixed_cores": 0.0,
    "job_event_us": 0.0,
    "group_fixed_cores": 0.0,
    "state_slot_bytes": {
        "count": 8.0,
        "sum": 8.0,
        "avg": 16.0,
        "min": 8.0,
        "max": 8.0,
        "last": 16.0,
        "distinct_count": 64.0,
        "top_k": 64.0,
    },
    "state_pane_bytes": 64.0,
    "state_dedup_id_bytes": 0.0,
    "table_row_bytes": 8.0,
}


@dataclass(frozen=True)
class Calibration:
    """One tier's cost constants and where they come from.

    Attributes:
        tier: realtime | nearline | offline.
        constants: every constant of the model (file values, defaults filled in).
        defaulted: the constants the file did not give (their values are :data:`DEFAULTS`).
        machine: what the constants were measured on (``model``, ``cores``), empty when never measured.
        measured_at: ISO date of the measurement, empty when never measured.
        command: the command that measured them.
        path: the file read (``None`` when there is no file for the tier).
        measured: per-view CPU and state measured by the calibration run (view name -> figures).
    """

    tier: str
    constants: dict[str, Any]
    defaulted: tuple[str, ...] = ()
    machine: dict[str, Any] = field(default_factory=dict)
    measured_at: str = ""
    command: str = ""
    path: Path | None = None
    measured: dict[str, Any] = field(default_factory=dict)

    def scalar(self, name: str) -> float:
        """Return a scalar constant, e.g. ``event_us``."""
        return float(self.constants[name])

    def per_agg(self, name: str, agg: str) -> float:
        """Return a per-aggregation constant (``agg_us`` or ``state_slot_bytes``) for ``agg``."""
        table = self.constants[name]
        return float(table.get(agg, DEFAULTS[name].get(agg, 0.0)))

    def source_text(self) -> str:
        """Where the constants come from, in one line (printed with every estimate)."""
        if self.path is None:
            return f"{self.tier}: default constants (never calibrated: run bench/bench_calibrate.py)"
        if not self.measured_at:
            return (
                f"{self.path.name}: NOT MEASURED (first guesses; bench_calibrate.py does not run {self.tier})"
            )
        model = self.machine.get("model", "?")
        cores = self.machine.get("cores", "?")
        guessed = f"; defaults for {', '.join(self.defaulted)}" if self.defaulted else ""
        return f"{self.path.name} measured {self.measured_at} on {model} x{cores}{guessed}"


def calibration_path(tier: str, folder: Path | None = None) -> Path:
    """Where the calibration of ``tier`` lives (``registry/calibration/<tier>.json``)."""
    return (folder or FOLDER) / f"{tier}.json"


def parse_calibration(tier: str, data: dict[str, Any], path: Path | None = None) -> Calibration:
    """Build a :class:`Calibration` from a file's JSON, defaults filled in for missing constants.

    Raises:
        ValueError: a constant that is not a number (or a table of numbers), naming the file and key.
    """
    given = data.get("constants", {})
    constants: dict[str, Any] = {}
    defaulted: list[str] = []
    where = path or f"{tier} calibration"
    for name, default in DEFAULTS.items():
        if name not in given:
            constants[name] = default
            defaulted.append(name)
            continue
        value = given[name]
        if isinstance(default, dict):
            if not isinstance(value, dict) or not all(_is_number(v) for v in value.values()):
                msg = f"{where}: constants.{name} must map aggregation kinds to numbers, got {value!r}"
                raise ValueError(msg)
            constants[name] = {**default, **{k: float(v) for k, v in value.items()}}
        elif not _is_number(value):
            msg = f"{where}: constants.{name} must be a number, got {value!r}"
            raise ValueError(msg)
        else:
            constants[name] = float(value)
    return Calibration(
        tier=tier,
        constants=constants,
        defaulted=tuple(defaulted),
        machine=dict(data.get("machine", {})),
        measured_at=str(data.get("measured_at", "")),
        command=str(data.get("command", "")),
        path=path,
        measured=dict(data.get("measured", {})),
    )


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


@functools.cache
def load_calibration(tier: str, folder: Path | None = None) -> Calibration:
    """Return the calibration of ``tier`` (cached): its file, or the defaults when there is none."""
    path = calibration_path(tier, folder)
    if not path.is_file():
        return parse_calibration(tier, {}, None)
    return parse_calibration(tier, json.loads(path.read_text(encoding="utf-8")), path)
