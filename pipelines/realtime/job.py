"""Build and submit the realtime Flink job: configuration, checkpoints, restore, the two halves.

The job is built in one stream environment, with one pipeline per source of the plan that has
realtime views (or the sources ``--source`` names): the SQL half (:mod:`.sql`: Kafka table, decode,
rules and dead-letter routing) as statements of the table environment, then per source the JVM half
attached to its routed table through the gateway (``RealtimeGraph.attach``: a keyed window operator
and a Redis sink per group of the source's :mod:`.program`), then the dead-letter inserts, and one
``execute_async``.

Checkpoints (operator state and Kafka offsets) go to ``<checkpoint_dir>/<version>/<job id>/chk-N``,
one folder per registry version, since a job compiled from other definitions cannot restore
another's state. On start the newest complete checkpoint of the version (one with a
``_metadata`` file) is restored, so a job killed with ``kill -9`` goes on where its last
checkpoint was; the sink flushes before every checkpoint barrier, and writes between that
checkpoint and the kill are replayed and rewrite the same bytes (the store keeps the newer event
time, and an equal value is a no-op), so the result equals a clean run
(tests/integration/pipelines/realtime/test_realtime_restore.py kills the job's process group
with SIGKILL mid-stream and checks this; Flink numbers the restored job's checkpoints after the
one it loaded).

Configuration keys are the Flink 2.x names (FLIP-406), checked against the
``CheckpointingOptions`` / ``StateRecoveryOptions`` classes of the bundled flink-dist 2.2.1:
``execution.checkpointing.dir`` (was ``state.checkpoints.dir``),
``execution.checkpointing.externalized-checkpoint-retention``,
``execution.checkpointing.num-retained`` and ``execution.state-recovery.path`` (was
``execution.savepoint.path``). A checkpoint of one registry version taken by a headwater
release that compiled a different job may not restore; start with ``--no-restore`` then.
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from headwater.pipelines import jvm
from headwater.pipelines.realtime.program import RealtimeProgram, StoreTarget, compile_program
from headwater.pipelines.realtime.sql import JobOptions, check_plan, compile_job
from headwater.registry.plans import TierPlan, short_version

if TYPE_CHECKING:
    from pyflink.common import JobClient
    from pyflink.datastream import StreamExecutionEnvironment
    from pyflink.table import StreamTableEnvironment

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunOptions:
    """How the job runs: where state goes, how often it is saved, where it is submitted."""

    redis_url: str
    checkpoint_dir: Path
    namespace: str = "hw"
    parallelism: int = 2
    checkpoint_interval_s: float = 5.0
    jobmanager: str | None = None
    """``HOST:PORT`` of a Flink cluster's REST endpoint; ``None`` = a local mini-cluster."""
    restore: bool = True
    flush_ms: int = 100
    """Longest time the online-store sink buffers values before writing them."""
    jvm_heap: str = "2g"
    """Heap of the local mini-cluster's JVM (``-Xmx``; ``JVM_ARGS`` set by the caller wins). Without
    a cap the JVM grows towards a quarter of the machine's memory under a high allocation rate."""


def latest_checkpoint(folder: Path) -> Path | None:
    """Return the newest complete checkpoint (``chk-N`` with ``_metadata``) under ``folder``, or None."""
    if not folder.is_dir():
        return None
    found = [p.parent for p in folder.glob("*/chk-*/_metadata")]
    return max(found, key=lambda p: p.stat().st_mtime_ns) if found else None


def version_dir(run: RunOptions, plan: TierPlan) -> Path:
    """Return the checkpoint folder of this registry version."""
    return run.checkpoint_dir / str(short_version(plan.registry_hash))


def job_jars() -> list[Path]:
    """Return the job's jars: the Kafka connector and headwater's Flink code (decode, operators, sink)."""
    return [*jvm.jars("flink"), *jvm.jars("flink-udfs")]


def configuration(run: RunOptions, plan: TierPlan) -> dict[str, str]:
    """Return the Flink configuration of the job (checkpointing, time zone, Python bundles, target)."""
    folder = version_dir(run, plan).resolve()
    conf = {
        "pipeline.name": f"headwater-realtime-{short_version(plan.registry_hash)}",
        "parallelism.default": str(run.parallelism),
        "table.local-time-zone": "UTC",
        "state.backend.type": "hashmap",
        "execution.checkpointing.interval": f"{int(run.checkpoint_interval_s * 1000)} ms",
        "execution.checkpointing.mode": "EXACTLY_ONCE",
        "execution.checkpointing.storage": "filesystem",
        "execution.checkpointing.dir": folder.as_uri(),
        "execution.checkpointing.externalized-checkpoint-retention": "RETAIN_ON_CANCELLATION",
        "execution.checkpointing.num-retained": "3",
        "restart-strategy.type": "fixed-delay",
        "restart-strategy.fixed-delay.attempts": "2147483647",
        "restart-strategy.fixed-delay.delay": "5 s",
        "python.executable": sys.executable,
        "python.client.executable": sys.executable,
        "pipeline.jars": ";".join(jar.as_uri() for jar in job_jars()),
        # records are not kept across calls by any operator of the job, so no defensive copies
        "pipeline.object-reuse": "true",
    }
    if run.restore:
        chk = latest_checkpoint(folder)
        if chk is not None:
            conf["execution.state-recovery.path"] = chk.as_uri()
            log.info("restoring from checkpoint %s", chk)
    if run.jobmanager:
        host, _, port = run.jobmanager.rpartition(":")
        if not host or not port.isdigit():
            msg = (
                "--jobmanager must be HOST:PORT of the Flink REST endpoint, e.g. flink-jm:8081; "
                f"got {run.jobmanager!r}"
            )
            raise ValueError(msg)
        conf.update({"execution.target": "remote", "rest.address": host, "rest.port": port})
    return conf


def table_environment(
    conf: dict[str, str], jvm_heap: str | None = None
) -> tuple[StreamExecutionEnvironment, StreamTableEnvironment]:
    """Return a stream environment and its table environment with ``conf`` applied.

    ``jvm_heap`` caps the gateway JVM (the local mini-cluster's host) unless ``JVM_ARGS`` is set; it
    takes effect only if this call starts that JVM.
    """
    from pyflink.common import Configuration
    from pyflink.datastream import StreamExecutionEnvironment
    from pyflink.table import EnvironmentSettings, StreamTableEnvironment
    from pyflink.util.java_utils import add_jars_to_context_class_loader

    if jvm_heap:  # read when PyFlink starts its gateway JVM, at the first Java object below
        os.environ.setdefault("JVM_ARGS", f"-Xmx{jvm_heap} -XX:+UseG1GC")
    config = Configuration()
    for key, value in conf.items():
        config.set_string(key, value)
    # the JVM half (dev.headwater.flink.realtime) is called through the gateway: load its jars there too
    add_jars_to_context_class_loader(conf["pipeline.jars"].split(";"))
    env = StreamExecutionEnvironment.get_execution_environment(config)
    settings = EnvironmentSettings.new_instance().in_streaming_mode().with_configuration(config).build()
    return env, StreamTableEnvironment.create(env, environment_settings=settings)


def build(
    plan: TierPlan, options: JobOptions, run: RunOptions
) -> tuple[StreamExecutionEnvironment, list[RealtimeProgram]]:
    """Build the whole job in a fresh environment: per source its SQL half and JVM half, the DLQ inserts."""
    from pyflink.java_gateway import get_gateway

    from headwater.pipelines.realtime import udfs

    store = StoreTarget(run.redis_url, run.namespace, run.flush_ms)
    programs = [compile_program(plan, src, store) for src in check_plan(plan, options.sources)]
    compiled = compile_job(plan, options, programs)
    env, t_env = table_environment(configuration(run, plan), run.jvm_heap)
    udfs.register(t_env, compiled.functions)
    for statement in compiled.ddl:
        t_env.execute_sql(statement)
    graph = get_gateway().jvm.dev.headwater.flink.realtime.RealtimeGraph
    for pipe in compiled.pipelines:
        graph.attach(t_env._j_tenv, pipe.routed, pipe.program.text, pipe.reason_column, pipe.dlq_rows)
    statements = t_env.create_statement_set()
    for insert in compiled.inserts:
        statements.add_insert_sql(insert)
    statements.attach_as_datastream()
    return env, programs


def submit(plan: TierPlan, options: JobOptions, run: RunOptions) -> tuple[JobClient, list[RealtimeProgram]]:
    """Build the job and submit it; returns at once (the job runs on). Returns the client and the programs."""
    env, programs = build(plan, options, run)
    return env.execute_async(f"headwater-realtime-{short_version(plan.registry_hash)}"), programs


def explain(plan: TierPlan, options: JobOptions, run: RunOptions) -> str:
    """Return the job's execution plan (JSON: every operator, SQL and JVM), without running it."""
    env, _ = build(plan, options, run)
    return str(env.get_execution_plan())
