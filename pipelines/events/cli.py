"""``headwater events produce`` and ``headwater events tail``."""

from __future__ import annotations

import json
import sys
from typing import get_args

import click

from headwater.pipelines.events.codec import DecodedEvent
from headwater.pipelines.events.generator import GeneratorConfig
from headwater.pipelines.events.producer import (
    Acks,
    Compression,
    ProduceError,
    ProducerSettings,
    ProduceStats,
    produce,
)
from headwater.pipelines.events.tail import TailedRecord, TailError, TailSummary, tail
from headwater.pipelines.settings import Settings
from headwater.registry.durations import parse_duration

_SHARE = click.FloatRange(0.0, 1.0)


@click.group()
def events() -> None:
    """Produce synthetic behaviour events to Kafka and read them back.

    Try `headwater events produce --rate 1000 --duration 10`, then
    `headwater events tail --from-beginning --max 20`.
    """


@events.command(name="produce")
@click.option(
    "--rate",
    type=click.FloatRange(min=0.0),
    default=1000.0,
    show_default=True,
    help="Events per second; 0 sends as fast as possible.",
)
@click.option(
    "--duration", type=click.FloatRange(min=0.0), default=10.0, show_default=True, help="Seconds to run."
)
@click.option("--max-events", type=click.IntRange(min=1), default=None, help="Stop after this many records.")
@click.option(
    "--history",
    default=None,
    metavar="DURATION",
    help="Backfill: spread --max-events over this span before now (e.g. 2d), sent as fast as possible.",
)
@click.option("--seed", type=int, default=7, show_default=True, help="Seed of the catalog, users and stream.")
@click.option("--topic", default=None, help="Target topic [default: $HEADWATER_EVENTS_TOPIC or 'events'].")
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
def produce_cmd(
    rate: float,
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
    """Generate realistic events and send them to Kafka, keyed by user_id.

    Each record carries the schema fingerprint (header schema-fp) and the produce time in ms
    (header produce-ts). Prints a progress line on stderr and the final counts as JSON.
    """
    settings = Settings.from_env()
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
    try:
        target = ProducerSettings(
            bootstrap=bootstrap or settings.kafka_bootstrap,
            topic=topic or settings.events_topic,
            rate=rate,
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
    progress = None if quiet else _print_progress
    try:
        stats = produce(target, config, progress=progress)
    except ProduceError as exc:
        raise click.ClickException(str(exc)) from exc
    if progress is not None:
        click.echo("", err=True)
    click.echo(json.dumps({"topic": target.topic, **stats.as_dict()}))
    if stats.failed:
        msg = f"{stats.failed} of {stats.sent} records were not acknowledged by the broker"
        raise click.ClickException(msg)


def _print_progress(stats: ProduceStats) -> None:
    line = (
        f"\rsent {stats.sent:,} in {stats.elapsed_s:.1f}s ({stats.rate:,.0f}/s)"
        f"  malformed {stats.malformed:,}  duplicates {stats.duplicates:,}  late {stats.late:,}"
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
@click.option("--topic", default=None, help="Topic [default: $HEADWATER_EVENTS_TOPIC or 'events'].")
@click.option("--bootstrap", default=None, help="Kafka bootstrap [default: from HEADWATER_* settings].")
@click.option("--summary-only", "--quiet", "quiet", is_flag=True, help="Print only the summary.")
def tail_cmd(
    max_records: int | None,
    from_beginning: bool,
    timeout: float,
    topic: str | None,
    bootstrap: str | None,
    quiet: bool,
) -> None:
    """Read events back: one JSON line per valid event on stdout, rejects and a summary on stderr."""
    settings = Settings.from_env()
    on_record = None if quiet else _print_record
    try:
        summary = tail(
            bootstrap or settings.kafka_bootstrap,
            topic or settings.events_topic,
            max_records=max_records,
            from_beginning=from_beginning,
            timeout_s=timeout,
            on_record=on_record,
        )
    except TailError as exc:
        raise click.ClickException(str(exc)) from exc
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
    click.echo("  by type:  " + "  ".join(f"{k} {v:,}" for k, v in data["by_type"].items()), err=True)
    invalid = "  ".join(f"{k} {v:,}" for k, v in data["invalid"].items()) or "none"
    click.echo(f"  invalid:  {invalid}", err=True)
    if data["age_ms_p50"] is not None:
        click.echo(
            f"  age at read (now - produce-ts): p50 {data['age_ms_p50']} ms  p99 {data['age_ms_p99']} ms",
            err=True,
        )
