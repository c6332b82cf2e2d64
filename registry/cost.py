"""The cost model: a view's CPU-hours per day, its state and its online memory, from measured constants.

CPU (per view, on its tier; the constants come from ``registry/calibration/<tier>.json``)::

    us/event  = event_us                                      every event the view reads
              + rekey_us                       if the view's join key is not the topic's key
              + where_us x filters                            each filter is evaluated per event
              + sum over aggregations a (a ratio: its two operands) of
                s(a) x (agg_us[kind(a)] + pane_us x (panes - 1))
                  with s(a) = the share of events a's filter keeps (measured on the calibration
                  stream, ``where_shares``; else ``selectivity``), 1 unfiltered; panes = window / slide
    writes/day = min(entities, rate x slide) x 86,400 / slide     (each feature's slide; the shortest)
    marginal  = (events read/day x us/event + writes/day x publish_us + tile rows/day x tile_row_us)
                / 1e6 / 3,600 + fixed_cores x 24
              + (run_counter_s if a counter map + run_window_s x distinct windows) / 3,600   (offline: a
                daily run's shape-bound seconds, :func:`run_fixed_s`)
    job share = (job_fixed_cores + rate x job_event_us / 1e6) / views in the job x 24
              + group_fixed_cores / views in the group x 24
    CPU-h/day = marginal + job share

Events read a day (offline, whose calibration says ``reads_window``): a tiled view (every window
whole days, :func:`windows_tiled`) reads one new day of bronze and merges its daily tiles, ``tile
rows/day`` = min(entities, events a day) x (window reach + 1) days (:func:`tile_rows_per_day`); any
other view re-reads its window (:func:`days_read` days of events). The streaming tiers read each
event once.

Per-view attribution: a tier runs one job per source (realtime: one Flink job reads the source once
and feeds every view; one operator per group, the views keyed by one entity). The job's fixed cost
(JVM, source, checkpoints, decode per event) is paid once whatever its views, so a view is charged
its marginal cost (what adding it to the job adds: its aggregations, its per-event work) plus an
equal share of its job's and its group's fixed cost (:class:`JobShare`: the views that share them).
The views of a job together are charged exactly the job's estimate; a view alone in its job carries
all of it.

Streaming state holds records only where events are: a record per (entity, pane) that an event hit
(one of the view's filters kept it: ``hit``, each filter's share measured on the calibration stream,
``where_shares``). :func:`pane_occupancy` counts them: the events of a window come in runs
(``burst``: a feed page's impressions share a user and a moment, so one pane) spread over the
entities as the stream's profile says (``stream_profile``: each tenth of the entities its share of
the events); an entity with ``r`` runs in a window of ``panes`` panes holds ``panes x (1 - exp(-r /
panes))`` of them, and has state at all with probability ``1 - exp(-r)``.

State (nearline: RocksDB, one record per view, entity and pane start of each slide)::

    bytes = records x state_pane_bytes + sum over aggregations a of records holding a x state_slot_bytes[a]
          + rate x dedup window x state_dedup_id_bytes  (every event's id: out-of-orderness, lateness, bucket)

State (realtime: Flink keyed state, ``KeyStateSerializer``'s layout: one record per live entity of a
group, one slice per (entity, slide) an event hit; an entity's record goes when its last slice
leaves the longest window)::

    bytes = live x (state_entity_bytes + key + state_view_bytes + slots x state_value_slot_bytes
                    + text slots x state_text_bytes + sum over a of state_running_bytes[a])
          + sum over a of rate x share(a) x window(a) x state_running_event_bytes[a]  (multiset/map entries)
          + slices x (state_pane_bytes + aggregations)                   (a slice, a null per feature)
          + sum over a of slices holding a x (state_slot_bytes[a] - 1)  (a's partials)
          + rate x hit x longest window x state_dedup_id_bytes         (event-id hashes, 8 bytes)

State (offline): the feature table (Parquet, dictionary-encoded), rows = entities x days kept (the
longest window), a file a day::

    row  = state_pane_bytes + slots x table_row_bytes                       (key, time)
         + sum over counts of entropy bits x table_bit_bytes      (count, distinct_count, a ratio's
                                                                   operands: bits grow with the events)
         + sum over real values of P(an event in its window) x table_value_bytes  (empty: a null)
         + sum over top_k of entries x table_entry_bytes        (entries = k x (1 - exp(-n / k)))
    file = columns x table_file_column_bytes                    (a column per feature, 2 a top_k, +2)

with ``n`` an entity's events in the feature's window its filter keeps, per tenth of the entities as
the stream's profile spreads them (:func:`table_row_terms`). A table computed from fewer days than
the window (a young lake, the calibration's) holds smaller counts, so fewer bytes.

Online memory (every tier, one Redis key per entity, layout :mod:`headwater.pipelines.store.codec`)::

    bytes = entities x (72-byte header + 4 x slots + key bytes + REDIS_KEY_OVERHEAD)

``entities`` is the entity's expected distinct keys (``budget.yaml`` ``entities:``), or, when not
declared, every event of the longest window a new key (an upper bound).

A declared ``compute_cost`` below ``UNDER_DECLARED_FACTOR`` x the estimate is under-declared (an
error); one above ``OVER_DECLARED_FACTOR`` x the estimate holds budget it will not use (a warning).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from headwater.registry.calibration import Calibration, StreamProfile, load_calibration, where_key
from headwater.registry.compiled import CompiledFeature
from headwater.registry.expr import And, Expr
from headwater.registry.slots import feature_slots
from headwater.registry.tiers import Tier

SECONDS_PER_DAY = 86_400
UNDER_DECLARED_FACTOR = 0.5
OVER_DECLARED_FACTOR = 10.0
HEADER_BYTES = 72
"""The packed online value's fixed header (``pipelines/store/codec.py`` packs it; the cost model sizes it)."""
REDIS_KEY_OVERHEAD = 64  # dictEntry + two SDS/robj headers + allocator rounding, per key (MEMORY USAGE)
KEY_PREFIX_BYTES = 40  # "<namespace>:<view>:" before the entity id
DEDUP_BUCKET_S = 60  # pipelines/nearline/state.py DEDUP_BUCKET_MS: ids expire a bucket at a time


@dataclass(frozen=True)
class Shape:
    """What the cost model reads of a view: its aggregations, filters, panes and keys.

    Attributes:
        aggs: one ``(kind, filtered, panes)`` per aggregation (a ratio: one per operand).
        filters: ``where`` clauses evaluated per event.
        slots: online float32 slots.
        rekeyed: the view's join key is not the topic's key (a repartition).
        shortest_slide_s: the most frequent publish step.
        longest_window_s: the longest window (state lifetime).
        agg_filters: per aggregation (as ``aggs``), its window and slide in seconds and its filter
            (``None``: every event), for the share of events it keeps (state).
        text_slots: online slots that carry text (top_k names, ``last`` of a text field).
    """

    aggs: tuple[tuple[str, bool, int], ...]
    filters: int
    slots: int
    rekeyed: bool
    shortest_slide_s: float
    longest_window_s: float
    agg_filters: tuple[tuple[float, Expr | None, float], ...] = ()
    text_slots: int = 0

    def hit_share(self, cal: Calibration) -> float:
        """Return the share of events that hit an aggregation (the filters' shares added, at most 1)."""
        return hit_share([w for _, w, _ in self.agg_filters], cal)

    def hit_burst(self, cal: Calibration, stream: tuple[str, str] | None) -> float:
        """Return the events of one entity that come together among those that hit the view."""
        return hit_burst([w for _, w, _ in self.agg_filters], cal, stream)

    def as_dict(self) -> dict[str, Any]:
        """Return a JSON form (reports)."""
        return {
            "aggregations": [{"kind": k, "filtered": f, "panes": p} for k, f, p in self.aggs],
            "filters": self.filters,
            "slots": self.slots,
            "rekeyed": self.rekeyed,
            "shortest_slide_s": self.shortest_slide_s,
            "longest_window_s": self.longest_window_s,
        }


def distinct_filters(filters: list[Expr | None]) -> list[Expr]:
    """Return ``filters`` once each, less those that imply another (``A and B`` beside ``A``)."""
    found = {where_key(w): w for w in filters if w is not None}
    return [
        w
        for k, w in found.items()
        if not (isinstance(w, And) and any(where_key(a) in found and where_key(a) != k for a in w.args))
    ]


def hit_share(filters: list[Expr | None], cal: Calibration) -> float:
    """Return the share of events one of ``filters`` keeps (None: every event); shares added, at most 1."""
    if not filters or any(w is None for w in filters):
        return 1.0
    return min(1.0, sum(cal.share(w) for w in distinct_filters(filters)))


def hit_burst(filters: list[Expr | None], cal: Calibration, stream: tuple[str, str] | None) -> float:
    """Return the events of one entity that come together among those one of ``filters`` keeps."""
    if not filters or any(w is None for w in filters):
        return cal.burst(None, stream)
    kept = distinct_filters(filters)
    runs = sum(cal.share(w) / cal.burst(w, stream) for w in kept)
    return max(1.0, sum(cal.share(w) for w in kept) / runs) if runs > 0 else 1.0


def pane_occupancy(
    hits: float, burst: float, panes: float, entities: float | None, profile: StreamProfile
) -> tuple[float, float]:
    """Return (entities with an event, (entity, pane) pairs with one) for ``hits`` events in a window.

    ``hits`` events come in runs of ``burst`` (one run, one moment, one pane) over the window's
    ``panes`` panes; they spread over ``entities`` as ``profile`` says (each tenth of the entities
    its share). An entity with ``r`` runs holds ``panes x (1 - exp(-r / panes))`` panes (Poisson).
    ``entities`` ``None``: every run a new entity (the upper bound).
    """
    if entities is None:
        return hits / burst, hits / burst
    live = filled = 0.0
    group = max(float(entities), 1.0) / len(profile.deciles)
    for share in profile.deciles:
        runs = hits * share / group / burst
        live += group * -math.expm1(-runs)
        filled += group * panes * -math.expm1(-runs / panes)
    return live, filled


def view_shape(features: tuple[CompiledFeature, ...], rekeyed: bool = False) -> Shape:
    """Return the shape of a view with ``features`` (``rekeyed``: keyed by another field than the topic)."""
    aggs: list[tuple[str, bool, int]] = []
    agg_filters: list[tuple[float, Expr | None, float]] = []
    filters = 0
    slots = 0
    text_slots = 0
    for f in features:
        panes = max(1, math.ceil(f.window.seconds / f.slide.seconds - 1e-9))
        slots += len(feature_slots(f.name, f.agg, f.k))
        text_slots += (f.k or 0) if f.agg == "top_k" else int(f.agg == "last" and f.dtype == "string")
        filters += f.where is not None
        operands = [op for op in (f.numerator, f.denominator) if op is not None]
        if operands:
            for op in operands:
                # the operand's where already includes the feature's own (compiled.Operand)
                own = op.where is not None and op.where is not f.where
                filters += own
                aggs.append((op.agg, op.where is not None, panes))
                agg_filters.append((f.window.seconds, op.where, f.slide.seconds))
        else:
            aggs.append((f.agg, f.where is not None, panes))
            agg_filters.append((f.window.seconds, f.where, f.slide.seconds))
    return Shape(
        aggs=tuple(aggs),
        filters=filters,
        slots=slots,
        rekeyed=rekeyed,
        shortest_slide_s=min((f.slide.seconds for f in features), default=1.0),
        longest_window_s=max((f.window.seconds for f in features), default=0.0),
        agg_filters=tuple(agg_filters),
        text_slots=text_slots,
    )


@dataclass(frozen=True)
class JobShare:
    """How many views share a view's job (same tier and source) and its group (same entity too).

    The job's fixed cost is split equally among ``job_views``, the group's among ``group_views``;
    ``JobShare()`` is a view alone in its job (it carries all of the fixed cost).
    """

    job_views: int = 1
    group_views: int = 1

    def as_dict(self) -> dict[str, int]:
        """Return a JSON form."""
        return {"job_views": self.job_views, "group_views": self.group_views}


def job_share(views: Iterable[tuple[str, str, str]], tier: str, source: str, entity: str) -> JobShare:
    """Return the :class:`JobShare` of a view on ``tier`` reading ``source`` keyed by ``entity``.

    ``views``: ``(tier, source, entity)`` of every view of the repo (the view itself included).
    """
    job = [(t, s, e) for t, s, e in views if t == tier and s == source]
    return JobShare(job_views=max(1, len(job)), group_views=max(1, sum(e == entity for _, _, e in job)))


@dataclass(frozen=True)
class CostEstimate:
    """A view's CPU estimate and how it was reached (printed with under-declared errors).

    ``cpu_hours_per_day`` = ``marginal_cpu_hours`` (the view's own work) + ``shared_cpu_hours`` (its
    share of its job's and group's fixed cost, ``share``).
    """

    cpu_hours_per_day: float
    events_per_day: float
    us_per_event: float
    writes_per_day: float
    fixed_cores: float
    calibration: str
    marginal_cpu_hours: float = 0.0
    shared_cpu_hours: float = 0.0
    job_cores: float = 0.0
    share: JobShare = JobShare()
    read_days: float = 1
    tile_rows_per_day: float = 0.0
    """Tile rows a tiled offline view's daily run merges (0: not tiled, :func:`tile_rows_per_day`)."""
    tile_row_us: float = 0.0
    """CPU us charged per tile row merged (the calibration's ``tile_row_us``)."""

    def explain(self) -> str:
        """One line: the numbers that make the estimate."""
        text = f"{self.events_per_day:,.0f} events/day x {self.us_per_event:.2f} us/event"
        if self.read_days != 1:
            text = f"{self.events_per_day:,.0f} events read/day ({self.read_days:g} days of window) x "
            text += f"{self.us_per_event:.2f} us/event"
        if self.tile_rows_per_day:
            text += f" + {self.tile_rows_per_day:,.0f} tile rows/day x {self.tile_row_us:.2f} us (tiled)"
        if self.writes_per_day:
            text += f" + {self.writes_per_day:,.0f} writes/day"
        if self.fixed_cores:
            text += f" + {self.fixed_cores:g} cores fixed"
        if self.shared_cpu_hours:
            text += (
                f" + 1/{self.share.job_views} of the job's {self.job_cores:.3g} fixed cores"
                f" = {self.marginal_cpu_hours:.2f} marginal + {self.shared_cpu_hours:.2f} shared"
            )
        return f"{text} = {self.cpu_hours_per_day:.2f} CPU-h/day ({self.calibration})"

    def as_dict(self) -> dict[str, Any]:
        """Return a JSON form (``check --format json``, ``costs``)."""
        return {
            "cpu_hours_per_day": round(self.cpu_hours_per_day, 4),
            "marginal_cpu_hours_per_day": round(self.marginal_cpu_hours, 4),
            "shared_cpu_hours_per_day": round(self.shared_cpu_hours, 4),
            "job_fixed_cores": round(self.job_cores, 4),
            **self.share.as_dict(),
            "events_per_day": round(self.events_per_day),
            "read_days": self.read_days,
            "tile_rows_per_day": round(self.tile_rows_per_day),
            "tile_row_us": self.tile_row_us,
            "us_per_event": round(self.us_per_event, 3),
            "writes_per_day": round(self.writes_per_day),
            "fixed_cores": self.fixed_cores,
            "constants": self.calibration,
        }


def us_per_event(shape: Shape, cal: Calibration) -> float:
    """CPU microseconds per event of a view of ``shape`` on the calibrated tier."""
    us = cal.scalar("event_us") + cal.scalar("where_us") * shape.filters
    if shape.rekeyed:
        us += cal.scalar("rekey_us")
    sel = cal.scalar("selectivity")
    wheres = [where for _, where, _ in shape.agg_filters] or [None] * len(shape.aggs)
    for (kind, filtered, panes), where in zip(shape.aggs, wheres, strict=True):
        # an aggregation folds the events its filter keeps: the share measured for that filter
        s = (cal.share(where) if where is not None else sel) if filtered else 1.0
        us += s * (cal.per_agg("agg_us", kind) + cal.scalar("pane_us") * (panes - 1))
    return us


COUNTER_KINDS = ("distinct_count", "top_k")
"""Aggregations that keep a count per value (a map), not a number."""


def run_fixed_s(shape: Shape, cal: Calibration) -> float:
    """Return a daily run's CPU seconds that depend on the view's shape, not its events (offline).

    ``run_counter_s`` if the view has a counter map (the offline job counts per value in its own
    pipeline: a shuffle and a join), plus ``run_window_s`` per distinct window length; 0 where the
    calibration has neither (the streaming tiers).
    """
    counter = any(kind in COUNTER_KINDS for kind, _, _ in shape.aggs)
    windows = len({window for window, _, _ in shape.agg_filters})
    return cal.scalar("run_counter_s") * counter + cal.scalar("run_window_s") * windows


def days_read(shape: Shape) -> int:
    """Days of bronze the offline daily job reads to compute one day of a view of ``shape``.

    ``pipelines/offline/job.py`` ``events_for`` reads every event that can reach the day's values:
    the longest window plus its slide (``attach_window_ms``), in whole days (partitions).
    """
    reach = max((w + s for w, _, s in shape.agg_filters), default=float(SECONDS_PER_DAY))
    return max(1, math.ceil(reach / SECONDS_PER_DAY - 1e-9))


def day_tiled(window_s: float, slide_s: float) -> bool:
    """Whether a feature's window at every UTC midnight is whole UTC days (the offline job can tile it).

    True when the window is a multiple of a day and the slide divides a day or is a multiple of
    one: then the boundary ``floor(T / S) * S`` of a midnight T is a midnight, and the window
    ``[B - W, B)`` is a set of whole days (``pipelines/offline/tiles.py``).
    """
    window, slide, day = round(window_s * 1000), round(slide_s * 1000), SECONDS_PER_DAY * 1000
    return window > 0 and slide > 0 and window % day == 0 and (day % slide == 0 or slide % day == 0)


def windows_tiled(windows: Iterable[tuple[float, float]]) -> bool:
    """Whether a view whose features have these ``(window_s, slide_s)`` is computed from daily tiles.

    Every window must be :func:`day_tiled`. The one rule of both the offline job
    (``pipelines/offline/tiles.py`` ``view_tiled``) and the cost model (:func:`shape_tiled`).
    """
    return all(day_tiled(window, slide) for window, slide in windows)


def shape_tiled(shape: Shape) -> bool:
    """Whether the offline job computes a view of ``shape`` from its daily tiles (:func:`windows_tiled`)."""
    return windows_tiled((window, slide) for window, _, slide in shape.agg_filters)


def run_reads(shape: Shape, cal: Calibration) -> tuple[int, bool]:
    """Days of events a daily run of a view of ``shape`` reads, and whether it merges tiles.

    Where the calibration says ``reads_window`` (the offline job): a tiled view (:func:`shape_tiled`)
    one new day and its tiles, any other view its window (:func:`days_read`); elsewhere each event once.
    """
    if not cal.scalar("reads_window"):
        return 1, False
    if shape_tiled(shape):
        return 1, True
    return days_read(shape), False


def tile_days_read(shape: Shape) -> int:
    """Days of tiles a tiled view's daily run merges: its window reach (:func:`days_read`) and one more.

    ``pipelines/offline/tile_table.py`` ``needed_days`` reads one day more than the events' reach
    (a day's last pane may be attached up to the reach after it).
    """
    return days_read(shape) + 1


def tile_rows_per_day(shape: Shape, rate_per_s: float, entities: float | None) -> float:
    """Tile rows a tiled view's daily run reads: each day of :func:`tile_days_read`, a row per entity.

    A row is an (entity, day) with an event: at most the declared entities a day, and at most one
    per event of the day (``entities`` ``None``: every event a new entity, the upper bound).
    """
    per_day = rate_per_s * SECONDS_PER_DAY
    return min(per_day, float(entities) if entities is not None else per_day) * tile_days_read(shape)


def live_entities(shape: Shape, rate_per_s: float, entities: float | None) -> float:
    """Entities with state: the declared distinct keys, at most one per event of the longest window."""
    bound = rate_per_s * max(shape.longest_window_s, 1.0)
    return bound if entities is None else min(float(entities), bound)


def live_slices(shape: Shape, rate_per_s: float, live: float) -> float:
    """Slices (panes) kept per live entity: every pane of the window, at most one per event of it."""
    panes = max(1.0, shape.longest_window_s / max(shape.shortest_slide_s, 1.0)) + 1
    events_per_entity = rate_per_s * max(shape.longest_window_s, 1.0) / max(live, 1.0)
    return min(panes, max(1.0, events_per_entity))


def writes_per_day(shape: Shape, rate_per_s: float, entities: float | None) -> float:
    """Online writes per day: at each boundary, the entities an event touched since the last one."""
    slide = max(shape.shortest_slide_s, 1.0)
    per_boundary = rate_per_s * slide if entities is None else min(float(entities), rate_per_s * slide)
    return per_boundary * SECONDS_PER_DAY / slide


def estimate_view(
    features: tuple[CompiledFeature, ...],
    rate_per_s: float,
    tier: Tier,
    rekeyed: bool = False,
    entities: float | None = None,
    calibration: Calibration | None = None,
    share: JobShare | None = None,
    read_days: float | None = None,
) -> CostEstimate:
    """Estimated CPU-hours per day of a view with ``features`` on ``tier`` at ``rate_per_s``.

    ``share``: the views sharing its job and group (:func:`job_share`); ``None``: alone in its job.
    ``read_days``: days of events each day's run is charged (``None``: decided by the calibration:
    where it says ``reads_window`` (the offline job), a tiled view (:func:`shape_tiled`) one day of
    events plus its tile rows (:func:`tile_rows_per_day`) at ``tile_row_us`` each, any other view
    its window of events (:func:`days_read`); elsewhere each event once). A given ``read_days``
    charges that many days of events and no tiles (a run from bronze: ``--full``, the calibration's).
    """
    cal = calibration or load_calibration(tier.name)
    share = share or JobShare()
    shape = view_shape(features, rekeyed)
    tiles = 0.0
    if read_days is None:
        read_days, tiled = run_reads(shape, cal)
        tiles = tile_rows_per_day(shape, rate_per_s, entities) if tiled else 0.0
    events = rate_per_s * SECONDS_PER_DAY * read_days
    us = us_per_event(shape, cal)
    writes = writes_per_day(shape, rate_per_s, entities) if cal.scalar("publish_us") else 0.0
    fixed = cal.scalar("fixed_cores") + run_fixed_s(shape, cal) / SECONDS_PER_DAY
    marginal = (events * us + writes * cal.scalar("publish_us") + tiles * cal.scalar("tile_row_us")) / 1e6
    marginal = marginal / 3600 + fixed * 24
    job = cal.scalar("job_fixed_cores") + rate_per_s * cal.scalar("job_event_us") / 1e6
    shared = (job / share.job_views + cal.scalar("group_fixed_cores") / share.group_views) * 24
    return CostEstimate(
        cpu_hours_per_day=marginal + shared,
        events_per_day=events,
        us_per_event=us,
        writes_per_day=writes,
        fixed_cores=fixed,
        calibration=cal.source_text(),
        marginal_cpu_hours=marginal,
        shared_cpu_hours=shared,
        job_cores=job + cal.scalar("group_fixed_cores"),
        share=share,
        read_days=read_days,
        tile_rows_per_day=tiles,
        tile_row_us=cal.scalar("tile_row_us") if tiles else 0.0,
    )


@dataclass(frozen=True)
class Footprint:
    """A view's state and online memory estimates, in bytes, and their inputs."""

    state_bytes: float
    online_bytes: float
    entities: float
    entities_declared: bool
    slots: int
    state_basis: str
    online_basis: str

    def as_dict(self) -> dict[str, Any]:
        """Return a JSON form."""
        return {
            "state_bytes": round(self.state_bytes),
            "online_bytes": round(self.online_bytes),
            "entities": round(self.entities),
            "entities_declared": self.entities_declared,
            "slots": self.slots,
            "state_basis": self.state_basis,
            "online_basis": self.online_basis,
        }


def estimate_footprint(
    features: tuple[CompiledFeature, ...],
    rate_per_s: float,
    tier: Tier,
    entities: float | None = None,
    key_bytes: int = 12,
    calibration: Calibration | None = None,
    dedup_window_s: float = 0.0,
    stream: tuple[str, str] | None = None,
    rekeyed: bool = False,
    age_s: float | None = None,
) -> Footprint:
    """State and online memory of a view (``entities``: expected distinct keys, ``None`` = unknown).

    ``dedup_window_s``: how long the nearline tier keeps each event id for de-duplication (the
    source's out-of-orderness + allowed lateness + one bucket); those ids are part of its state (the
    realtime tier keeps them in their slice: :func:`realtime_state`). ``stream``: the view's
    ``(source, join key)``, whose measured profile the realtime state follows (``None``: even, no
    bursts). ``rekeyed``: the view's join key is not the topic's key (nearline: a repartitioned
    leg with its own store, :func:`nearline_state`). ``age_s``: nearline and offline, how long the
    stream has run when younger than the view's window (a calibration run, a young lake; ``None``:
    the steady state).
    """
    cal = calibration or load_calibration(tier.name)
    shape = view_shape(features, rekeyed)
    live = live_entities(shape, rate_per_s, entities)
    if tier.name == "offline":
        state, state_basis = offline_state(features, shape, rate_per_s, live, cal, stream, age_s)
    elif tier.name == "realtime":
        state, state_basis = realtime_state(shape, rate_per_s, entities, key_bytes, cal, stream)
    else:
        state, state_basis = nearline_state(shape, rate_per_s, entities, cal, stream, dedup_window_s, age_s)
    per_key = HEADER_BYTES + 4 * shape.slots + KEY_PREFIX_BYTES + key_bytes + REDIS_KEY_OVERHEAD
    online = live * per_key
    online_basis = (
        f"{live:,.0f} keys x ({HEADER_BYTES} header + 4 x {shape.slots} slots + "
        f"{KEY_PREFIX_BYTES + key_bytes} key + {REDIS_KEY_OVERHEAD} Redis overhead) bytes"
    )
    return Footprint(
        state_bytes=state,
        online_bytes=online,
        entities=live,
        entities_declared=entities is not None,
        slots=shape.slots,
        state_basis=state_basis,
        online_basis=online_basis,
    )


COUNT_KINDS = ("count", "distinct_count")
"""Aggregations whose table value is a count (a long): its bytes follow the spread of the counts."""


def poisson_entropy_bits(mean: float) -> float:
    """Return the entropy in bits of a Poisson count of ``mean`` (0 for no events)."""
    if mean <= 0:
        return 0.0
    if mean >= 50:  # the normal approximation is within 0.1 % there
        return 0.5 * math.log2(2 * math.pi * math.e * mean)
    bits = 0.0
    for k in range(int(mean + 12 * math.sqrt(mean) + 12) + 1):
        p = math.exp(k * math.log(mean) - mean - math.lgamma(k + 1))
        if p > 0:
            bits -= p * math.log2(p)
    return bits


@dataclass(frozen=True)
class TableRow:
    """What one offline table row holds, on average over the entities (:func:`table_row_terms`).

    Attributes:
        count_bits: entropy bits of its counts (count, distinct_count, a ratio's count operands).
        values: real values (sum, avg, min, max, last) whose window held an event (not null).
        entries: top_k entries (value, share).
        columns: Parquet columns of a day's file (one a feature, two a top_k, the key and the time).
    """

    count_bits: float
    values: float
    entries: float
    columns: int


def table_row_terms(
    features: tuple[CompiledFeature, ...],
    rate_per_s: float,
    entities: float,
    cal: Calibration,
    stream: tuple[str, str] | None = None,
    age_s: float | None = None,
) -> TableRow:
    """Return what an offline table row holds, from the events of each feature's window.

    An entity of a tenth of ``entities`` (``stream``'s profile: its share of the events) has ``n`` =
    rate x share(filter) x window x its share / its entities events in a feature's window (``age_s``:
    the days the lake holds, when fewer than the window). A count costs its entropy (a Poisson of
    mean ``n``), a real value is there when ``n`` >= 1 (``1 - exp(-n)``), a top_k holds ``k x (1 -
    exp(-n / k))`` entries (``k`` values, each equally likely: an upper side for skewed fields).
    """
    deciles = cal.profile(stream).deciles
    group = max(float(entities), 1.0) / len(deciles)
    bits = values = entries = 0.0
    columns = 2  # the key and the time
    for f in features:
        window = f.window.seconds if age_s is None else min(f.window.seconds, max(age_s, 0.0))
        operands = [op for op in (f.numerator, f.denominator) if op is not None]
        parts = [(op.agg, op.where) for op in operands] or [(f.agg, f.where)]
        columns += 2 if f.agg == "top_k" else 1
        for kind, where in parts:
            hits = rate_per_s * cal.share(where) * window
            for share in deciles:
                n = hits * share / group
                if kind == "top_k":
                    k = float(f.k or 1)
                    entries += k * -math.expm1(-n / k) / len(deciles)
                elif kind in COUNT_KINDS:
                    bits += poisson_entropy_bits(n) / len(deciles)
                else:
                    values += -math.expm1(-n) / len(deciles)
    return TableRow(count_bits=bits, values=values, entries=entries, columns=columns)


def offline_state(
    features: tuple[CompiledFeature, ...],
    shape: Shape,
    rate_per_s: float,
    live: float,
    cal: Calibration,
    stream: tuple[str, str] | None = None,
    age_s: float | None = None,
) -> tuple[float, str]:
    """Bytes of an offline view's feature table (a row per entity and day kept, a file a day); the basis.

    A row: its key and time, its counts' entropy, its real values where their window held an event
    and its top_k entries (:func:`table_row_terms`); a day's file: its columns' overhead.
    """
    days = max(1, math.ceil(shape.longest_window_s / SECONDS_PER_DAY))
    terms = table_row_terms(features, rate_per_s, live, cal, stream, age_s)
    row = (
        cal.scalar("state_pane_bytes")
        + shape.slots * cal.scalar("table_row_bytes")
        + terms.count_bits * cal.scalar("table_bit_bytes")
        + terms.values * cal.scalar("table_value_bytes")
        + terms.entries * cal.scalar("table_entry_bytes")
    )
    # a day's partition is one Parquet file (Z-ordered): its per-column overhead, whatever its rows
    file = terms.columns * cal.scalar("table_file_column_bytes")
    state = live * days * row + days * file
    basis = (
        f"{live:,.0f} entities x {days} days x {row:.1f} bytes/row (feature table: "
        f"{terms.count_bits:.1f} count bits, {terms.values:.1f} values, {terms.entries:.1f} top_k entries)"
    )
    if file:
        basis += f" + {days} day files x {file:,.0f} bytes ({terms.columns} columns)"
    return state, basis


def realtime_state(
    shape: Shape,
    rate_per_s: float,
    entities: float | None,
    key_bytes: int,
    cal: Calibration,
    stream: tuple[str, str] | None = None,
) -> tuple[float, str]:
    """Flink keyed state of a realtime view, by the operator's layout; the bytes and how they add up.

    ``entities``: the join key's distinct entities (``None``: each burst of events a new entity, the
    upper bound); ``stream``: ``(source, join key)``, whose measured profile (how events spread over
    entities, how they come in bursts) gives the live entities and slices. Every term follows
    ``KeyStateSerializer`` (format 2): one record per live entity (header, running accumulators,
    last values), one per (entity, slice) holding events (start, a partial per feature), the ids'
    8-byte hashes. A slice holds a burst's events: ``panes x (1 - exp(-bursts / panes))`` slices of
    an entity with ``bursts`` runs of events in the window (Poisson occupancy of its panes).
    """
    hit = shape.hit_share(cal)
    window = max(shape.longest_window_s, 1.0)
    panes = max(1.0, shape.longest_window_s / max(shape.shortest_slide_s, 1.0)) + 1
    burst = shape.hit_burst(cal, stream)
    hits = rate_per_s * hit * window
    profile = cal.profile(stream)
    per_agg = [
        (kind, cal.share(where), agg_window, cal.burst(where, stream))
        for (kind, _, _), (agg_window, where, _) in zip(shape.aggs, shape.agg_filters, strict=True)
    ]
    live, slices = pane_occupancy(hits, burst, panes, entities, profile)
    partials = 0.0
    for kind, s, _, b in per_agg:  # a partial lives in its slice as long as the slice (the longest window)
        _, filled = pane_occupancy(rate_per_s * s * window, b, panes, entities, profile)
        partials += filled * (cal.per_agg("state_slot_bytes", kind) - 1)
    entity = (
        cal.scalar("state_entity_bytes")
        + key_bytes
        + cal.scalar("state_view_bytes")
        + shape.slots * cal.scalar("state_value_slot_bytes")
        + shape.text_slots * cal.scalar("state_text_bytes")
        + sum(cal.per_agg("state_running_bytes", k) for k, _, _, _ in per_agg)
    )
    # what a running accumulator keeps per value of its window (a multiset, a counter map): every
    # event of the window, whichever entity it belongs to
    running = sum(rate_per_s * s * w * cal.per_agg("state_running_event_bytes", k) for k, s, w, _ in per_agg)
    slice_bytes = cal.scalar("state_pane_bytes") + len(shape.aggs)
    ids = hits * cal.scalar("state_dedup_id_bytes")
    state = live * entity + running + slices * slice_bytes + partials + ids
    basis = (
        f"{live:,.0f} live entities x {entity:.0f} bytes + {running:,.0f} bytes of running values + "
        f"{slices:,.0f} slices x {slice_bytes:.0f} bytes + {partials:,.0f} bytes of partials + "
        f"{hits:,.0f} event ids ({hit:.0%} of events hit, {burst:.1f} a burst) x "
        f"{cal.scalar('state_dedup_id_bytes'):.0f} bytes"
    )
    return state, basis


def nearline_state(
    shape: Shape,
    rate_per_s: float,
    entities: float | None,
    cal: Calibration,
    stream: tuple[str, str] | None = None,
    dedup_window_s: float = 0.0,
    age_s: float | None = None,
) -> tuple[float, str]:
    """RocksDB state of a nearline view: its pane records and the event ids it keeps; the basis.

    One record per (entity, pane start) of each slide that an event hit (pipelines/windows/panes.py
    folds an event only into the features whose filter keeps it): ``state_pane_bytes`` each, plus
    ``state_slot_bytes`` per aggregation whose filter an event of that pane passed. A record lives as
    long as a feature whose slide divides its start still needs it (pipelines/nearline/task.py
    ``_expire``): a route's records live its longest window, those at starts on a longer-lived route's
    grid (a share ``slide / that slide``) as long as that route's. Records follow :func:`pane_occupancy`
    over visits: a session's events come seconds apart, so one visit of an entity brings several events
    to a pane (``Calibration.pane_burst``, measured per filter set and slide; the run burst where not
    measured). The slides of a view share one record per pane start (the panes of an entity are one
    dict): a route's records at starts of a longer route that keeps all its events are counted once. A
    counter map (distinct_count, top_k: ``[[value, count], ...]``) holds an entry per distinct value of
    its pane: the first is in ``state_slot_bytes``, each further event of the record adds
    ``state_running_event_bytes`` (an upper bound: every value new). Every event's id is kept
    ``dedup_window_s``; a re-keyed view (``shape.rekeyed``) keeps them twice: the source partition's
    task de-duplicates every event and the repartitioned task (pipelines/nearline/repartition.py, its
    own store) every forwarded one. ``age_s``: how long the stream has run (a calibration stream shorter
    than the window; ``None``: the steady state).
    """
    profile = cal.profile(stream)
    routes: dict[float, list[tuple[str, Expr | None]]] = {}
    life: dict[float, float] = {}  # slide -> how long its records live: its longest window
    for (kind, _, _), (agg_window, where, slide) in zip(shape.aggs, shape.agg_filters, strict=True):
        routes.setdefault(slide, []).append((kind, where))
        life[slide] = max(life.get(slide, 1.0), agg_window)
    if age_s is not None:  # a stream younger than the window holds its age's events only
        life = {slide: max(min(w, age_s), 1.0) for slide, w in life.items()}

    def occupancy(slide: float, aggs: list[tuple[str, Expr | None]], window: float) -> tuple[float, ...]:
        """Return (records, partial bytes, counter-map entry bytes) of one route over ``window``."""
        panes = window / max(slide, 1.0) + 1  # the pane starts a window's events fall in, on average
        wheres = [w for _, w in aggs]
        hits = rate_per_s * hit_share(wheres, cal) * window
        burst = cal.pane_burst(wheres, stream, slide) or hit_burst(wheres, cal, stream)
        records = pane_occupancy(hits, burst, panes, entities, profile)[1]
        partials = entries = 0.0
        for kind, where in aggs:
            own = rate_per_s * cal.share(where) * window
            b = cal.pane_burst([where], stream, slide) or cal.burst(where, stream)
            filled = pane_occupancy(own, b, panes, entities, profile)[1]
            partials += filled * cal.per_agg("state_slot_bytes", kind)
            entries += max(0.0, own - filled) * cal.per_agg("state_running_event_bytes", kind)
        return records, partials, entries

    per_route: dict[float, float] = {}
    at_longer: dict[float, float] = {}  # slide -> its records at the starts of its longest multiple
    partials = entries = 0.0
    for slide, aggs in routes.items():
        multiples = multiples_of(slide, routes)
        longer = max(multiples, key=lambda s: (life[s], s), default=None)
        # the starts on the longer-lived route's grid (a share slide / its slide) live as long as it
        lives = life[longer] if longer is not None else 0.0
        share = slide / longer if longer is not None and lives > life[slide] else 0.0
        own = occupancy(slide, aggs, life[slide])
        kept = occupancy(slide, aggs, lives) if share else own
        per_route[slide] = own[0] * (1 - share) + kept[0] * share
        partials += own[1] * (1 - share) + kept[1] * share
        entries += own[2] * (1 - share) + kept[2] * share
        if multiples:
            top = max(multiples)
            at_longer[slide] = occupancy(slide, aggs, max(life[slide], life[top]))[0] * slide / top
    records = sum(per_route.values()) - shared_records(routes, at_longer)
    ids = rate_per_s * dedup_window_s * (2 if shape.rekeyed else 1)
    id_bytes = cal.scalar("state_dedup_id_bytes")
    state = records * cal.scalar("state_pane_bytes") + partials + entries + ids * id_bytes
    pane = cal.scalar("state_pane_bytes")
    basis = f"{records:,.0f} pane records x {pane:.0f} bytes + {partials:,.0f} bytes of partials"
    if entries:
        basis += f" + {entries:,.0f} bytes of counter-map entries"
    if ids and id_bytes:
        twice = " (x 2: the repartitioned leg keeps its own)" if shape.rekeyed else ""
        basis += f" + {ids:,.0f} event ids{twice} x {id_bytes:.0f} bytes"
    return state, basis


def multiples_of(slide: float, slides: Iterable[float]) -> list[float]:
    """Return the longer ``slides`` whose pane starts are all starts of ``slide`` too (multiples)."""
    return [s for s in slides if s > slide and round(s * 1000) % max(round(slide * 1000), 1) == 0]


def shared_records(
    routes: dict[float, list[tuple[str, Expr | None]]], at_longer: dict[float, float]
) -> float:
    """Return the records two slides of one view share (one record per entity and pane start).

    A route's record at a start that is also a start of a longer route (its slide a multiple)
    whose filters keep every event this route keeps is that route's record too, counted once.
    ``at_longer``: each route's records at the starts of its longest multiple (they live as long as
    the longer of the two windows); at a shorter multiple's starts, that times the two slides'
    ratio. Each route is paired with its longest such route only (no start is taken off twice).
    """

    def keeps(aggs: list[tuple[str, Expr | None]]) -> set[str] | None:  # None: every event
        if any(w is None for _, w in aggs):
            return None
        return {where_key(w) for _, w in aggs if w is not None}

    shared = 0.0
    for slide in sorted(routes):
        mine = keeps(routes[slide])
        multiples = multiples_of(slide, routes)
        longer = [
            s
            for s in multiples
            if (theirs := keeps(routes[s])) is None or (mine is not None and mine <= theirs)
        ]
        if longer:
            shared += at_longer.get(slide, 0.0) * max(multiples) / max(longer)
    return shared


def format_bytes(n: float) -> str:
    """E.g. ``1.5 GiB``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"
