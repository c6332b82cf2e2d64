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
    table_file_column_bytes offline only: bytes per column of a day's Parquet file (footer, column
                      chunk and page headers, statistics, dictionaries), whatever its rows
    table_bit_bytes   offline only: bytes per bit of a count's entropy in one row (Parquet packs
                      dictionary indexes: a count spread over more values costs more bits)
    table_value_bytes offline only: bytes of one real value (sum, avg, min, max, last, a double) in a
                      row whose window held an event for it (an empty window: a null, nothing)
    table_entry_bytes offline only: bytes of one top_k entry (value, share) in a row
    run_counter_s     offline only: CPU seconds a run of a view with a counter map (distinct_count,
                      top_k: its own count-per-value pipeline, a shuffle and a join) pays whatever its
                      events, on top of ``fixed_cores`` (a day's run: fixed_cores x 86,400 s)
    run_window_s      offline only: CPU seconds a run pays per distinct window length of the view
    reads_window      offline only: 1 = each day's run is charged every event of the window it reads
                      (``events_for`` reads the longest window + slide of bronze, ``cost.days_read``),
                      0 = each event once (what a one-day calibration stream measures)
    tile_row_us       offline only, with ``reads_window``: CPU us per tile row (entity, day) a tiled
                      view's daily run merges (``cost.tile_rows_per_day``: it reads one day of events
                      and its window's tiles, not the window's events); measured by
                      ``bench/bench_offline_tiles.py``, its command, date and load in the file's
                      ``provenance.tile_row_us``

Realtime state follows the operator's byte layout (``KeyStateSerializer`` format 2), so it has terms
per live entity besides the slices (0 elsewhere):

    state_entity_bytes        per live entity: Flink's entry (namespace, key length) and the state's
                              header (format, boundary, next change, array and map sizes); the key's
                              own bytes are added
    state_view_bytes          per live entity and view: the last value's header (change, pending, size)
    state_value_slot_bytes    per live entity and online slot: the last value (float + text marker)
    state_text_bytes          per live entity and text slot (a top_k name, a text ``last``): its text
    state_running_bytes       per live entity and aggregation, by kind: the running accumulator
    state_running_event_bytes per live entity, aggregation and event of its window, by kind: what a
                              running accumulator keeps per value (min/max: a multiset; distinct_count,
                              top_k: a counter map)

Two measured properties of the calibration stream (not constants: a registry declares neither) shape
realtime state, which holds one record per live entity and one slice per (entity, slide) with events:

    where_shares    ``[{"where": text, "share": fraction, "bursts": {key: events}}]``: the share of
                    events each filter keeps (a filter not listed takes ``selectivity``), and per join
                    key the events of one entity that come together (one run: a feed page's
                    impressions share a user and a moment, so they fill one slice)
    stream_profile  ``{source: {key: {"deciles": [10 event shares], "burst": events}}}``: how unevenly
                    events spread over entities (the share of events of each tenth of the entities,
                    most active first) and the burst of all its events; without one, every entity is
                    as active as the others and every event comes alone (an upper bound)
    pane_bursts     ``[{"source": s, "where": [filter texts], "key": k, "slides": {"60": events}}]``
                    (nearline): the events that one visit of an entity (one session: its events in
                    one pane of that slide) brings to a pane record whose filters are ``where`` (all
                    of them, their union; ``[]``: every event). A session's events are seconds apart,
                    so a minute's pane holds several of one visit: the record count follows visits,
                    not events. Measured per filter set of the example views' pane routes; a set or
                    slide not measured falls back to the run burst above (more records: the upper
                    side), a slide between two measured ones takes the shorter one's
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from headwater.registry.aggs import AGG_NAMES
from headwater.registry.expr import Expr, ExprError, parse, to_json

FOLDER = Path(__file__).resolve().parent
AGG_KINDS = tuple(name for name in AGG_NAMES if name != "ratio")
"""The aggregations with a cost of their own (a ratio costs its two operands)."""
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
    "state_entity_bytes",
    "state_view_bytes",
    "state_value_slot_bytes",
    "state_text_bytes",
    "reads_window",
    "table_file_column_bytes",
    "table_bit_bytes",
    "table_value_bytes",
    "table_entry_bytes",
    "run_counter_s",
    "run_window_s",
    "tile_row_us",
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
    "state_entity_bytes": 0.0,
    "state_view_bytes": 0.0,
    "state_value_slot_bytes": 0.0,
    "state_text_bytes": 0.0,
    "reads_window": 0.0,
    "table_file_column_bytes": 0.0,
    "table_bit_bytes": 0.0,
    "table_value_bytes": 0.0,
    "table_entry_bytes": 0.0,
    "run_counter_s": 0.0,
    "run_window_s": 0.0,
    "tile_row_us": 0.0,
    "state_running_bytes": dict.fromkeys(AGG_KINDS, 0.0),
    "state_running_event_bytes": dict.fromkeys(AGG_KINDS, 0.0),
}


@dataclass(frozen=True)
class StreamProfile:
    """How a source's events spread over one join key's entities (measured on the calibration stream).

    Attributes:
        deciles: the share of events of each tenth of the entities, most active first (sums to 1).
        burst: events of one entity that come one right after the other (1: each alone).
    """

    deciles: tuple[float, ...]
    burst: float = 1.0


EVEN = StreamProfile(deciles=(0.1,) * 10)
"""No profile measured: every entity equally active, no bursts (the state's upper bound)."""


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
        where_shares: the share of the calibration stream's events a filter keeps, by the filter's
            canonical form (:func:`where_key`); filters not listed take the ``selectivity`` constant.
    """

    tier: str
    constants: dict[str, Any]
    defaulted: tuple[str, ...] = ()
    machine: dict[str, Any] = field(default_factory=dict)
    measured_at: str = ""
    command: str = ""
    path: Path | None = None
    measured: dict[str, Any] = field(default_factory=dict)
    where_shares: dict[str, float] = field(default_factory=dict)
    where_bursts: dict[tuple[str, str], float] = field(default_factory=dict)
    profiles: dict[tuple[str, str], StreamProfile] = field(default_factory=dict)
    pane_bursts: dict[tuple[tuple[str, ...], str], tuple[tuple[float, float], ...]] = field(
        default_factory=dict
    )

    def share(self, where: Expr | None) -> float:
        """Return the share of events ``where`` keeps: measured on the stream, else ``selectivity``."""
        if where is None:
            return 1.0
        return self.where_shares.get(where_key(where), self.scalar("selectivity"))

    def burst(self, where: Expr | None, stream: tuple[str, str] | None) -> float:
        """Return the events of one entity that come together among those ``where`` keeps (1: alone)."""
        if stream is None:
            return 1.0
        if where is None:
            profile = self.profiles.get(stream)
            return profile.burst if profile else 1.0
        return self.where_bursts.get((where_key(where), stream[1]), 1.0)

    def pane_burst(
        self, filters: list[Expr | None], stream: tuple[str, str] | None, slide_s: float
    ) -> float | None:
        """Return the events one visit brings to a record of ``filters`` (their union) and ``slide_s``.

        ``None`` where the calibration stream did not measure that filter set and key (the caller
        falls back to the run burst). A slide between measured ones takes the longest measured slide
        not above it (bursts grow with the pane: the smaller burst, the more records, the upper side);
        one below every measured slide is not measured.
        """
        if stream is None:
            return None
        keys = () if any(w is None for w in filters) else tuple(sorted({where_key(w) for w in filters if w}))
        table = self.pane_bursts.get((keys, stream[1]))
        if not table:
            return None
        below = [b for s, b in table if s <= slide_s]
        return below[-1] if below else None

    def profile(self, stream: tuple[str, str] | None) -> StreamProfile:
        """Return how events spread over the entities of ``(source, join key)`` (even: not measured)."""
        return self.profiles.get(stream, EVEN) if stream else EVEN

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


def where_key(where: Expr) -> str:
    """Return a filter's canonical form (its AST as sorted JSON): one key however it is spelled."""
    return json.dumps(to_json(where), sort_keys=True, separators=(",", ":"))


def parse_where_shares(data: Any, where: object) -> dict[str, float]:
    """Read a file's ``where_shares`` list (``[{"where": text, "share": fraction}]``) by canonical filter.

    Raises:
        ValueError: an entry without a parseable ``where`` or a share outside [0, 1], naming the file.
    """
    out: dict[str, float] = {}
    for i, item in enumerate(data or []):
        text, share = (item.get("where"), item.get("share")) if isinstance(item, dict) else (None, None)
        if not isinstance(text, str) or not isinstance(share, int | float) or not 0 <= share <= 1:
            msg = f"{where}: where_shares[{i}] must be {{where: filter text, share: 0..1}}, got {item!r}"
            raise ValueError(msg)
        try:
            out[where_key(parse(text))] = float(share)
        except ExprError as e:
            msg = f"{where}: where_shares[{i}]: cannot parse the filter {text!r}: {e}"
            raise ValueError(msg) from e
    return out


def parse_where_bursts(data: Any, where: object) -> dict[tuple[str, str], float]:
    """Read the ``bursts`` of a file's ``where_shares`` entries: ``{(canonical filter, key): events}``.

    Raises:
        ValueError: a burst that is not a number >= 1, naming the file.
    """
    out: dict[tuple[str, str], float] = {}
    for i, item in enumerate(data or []):
        bursts = item.get("bursts", {}) if isinstance(item, dict) else {}
        for key, value in bursts.items():
            if not _is_number(value) or float(value) < 1:
                msg = f"{where}: where_shares[{i}].bursts.{key} must be a number >= 1, got {value!r}"
                raise ValueError(msg)
            out[(where_key(parse(item["where"])), key)] = float(value)
    return out


def parse_profiles(data: Any, where: object) -> dict[tuple[str, str], StreamProfile]:
    """Read a file's ``stream_profile``: ``{source: {key: {"deciles": [...], "burst": n}}}``.

    Raises:
        ValueError: deciles that are not 10 non-negative shares summing to 1, or a burst below 1.
    """
    out: dict[tuple[str, str], StreamProfile] = {}
    for source, keys in (data or {}).items():
        for key, prof in keys.items():
            deciles = prof.get("deciles") if isinstance(prof, dict) else None
            burst = prof.get("burst", 1.0) if isinstance(prof, dict) else None
            ok = (
                isinstance(deciles, list)
                and len(deciles) == 10
                and all(_is_number(x) and x >= 0 for x in deciles)
                and abs(sum(deciles) - 1) < 1e-3
                and _is_number(burst)
                and float(burst) >= 1  # type: ignore[arg-type]
            )
            if not ok:
                msg = (
                    f"{where}: stream_profile.{source}.{key} must be {{deciles: 10 shares summing to 1, "
                    f"burst: a number >= 1}}, got {prof!r}"
                )
                raise ValueError(msg)
            out[(source, key)] = StreamProfile(tuple(float(x) for x in deciles), float(burst))  # type: ignore[union-attr, arg-type]
    return out


def parse_pane_bursts(
    data: Any, where: object
) -> dict[tuple[tuple[str, ...], str], tuple[tuple[float, float], ...]]:
    """Read a file's ``pane_bursts``: ``{(sorted canonical filters, key): ((slide s, events), ...)}``.

    Raises:
        ValueError: an entry without a list of filters, a key and slides of numbers >= 1, naming the file.
    """
    out: dict[tuple[tuple[str, ...], str], tuple[tuple[float, float], ...]] = {}
    for i, item in enumerate(data or []):
        texts = item.get("where") if isinstance(item, dict) else None
        key = item.get("key") if isinstance(item, dict) else None
        slides = item.get("slides") if isinstance(item, dict) else None
        ok = (
            isinstance(texts, list)
            and all(isinstance(t, str) for t in texts)
            and isinstance(key, str)
            and isinstance(slides, dict)
            and all(_is_number(v) and float(v) >= 1 for v in slides.values())
        )
        try:
            points = tuple(sorted((float(s), float(b)) for s, b in slides.items())) if ok else ()  # type: ignore[union-attr]
        except ValueError:
            ok = False
        if not ok or any(s <= 0 for s, _ in points):
            msg = (
                f"{where}: pane_bursts[{i}] must be {{where: [filter texts], key: join key, slides: "
                f"{{seconds: events >= 1}}}}, got {item!r}"
            )
            raise ValueError(msg)
        try:
            keys = tuple(sorted({where_key(parse(t)) for t in texts}))  # type: ignore[union-attr]
        except ExprError as e:
            msg = f"{where}: pane_bursts[{i}]: cannot parse a filter of {texts!r}: {e}"
            raise ValueError(msg) from e
        out[(keys, key)] = points  # type: ignore[index]
    return out


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
        where_shares=parse_where_shares(data.get("where_shares"), where),
        where_bursts=parse_where_bursts(data.get("where_shares"), where),
        profiles=parse_profiles(data.get("stream_profile"), where),
        pane_bursts=parse_pane_bursts(data.get("pane_bursts"), where),
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
