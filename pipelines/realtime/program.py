"""Compile the realtime plan into the program the JVM operators run (format 1), and its SQL columns.

The realtime job is Flink SQL up to the decoded, routed events (:mod:`.sql`) and Java after that
(``dev.headwater.flink.realtime`` in infra/maven/flink-udfs): a keyed window operator per group of
views with the same join key and slide, and a batched Redis sink. This module is the contract
between the two, in the spirit of "define once, compile per tier": the JVM reads only this JSON.

- ``columns``: what each event row carries, in order: ``event_id``, ``event_time``, the fields any
  feature reads (join keys, aggregated fields), then one BOOLEAN per distinct filter (``h0``,
  ``h1``...), evaluated by Flink SQL from the plan's Flink SQL text. The JVM never parses a filter.
- ``groups``: per (join key, slide), the views and their features: aggregation, window, the column
  of its filter and of its field, ``k``, and the dictionary field of text slots (top_k values, and
  ``last`` of a text field), laid out in the shared vector order (:mod:`headwater.registry.slots`).
- ``store``: the online store's address and the two Lua scripts, as text, so the JVM writes through
  the very ``write.lua`` and dictionary script the Python tiers use.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from headwater.pipelines.realtime.decode import EVENT_COLUMNS
from headwater.pipelines.store.layout import FRESHNESS_MAXLEN
from headwater.pipelines.store.store import WRITE_SCRIPT
from headwater.pipelines.windows import compile_view, layout_version, view_layout
from headwater.pipelines.windows.vector import ASSIGN_LUA
from headwater.registry.plans import PlanFeature, PlanOperand, PlanSource, PlanView, PlanWhere, TierPlan

FORMAT = 1
NUMERIC = frozenset({"BIGINT", "INT", "DOUBLE"})
NEEDS_NUMBER = frozenset({"sum", "avg", "min", "max"})
_TYPES = dict(EVENT_COLUMNS)
DEFAULT_IDLE_ADVANCE_MS = 2_000
"""On a live stream with no event for this long, the operators' clock follows the wall clock minus this,
so windows still slide (counts decay) when the traffic stops."""


class RealtimePlanError(ValueError):
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
    """The compiled program: the JSON text for the JVM and the event columns for the SQL side."""

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
    """Collects the columns the features read, and one hit column per distinct filter text."""

    def __init__(self) -> None:
        self.fields: list[str] = ["event_id", "event_time"]
        self.hits: dict[str, int] = {}
        self.filters: list[PlanWhere] = []

    def field(self, name: str | None, view: PlanView, feature: str) -> int:
        if name is None:
            return -1
        if name not in _TYPES:
            msg = (
                f"view {view.name!r} ({view.defined_at}) feature {feature!r}: field {name!r} is not a field"
                f" of the event schema ({', '.join(_TYPES)}); fix the definition and run `headwater apply`"
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

    def resolve(self) -> tuple[Column, ...]:
        """Fields in schema order after id and time, then the hits; the indexes given out are remapped."""
        order = ["event_id", "event_time"] + [n for n, _ in EVENT_COLUMNS if n in self.fields[2:]]
        cols = [Column(n, _TYPES[n], f"`{n}`") for n in order]
        cols += [Column(f"h{i}", "BOOLEAN", f"COALESCE(({sql}), FALSE)") for sql, i in self.hits.items()]
        return tuple(cols)


def _operand(op: PlanOperand | None, cols: _Columns, view: PlanView, feature: str) -> dict[str, Any]:
    if op is None:
        msg = f"view {view.name!r} ({view.defined_at}) feature {feature!r}: a ratio needs both operands"
        raise RealtimePlanError(msg)
    _check_field(op.agg, op.field, view, feature)
    return {
        "name": f"{feature}.{op.agg}",
        "agg": op.agg,
        "hit": cols.hit(op.where),
        "field": cols.field(op.field, view, feature),
        "dict_field": None,
    }


def _check_field(agg: str, field: str | None, view: PlanView, feature: str) -> None:
    where = f"view {view.name!r} ({view.defined_at}) feature {feature!r}"
    if agg in NEEDS_NUMBER | {"last", "distinct_count", "top_k"} and field is None:
        msg = f"{where}: {agg} needs a `field`"
        raise RealtimePlanError(msg)
    if agg in NEEDS_NUMBER and field is not None and _TYPES.get(field) not in NUMERIC:
        msg = f"{where}: {agg} needs a numeric field; {field!r} is {_TYPES.get(field)}"
        raise RealtimePlanError(msg)


def _feature(f: PlanFeature, cols: _Columns, view: PlanView) -> dict[str, Any]:
    _check_field(f.agg, f.field, view, f.name)
    out: dict[str, Any] = {
        "name": f.name,
        "agg": f.agg,
        "window_ms": _ms(f.window_s),
        "hit": cols.hit(f.where),
        "field": cols.field(f.field, view, f.name),
        "k": f.k or 0,
        "dict_field": None,
    }
    if f.agg == "top_k" or (f.agg == "last" and _TYPES.get(f.field or "") == "STRING"):
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
) -> RealtimeProgram:
    """Compile every view of ``plan`` (already checked by :func:`.sql.check_plan`) into one program."""
    cols = _Columns()
    groups: dict[tuple[str, int], dict[str, Any]] = {}
    for view in plan.views:
        slide_ms = _ms(view.features[0].slide_s)
        key = (view.join_key, slide_ms)
        group = groups.setdefault(
            key,
            {"id": f"{view.join_key}@{slide_ms}", "key": view.join_key, "slide_ms": slide_ms, "views": []},
        )
        cols.field(view.join_key, view, "(join key)")
        spec = compile_view(view)
        layout = view_layout(spec, plan.registry_hash)
        group["views"].append(
            {
                "name": view.name,
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
        "version": layout_version(plan.registry_hash),
        "namespace": store.namespace,
        "columns": names,
        "column_types": [c.sql_type for c in columns],
        "event_id_column": 0,
        "event_time_column": 1,
        "out_of_orderness_ms": _ms(source.max_out_of_orderness_s or 0),
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
    return RealtimeProgram(
        text=json.dumps(program, separators=(",", ":")),
        columns=columns,
        groups=tuple(g["id"] for g in groups.values()),
        hit_filters=tuple(cols.filters),
    )
