"""The ``headwater`` command line: one click group with noun/verb sub-commands.

Each area owns its commands in its own module and is registered here, so this file stays a
table of contents. Heavy libraries (Feast, PySpark, PyFlink) are imported inside the commands
that need them, never at start-up, so ``headwater --help`` answers at once.
"""

from __future__ import annotations

import click

from headwater.pipelines.events.cli import events
from headwater.pipelines.freshness.cli import freshness
from headwater.pipelines.nearline.cli import run_nearline
from headwater.pipelines.offline.cli import consistency, landing, materialize, offline, training_set
from headwater.pipelines.offline.cli_labels import labels
from headwater.pipelines.realtime.cli import realtime
from headwater.pipelines.store.cli import online
from headwater.pipelines.topics import topics
from headwater.registry.commands import apply, check, features, plan
from headwater.serving.cli import model, serve
from headwater.serving.client import feedback, rank


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="headwater")
def main() -> None:
    """Headwater: a streaming feature platform with tiered freshness.

    Register features in YAML (features/), check them against their SLA and the budget,
    apply them, and run the realtime, nearline and offline tiers that keep one Redis online
    store fresh.
    """


@main.group("run")
def run() -> None:
    """Run a pipeline tier: realtime (Flink), nearline (Kafka + RocksDB), offline (Spark + Delta)."""


run.add_command(realtime)
run.add_command(run_nearline)
run.add_command(landing)
run.add_command(offline)
main.add_command(events)
main.add_command(online)
main.add_command(topics)
main.add_command(check)
main.add_command(plan)
main.add_command(apply)
main.add_command(features)
main.add_command(model)
main.add_command(serve)
main.add_command(training_set)
main.add_command(labels)
main.add_command(materialize)
main.add_command(consistency)
main.add_command(freshness)
main.add_command(rank)
main.add_command(feedback)
