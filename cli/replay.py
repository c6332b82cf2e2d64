"""``headwater replay``: replay recorded ranking requests against a service and compare the answers."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import click

from headwater.cli.errors import HeadwaterCommand
from headwater.serving.recording import read_records, read_topic_records
from headwater.serving.replay import replay


@click.command("replay", cls=HeadwaterCommand)
@click.argument("files", nargs=-1, type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--topic", default=None, help="Read the recording from this Kafka topic (recording.topic) instead."
)
@click.option("--bootstrap", default=None, help="Kafka of --topic (default: HEADWATER_* settings).")
@click.option("--url", required=True, help="Base URL of the ranking service, e.g. http://127.0.0.1:8080.")
@click.option(
    "--speed", type=click.FloatRange(min=0.001), default=1.0, show_default=True,
    help="Times faster than recorded (2: twice as fast).",
)  # fmt: skip
@click.option("--max-in-flight", type=click.IntRange(1, 10_000), default=64, show_default=True)
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=0.01), default=10.0, show_default=True)
@click.option(
    "--log-impressions", is_flag=True,
    help="Send the requests as recorded; by default log_impressions is false, so replays stay out of Kafka.",
)  # fmt: skip
@click.option(
    "--max-changed", type=click.FloatRange(0.0, 1.0), default=None,
    help="Exit 1 when the share of changed answers is above this (a CI gate).",
)  # fmt: skip
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
def replay_command(
    files: tuple[Path, ...],
    topic: str | None,
    bootstrap: str | None,
    url: str,
    speed: float,
    max_in_flight: int,
    timeout_s: float,
    log_impressions: bool,
    max_changed: float | None,
    fmt: str,
) -> None:
    """Send recorded ranking requests (`serve` with recording on) again and compare the answers.

    FILES are JSON Lines recordings (a rotated set may be given together), or --topic the Kafka
    topic the service recorded to. Reports latency p50/p95/p99, errors, fallbacks and the share
    of answers whose ranked ids changed.
    """
    if bool(files) == (topic is not None):
        msg = "pass recording FILES or --topic, one of the two"
        raise click.UsageError(msg)
    if topic is not None:
        from headwater.pipelines.settings import Settings

        records = read_topic_records(bootstrap or Settings.from_env().kafka_bootstrap, topic)
    else:
        records = read_records(list(files))
    if not records:
        raise click.ClickException(f"no records in {topic or ', '.join(map(str, files))}")
    report = asyncio.run(replay(records, url, speed, max_in_flight, timeout_s, log_impressions))
    click.echo(json.dumps(report.as_dict(), indent=2) if fmt == "json" else report.text())
    share = report.changed_share
    if max_changed is not None and share is not None and share > max_changed:
        raise click.ClickException(f"{share:.2%} of the answers changed; the limit is {max_changed:.2%}")
