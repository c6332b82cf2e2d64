"""Check the sources of a feature repo and resolve their event-time rules: one rule, one place.

Every default the tiers share about a source's events lives here and nowhere else. ``check``
resolves each source into numbers (:class:`ResolvedTiming`) that travel in the plan, so the
realtime job, the nearline workers and the landing apply the same lateness, the same
future-dated limit and the same lower bound on event time.

Checks per source (each finding names ``sources.yaml``'s line, or the ``.avsc`` file and line):
    1. the current schema and every ``previous_schemas`` entry load (supported Avro only);
    2. ``event_time`` is a timestamp (or a long of UTC ms), ``key`` and ``event_id`` are string or
       integer fields, and no other field is named ``event_time`` or ``event_id`` (reserved);
    3. each ``rules`` entry parses and type-checks against the schema;
    4. the current schema reads every previous version (Avro's resolution rules).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime
from pathlib import Path

from headwater.registry.avro import EventSchema, SchemaError, compatibility_problems, load_event_schema
from headwater.registry.compiled import CompiledSource, SourceRule
from headwater.registry.diagnostics import Diagnostic, Diagnostics, display_path
from headwater.registry.expr import ExprError, parse
from headwater.registry.expr_check import check_expr
from headwater.registry.load import Located
from headwater.registry.models import SourceSpec

DEFAULT_MAX_OUT_OF_ORDERNESS_S = 0.0
"""Watermark delay when a source declares none: events are expected in order."""
DEFAULT_ALLOWED_LATENESS_S = 60.0
"""How far behind the watermark an event may be and still count, when a source declares none."""
DEFAULT_MAX_FUTURE_S = 300.0
"""How far ahead of a tier's clock an event may be, when a source declares none."""
DEFAULT_MIN_EVENT_DATE = "2000-01-01"
"""Events before this UTC date are invalid, when a source declares no ``min_event_time``."""
MAX_EVENT_TIME_MS = 4_102_444_800_000
"""2100-01-01T00:00:00Z: no event time at or after it is valid, whatever the source."""
DEFAULT_ID_MAX_BYTES = 256
"""The longest key or event id, in UTF-8 bytes, when a source declares no ``ids: {max_bytes}``."""
DEFAULT_ID_CHARSET = "any"
"""What a key or event id may hold when a source declares no ``ids: {charset}``: any UTF-8 but NUL."""
KEY_KINDS = frozenset({"string", "int", "long"})
LANDING_COLUMNS = ("produce_ts_ms", "kafka_topic", "kafka_partition", "kafka_offset", "late", "date")
"""Columns the landing adds beside a source's fields in its bronze table: no field may take these names."""


@dataclass(frozen=True)
class ResolvedTiming:
    """A source's event-time rules as numbers (ms), defaults applied: what every tier enforces."""

    max_out_of_orderness_ms: int
    allowed_lateness_ms: int
    max_future_ms: int
    min_event_time_ms: int
    max_event_time_ms: int = MAX_EVENT_TIME_MS


def resolve_ids(spec: SourceSpec) -> tuple[int, str]:
    """Return ``spec``'s id policy as (max_bytes, charset), the defaults above applied."""
    ids = spec.ids
    max_bytes = ids.max_bytes if ids is not None and ids.max_bytes is not None else DEFAULT_ID_MAX_BYTES
    charset = ids.charset if ids is not None and ids.charset is not None else DEFAULT_ID_CHARSET
    return max_bytes, charset


def resolve_timing(spec: SourceSpec) -> ResolvedTiming:
    """Apply the defaults above to ``spec``'s event-time settings."""
    ooo = spec.max_out_of_orderness.seconds if spec.max_out_of_orderness else DEFAULT_MAX_OUT_OF_ORDERNESS_S
    late = spec.allowed_lateness.seconds if spec.allowed_lateness else DEFAULT_ALLOWED_LATENESS_S
    future = spec.max_future.seconds if spec.max_future else DEFAULT_MAX_FUTURE_S
    first = date.fromisoformat(spec.min_event_time or DEFAULT_MIN_EVENT_DATE)
    return ResolvedTiming(
        max_out_of_orderness_ms=round(ooo * 1000),
        allowed_lateness_ms=round(late * 1000),
        max_future_ms=round(future * 1000),
        min_event_time_ms=int(datetime(first.year, first.month, first.day, tzinfo=UTC).timestamp() * 1000),
    )


def check_sources(
    root: Path, sources: dict[str, Located[SourceSpec]], diags: Diagnostics
) -> dict[str, CompiledSource]:
    """Check every source (see the module docstring); return those without errors."""
    out = {}
    for name, loc in sources.items():
        compiled = _check_source(root, loc, diags)
        if compiled is not None:
            out[name] = compiled
    return out


def _check_source(root: Path, loc: Located[SourceSpec], diags: Diagnostics) -> CompiledSource | None:
    spec = loc.spec
    # Step 1
    schema = _schema(root, loc, spec.schema_path, ("schema",), diags)
    previous = [
        _schema(root, loc, p, ("previous_schemas", i), diags) for i, p in enumerate(spec.previous_schemas)
    ]
    if spec.min_event_time is not None:
        try:
            date.fromisoformat(spec.min_event_time)
        except ValueError:
            diags.add(
                _source_diag(
                    loc,
                    "bad-value",
                    ("min_event_time",),
                    f"min_event_time {spec.min_event_time!r} is not a date",
                    "a UTC date YYYY-MM-DD",
                    spec.min_event_time,
                    "write e.g. 1995-01-01",
                )
            )
            return None
    if schema is None or any(p is None for p in previous):
        return None
    # Step 2
    ok = _check_field(loc, schema, "event_time", spec.event_time, frozenset({"timestamp", "long"}), diags)
    if spec.key is not None:
        ok &= _check_field(loc, schema, "key", spec.key, KEY_KINDS, diags)
    if spec.event_id is not None:
        ok &= _check_field(loc, schema, "event_id", spec.event_id, KEY_KINDS, diags)
    ok &= _check_reserved(loc, schema, diags)
    # Step 3
    rules = []
    for i, text in enumerate(spec.rules):
        rule = _rule(loc, schema, i, text, diags)
        ok &= rule is not None
        if rule is not None:
            rules.append(rule)
    # Step 4
    versions = [p for p in previous if p is not None]
    for old in versions:
        for problem in compatibility_problems(old, schema):
            diags.add(
                Diagnostic(
                    code="incompatible-schema",
                    message=f"source '{spec.name}': field '{problem.field}' {problem.problem}, so events "
                    f"written with {old.path.name} (fingerprint {old.fingerprint}) no longer decode",
                    file=display_path(schema.path, root),
                    line=schema.line_of(problem.field),
                    expected="a change Avro can resolve (a field added with a default, a promotion)",
                    found=problem.problem,
                    hint=problem.fix,
                )
            )
            ok = False
    if not ok:
        return None
    return CompiledSource(spec=spec, schema=schema, previous=tuple(versions), rules=tuple(rules))


def _schema(
    root: Path, loc: Located[SourceSpec], rel: str, key: tuple[str | int, ...], diags: Diagnostics
) -> EventSchema | None:
    path = root / rel
    try:
        return load_event_schema(path)
    except SchemaError as exc:
        in_avsc = exc.field is not None
        diags.add(
            Diagnostic(
                code="bad-schema",
                message=f"source '{loc.spec.name}': {exc}",
                file=display_path(path, root) if in_avsc else loc.file,
                line=exc.line if in_avsc else loc.line_of(*key),
                expected="a readable flat Avro record schema, relative to the repo",
                found=rel if not in_avsc else f"field '{exc.field}'",
                hint="fix the path or the .avsc file (supported field types are listed above)",
            )
        )
        return None


def _check_field(
    loc: Located[SourceSpec],
    schema: EventSchema,
    key: str,
    name: str,
    kinds: frozenset[str],
    diags: Diagnostics,
) -> bool:
    found = schema.fields.get(name)
    if found is not None and found.kind in kinds and (key == "event_time" or not found.nullable):
        return True
    wanted = " or ".join(sorted(kinds)) + ("" if key == "event_time" else ", not nullable")
    candidates = [f.name for f in schema.fields.values() if f.kind in kinds]
    diags.add(
        _source_diag(
            loc,
            "unknown-field",
            (key,),
            f"{key} '{name}' is not a {wanted} field of {schema.path.name}",
            f"a {wanted} field",
            found.describe() if found else "no such field",
            f"use one of: {', '.join(candidates) or '(none of that type)'}",
        )
    )
    return False


def _check_reserved(loc: Located[SourceSpec], schema: EventSchema, diags: Diagnostics) -> bool:
    """Refuse fields named ``event_time`` / ``event_id`` that are not the source's event time / id.

    The window code of every tier names an event's time ``event_time`` (UTC ms) and its id
    ``event_id``. A field of either name that means something else would be shadowed, so it is an error here
    rather than a refusal when a tier starts.
    """
    spec, ok = loc.spec, True
    time_field = schema.fields.get("event_time")
    if time_field is not None and (spec.event_time != "event_time" or time_field.time_unit == "us"):
        diags.add(
            _source_diag(
                loc,
                "reserved-field",
                ("event_time",),
                "field 'event_time' is not the source's event time in milliseconds, and the tiers reserve "
                "that name for it",
                "a field named event_time only as the source's event_time, in ms",
                f"event_time: {spec.event_time}, event_time field: {time_field.describe()}",
                "rename the schema's event_time field (add the new name, keep writing both), or "
                "declare it as the source's event_time",
            )
        )
        ok = False
    for name in (n for n in LANDING_COLUMNS if n in schema.fields):
        diags.add(
            Diagnostic(
                code="reserved-field",
                message=f"source '{spec.name}': field '{name}' has the name of a column the landing adds to "
                "the source's bronze table",
                file=loc.file,
                line=loc.line_of("schema"),
                expected=f"no field named {', '.join(LANDING_COLUMNS)}",
                found=name,
                hint=f"rename the field in {schema.path.name} (add the new name, keep writing both a while)",
            )
        )
        ok = False
    if schema.fields.get("event_id") is not None and spec.event_id != "event_id":
        diags.add(
            _source_diag(
                loc,
                "reserved-field",
                ("event_id",) if spec.event_id else ("name",),
                "field 'event_id' is not the source's event_id, and the tiers reserve that name for it",
                "a field named event_id only as the source's event_id",
                f"event_id: {spec.event_id}",
                "declare `event_id: event_id` for the source, or rename the field",
            )
        )
        ok = False
    return ok


def _rule(
    loc: Located[SourceSpec], schema: EventSchema, index: int, text: str, diags: Diagnostics
) -> SourceRule | None:
    try:
        expr = parse(text)
        problems = check_expr(expr, schema)
    except ExprError as exc:
        problems = [exc]
    if problems:
        first = problems[0]
        diags.add(
            _source_diag(
                loc,
                "bad-rule",
                ("rules", index),
                f"rule {text!r}: {first}",
                "a condition in the `where` grammar over the schema's fields",
                f"rule: {text}\n          {' ' * first.pos}^",
                first.hint or "fix the rule",
            )
        )
        return None
    return SourceRule(text=text, expr=expr)


def _source_diag(
    loc: Located[SourceSpec],
    code: str,
    key: tuple[str | int, ...],
    message: str,
    expected: str,
    found: str,
    hint: str,
) -> Diagnostic:
    return Diagnostic(
        code=code,
        message=f"source '{loc.spec.name}': {message}",
        file=loc.file,
        line=loc.line_of(*key),
        expected=expected,
        found=found,
        hint=hint,
    )
