"""Kafka topics of the platform, and a broker health check that proves a real round trip.

``headwater topics create`` makes the topic of every source of the applied plan and the dead-letter
topic, with the configured partition count (``make services-up`` runs it before anything is applied:
the example repo's sources stand in for the plan then); ``headwater topics health`` produces one
record and reads it back, which is what ``infra/kafka.sh`` waits for: an open port is not a working
broker.
"""

from __future__ import annotations

import os
import sys
import time
import uuid
from collections.abc import Iterable
from pathlib import Path

import click
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import NewTopic
from kafka.errors import KafkaError, TopicAlreadyExistsError

from headwater.pipelines.settings import Settings
from headwater.registry.plans import PlanSource

HEALTH_TOPIC = "__headwater_health"

# Dead letters are kept longer than events: they are evidence to investigate, not traffic.
DLQ_RETENTION_MS = str(30 * 24 * 3600 * 1000)


def replication_factor() -> int:
    """Return the replication factor of new topics: ``HEADWATER_KAFKA_REPLICATION``, else 1 (one broker).

    The cluster profile's 3 brokers (infra/cluster.sh) take 3; its brokers' min.insync.replicas 2
    then lets one broker be down without a write with acks=all failing.
    """
    return int(os.environ.get("HEADWATER_KAFKA_REPLICATION", "1"))


def ensure_topics(
    settings: Settings, topics: dict[str, dict[str, str]], partitions: int, replication: int | None = None
) -> list[str]:
    """Create the topics that do not exist yet; return the names that were created.

    Existing topics are left as they are (their partition count is never changed here: that
    would move keys between partitions and break per-user ordering). ``replication`` defaults to
    :func:`replication_factor`.
    """
    factor = replication or replication_factor()
    admin = KafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap, client_id="headwater-admin")
    try:
        existing = set(admin.list_topics())
        missing = [
            NewTopic(name=name, num_partitions=partitions, replication_factor=factor, topic_configs=configs)
            for name, configs in topics.items()
            if name not in existing
        ]
        created: list[str] = []
        for topic in missing:
            try:
                admin.create_topics([topic])
                created.append(topic.name)
            except TopicAlreadyExistsError:
                pass  # created concurrently by another process: the outcome we wanted
        return created
    finally:
        admin.close()


def platform_topics(
    settings: Settings, sources: Iterable[PlanSource] | None = None
) -> dict[str, dict[str, str]]:
    """Return the topics a deployment needs, with their configs: each source's, then the dead letters.

    Without ``sources``, the configured events topic stands for them (``HEADWATER_EVENTS_TOPIC``).
    """
    names = [s.topic for s in sources] if sources is not None else [settings.events_topic]
    topics: dict[str, dict[str, str]] = {name: {} for name in names}
    topics[settings.dlq_topic] = {"retention.ms": DLQ_RETENTION_MS}
    return topics


def round_trip(settings: Settings, timeout_s: float) -> float:
    """Produce one record to the health topic and consume it back; return the seconds it took.

    Raises:
        KafkaError: the broker did not accept or return the record within ``timeout_s``.
    """
    started = time.monotonic()
    ensure_topics(settings, {HEALTH_TOPIC: {"retention.ms": "3600000"}}, partitions=1)
    token = uuid.uuid4().hex.encode()
    producer = KafkaProducer(bootstrap_servers=settings.kafka_bootstrap, acks="all")
    try:
        meta = producer.send(HEALTH_TOPIC, token).get(timeout=timeout_s)
    finally:
        producer.close(timeout=timeout_s)
    consumer = KafkaConsumer(bootstrap_servers=settings.kafka_bootstrap, enable_auto_commit=False)
    try:
        partition = TopicPartition(HEALTH_TOPIC, meta.partition)
        consumer.assign([partition])
        consumer.seek(partition, meta.offset)
        deadline = started + timeout_s
        while time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=200).values():
                if any(record.value == token for record in records):
                    return time.monotonic() - started
    finally:
        consumer.close()
    msg = f"record produced to {HEALTH_TOPIC} was not consumed back within {timeout_s} s"
    raise KafkaError(msg)


@click.group()
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
    from headwater.pipelines.events.sources import SourceError, sources_or_examples

    settings = Settings.from_env()
    count = partitions or settings.partitions
    try:
        sources, why = sources_or_examples(state_dir)
    except SourceError as exc:
        raise click.ClickException(str(exc)) from exc
    if why is not None:
        click.echo(f"creating the example repo's source topics: {why}", err=True)
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
