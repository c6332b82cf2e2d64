"""``headwater topics``: create the platform's topics, check the broker."""

from __future__ import annotations

import sys
from pathlib import Path

import click
from kafka.errors import KafkaError

from headwater.cli.errors import HeadwaterGroup
from headwater.pipelines.settings import Settings
from headwater.pipelines.topics import ensure_topics, platform_topics, round_trip


@click.group(cls=HeadwaterGroup)
def topics() -> None:
    """Kafka topics: create the platform's topics, check the broker."""


@topics.command("create")
@click.option("--partitions", type=int, default=None, help="Partitions per topic (default: settings).")
@click.option(
    "--replication-factor",
    type=int,
    default=None,
    help="Replicas per new topic [default: $HEADWATER_KAFKA_REPLICATION, else 1; 3 on the cluster profile].",
)
@click.option(
    "--state-dir",
    type=click.Path(path_type=Path),
    default=None,
    help="Where `headwater apply` wrote the plans [default: $HEADWATER_STATE_DIR, else headwater.yaml's].",
)
def create_command(partitions: int | None, replication_factor: int | None, state_dir: Path | None) -> None:
    """Create the topic of every source of the applied plan, and the dead-letter topic, if missing.

    Before any `headwater apply`, the example repo's sources are used.
    """
    from headwater.pipelines.events.sources import sources_or_examples

    settings = Settings.from_env()
    count = partitions or settings.partitions
    sources, why = sources_or_examples(state_dir)
    if why is not None:  # a plan exists but cannot be read; none at all (before any apply) is silent
        click.echo(f"warning: creating the example repo's source topics: {why}", err=True)
    wanted = platform_topics(settings, sources)
    try:
        created = ensure_topics(settings, wanted, count, replication_factor)
    except KafkaError as exc:
        msg = (
            f"cannot create topics on {settings.kafka_bootstrap} ({exc}); start Kafka with "
            "`make services-up` or point HEADWATER_KAFKA_BOOTSTRAP at yours"
        )
        raise click.ClickException(msg) from exc
    by_topic = {s.topic: s.name for s in sources}
    for name in wanted:
        state = "created" if name in created else "exists"
        role = f"source {by_topic[name]}" if name in by_topic else "dead letters"
        click.echo(f"{name}: {state} ({role}, {settings.kafka_bootstrap})")


@topics.command("health")
@click.option("--timeout", "timeout_s", type=float, default=10.0, show_default=True)
def health_command(timeout_s: float) -> None:
    """Produce and consume one record; exit 1 when the broker cannot do it."""
    settings = Settings.from_env()
    try:
        took = round_trip(settings, timeout_s)
    except KafkaError as err:
        click.echo(f"kafka at {settings.kafka_bootstrap}: unhealthy: {err}", err=True)
        sys.exit(1)
    click.echo(f"kafka at {settings.kafka_bootstrap}: healthy (round trip {took * 1000:.0f} ms)")


if __name__ == "__main__":
    topics()
