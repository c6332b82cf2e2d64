"""The ``headwater`` command line: one click group with noun/verb sub-commands.

Each area owns its commands in its own module and is registered here, so this file stays a
table of contents. Heavy libraries (Feast, PySpark, PyFlink) are imported inside the commands
that need them, never at start-up, so ``headwater --help`` answers at once.
"""

from __future__ import annotations

from pathlib import Path

import click

from headwater.cli.alerts import alerts
from headwater.cli.client import feedback, rank
from headwater.cli.costs import calibrate, costs
from headwater.cli.errors import HeadwaterGroup
from headwater.cli.events import events
from headwater.cli.events_import import import_cmd
from headwater.cli.experiment import experiment
from headwater.cli.freshness import freshness
from headwater.cli.funnel import funnel
from headwater.cli.ingest import ingest
from headwater.cli.init import init
from headwater.cli.labels import labels
from headwater.cli.monitor import monitor_command
from headwater.cli.nearline import run_nearline
from headwater.cli.offline import consistency, landing, materialize, offline, training_set
from headwater.cli.online import online
from headwater.cli.realtime import realtime
from headwater.cli.registry import apply, check, config, features, plan
from headwater.cli.replay import replay_command
from headwater.cli.retrieval import retrieval
from headwater.cli.serve import model, serve
from headwater.cli.setup import setup
from headwater.cli.skew import skew_command
from headwater.cli.topics import topics
from headwater.registry.config import REPO_ENV, resolve, use_repo


@click.group(cls=HeadwaterGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="headwater")
@click.option(
    "--repo",
    type=click.Path(path_type=Path),
    default=None,
    envvar=REPO_ENV,
    help="The feature repo: a folder with headwater.yaml, or the file [default: $HEADWATER_REPO, "
    "else the nearest headwater.yaml from the current folder up; none: defaults relative to it].",
)
@click.pass_context
def main(ctx: click.Context, repo: Path | None) -> None:
    """Headwater: a streaming feature platform with tiered freshness.

    Create a feature repo (`headwater init DIR`), register features in YAML (features/), check
    them against their SLA and the budget, apply them, and run the realtime, nearline and offline
    tiers that keep one Redis online store fresh. Where Kafka, Redis, the state folder and the lake
    are comes from the repo's headwater.yaml (`headwater config` shows it).
    """
    if ctx.invoked_subcommand == "init":
        return  # a new repo: whatever config is around (or broken) is not its concern
    if repo is not None:
        use_repo(repo)  # exported as $HEADWATER_REPO: the tiers' worker processes see it too
    resolve()  # a broken headwater.yaml stops here, with its file and line, before any work


@main.group("run")
def run() -> None:
    """Run a pipeline tier: realtime (Flink), nearline (Kafka + RocksDB), offline (Spark + Delta)."""


run.add_command(realtime)
run.add_command(run_nearline)
run.add_command(landing)
run.add_command(offline)
main.add_command(init)
main.add_command(config)
main.add_command(setup)
events.add_command(import_cmd)  # history straight into a source's bronze table (Spark + Delta)
main.add_command(events)
main.add_command(online)
main.add_command(ingest)  # the push API (issue 36)
main.add_command(topics)
main.add_command(check)
main.add_command(plan)
main.add_command(apply)
main.add_command(features)
main.add_command(model)
main.add_command(serve)
main.add_command(experiment)  # experiment report (issue 20)
main.add_command(replay_command)  # replay recorded ranking requests (issue 20)
main.add_command(skew_command)  # rescore logged predictions offline (issue 20)
main.add_command(monitor_command)  # served feature values: drift and expectations (issue 34)
main.add_command(alerts)  # Prometheus alerting rules from the registry (issue 34)
main.add_command(retrieval)  # the two-tower retrieval model (issue 15)
main.add_command(funnel)  # the re-ranker of /v1/recommend (issue 15)
main.add_command(training_set)
main.add_command(labels)
main.add_command(materialize)
main.add_command(consistency)
main.add_command(freshness)
main.add_command(rank)
main.add_command(feedback)
main.add_command(costs)  # declared vs estimated vs measured cost per view
main.add_command(calibrate)  # bench/bench_calibrate.py: the cost model's constants
