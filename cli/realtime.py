"""``headwater run realtime``: compile the applied realtime plan into one Flink job and run it.

The job runs every realtime view of every source of the plan, one pipeline per source (``--source``
runs a subset).

Local mini-cluster by default (the command blocks while the job runs; Ctrl-C or SIGTERM stops
it, and the next start resumes from the newest checkpoint); ``--jobmanager HOST:PORT`` submits
the same job to a Flink cluster and returns once it is accepted.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from headwater.cli.errors import HeadwaterCommand
from headwater.cli.options import STATE_HELP, resolved_state_dir
from headwater.pipelines.settings import Settings

if TYPE_CHECKING:
    from headwater.pipelines.realtime.job import RunOptions
    from headwater.pipelines.realtime.sql import JobOptions
    from headwater.registry.plans import TierPlan


@click.command("realtime", cls=HeadwaterCommand)
@click.option(
    "--state-dir",
    type=click.Path(path_type=Path),
    default=None,
    callback=resolved_state_dir,
    help=f"Where `headwater apply` wrote the plans {STATE_HELP}.",
)
@click.option(
    "--checkpoint-dir",
    type=click.Path(path_type=Path),
    default=None,
    help="Checkpoint folder (default: <state-dir>/checkpoints/realtime).",
)
@click.option(
    "--jobmanager",
    default=None,
    metavar="HOST:PORT",
    help="Submit to this Flink cluster's REST endpoint instead of a local mini-cluster.",
)
@click.option("--parallelism", type=int, default=2, show_default=True)
@click.option(
    "--checkpoint-interval",
    "checkpoint_interval_s",
    type=float,
    default=5.0,
    show_default=True,
    help="Seconds between checkpoints.",
)
@click.option(
    "--source",
    "sources",
    multiple=True,
    metavar="NAME",
    help="Run only this source's realtime views (repeatable; default: every source with a realtime view).",
)
@click.option(
    "--topic",
    "topics",
    multiple=True,
    metavar="[SOURCE=]TOPIC",
    help="Read SOURCE from TOPIC, not the plan's topic (repeatable); a bare TOPIC when one source runs.",
)
@click.option("--dlq-topic", default=None, help="Dead-letter topic (default: settings, events.dlq).")
@click.option("--group-id", default="headwater-realtime", show_default=True)
@click.option("--namespace", default="hw", show_default=True, help="Redis key namespace of the store.")
@click.option("--from-earliest", is_flag=True, help="Without a checkpoint, start at the earliest offset.")
@click.option(
    "--from-latest",
    is_flag=True,
    help="Without a checkpoint, start at the latest offset (skip a backfill left to the other tiers).",
)
@click.option("--no-restore", is_flag=True, help="Ignore existing checkpoints.")
@click.option(
    "--no-backfill",
    is_flag=True,
    help="At a restore, start new and changed views empty instead of replaying their windows from Kafka.",
)
@click.option(
    "--jvm-heap",
    default="2g",
    show_default=True,
    help="Heap of the local mini-cluster's JVM (-Xmx); JVM_ARGS in the environment wins.",
)
@click.option(
    "--conf",
    "conf",
    multiple=True,
    metavar="KEY=VALUE",
    envvar="HEADWATER_REALTIME_CONF",
    help="More Flink configuration, e.g. execution.checkpointing.unaligned.enabled=true (repeatable; wins;"
    " also from HEADWATER_REALTIME_CONF, whitespace-separated).",
)
@click.option("--explain", "explain_only", is_flag=True, help="Print the Flink plan and exit.")
def realtime(
    state_dir: Path,
    checkpoint_dir: Path | None,
    jobmanager: str | None,
    parallelism: int,
    checkpoint_interval_s: float,
    sources: tuple[str, ...],
    topics: tuple[str, ...],
    dlq_topic: str | None,
    group_id: str,
    namespace: str,
    from_earliest: bool,
    from_latest: bool,
    no_restore: bool,
    no_backfill: bool,
    jvm_heap: str,
    conf: tuple[str, ...],
    explain_only: bool,
) -> None:
    """Run every realtime view of the applied registry as one PyFlink job (Kafka -> Redis), per source.

    Values are published as soon as the job's clock (the newest event time seen) passes their window
    boundary, and revised when an out-of-order event arrives; events later than the source's allowed
    lateness go to the dead-letter topic.
    """
    from headwater.pipelines.realtime.job import RunOptions, explain
    from headwater.pipelines.realtime.sql import JobOptions, RealtimePlanError, check_plan
    from headwater.pipelines.store.connect import check_eviction_policy, redis_client
    from headwater.registry.plans import read_plan

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = Settings.from_env()
    plan = read_plan(state_dir, "realtime")
    running = [s.name for s in check_plan(plan, sources)]
    options = JobOptions(
        kafka_bootstrap=settings.kafka_bootstrap,
        dlq_topic=dlq_topic or settings.dlq_topic,
        group_id=group_id,
        topics=_topic_overrides(topics, running),
        sources=tuple(sources),
        startup_mode=_startup_mode(from_earliest, from_latest),
    )
    if from_latest:
        # "Latest" is the end of each topic now, not when the job's source first polls: a JVM and its
        # Python workers can take minutes to start on a busy machine, and every event sent meanwhile
        # would be skipped. A restored checkpoint's offsets still win (its scan uid is restored).
        ends = _end_offsets(
            settings.kafka_bootstrap, {s.name: options.topic(s) for s in plan.sources if s.name in running}
        )
        options = replace(options, start_offsets=ends)
    run = RunOptions(
        redis_url=settings.redis_url,
        checkpoint_dir=checkpoint_dir or state_dir / "checkpoints" / "realtime",
        namespace=namespace,
        parallelism=parallelism,
        checkpoint_interval_s=checkpoint_interval_s,
        jobmanager=jobmanager,
        restore=not no_restore,
        backfill=not no_backfill,
        jvm_heap=jvm_heap,
        extra_conf=_conf_pairs(conf),
        reported_dir=state_dir / "realtime" / "reported",
    )
    if explain_only:
        try:
            click.echo(explain(plan, options, run))
        except (RealtimePlanError, ValueError) as exc:
            raise click.ClickException(str(exc)) from exc
        return
    # The JVM sink writes the values: refuse an evicting store before anything is submitted.
    store = redis_client(settings.redis_url, socket_connect_timeout=2.0, socket_timeout=5.0)
    try:
        check_eviction_policy(store, allowed=settings.redis_eviction, tier="the realtime tier")
    finally:
        store.close()  # the job opens its own connections; this one would idle until the job ends
    _run(plan, options, run, running)


class _Submitted:
    """A submitted job: its id, and a wait that returns its failure as Flink's text."""

    def __init__(self, client: Any, job_id: str) -> None:
        self.client = client
        self.job_id = job_id

    def wait(self) -> str | None:
        from py4j.protocol import Py4JJavaError
        from pyflink.util.exceptions import JavaException

        try:
            self.client.get_job_execution_result().result()
        except (Py4JJavaError, JavaException) as exc:
            return str(exc)
        return None


def _run(plan: TierPlan, options: JobOptions, run: RunOptions, running: list[str]) -> None:
    """Choose a checkpoint (each candidate checked), submit, and on a local mini-cluster supervise the job.

    See :mod:`headwater.pipelines.realtime.recovery`: a checkpoint that fails its check or its restore is
    marked and the previous one restored; any other failure is submitted again from the newest.
    """
    from headwater.pipelines.realtime.job import (
        checkpoint_candidates,
        lost_state_report,
        record_views,
        start_gateway,
        state_report,
        submit,
    )
    from headwater.pipelines.realtime.recovery import Choice, choose_checkpoint, job_checkpointed, supervise
    from headwater.pipelines.realtime.sql import RealtimePlanError

    start_gateway(run.jvm_heap)  # the checkpoint check reads _metadata with Flink's loader

    def choose() -> Choice:
        return choose_checkpoint(checkpoint_candidates(run, plan)) if run.restore else Choice(None)

    def start(choice: Choice) -> _Submitted:
        try:
            client, programs = submit(plan, options, run, choice.checkpoint)
        except (RealtimePlanError, ValueError) as exc:
            raise click.ClickException(str(exc)) from exc
        job_id = str(client.get_job_id())
        record_views(run, job_id, plan, running, programs)
        click.echo(f"realtime job {job_id} submitted:")
        for program in programs:
            src = next(s for s in plan.sources if s.name == program.source)
            views = ", ".join(v.name for v in plan.views if v.source == src.name)
            click.echo(
                f"  source {src.name}: reading {options.topic(src)}; views {views} "
                f"(operators {', '.join(program.groups)})"
            )
        for chk, why in choice.skipped:
            click.echo(f"  checkpoint skipped: {chk}: {why}")
        if choice.checkpoint is not None:  # echoed: PyFlink can raise the log level after the first job
            click.echo(f"  checkpoint to restore: {choice.checkpoint}")
            report = state_report(choice.checkpoint, plan, running, programs)
        else:
            report = lost_state_report(plan, running) if choice.skipped else None
        for line in report.lines() if report is not None else []:
            click.echo(f"  {line}")
        return _Submitted(client, job_id)

    if run.jobmanager:
        start(choose())  # the cluster runs it; its own restarts apply
        return
    try:
        supervise(choose, start, lambda job_id: job_checkpointed(run.checkpoint_dir.resolve(), job_id))
    except KeyboardInterrupt:
        click.echo("stopping the realtime job", err=True)
        sys.exit(130)


def _conf_pairs(values: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    """Parse ``--conf KEY=VALUE`` values."""
    out = []
    for value in values:
        key, sep, val = value.partition("=")
        if not sep or not key.strip():
            msg = f"--conf {value}: write KEY=VALUE, e.g. execution.checkpointing.unaligned.enabled=true"
            raise click.UsageError(msg)
        out.append((key.strip(), val.strip()))
    return tuple(out)


def _topic_overrides(values: tuple[str, ...], running: list[str]) -> dict[str, str]:
    """Parse ``--topic`` values: ``SOURCE=TOPIC``, or a bare ``TOPIC`` when exactly one source runs."""
    out: dict[str, str] = {}
    for value in values:
        name, sep, topic = value.partition("=")
        if not sep:
            if len(running) != 1:
                msg = (
                    f"--topic {value}: {len(running)} sources run ({', '.join(running)}); "
                    "write --topic SOURCE=TOPIC, or run one with --source NAME"
                )
                raise click.UsageError(msg)
            name, topic = running[0], value
        if name not in running or not topic:
            msg = f"--topic {value}: SOURCE must be one of the sources this job runs ({', '.join(running)})"
            raise click.UsageError(msg)
        out[name] = topic
    return out


def _end_offsets(bootstrap: str, topics: dict[str, str]) -> dict[str, dict[int, int]]:
    """Return, per source, each partition's end offset of its topic at this moment."""
    from kafka import TopicPartition

    from headwater.pipelines import kafka as kafka_clients

    consumer = kafka_clients.consumer(bootstrap, client_id="headwater-realtime-start")
    try:
        out: dict[str, dict[int, int]] = {}
        for source, topic in topics.items():
            parts = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())]
            if not parts:
                msg = f"topic {topic!r} of source {source!r} does not exist; run `headwater topics create`"
                raise click.ClickException(msg)
            out[source] = {tp.partition: int(off) for tp, off in consumer.end_offsets(parts).items()}
        return out
    finally:
        consumer.close()


def _startup_mode(from_earliest: bool, from_latest: bool) -> str:
    """Return the Kafka source's scan.startup.mode; a restored checkpoint's offsets win over it."""
    if from_earliest and from_latest:
        msg = "--from-earliest and --from-latest exclude each other"
        raise click.UsageError(msg)
    if from_latest:
        return "latest-offset"
    return "earliest-offset" if from_earliest else "group-offsets"


if __name__ == "__main__":
    realtime()
