"""Compile the SQL half of the realtime job: the Kafka source, the decode, dead letters, event columns.

Shape of the job (one Flink job; the Java half is ``dev.headwater.flink.realtime``, see
:mod:`.program`):

1. ``hw_source``: the Kafka topic through the Kafka connector, raw bytes plus headers, key,
   partition and offset. The Avro payload is decoded by a JVM function (infra/maven/flink-udfs) or,
   with ``--decode python``, a vectorised Python UDF (:mod:`.decode`); ``rt`` (the event time as a
   rowtime) carries the watermark ``rt - max_out_of_orderness``.
2. ``hw_routed``: one row per record: the event columns of the program (its fields, and one BOOLEAN
   per filter of the registry, from the plan's Flink SQL), and for a rejected record its reason,
   detail and raw bytes. A record is rejected when it does not decode, or when it is ``late``: its
   event time is behind the watermark by more than the source's ``allowed_lateness``, as in the
   nearline and offline tiers (an event within the allowed lateness still revises the values whose
   windows hold it).
3. The JVM converts ``hw_routed`` to a stream once (so the source and the decode run once), sends the
   good rows to the window operators and hands the rejected ones back as ``hw_dlq_rows``, which
   ``INSERT INTO hw_dlq`` writes to the dead-letter topic with the ``dlq-*`` headers.

Everything here is pure string building, so it is unit-tested without Flink.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from headwater.pipelines.realtime.decode import DEFAULT_MAX_FUTURE_MS, EVENT_COLUMNS
from headwater.pipelines.realtime.program import RealtimePlanError, RealtimeProgram
from headwater.registry.plans import PlanSource, PlanView, TierPlan

_TYPES = dict(EVENT_COLUMNS)
DLQ_ROWS = "hw_dlq_rows"
"""The view of rejected rows that the JVM registers (``RealtimeGraph.attach``) for the DLQ insert."""
ROUTED = "hw_routed"
RAW = ("k", "value", "headers")
__all__ = ["CompiledJob", "JobOptions", "RealtimePlanError", "check_plan", "compile_job", "interval"]


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
    decode: str = "java"
    """``java``: Avro decode in the JVM (infra/maven/flink-udfs); ``python``: the vectorised Python UDF."""
    max_future_ms: int = DEFAULT_MAX_FUTURE_MS
    """Events further ahead of the job's clock go to the dead-letter topic as ``future_dated``."""


@dataclass(frozen=True)
class CompiledJob:
    """The SQL statements of the job, in execution order."""

    ddl: list[str]
    inserts: list[str]
    """Run after the JVM half is attached: they read the view of rejected rows it registers."""
    reason_column: int
    """Index of ``reason`` in ``hw_routed`` rows (the JVM routes on it: NULL = a good event)."""


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


def compile_job(plan: TierPlan, options: JobOptions, program: RealtimeProgram) -> CompiledJob:
    """Compile the SQL statements of the job: DDL, the routed-events view and the dead-letter insert."""
    src = check_plan(plan)
    ddl = [
        _source_ddl(src, options, _decode_args(options)),
        _dlq_ddl(options),
        "CREATE TEMPORARY VIEW hw_decoded AS "
        "SELECT `k`, `value`, `headers`, `partition`, `offset`, ev, rt FROM hw_source",
        _routed_view(src, program),
    ]
    topic = options.topic or src.topic
    insert = (
        "INSERT INTO hw_dlq SELECT `k`, `value`, "
        f"hw_dlq_headers(`headers`, reason, detail, `partition`, `offset`, {literal(topic)}) FROM {DLQ_ROWS}"
    )
    return CompiledJob(ddl=ddl, inserts=[insert], reason_column=len(program.columns))


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


def late_condition(src: PlanSource) -> str:
    """Return SQL that is TRUE for an event behind the watermark by more than the allowed lateness."""
    lateness = interval(_ms(src.allowed_lateness_s or 0))
    return f"rt < CURRENT_WATERMARK(rt) - {lateness}"


def _routed_view(src: PlanSource, program: RealtimeProgram) -> str:
    """One row per record: the program's event columns, then reason, detail and the raw record.

    The raw record (key, value, headers) is kept only on rejected rows, so good rows stay small on
    their way to the window operators.
    """
    lateness_s = src.allowed_lateness_s or 0
    fields = ", ".join(f"ev.{ident(name)} AS {ident(name)}" for name, _ in EVENT_COLUMNS)
    detail = (
        "'event_time ' || CAST(rt AS STRING) || ' is behind the watermark ' "
        f"|| CAST(CURRENT_WATERMARK(rt) AS STRING) || ' by more than the allowed lateness ({lateness_s:g} s)'"
    )
    cols = ", ".join(f"{c.sql} AS {ident(c.name)}" for c in program.columns)
    raw = ", ".join(f"CASE WHEN reason IS NOT NULL THEN {ident(c)} END AS {ident(c)}" for c in RAW)
    return f"""CREATE TEMPORARY VIEW hw_routed AS
SELECT {cols}, reason, detail, {raw}, `partition`, `offset` FROM (
  SELECT {fields}, `k`, `value`, `headers`, `partition`, `offset`, reason,
    CASE WHEN ev.reason IS NOT NULL THEN ev.detail WHEN reason IS NOT NULL THEN {detail} END AS detail
  FROM (
    SELECT *, COALESCE(ev.reason, CASE WHEN {late_condition(src)} THEN 'late' END) AS reason FROM hw_decoded
  )
)"""
