"""``headwater init``: a new feature repo from the example."""

from __future__ import annotations

from pathlib import Path

import click
from pydantic import ValidationError

from headwater.cli.errors import HeadwaterCommand
from headwater.registry.config import (
    DEFAULT_FEATURES,
    KafkaConfig,
    RedisConfig,
)
from headwater.registry.init import scaffold


@click.command(cls=HeadwaterCommand)
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path))
@click.option("--kafka-bootstrap", default=KafkaConfig().bootstrap, show_default=True, help="Kafka brokers.")
@click.option("--redis-url", default=RedisConfig().url, show_default=True, help="The online store.")
def init(directory: Path, kafka_bootstrap: str, redis_url: str) -> None:
    """Create a feature repo in DIRECTORY: headwater.yaml and the example definitions in features/.

    Edit features/ (a source and its Avro schema in sources.yaml and schemas/, views in one YAML
    file each) and headwater.yaml (Kafka, Redis, the state folder and the lake), then run the
    commands printed at the end from inside DIRECTORY.
    """
    try:
        config = scaffold(directory, kafka_bootstrap, redis_url)
    except ValidationError as exc:  # a bad --kafka-bootstrap / --redis-url
        raise click.BadParameter(str(exc)) from exc
    click.echo(f"Created feature repo {directory.resolve()}")
    click.echo(f"  config:   {config}")
    click.echo(f"  features: {config.parent / DEFAULT_FEATURES}")
    click.echo("Next, from that folder:")
    click.echo("  headwater check                 # validate features/ against SLAs and the budget")
    click.echo("  headwater apply                 # Feast objects and one plan per tier, under .headwater/")
    click.echo("  headwater setup jars            # once: the JVM jars the realtime and offline tiers need")
    click.echo("  headwater run nearline          # (and run realtime, run landing, run offline)")
