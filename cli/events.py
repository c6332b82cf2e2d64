"""``headwater events produce`` and ``headwater events tail``."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import get_args

import click

from headwater.cli.errors import HeadwaterGroup
from headwater.pipelines.events.codec import DecodedEvent, EventCodec
from headwater.pipelines.events.generator import GeneratorConfig
from headwater.pipelines.events.ingest import (
    FileOptions,
    IngestError,
    Pace,
    Reject,
    RejectFile,
    RejectSink,
    RejectTopic,
    produce_file,
)
from headwater.pipelines.events.producer import (
    Acks,
    Compression,
    ProducerSettings,
    ProduceStats,
    open_producer,
    produce,
)
from headwater.pipelines.events.readers import FORMATS, open_rows
from headwater.pipelines.events.sending import RunStats
from headwater.pipelines.events.sources import applied_source
from headwater.pipelines.events.tail import TailedRecord, TailSummary, tail
from headwater.pipelines.settings import Settings
from headwater.registry.durations import parse_duration
from headwater.registry.plans import PlanSource

_SHARE = click.FloatRange(0.0, 1.0)
DEFAULT_GENERATED_RATE = 1000.0
_CLEAR_LINE = "\r\x1b[K" if sys.stderr.isatty() else "\r"
"""Start of a line printed over the progress line (erased to its end on a terminal)."""
REJECTS_SHOWN = 5
"""Rejects printed on stderr as they happen; the rest are only in the reject file or the DLQ."""
_GENERATOR_OPTIONS = (
    "history",
    "diurnal_amplitude",
    "late_share",
    "out_of_order_share",
    "duplicate_share",
    "malformed_share",
)


@click.group(cls=HeadwaterGroup)
def events() -> None:
    """Produce events to Kafka (generated, or your own file) and read them back.

    Try `headwater events produce --rate 1000 --duration 10`, then
    `headwater events tail --from-beginning --max 20`. Bring your own data with
    `headwater events produce --source NAME --from rows.jsonl` (JSON Lines, CSV, Parquet).
    """


_state_dir_option = click.option(
    "--state-dir",
    type=click.Path(path_type=Path),
    default=None,
    help="Where `headwater apply` wrote the plans [default: $HEADWATER_STATE_DIR, else headwater.yaml's].",
)


@events.command(name="produce")
@click.option(
    "--source",
    "source_name",
    default=None,
    metavar="NAME",
    help="A source of the applied plan: its topic, schema and key. Without --from, random valid events "
    "of its schema (the behaviour generator for the example behaviour schema) [default: behaviour events].",
)
@click.option(
    "--from",
    "from_file",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    metavar="FILE",
    help="Send the rows of FILE (JSON Lines, CSV, TSV, Parquet; .gz for the text ones) to --source.",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(FORMATS),
    default=None,
    help="Format of FILE [default: its extension].",
)
@click.option(
    "--reject-file",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="Rejected rows with their line and reason, as JSON Lines [default: FILE.rejects.jsonl].",
)
@click.option(
    "--rejects-to",
    type=click.Choice(["file", "dlq"]),
    default="file",
    show_default=True,
    help="Write rejected rows to the reject file, or as dead letters to the DLQ topic.",
)
@click.option(
    "--time-shift",
    default=None,
    metavar="SHIFT",
    help="Move FILE's times: to-now (newest event = now), from-now (oldest = now), or a signed "
    "duration such as +3650d or -2h.",
)
@click.option(
    "--pace",
    type=click.Choice(get_args(Pace)),
    default="rate",
    show_default=True,
    help="FILE only: 'rate' sends at --rate; 'recorded' follows the gaps between the rows' event times "
    "(with --time-shift from-now: a live replay).",
)
@click.option(
    "--speed",
    type=click.FloatRange(min=0.0, min_open=True),
    default=1.0,
    show_default=True,
    help="With --pace recorded: replay this many times faster than recorded.",
)
@_state_dir_option
@click.option(
    "--rate",
    type=click.FloatRange(min=0.0),
    default=None,
    help="Events per second; 0 sends as fast as possible [default: 1000 generated, 0 from a file].",
)
@click.option(
    "--duration",
    type=click.FloatRange(min=0.0),
    default=10.0,
    show_default=True,
    help="Seconds to run (generated events).",
)
@click.option(
    "--max-events", type=click.IntRange(min=1), default=None, help="Stop after this many records (rows)."
)
@click.option(
    "--history",
    default=None,
    metavar="DURATION",
    help="Backfill: spread --max-events over this span before now (e.g. 2d), sent as fast as possible.",
)
@click.option("--seed", type=int, default=7, show_default=True, help="Seed of the generated stream.")
@click.option(
    "--topic",
    default=None,
    help="Target topic [default: the source's, else $HEADWATER_EVENTS_TOPIC or 'events'].",
)
@click.option("--bootstrap", default=None, help="Kafka bootstrap [default: from HEADWATER_* settings].")
@click.option(
    "--diurnal-amplitude",
    type=click.FloatRange(0.0, 0.95),
    default=0.0,
    show_default=True,
    help="Swing of the rate over the day (0 keeps it flat at --rate).",
)
@click.option(
    "--late-share",
    type=_SHARE,
    default=0.01,
    show_default=True,
    help="Share of events whose event time is 2-15 min behind (past any allowed lateness).",
)
@click.option(
    "--out-of-order-share",
    type=_SHARE,
    default=0.02,
    show_default=True,
    help="Share of events whose event time is up to 5 s behind.",
)
@click.option(
    "--duplicate-share",
    type=_SHARE,
    default=0.01,
    show_default=True,
    help="Share of records that repeat a recent event (same event_id).",
)
@click.option(
    "--malformed-share",
    type=_SHARE,
    default=0.005,
    show_default=True,
    help="Share of records a consumer must reject (broken bytes, bad fields, unknown schema).",
)
@click.option(
    "--compression",
    type=click.Choice(get_args(Compression)),
    default="zstd",
    show_default=True,
    help="Batch compression (zstd costs the least CPU per event; lz4 needs the lz4 package).",
)
@click.option(
    "--acks",
    type=click.Choice(get_args(Acks)),
    default="all",
    show_default=True,
    help="'all' is durable and idempotent; '1' waits for the leader only.",
)
@click.option(
    "--linger-ms",
    type=click.IntRange(min=0),
    default=20,
    show_default=True,
    help="How long a batch waits for more records (see bench/bench_producer.py).",
)
@click.option(
    "--batch-size",
    type=click.IntRange(min=1024),
    default=256 * 1024,
    show_default=True,
    help="Max bytes per partition batch.",
)
@click.option("--quiet", is_flag=True, help="No progress line; print only the final JSON counts.")
@click.pass_context
def produce_cmd(
    ctx: click.Context,
    source_name: str | None,
    from_file: Path | None,
    fmt: str | None,
    reject_file: Path | None,
    rejects_to: str,
    time_shift: str | None,
    pace: Pace,
    speed: float,
    state_dir: Path | None,
    rate: float | None,
    duration: float,
    max_events: int | None,
    history: str | None,
    seed: int,
    topic: str | None,
    bootstrap: str | None,
    diurnal_amplitude: float,
    late_share: float,
    out_of_order_share: float,
    duplicate_share: float,
    malformed_share: float,
    compression: Compression,
    acks: Acks,
    linger_ms: int,
    batch_size: int,
    quiet: bool,
) -> None:
    """Send events to Kafka: generated ones, or the rows of your own file.

    Generated: `headwater events produce --rate 1000 --duration 10` (behaviour events), or
    `headwater events produce --source payments --rate 200 --duration 30` (any source, from its schema).

    Your file: `headwater events produce --source payments --from payments.jsonl`; move old times
    to now with `--time-shift to-now`, pace with `--rate 5000`, or replay as live with
    `--time-shift from-now --pace recorded`.

    Records are keyed by the source's key and carry the schema fingerprint (header schema-fp) and
    the produce time in ms (header produce-ts). A row of FILE that does not fit the source's schema
    or rules is rejected with its line and reason (reject file or DLQ) and the run goes on. Prints
    progress on stderr and the final counts as JSON on stdout.
    """
    settings = Settings.from_env()
    source = _source(source_name, state_dir)
    file_only = {"reject_file": reject_file, "time_shift": time_shift, "fmt": fmt}
    if from_file is None:
        given = [f"--{k.replace('_', '-')}" for k, v in file_only.items() if v is not None]
        if rejects_to != "file" or pace != "rate":
            given.append("--rejects-to/--pace")
        if given:
            raise click.UsageError(f"{', '.join(given)} only apply with --from FILE")
    try:
        target = ProducerSettings(
            bootstrap=bootstrap or settings.kafka_bootstrap,
            topic=topic or (source.topic if source is not None else settings.events_topic),
            rate=rate if rate is not None else (0.0 if from_file is not None else DEFAULT_GENERATED_RATE),
            duration_s=duration,
            max_events=max_events,
            linger_ms=linger_ms,
            batch_size=batch_size,
            compression=compression,
            acks=acks,
            history_s=parse_duration(history).seconds if history else None,
        )
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
    if from_file is not None:
        if rejects_to == "dlq" and reject_file is not None:
            msg = "--reject-file and --rejects-to dlq contradict each other: choose one place for the rejects"
            raise click.UsageError(msg)
        if source is None:
            msg = "--from FILE needs --source NAME: the source whose schema its rows follow"
            raise click.UsageError(msg)
        _refuse_generator_options(ctx, "--from FILE")
        try:
            options = FileOptions(
                time_shift=time_shift, rate=target.rate, pace=pace, speed=speed, max_rows=max_events
            )
        except IngestError as exc:
            raise click.UsageError(str(exc)) from exc
        if time_shift is not None and time_shift.strip() == "from-now" and pace != "recorded":
            click.echo(
                "warning: --time-shift from-now dates every event after the file's first in the future, "
                "and the tiers dead-letter those beyond the source's max_future; add --pace recorded to "
                "send each at its time, or use --time-shift to-now",
                err=True,
            )
        _produce_file(target, settings, source, from_file, fmt, reject_file, rejects_to, options, quiet)
        return
    if source is not None and not _is_behaviour(source):
        _refuse_generator_options(ctx, f"random events of source {source.name!r}", allowed=("history",))
        _produce_synthetic(target, source, seed, quiet)
        return
    _produce_behaviour(
        target,
        source,
        seed,
        diurnal_amplitude,
        late_share,
        out_of_order_share,
        duplicate_share,
        malformed_share,
        quiet,
    )


def _source(name: str | None, state_dir: Path | None) -> PlanSource | None:
    if name is None:
        return None
    return applied_source(name, state_dir)


def _is_behaviour(source: PlanSource) -> bool:
    """Whether the source's current schema is the example behaviour schema (its generator then applies)."""
    from headwater.pipelines.events.schema import ExampleRepoError, behavior_source

    try:
        return source.current.fingerprint == behavior_source().current.fingerprint
    except ExampleRepoError:
        return False


def _refuse_generator_options(ctx: click.Context, mode: str, allowed: tuple[str, ...] = ()) -> None:
    """Options of the behaviour generator, set on the command line, are an error in another mode."""
    given = [
        f"--{name.replace('_', '-')}"
        for name in _GENERATOR_OPTIONS
        if name not in allowed and ctx.get_parameter_source(name) is click.core.ParameterSource.COMMANDLINE
    ]
    if given:
        raise click.UsageError(f"{', '.join(given)} only shape the behaviour generator, not {mode}")


def _produce_behaviour(
    target: ProducerSettings,
    source: PlanSource | None,
    seed: int,
    diurnal_amplitude: float,
    late_share: float,
    out_of_order_share: float,
    duplicate_share: float,
    malformed_share: float,
    quiet: bool,
) -> None:
    try:
        config = GeneratorConfig(
            seed=seed,
            diurnal_amplitude=diurnal_amplitude,
            late_share=late_share,
            out_of_order_share=out_of_order_share,
            duplicate_share=duplicate_share,
            malformed_share=malformed_share,
        )
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
    progress = None if quiet else _print_progress
    codec = EventCodec(source) if source is not None else None
    stats = produce(target, config, progress=progress, codec=codec)
    if progress is not None:
        click.echo("", err=True)
    click.echo(json.dumps({"topic": target.topic, **stats.as_dict()}))
    if stats.failed:
        msg = f"{stats.failed} of {stats.sent} records were not acknowledged by the broker"
        raise click.ClickException(msg)


def _produce_synthetic(target: ProducerSettings, source: PlanSource, seed: int, quiet: bool) -> None:
    from headwater.pipelines.events.synthetic import produce_synthetic

    kafka = open_producer(target)
    progress = None if quiet else _print_run_progress
    try:
        stats = produce_synthetic(
            kafka,
            source,
            rate=target.rate,
            duration_s=target.duration_s,
            max_events=target.max_events,
            seed=seed,
            progress=progress,
            topic=target.topic,
            history_s=target.history_s,
        )
    finally:
        kafka.close(timeout=10)
    if progress is not None:
        click.echo("", err=True)
    click.echo(json.dumps({"source": source.name, "topic": target.topic, **stats.as_dict()}))
    _fail_on_unacknowledged(stats)


def _produce_file(
    target: ProducerSettings,
    settings: Settings,
    source: PlanSource,
    path: Path,
    fmt: str | None,
    reject_file: Path | None,
    rejects_to: str,
    options: FileOptions,
    quiet: bool,
) -> None:
    reader = open_rows(path, fmt)
    with reader:
        to_dlq = rejects_to == "dlq"
        kafka = open_producer(target, also=(settings.dlq_topic,) if to_dlq else ())
        try:
            sink: RejectSink
            if to_dlq:
                sink = RejectTopic(kafka, settings.dlq_topic, target.topic, path)
            else:
                sink = RejectFile(reject_file or path.with_name(path.name + ".rejects.jsonl"))
            shown = _RejectPrinter(path, sink.where)
            try:
                stats = produce_file(
                    kafka,
                    source,
                    reader,
                    sink,
                    options,
                    topic=target.topic,
                    progress=None if quiet else _print_run_progress,
                    on_reject=shown,
                )
            finally:
                sink.close()
        finally:
            kafka.close(timeout=10)
    if not quiet:
        click.echo("", err=True)
    shown.summary(stats.rejected)
    if stats.ignored_columns:
        click.echo(
            f"ignored columns (not in source {source.name!r}): {', '.join(stats.ignored_columns)}", err=True
        )
    out = {
        "source": source.name,
        "topic": target.topic,
        "file": str(path),
        **stats.as_dict(),
        "rejects": sink.where,
    }
    click.echo(json.dumps(out))
    _fail_on_unacknowledged(stats)


class _RejectPrinter:
    """Print the first rejects as FILE:LINE: field: reason, then only count them."""

    def __init__(self, path: Path, where: str) -> None:
        self.path = path
        self.where = where
        self.count = 0

    def __call__(self, reject: Reject) -> None:
        self.count += 1
        if self.count <= REJECTS_SHOWN:
            field = f"{reject.field}: " if reject.field else ""
            click.echo(f"{_CLEAR_LINE}{self.path}:{reject.line}: {field}{reject.reason}", err=True)

    def summary(self, rejected: int) -> None:
        if rejected:
            more = f" ({rejected - REJECTS_SHOWN:,} more not shown)" if rejected > REJECTS_SHOWN else ""
            click.echo(f"{rejected:,} rejected row(s){more}: see {self.where}", err=True)


def _fail_on_unacknowledged(stats: RunStats) -> None:
    if stats.failed:
        msg = f"{stats.failed} of {stats.sent} records were not acknowledged by the broker"
        raise click.ClickException(msg)


def _print_progress(stats: ProduceStats) -> None:
    line = (
        f"\rsent {stats.sent:,} in {stats.elapsed_s:.1f}s ({stats.rate:,.0f}/s)"
        f"  malformed {stats.malformed:,}  duplicates {stats.duplicates:,}  late {stats.late:,}"
    )
    click.echo(line, err=True, nl=False)


def _print_run_progress(stats: RunStats) -> None:
    done = f" ({stats.done:.0%})" if stats.done is not None else ""
    eta = ""
    if stats.done and 0 < stats.done < 1:
        eta = f"  eta {stats.elapsed_s * (1 - stats.done) / stats.done:,.0f}s"
    line = (
        f"\rread {stats.read:,}{done}  sent {stats.sent:,}  rejected {stats.rejected:,}"
        f"  {stats.rate:,.0f} rows/s  {stats.elapsed_s:.1f}s{eta}   "
    )
    click.echo(line, err=True, nl=False)


@events.command(name="tail")
@click.option("--max", "max_records", type=click.IntRange(min=1), default=None, help="Stop after N records.")
@click.option("--from-beginning", is_flag=True, help="Start at the oldest record instead of the newest.")
@click.option(
    "--timeout",
    type=click.FloatRange(min=0.1),
    default=5.0,
    show_default=True,
    help="Stop after this many seconds without a new record.",
)
@click.option(
    "--source",
    "source_name",
    default=None,
    metavar="NAME",
    help="A source of the applied plan: read its topic with its codec [default: the behaviour events].",
)
@_state_dir_option
@click.option(
    "--topic", default=None, help="Topic [default: the source's, else $HEADWATER_EVENTS_TOPIC or 'events']."
)
@click.option("--bootstrap", default=None, help="Kafka bootstrap [default: from HEADWATER_* settings].")
@click.option("--summary-only", "--quiet", "quiet", is_flag=True, help="Print only the summary.")
def tail_cmd(
    max_records: int | None,
    from_beginning: bool,
    timeout: float,
    source_name: str | None,
    state_dir: Path | None,
    topic: str | None,
    bootstrap: str | None,
    quiet: bool,
) -> None:
    """Read events back: one JSON line per valid event on stdout, rejects and a summary on stderr."""
    settings = Settings.from_env()
    source = _source(source_name, state_dir)
    on_record = None if quiet else _print_record
    summary = tail(
        bootstrap or settings.kafka_bootstrap,
        topic or (source.topic if source is not None else settings.events_topic),
        max_records=max_records,
        from_beginning=from_beginning,
        timeout_s=timeout,
        on_record=on_record,
        codec=EventCodec(source) if source is not None else None,
    )
    _print_summary(summary)


def _print_record(record: TailedRecord) -> None:
    result = record.result
    if isinstance(result, DecodedEvent):
        sys.stdout.write(json.dumps(result.event, separators=(",", ":")) + "\n")
    else:
        where = {"partition": record.partition, "offset": record.offset}
        click.echo(json.dumps({"invalid": result.reason.value, "detail": result.detail, **where}), err=True)


def _print_summary(summary: TailSummary) -> None:
    data = summary.as_dict()
    click.echo(
        f"records {data['records']:,}  valid {data['valid']:,}  duplicate ids {data['duplicate_ids']:,}",
        err=True,
    )
    if data["by_field"] is not None:
        counts = "  ".join(f"{k} {v:,}" for k, v in data["by_type"].items())
        click.echo(f"  by {data['by_field']}:  {counts}", err=True)
    invalid = "  ".join(f"{k} {v:,}" for k, v in data["invalid"].items()) or "none"
    click.echo(f"  invalid:  {invalid}", err=True)
    if data["age_ms_p50"] is not None:
        click.echo(
            f"  age at read (now - produce-ts): p50 {data['age_ms_p50']} ms  p99 {data['age_ms_p99']} ms",
            err=True,
        )
