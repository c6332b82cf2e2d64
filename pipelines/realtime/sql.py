"""Compile the realtime plan into Flink SQL: one source, one DLQ sink, and per view a merged window result.

Shape of the job (all of it is one Flink job, run as one statement set):

1. ``hw_source``: the Kafka topic through the Kafka connector, raw bytes plus headers, key,
   partition and offset. A vectorised Python UDF decodes the Avro payload (:mod:`.decode`);
   ``rt`` (the event time as a rowtime) carries the watermark ``rt - max_out_of_orderness``.
2. Rows with a decode reason, and rows at or behind the current watermark, go to the dead-letter
   topic with the codec's reason or ``late``. Note on ``late``: this tier sends *every* event behind
   its watermark there, also those within the source's ``allowed_lateness``: Flink's window
   aggregation drops a row whose pane has closed (even from the later windows that still hold
   that pane), and the tier never revises a boundary it published. The nearline and offline
   tiers do count events within the allowed lateness, so for such events the realtime value
   differs from theirs until the window has slid past them. The dead letter's detail says which
   case it was (within or beyond the allowed lateness) and this policy, so the DLQ is not
   mistaken for data loss.
3. ``hw_events``: the good rows, deduplicated on ``event_id`` (first arrival wins, keyed state
   with a TTL longer than any window).
4. Per view and per distinct (window, slide) of its features, a HOP window aggregation with
   the features' filters as ``FILTER (WHERE ...)`` clauses; per ``top_k`` feature a window
   aggregation by value and a window Top-N; and a "closing" HOP that emits the first boundary at
   which an entity has no event left in the view's longest window (so its value goes back to
   the empty value instead of staying at the last non-empty one).
5. Per view, the parts are merged by (entity, boundary) in a TUMBLE of the slide on the parts'
   ``window_time``; an OVER aggregation per entity keeps only the rows whose value differs from
   the entity's previous row (:func:`_changed_view`), and those go to the view's sink, which
   writes in batches. An unchanged value is not rewritten: the stored event time is the
   boundary at which the value last changed (the value as of any later boundary is the same).

Everything here is pure string building, so it is unit-tested without Flink.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

from headwater.pipelines.realtime.decode import DECODED_COLUMNS, DEFAULT_MAX_FUTURE_MS, EVENT_COLUMNS
from headwater.registry.plans import PlanFeature, PlanOperand, PlanSource, PlanView, TierPlan

NUMERIC_TYPES = frozenset({"BIGINT", "INT", "DOUBLE"})
_TYPES = dict(EVENT_COLUMNS)
SEP = "CHR(1)"
"""Separator inside a ``last`` key: below every printable character, so ids compare as in Python."""


class RealtimePlanError(ValueError):
    """The realtime plan asks for something this job cannot compile; the message says what to do."""


@dataclass(frozen=True)
class JobOptions:
    """Where the job reads and writes, and how it starts."""

    kafka_bootstrap: str
    dlq_topic: str
    group_id: str = "headwater-realtime"
    topic: str | None = None
    """Override of the source topic (tests, benchmarks); default: the plan's source topic."""
    startup_mode: str = "group-offsets"
    idle_timeout_s: float = 5.0
    dedup_ttl_s: float | None = None
    """How long an ``event_id`` is remembered; default: out-of-orderness + allowed lateness + 2 min.

    A duplicate whose event time is behind the watermark goes to the DLQ as late whatever this TTL,
    so remembering an id longer than the watermark delay only guards against a stalled stream; the
    2 min margin covers that. A longer TTL cost memory and checkpoint time in proportion to the rate
    (at 10k events/s the old default of window + lateness + 10 min held about 9M ids)."""
    decode: str = "java"
    """``java``: Avro decode in the JVM (infra/maven/flink-udfs); ``python``: the vectorised Python UDF."""
    max_future_ms: int = DEFAULT_MAX_FUTURE_MS
    """Events further ahead of the job's clock go to the dead-letter topic as ``future_dated``."""


@dataclass(frozen=True)
class SlotSpec:
    """One column of a view's merged row: its SQL name, SQL type, and the feature it belongs to."""

    name: str
    sql_type: str
    feature: str
    role: str
    """``value`` (a number), ``last`` (an encoded last key), ``top`` / ``cnt`` (i-th top_k value and
    count, with ``rank``) or ``total`` (the top_k denominator)."""
    rank: int = 0


@dataclass(frozen=True)
class ViewJob:
    """The compiled form of one view: its merged table, its columns and the sink UDF name."""

    view: PlanView
    slide_ms: int
    merged_table: str
    sink_function: str
    slots: tuple[SlotSpec, ...]


@dataclass(frozen=True)
class CompiledJob:
    """All statements of the job, in execution order, plus per-view details for the sinks."""

    ddl: list[str]
    inserts: list[str]
    views: list[ViewJob] = field(default_factory=list)
    config: dict[str, str] = field(default_factory=dict)
    """Table configuration the statements need (the deduplication state TTL)."""


def interval(ms: int) -> str:
    """Return a Flink SQL day-time interval literal of ``ms`` milliseconds."""
    days, rest = divmod(ms, 86_400_000)
    hours, rest = divmod(rest, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    seconds, millis = divmod(rest, 1000)
    return f"INTERVAL '{days} {hours:02d}:{minutes:02d}:{seconds:02d}.{millis:03d}' DAY TO SECOND(3)"


def ident(name: str) -> str:
    """Quote an identifier with backticks (``position`` and ``query`` are reserved words)."""
    return "`" + name.replace("`", "``") + "`"


def literal(text: str) -> str:
    """Return a Flink SQL string literal."""
    return "'" + text.replace("'", "''") + "'"


def _ms(seconds: float) -> int:
    return round(seconds * 1000)


def source_of(plan: TierPlan, view: PlanView) -> PlanSource:
    """Return the plan source a view reads (raises :class:`RealtimePlanError` when it is missing)."""
    for src in plan.sources:
        if src.name == view.source:
            return src
    msg = f"view {view.name!r} ({view.defined_at}) reads source {view.source!r}, which the plan lacks"
    raise RealtimePlanError(msg)


def check_plan(plan: TierPlan) -> PlanSource:
    """Check that the plan fits one job: one source, one slide per view, an event-time field.

    Returns:
        The one source every view reads.
    """
    if not plan.views:
        msg = "the realtime plan has no views: add a view with `tier: realtime` and run `headwater apply`"
        raise RealtimePlanError(msg)
    sources = {source_of(plan, v).name for v in plan.views}
    if len(sources) > 1:
        msg = f"realtime views read several sources {sorted(sources)}; this job reads one: run one job each"
        raise RealtimePlanError(msg)
    src = source_of(plan, plan.views[0])
    if src.event_time != "event_time":
        msg = f"source {src.name!r}: event_time field {src.event_time!r} is not the schema's `event_time`"
        raise RealtimePlanError(msg)
    for v in plan.views:
        slides = {f.slide_s for f in v.features}
        if len(slides) != 1:
            detail = ", ".join(f"{f.name}: {f.slide_s:g}s" for f in v.features)
            msg = (
                f"view {v.name!r} ({v.defined_at}): the realtime tier publishes a view at one slide, "
                f"found several ({detail}); give its features the same `slide` or split the view"
            )
            raise RealtimePlanError(msg)
        if v.join_key not in _TYPES:
            msg = f"view {v.name!r} ({v.defined_at}): join key {v.join_key!r} is not an event field"
            raise RealtimePlanError(msg)
    return src


def compile_job(plan: TierPlan, options: JobOptions) -> CompiledJob:
    """Compile every view of ``plan`` into the statements of one Flink SQL job."""
    src = check_plan(plan)
    delay_ms = _ms(src.max_out_of_orderness_s or 0) + _ms(src.allowed_lateness_s or 0)
    ttl_s = options.dedup_ttl_s or delay_ms / 1000 + 120
    ddl = [
        _source_ddl(src, options, _decode_args(options)),
        _dlq_ddl(options),
        "CREATE TABLE hw_done (n BIGINT) WITH ('connector' = 'blackhole')",
        "CREATE TEMPORARY VIEW hw_decoded AS "
        "SELECT `k`, `value`, `headers`, `partition`, `offset`, ev, rt, pt FROM hw_source",
        _events_view(),
    ]
    inserts = [_dlq_insert(src)]
    views: list[ViewJob] = []
    windows = _window_groups(plan.views)
    ddl += [_window_group_ddl(n, group) for n, group in enumerate(windows.values())]
    for index, view in enumerate(plan.views):
        job_view, statements = _view_statements(index, view, windows)
        ddl += statements
        views.append(job_view)
        cols = ", ".join(["entity", "b", *(s.name for s in job_view.slots)])
        inserts.append(
            f"INSERT INTO hw_done SELECT {job_view.sink_function}({cols}) FROM {job_view.merged_table}"
        )
    config = {
        "table.exec.state.ttl": f"{math.ceil(ttl_s)} s",
        # decode and deduplicate once: the DLQ and the windows share the decoded source block
        "table.optimizer.reuse-optimize-block-with-digest-enabled": "true",
    }
    return CompiledJob(ddl=ddl, inserts=inserts, views=views, config=config)


def _decode_args(options: JobOptions) -> str:
    """Return the decode functions' arguments after the payload: the two headers, and for Java more.

    The Java functions (``dev.headwater.flink.DecodeEvent`` / ``EventTime``) get the schema-fp they
    accept, the future-dated limit and the schema's JSON text as literals, so a Flink cluster needs
    no file of this repo; the Python one reads them in its worker.
    """
    headers = "`headers`['schema-fp'], `headers`['produce-ts']"
    if options.decode == "python":
        return headers
    if options.decode != "java":
        msg = f"JobOptions.decode must be 'java' or 'python', found {options.decode!r}"
        raise RealtimePlanError(msg)
    from headwater.pipelines.events.schema import load_schema

    schema = load_schema()
    text = json.dumps(schema.raw, separators=(",", ":"))
    return (
        f"{headers}, {literal(schema.fingerprint)}, CAST({options.max_future_ms} AS BIGINT), {literal(text)}"
    )


def _source_ddl(src: PlanSource, options: JobOptions, decode_args: str) -> str:
    topic = options.topic or src.topic
    ooo_ms = _ms(src.max_out_of_orderness_s or 0)
    return f"""CREATE TABLE hw_source (
  `k` BYTES,
  `value` BYTES,
  `headers` MAP<STRING, BYTES> METADATA,
  `partition` INT METADATA VIRTUAL,
  `offset` BIGINT METADATA VIRTUAL,
  `ev` AS hw_decode(`value`, {decode_args}),
  `rt` AS TO_TIMESTAMP_LTZ(hw_event_time(`value`, {decode_args}), 3),
  `pt` AS PROCTIME(),
  WATERMARK FOR `rt` AS `rt` - {interval(ooo_ms)}
) WITH (
  'connector' = 'kafka',
  'topic' = {literal(topic)},
  'properties.bootstrap.servers' = {literal(options.kafka_bootstrap)},
  'properties.group.id' = {literal(options.group_id)},
  'properties.auto.offset.reset' = 'earliest',
  'scan.startup.mode' = {literal(options.startup_mode)},
  'scan.watermark.idle-timeout' = '{options.idle_timeout_s:g} s',
  'key.format' = 'raw',
  'key.fields' = 'k',
  'value.format' = 'raw',
  'value.fields-include' = 'EXCEPT_KEY'
)"""


def _dlq_ddl(options: JobOptions) -> str:
    return f"""CREATE TABLE hw_dlq (
  `k` BYTES,
  `value` BYTES,
  `headers` MAP<STRING, BYTES> METADATA
) WITH (
  'connector' = 'kafka',
  'topic' = {literal(options.dlq_topic)},
  'properties.bootstrap.servers' = {literal(options.kafka_bootstrap)},
  'sink.delivery-guarantee' = 'at-least-once',
  'key.format' = 'raw',
  'key.fields' = 'k',
  'value.format' = 'raw',
  'value.fields-include' = 'EXCEPT_KEY'
)"""


def _dlq_insert(src: PlanSource) -> str:
    lateness = src.allowed_lateness_s or 0
    return f"""INSERT INTO hw_dlq
SELECT `k`, `value`, hw_dlq_headers(`headers`, reason, detail, `partition`, `offset`, {lateness!r})
FROM (
  SELECT `k`, `value`, `headers`, `partition`, `offset`,
    COALESCE(ev.reason, 'late') AS reason,
    COALESCE(ev.detail, 'event_time ' || CAST(rt AS STRING) || ' is at or behind the watermark '
      || CAST(CURRENT_WATERMARK(rt) AS STRING)
      || CASE WHEN rt > CURRENT_WATERMARK(rt) - {interval(_ms(lateness))}
         THEN ' but within' ELSE ' and beyond' END
      || ' the allowed lateness') AS detail
  FROM hw_decoded
  WHERE ev.reason IS NOT NULL OR rt <= CURRENT_WATERMARK(rt)
)"""


def _events_view() -> str:
    fields = ", ".join(f"ev.{ident(name)} AS {ident(name)}" for name, _ in EVENT_COLUMNS)
    return f"""CREATE TEMPORARY VIEW hw_events AS
SELECT {", ".join(ident(name) for name, _ in EVENT_COLUMNS)}, rt FROM (
  SELECT *, ROW_NUMBER() OVER (PARTITION BY event_id ORDER BY pt ASC) AS hw_rn FROM (
    SELECT {fields}, rt, pt FROM hw_decoded
    WHERE ev.reason IS NULL AND (CURRENT_WATERMARK(rt) IS NULL OR rt > CURRENT_WATERMARK(rt))
  )
) WHERE hw_rn = 1"""


def _hop(slide_ms: int, size_ms: int) -> str:
    return f"TABLE(HOP(TABLE hw_events, DESCRIPTOR(rt), {interval(slide_ms)}, {interval(size_ms)}))"


def _filter(where_sql: str | None) -> str:
    return f" FILTER (WHERE {where_sql})" if where_sql else ""


def _where(f: PlanFeature | PlanOperand) -> str | None:
    return f.where.sql["flink"] if f.where is not None else None


def _scalar(agg: str, fld: str | None, where_sql: str | None) -> str:
    """Return a SQL aggregate for one scalar aggregation (NULL when nothing matched, except counts)."""
    flt = _filter(where_sql)
    col = ident(fld) if fld else None
    if agg == "count":
        return f"CAST(COUNT({col or '*'}){flt} AS DOUBLE)"
    if col is None:
        msg = f"aggregation {agg!r} needs a field"
        raise RealtimePlanError(msg)
    if agg == "sum":
        return f"COALESCE(SUM(CAST({col} AS DOUBLE)){flt}, 0.0)"
    if agg in ("avg", "min", "max"):
        return f"{agg.upper()}(CAST({col} AS DOUBLE)){flt}"
    if agg == "distinct_count":
        return f"CAST(COUNT(DISTINCT {col}){flt} AS DOUBLE)"
    msg = f"aggregation {agg!r} cannot be a ratio operand in the realtime tier"
    raise RealtimePlanError(msg)


def last_key_sql(fld: str) -> str:
    """Return the key whose MAX is the ``last`` value: ``time13 SEP event_id SEP ('v' value | 'n')``."""
    value = f"COALESCE('v' || CAST({ident(fld)} AS STRING), 'n')"
    return f"LPAD(CAST(event_time AS STRING), 13, '0') || {SEP} || event_id || {SEP} || {value}"


def _feature_slots(f: PlanFeature, prefix: str) -> list[SlotSpec]:
    if f.agg == "top_k":
        k = f.k or 0
        tops = [SlotSpec(f"{prefix}_top{i}", "STRING", f.name, "top", i) for i in range(1, k + 1)]
        cnts = [SlotSpec(f"{prefix}_cnt{i}", "BIGINT", f.name, "cnt", i) for i in range(1, k + 1)]
        return [*tops, *cnts, SlotSpec(f"{prefix}_total", "BIGINT", f.name, "total")]
    if f.agg == "last":
        return [SlotSpec(prefix, "STRING", f.name, "last")]
    return [SlotSpec(prefix, "DOUBLE", f.name, "value")]


def _feature_aggs(f: PlanFeature, prefix: str) -> dict[str, str]:
    """Return the aggregates computed in the feature's HOP group, by slot name (top_k: only its total)."""
    where_sql = _where(f)
    if f.agg == "top_k":
        cond = " AND ".join(c for c in (where_sql, f"{ident(f.field or '')} IS NOT NULL") if c)
        return {f"{prefix}_total": f"COUNT(*){_filter(cond)}"}
    if f.agg == "last":
        return {prefix: f"MAX({last_key_sql(f.field or '')}){_filter(where_sql)}"}
    if f.agg == "ratio":
        if f.numerator is None or f.denominator is None:
            msg = f"feature {f.name!r}: ratio needs numerator and denominator"
            raise RealtimePlanError(msg)
        num = _scalar(f.numerator.agg, f.numerator.field, _where(f.numerator))
        den = _scalar(f.denominator.agg, f.denominator.field, _where(f.denominator))
        return {prefix: f"CASE WHEN ({den}) = 0 THEN CAST(NULL AS DOUBLE) ELSE ({num}) / ({den}) END"}
    return {prefix: _scalar(f.agg, f.field, where_sql)}


def _select_row(entity: str, wt: str, slots: list[SlotSpec], values: dict[str, str]) -> str:
    cols = [f"{entity} AS entity", f"{wt} AS wt"]
    cols += [f"{values.get(s.name, f'CAST(NULL AS {s.sql_type})')} AS {s.name}" for s in slots]
    return ", ".join(cols)


WindowKey = tuple[str, int, int]
"""(join key, slide ms, window ms) of a window aggregation."""


@dataclass
class WindowGroup:
    """One HOP aggregation shared by every view with the same entity, slide and window."""

    key: WindowKey
    table: str
    aggs: dict[str, str] = field(default_factory=dict)
    """Aggregate SQL by column name (``v<view>_<slot>``)."""


def _window_groups(views: list[PlanView]) -> dict[WindowKey, WindowGroup]:
    """Group the scalar aggregations of all views by (entity, slide, window): one HOP each.

    Two views with the same entity and window (the registry's two 5 min / 1 s user views) must
    not each aggregate their own HOP: the planner then shares one window table function between
    the two aggregations, and a shared one cannot be fused into a sliced window aggregation, so
    every event was copied into all W / S = 300 windows (profiled: 28k rows/s out of 93 events/s).
    """
    groups: dict[WindowKey, WindowGroup] = {}
    for index, view in enumerate(views):
        for i, f in enumerate(view.features):
            wkey = (view.join_key, _ms(f.slide_s), _ms(f.window_s))
            group = groups.setdefault(wkey, WindowGroup(wkey, f"hw_win_{len(groups)}"))
            for name, sql in _feature_aggs(f, f"f{i}").items():
                group.aggs[f"v{index}_{name}"] = sql
    return groups


def _window_group_ddl(n: int, group: WindowGroup) -> str:
    key, slide_ms, window_ms = group.key
    cols = ", ".join(f"{sql} AS {name}" for name, sql in group.aggs.items())
    return (
        f"CREATE TEMPORARY VIEW {group.table} AS\n"
        f"SELECT {ident(key)} AS entity, window_time AS wt, {cols}\n"
        f"FROM {_hop(slide_ms, window_ms)} WHERE {ident(key)} IS NOT NULL\n"
        f"GROUP BY {ident(key)}, window_start, window_end, window_time"
    )


def _view_statements(
    index: int, view: PlanView, windows: dict[WindowKey, WindowGroup]
) -> tuple[ViewJob, list[str]]:
    key = ident(view.join_key)
    slide_ms = _ms(view.features[0].slide_s)
    prefixes = {f.name: f"f{i}" for i, f in enumerate(view.features)}
    slots = [s for f in view.features for s in _feature_slots(f, prefixes[f.name])]
    group_by = f"GROUP BY {key}, window_start, window_end, window_time"
    parts: list[str] = []
    for window_ms in sorted({_ms(f.window_s) for f in view.features}):
        group = windows[(view.join_key, slide_ms, window_ms)]
        mine = f"v{index}_"
        values = {name.removeprefix(mine): name for name in group.aggs if name.startswith(mine)}
        parts.append(f"SELECT {_select_row('entity', 'wt', slots, values)}\nFROM {group.table}")
    for f in view.features:
        if f.agg == "top_k":
            parts.append(_top_k_part(f, prefixes[f.name], key, slide_ms, slots))
    longest_ms = max(_ms(f.window_s) for f in view.features)
    parts.append(
        f"SELECT {_select_row(key, 'window_time', slots, {})}\n"
        f"FROM {_hop(slide_ms, longest_ms + slide_ms)} WHERE {key} IS NOT NULL {group_by}\n"
        f"HAVING MAX(CAST(rt AS TIMESTAMP(3))) < window_start + {interval(slide_ms)}"
    )
    parts_table = f"hw_parts_{index}"
    every = f"hw_every_{index}"
    merged = f"hw_merged_{index}"
    merge_cols = ", ".join(f"MAX({s.name}) AS {s.name}" for s in slots)
    statements = [
        f"CREATE TEMPORARY VIEW {parts_table} AS\n" + "\nUNION ALL\n".join(parts),
        f"CREATE TEMPORARY VIEW {every} AS\n"
        f"SELECT entity, window_end AS b, window_time AS bt, {merge_cols}\n"
        f"FROM TABLE(TUMBLE(TABLE {parts_table}, DESCRIPTOR(wt), {interval(slide_ms)}))\n"
        f"GROUP BY entity, window_start, window_end, window_time",
        _changed_view(merged, every, slots),
    ]
    job = ViewJob(
        view=view,
        slide_ms=slide_ms,
        merged_table=merged,
        sink_function=f"hw_sink_{index}",
        slots=tuple(slots),
    )
    return job, statements


def _changed_view(name: str, every: str, slots: list[SlotSpec]) -> str:
    """Return the view of the rows whose value differs from the entity's previous published row.

    ``every`` has one row per entity and boundary while the entity has events in the view's longest
    window, plus its closing row. A value only changes when an event enters or leaves a window, so
    most of those rows repeat the previous boundary's value; an OVER aggregation (JVM, keyed state:
    the previous row of each entity) keeps the first row of an entity and every row that differs
    in any slot (``IS DISTINCT FROM``: NULL equals NULL), which bounds the writes by about twice
    the events per window instead of active entities x slides.
    """
    win = "OVER (PARTITION BY entity ORDER BY bt)"
    cols = ", ".join(s.name for s in slots)
    prev = ", ".join(f"LAG({s.name}, 1) {win} AS p_{s.name}" for s in slots)
    changed = " OR ".join(f"{s.name} IS DISTINCT FROM p_{s.name}" for s in slots)
    return (
        f"CREATE TEMPORARY VIEW {name} AS\n"
        f"SELECT entity, b, {cols} FROM (\n"
        f"  SELECT entity, b, {cols}, LAG(b, 1) {win} AS p_b, {prev}\n"
        f"  FROM {every}\n"
        f") WHERE p_b IS NULL OR {changed}"
    )


def _top_k_part(f: PlanFeature, prefix: str, key: str, slide_ms: int, slots: list[SlotSpec]) -> str:
    """Return counts per (entity, value) in the window, ranked by count desc then value asc, k kept."""
    k = f.k or 0
    fld = ident(f.field or "")
    cond = " AND ".join(c for c in (_where(f), f"{fld} IS NOT NULL", f"{key} IS NOT NULL") if c)
    counted = (
        f"SELECT {key} AS entity, {fld} AS val, window_start, window_end, window_time, COUNT(*) AS cnt\n"
        f"FROM {_hop(slide_ms, _ms(f.window_s))} WHERE {cond}\n"
        f"GROUP BY {key}, {fld}, window_start, window_end, window_time"
    )
    ranked = (
        "SELECT *, ROW_NUMBER() OVER (PARTITION BY window_start, window_end, entity "
        f"ORDER BY cnt DESC, val ASC) AS rn FROM ({counted})"
    )
    values: dict[str, str] = {}
    for i in range(1, k + 1):
        values[f"{prefix}_top{i}"] = f"CASE WHEN rn = {i} THEN CAST(val AS STRING) END"
        values[f"{prefix}_cnt{i}"] = f"CASE WHEN rn = {i} THEN cnt END"
    return f"SELECT {_select_row('entity', 'window_time', slots, values)}\nFROM ({ranked}) WHERE rn <= {k}"


def udf_columns() -> list[tuple[str, str]]:
    """Return the decode UDF's result columns (name, SQL type)."""
    return list(DECODED_COLUMNS)
