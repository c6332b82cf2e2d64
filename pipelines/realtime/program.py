"""Compile the realtime plan into the programs the JVM operators run (format 3), and their SQL columns.

The realtime job is Flink SQL up to the decoded, routed events (:mod:`.sql`) and Java after that
(``dev.headwater.flink.realtime`` in infra/maven/flink-udfs): a keyed window operator per group of
views with the same join key and slide, and a batched Redis sink. This module is the contract
between the two, in the spirit of "define once, compile per tier": the JVM reads only this JSON.

One program per source of the plan (``source``: its name): each source is its own pipeline of the job.

- ``columns``: what each event row carries, in order: the source's event id as text (``hw_event_id``,
  only when the source declares an ``event_id``; without one nothing is de-duplicated), the event
  time in UTC ms (``hw_time_ms``, whatever the field's unit), the source's fields any feature reads
  (join keys, aggregated fields), then one BOOLEAN per distinct filter (``hw_hit0``, ``hw_hit1``...),
  evaluated by Flink SQL from the plan's Flink SQL text. The JVM never parses a filter.
- ``groups``: per (join key, slide), the views and their features: aggregation, window, the column
  of its filter and of its field, ``k``, and the dictionary field of text slots (top_k values, and
  ``last`` of a text field), laid out in the shared vector order (:mod:`headwater.registry.slots`).
- ``store``: the online store's address and the two Lua scripts, as text, so the JVM writes through
  the very ``write.lua`` and dictionary script the Python tiers use.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from headwater.pipelines.realtime.decode import TIME_MS, event_columns
from headwater.pipelines.store.layout import FRESHNESS_MAXLEN
from headwater.pipelines.store.store import WRITE_SCRIPT
from headwater.pipelines.windows import compile_view, view_layout
from headwater.pipelines.windows.vector import ASSIGN_LUA
from headwater.registry.aggs import FIELD_REQUIRED
from headwater.registry.errors import HeadwaterError
from headwater.registry.plans import PlanFeature, PlanOperand, PlanSource, PlanView, PlanWhere, TierPlan

FORMAT = 3
NUMERIC = frozenset({"BIGINT", "INT", "DOUBLE"})
NEEDS_NUMBER = frozenset({"sum", "avg", "min", "max"})
EVENT_ID = "hw_event_id"
HIT_PREFIX = "hw_hit"
DEFAULT_IDLE_ADVANCE_MS = 2_000
"""On a live stream with no event for this long, the operators' clock follows the wall clock minus this,
so windows still slide (counts decay) when the traffic stops."""


class RealtimePlanError(HeadwaterError, ValueError):
    """The realtime plan asks for something this job cannot run; the message says what to do."""


@dataclass(frozen=True)
class Column:
    """One column of the event rows: its name, Flink SQL type and the SQL that computes it."""

    name: str
    sql_type: str
    sql: str


@dataclass(frozen=True)
class StoreTarget:
    """Where the sink writes and how often it flushes."""

    redis_url: str
    namespace: str = "hw"
    flush_ms: int = 100
    chunk_rows: int = 256
    max_pending_rows: int = 4096


@dataclass(frozen=True)
class RealtimeProgram:
    """The compiled program of one source: JSON text for the JVM and the event columns for the SQL side."""

    source: str
    text: str
    columns: tuple[Column, ...]
    groups: tuple[str, ...]
    """Group ids (``<join key>@<slide ms>``), in program order."""
    hit_filters: tuple[PlanWhere, ...]
    """The filter of each hit column, in column order (tests evaluate them in Python)."""

    @property
    def data(self) -> dict[str, Any]:
        """The program as a dict."""
        parsed: dict[str, Any] = json.loads(self.text)
        return parsed


def _ms(seconds: float) -> int:
    return round(seconds * 1000)


class _Columns:
    """Collects the source's fields the features read, and one hit column per distinct filter text."""

    def __init__(self, source: PlanSource) -> None:
        self.source = source
        self.types = dict(event_columns(source))
        self.fields: list[str] = []
        self.hits: dict[str, int] = {}
        self.filters: list[PlanWhere] = []

    def type_of(self, name: str | None) -> str | None:
        return self.types.get(name or "")

    def field(self, name: str | None, view: PlanView, feature: str) -> int:
        """Return a provisional index of field ``name`` (remapped by :meth:`resolve`); -1 for none."""
        if name is None:
            return -1
        if name not in self.types:
            msg = (
                f"view {view.name!r} ({view.defined_at}) feature {feature!r}: field {name!r} is not a field"
                f" of source {self.source.name!r} ({', '.join(self.types)}); fix the definition and run"
                " `headwater apply`"
            )
            raise RealtimePlanError(msg)
        if name not in self.fields:
            self.fields.append(name)
        return self.fields.index(name)

    def hit(self, where: PlanWhere | None) -> int:
        """Return the hit column of a filter; filters with the same Flink SQL text share one."""
        if where is None:
            return -1
        sql = where.sql.get("flink")
        if not sql:
            msg = f"filter {where.text!r} has no Flink SQL in the plan: re-run `headwater apply`"
            raise RealtimePlanError(msg)
        if sql not in self.hits:
            self.hits[sql] = len(self.hits)
            self.filters.append(where)
        return self.hits[sql]

    def head(self) -> list[Column]:
        """Return the event id column (when the source has one) and the event time (ms) column."""
        cols = []
        if self.source.event_id is not None:
            ident = f"`{self.source.event_id}`"
            text = self.type_of(self.source.event_id) == "STRING"
            cols.append(Column(EVENT_ID, "STRING", ident if text else f"CAST({ident} AS STRING)"))
        return [*cols, Column(TIME_MS, "BIGINT", f"`{TIME_MS}`")]

    def resolve(self) -> tuple[Column, ...]:
        """Head, then the fields in schema order, then the hits; the indexes given out are remapped."""
        cols = self.head()
        cols += [Column(n, t, f"`{n}`") for n, t in self.types.items() if n in self.fields]
        hits = self.hits.items()
        cols += [Column(f"{HIT_PREFIX}{i}", "BOOLEAN", f"COALESCE(({q}), FALSE)") for q, i in hits]
        return tuple(cols)


def _operand(op: PlanOperand | None, cols: _Columns, view: PlanView, feature: str) -> dict[str, Any]:
    if op is None:
        msg = f"view {view.name!r} ({view.defined_at}) feature {feature!r}: a ratio needs both operands"
        raise RealtimePlanError(msg)
    _check_field(op.agg, op.field, cols, view, feature)
    return {
        "name": f"{feature}.{op.agg}",
        "agg": op.agg,
        "hit": cols.hit(op.where),
        "field": cols.field(op.field, view, feature),
        "dict_field": None,
    }


def _check_field(agg: str, field: str | None, cols: _Columns, view: PlanView, feature: str) -> None:
    where = f"view {view.name!r} ({view.defined_at}) feature {feature!r}"
    cols.field(field, view, feature)  # a field the source lacks: that error first
    if agg in FIELD_REQUIRED and field is None:
        msg = f"{where}: {agg} needs a `field`"
        raise RealtimePlanError(msg)
    if agg in NEEDS_NUMBER and field is not None and cols.type_of(field) not in NUMERIC:
        msg = f"{where}: {agg} needs a numeric field; {field!r} is {cols.type_of(field)}"
        raise RealtimePlanError(msg)


def _feature(f: PlanFeature, cols: _Columns, view: PlanView) -> dict[str, Any]:
    _check_field(f.agg, f.field, cols, view, f.name)
    out: dict[str, Any] = {
        "name": f.name,
        "agg": f.agg,
        "window_ms": _ms(f.window_s),
        "hit": cols.hit(f.where),
        "field": cols.field(f.field, view, f.name),
        "k": f.k or 0,
        "dict_field": None,
    }
    if f.agg == "top_k" or (f.agg == "last" and cols.type_of(f.field) == "STRING"):
        out["dict_field"] = f.field
    if f.agg == "ratio":
        out["numerator"] = _operand(f.numerator, cols, view, f.name)
        out["denominator"] = _operand(f.denominator, cols, view, f.name)
    return out


def compile_program(
    plan: TierPlan,
    source: PlanSource,
    store: StoreTarget,
    idle_advance_ms: int = DEFAULT_IDLE_ADVANCE_MS,
    reported_dir: Path | None = None,
) -> RealtimeProgram:
    """Compile the views of ``plan`` that read ``source`` (checked by :func:`.sql.check_plan`) into a program.

    ``reported_dir``: where each operator subtask writes its views' timed work (``ViewCpuStats``,
    read by ``headwater costs``); None: not written.

    Raises:
        RealtimePlanError: a view of ``source`` reads a field the source lacks, or aggregates one of the
            wrong type; the message names the view and its definition.
    """
    cols = _Columns(source)
    groups: dict[tuple[str, int], dict[str, Any]] = {}
    views = [v for v in plan.views if v.source == source.name]
    if not views:
        msg = f"source {source.name!r} has no realtime view: nothing to compile"
        raise RealtimePlanError(msg)
    for view in views:
        slide_ms = _ms(view.features[0].slide_s)
        key = (view.join_key, slide_ms)
        group = groups.setdefault(
            key,
            {"id": f"{view.join_key}@{slide_ms}", "key": view.join_key, "slide_ms": slide_ms, "views": []},
        )
        cols.field(view.join_key, view, "(join key)")
        spec = compile_view(view)
        layout = view_layout(spec)
        group["views"].append(
            {
                "name": view.name,
                "version": layout.version,
                "ttl_ms": layout.ttl_ms,
                "schema_hash": layout.schema_hash,
                "dim": layout.dim,
                "features": [_feature(f, cols, view) for f in view.features],
            }
        )
    columns = cols.resolve()
    names = [c.name for c in columns]
    remap = {old: names.index(name) for old, name in enumerate(cols.fields)}
    hit_base = len(names) - len(cols.hits)

    def fix(feature: dict[str, Any]) -> None:
        feature["field"] = remap.get(feature["field"], -1)
        feature["hit"] = hit_base + feature["hit"] if feature["hit"] >= 0 else -1
        for side in ("numerator", "denominator"):
            if side in feature:
                fix(feature[side])

    for group in groups.values():
        group["key_column"] = names.index(group.pop("key"))
        for view in group["views"]:
            for feature in view["features"]:
                fix(feature)
    program = {
        "format": FORMAT,
        "source": source.name,
        "namespace": store.namespace,
        "columns": names,
        "column_types": [c.sql_type for c in columns],
        "event_id_column": names.index(EVENT_ID) if EVENT_ID in names else -1,
        "event_time_column": names.index(TIME_MS),
        "out_of_orderness_ms": source.max_out_of_orderness_ms,
        "allowed_lateness_ms": source.allowed_lateness_ms,
        "event_time_field": source.event_time,
        "idle_advance_ms": idle_advance_ms,
        "store": {
            "url": store.redis_url,
            "write_script": WRITE_SCRIPT,
            "dict_script": ASSIGN_LUA,
            "flush_ms": store.flush_ms,
            "chunk_rows": store.chunk_rows,
            "max_pending_rows": store.max_pending_rows,
            "freshness_maxlen": FRESHNESS_MAXLEN,
        },
        "groups": list(groups.values()),
    }
    if reported_dir is not None:
        program["reported_dir"] = str(reported_dir.resolve())
    return RealtimeProgram(
        source=source.name,
        text=json.dumps(program, separators=(",", ":")),
        columns=columns,
        groups=tuple(g["id"] for g in groups.values()),
        hit_filters=tuple(cols.filters),
    )
