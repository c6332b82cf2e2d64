"""Build and submit the realtime Flink job: configuration, checkpoints, restore, the two halves.

The job is built in one stream environment, with one pipeline per source of the plan that has
realtime views (or the sources ``--source`` names): the SQL half (:mod:`.sql`: Kafka table, decode,
rules and dead-letter routing) as statements of the table environment, then per source the JVM half
attached to its routed table through the gateway (``RealtimeGraph.attach``: a keyed window operator
and a Redis sink per group of the source's :mod:`.program`), then the dead-letter inserts, and one
``execute_async``.

Checkpoints (operator state and Kafka offsets) go to ``<checkpoint_dir>/<job id>/chk-N``: one folder
for the job, whatever the registry version, so a registry edit does not start the windows empty. On
start the newest complete checkpoint (one with a ``_metadata`` file) is restored, also into a job
compiled from another plan (issue 14):

- operators are matched by uid: per source the Kafka scan (``hw-kafka-<source>``, set by
  ``RealtimeGraph.pinSourceUid``, since the table planner gives it none), and per group of views
  (``<join key>@<slide>``) its window operator and sink (``hw-views-<source>-<group>``...). The offsets
  of a source restore whatever its views' columns; a group that is gone (its last view removed, or
  moved to another slide or key) is state nobody claims, dropped at restore
  (``execution.state-recovery.ignore-unclaimed-state``). A source that is new starts from
  ``scan.startup.mode``; the stateless SQL operators between (decode, rules, projection) need no uid.
- inside a group the keyed state is indexed by its views' ``name@version`` (the serializer's snapshot
  records them, ``KeyStateSerializer`` format 2): when the job opens, every entity's state is adopted
  into the new program (``Aggregator.adopt``): a view whose version is unchanged keeps its panes and
  goes on exactly, a new or changed view starts empty, a removed view's panes are dropped at once
  (they are in no later checkpoint). An edit of a description, owner, cost or SLA changes no version
  and so keeps every window.

So a job killed with ``kill -9`` goes on where its last checkpoint was; the sink flushes before
every checkpoint barrier, and writes between that checkpoint and the kill are replayed and rewrite
the same bytes (the store keeps the newer event time, and an equal value is a no-op), so the result
equals a clean run (tests/integration/pipelines/realtime/test_realtime_restore.py kills the job's
process group with SIGKILL mid-stream and checks this, test_realtime_versions.py restarts it on an
edited plan; Flink numbers the restored job's checkpoints after the one it loaded).

Each job also writes ``<checkpoint_dir>/<job id>/views.json`` (``{view: version}``), so the next start
prints what it keeps, backfills and drops (:func:`state_report`), and ``scans.json`` (``{source: scan
uid}``). A new or changed view is backfilled in the restarted job itself (:mod:`.backfill`): its
source's scan is rewound (under a new uid) to cover its windows before the checkpoint's offsets, the
rows before those offsets feed only the backfilled views, and from them on the stream goes on for
every view: full windows at once, no gap, no double count. ``--no-backfill`` starts them empty
(partial values for their longest window).

Before one folder per job, checkpoints went to ``<checkpoint_dir>/<short registry version>/``; when
the job folder has none, the legacy folder of this very registry version is restored (its key state,
format 1, was written by a job compiled from the same plan, so its layout is this one). Legacy folders
of other versions are not read (their layout is unknown): the job starts empty, as it did then.

Configuration keys are the Flink 2.x names (FLIP-406), checked against the
``CheckpointingOptions`` / ``StateRecoveryOptions`` classes of the bundled flink-dist 2.2.1:
``execution.checkpointing.dir`` (was ``state.checkpoints.dir``),
``execution.checkpointing.externalized-checkpoint-retention``,
``execution.checkpointing.num-retained`` and ``execution.state-recovery.path`` (was
``execution.savepoint.path``), ``execution.state-recovery.ignore-unclaimed-state`` (was
``execution.savepoint.ignore-unclaimed-state``). A checkpoint taken by a headwater release whose job
had other uids or another key-state format may not restore; start with ``--no-restore`` then.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from headwater.pipelines import jvm
from headwater.pipelines.realtime.backfill import SCANS_FILE, SEEDS_FILE, plan_backfill
from headwater.pipelines.realtime.program import RealtimeProgram, StoreTarget, compile_program
from headwater.pipelines.realtime.recovery import is_marked
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
    backfill: bool = True
    """Backfill new and changed views at restore (:mod:`.backfill`); False: they start empty."""
    extra_conf: tuple[tuple[str, str], ...] = ()
    """More Flink configuration (``--conf KEY=VALUE``), applied last: it wins over :func:`configuration`'s."""
    reported_dir: Path | None = None
    """Where the operators write each view's timed work (``<state>/realtime/reported``); None: nowhere."""


def latest_checkpoint(folder: Path) -> Path | None:
    """Return the newest complete checkpoint (``<job id>/chk-N``, with ``_metadata``) in ``folder``.

    Newest by the time its ``_metadata`` was written (once, when the checkpoint completed), then by N.
    Not by the folder's time: Flink discards a subsumed checkpoint file by file, and a kill -9 in the
    middle leaves an old ``chk-N`` with its ``_metadata`` and a fresh folder time but state files gone;
    restoring it fails at every restart ("FileNotFoundException" in the keyed state backend). A checkpoint
    marked unrestorable (:mod:`.recovery`) is passed over.
    """
    found = [chk for chk in complete_checkpoints(folder) if not is_marked(chk)]
    return found[0] if found else None


def complete_checkpoints(folder: Path) -> list[Path]:
    """Return the complete checkpoints (``<job id>/chk-N`` with ``_metadata``) in ``folder``, newest first.

    Newest as :func:`latest_checkpoint` says (the ``_metadata`` file's time, then N); marked ones included.
    """
    if not folder.is_dir():
        return []
    found = [
        (meta.stat().st_mtime_ns, checkpoint_number(meta.parent), meta.parent)
        for meta in folder.glob("*/chk-*/_metadata")
    ]
    return [chk for _, _, chk in sorted(found, reverse=True)]


def checkpoint_number(chk: Path) -> int:
    """Return N of a ``chk-N`` folder (-1 where the name has no number)."""
    _, _, number = chk.name.partition("-")
    return int(number) if number.isdigit() else -1


def legacy_dir(run: RunOptions, plan: TierPlan) -> Path:
    """Return the per-registry-version folder older releases checkpointed this plan's job to."""
    return run.checkpoint_dir / short_version(plan.registry_hash)


def checkpoint_candidates(run: RunOptions, plan: TierPlan) -> list[Path]:
    """Return the checkpoints a start may restore, newest first.

    The job folder's, else this registry version's legacy ones (:func:`legacy_dir`);
    :func:`.recovery.choose_checkpoint` picks among them.
    """
    folder = run.checkpoint_dir.resolve()
    found = complete_checkpoints(folder)
    if not found:
        found = complete_checkpoints(legacy_dir(run, plan).resolve())
        if found:
            log.info("no checkpoint in %s; restoring the legacy one of this registry version", folder)
        elif any(folder.glob("*/*/chk-*/_metadata")):
            log.warning(
                "%s holds checkpoints of other registry versions in the old per-version layout; they "
                "cannot be restored into this plan (their key state has no view versions): the windows "
                "start empty. Remove those folders once this job has checkpointed.",
                folder,
            )
    return found


def checkpoint_to_restore(run: RunOptions, plan: TierPlan) -> Path | None:
    """Return the newest candidate (:func:`checkpoint_candidates`) not marked unrestorable, unchecked.

    ``headwater run realtime`` checks each candidate first (:func:`.recovery.choose_checkpoint`).
    """
    found = [chk for chk in checkpoint_candidates(run, plan) if not is_marked(chk)]
    return found[0] if found else None


VIEWS_FILE = "views.json"
"""Per job folder: ``{view: version}`` of the views the job ran, so a later start can say what it keeps."""


@dataclass(frozen=True)
class StateReport:
    """What a start on a new plan does with the restored state, per view (names, sorted)."""

    kept: tuple[str, ...]
    """Same name and version: its windows go on from the checkpoint, exact."""
    restarted: tuple[str, ...]
    """A new version of a view the checkpoint had: its windows start empty."""
    new: tuple[str, ...]
    dropped: tuple[str, ...]
    warm_after_s: dict[str, float]
    """Per restarted or new view: its longest window; without a backfill its values are partial until
    that much stream has been read after the restore."""
    backfilled: dict[str, str] = field(default_factory=dict)
    """Per restarted or new view the job backfills: the line of its source's backfill."""
    lost: bool = False
    """Checkpoints existed but none could be restored: every view of :attr:`new` lost its windows."""

    def lines(self) -> list[str]:
        """Human lines for ``headwater run realtime``."""
        out = [f"state kept (windows go on): {', '.join(self.kept) or '-'}"]
        new = "LOST, no restorable checkpoint" if self.lost else "new"
        for label, names in (("changed", self.restarted), (new, self.new)):
            for name in names:
                if name in self.backfilled:
                    out.append(f"state backfilled ({label}): {name}: full windows at once")
                    continue
                out.append(
                    f"state empty ({label}): {name}: partial values until {self.warm_after_s[name]:g} s of"
                    " stream after the restore (its longest window)"
                )
        out += sorted(set(self.backfilled.values()))
        if self.dropped:
            out.append(f"state dropped (removed): {', '.join(self.dropped)}; their online keys expire")
        return out


def record_views(
    run: RunOptions, job_id: str, plan: TierPlan, sources: list[str], programs: Sequence[RealtimeProgram] = ()
) -> Path:
    """Write ``{view: version}`` of the views the job runs into its checkpoint folder; return the file.

    Also ``scans.json``: the Kafka scan uid of each of ``programs`` (so the next start restores it), and
    ``seeds.json``: their backfills (so a restart from a checkpoint taken during one goes on with it).
    """
    folder = run.checkpoint_dir / job_id
    folder.mkdir(parents=True, exist_ok=True)
    views = {v.name: v.version for v in plan.views if v.source in sources}
    path = folder / VIEWS_FILE
    path.write_text(json.dumps(views, sort_keys=True, indent=1) + "\n", encoding="utf-8")
    scans = {p.source: p.data["scan_uid"] for p in programs if "scan_uid" in p.data}
    if scans:
        (folder / SCANS_FILE).write_text(json.dumps(scans, sort_keys=True, indent=1) + "\n", encoding="utf-8")
    seeds = {p.source: p.data["seed"] for p in programs if p.data.get("seed")}
    if seeds:
        (folder / SEEDS_FILE).write_text(json.dumps(seeds, sort_keys=True, indent=1) + "\n", encoding="utf-8")
    return path


def backfilled_views(programs: Sequence[RealtimeProgram]) -> dict[str, str]:
    """Per view the programs backfill (their ``seed``): a line saying from where."""
    out = {}
    for p in programs:
        seed = p.data.get("seed")
        if seed:
            for view in seed["views"]:
                out[view.split("@")[0]] = seed.get("line", f"backfill {p.source}")
    return out


def state_report(
    checkpoint: Path, plan: TierPlan, sources: list[str], programs: Sequence[RealtimeProgram] = ()
) -> StateReport | None:
    """Compare the views of the job that wrote ``checkpoint`` with the plan's; None when it recorded none."""
    path = checkpoint.parent / VIEWS_FILE
    if not path.is_file():
        return None
    before: dict[str, str] = json.loads(path.read_text(encoding="utf-8"))
    now = {v.name: v for v in plan.views if v.source in sources}
    kept = sorted(n for n, v in now.items() if before.get(n) == v.version)
    restarted = sorted(n for n, v in now.items() if n in before and before[n] != v.version)
    new = sorted(n for n in now if n not in before)
    warm = {n: max(f.window_s for f in now[n].features) for n in [*restarted, *new]}
    dropped = tuple(sorted(set(before) - set(now)))
    return StateReport(tuple(kept), tuple(restarted), tuple(new), dropped, warm, backfilled_views(programs))


def lost_state_report(plan: TierPlan, sources: list[str]) -> StateReport:
    """Return the report of a start whose checkpoints all failed: every view's windows start empty."""
    now = {v.name: v for v in plan.views if v.source in sources}
    warm = {n: max(f.window_s for f in v.features) for n, v in now.items()}
    return StateReport((), (), tuple(sorted(now)), (), warm, lost=True)


def job_jars() -> list[Path]:
    """Return the job's jars: the Kafka connector and headwater's Flink code (decode, operators, sink)."""
    return [*jvm.jars("flink"), *jvm.jars("flink-udfs")]


RESTART_STRATEGY = {
    "restart-strategy.type": "exponential-delay",
    "restart-strategy.exponential-delay.initial-backoff": "1 s",
    "restart-strategy.exponential-delay.backoff-multiplier": "2.0",
    "restart-strategy.exponential-delay.max-backoff": "30 s",
    "restart-strategy.exponential-delay.jitter-factor": "0.1",
    "restart-strategy.exponential-delay.attempts-before-reset-backoff": "5",
    "restart-strategy.exponential-delay.reset-backoff-threshold": "2 min",
}
"""Flink restarts a failing job 5 times (1, 2, 4, 8, 16 s apart, +/-10%), the count reset after 2 minutes
without a failure; then the job fails and ``headwater run realtime`` takes over (:mod:`.recovery`): a
restore that failed falls back to the previous retained checkpoint, any other failure is submitted again
from the newest one. It was fixed-delay with unlimited attempts: a checkpoint whose files were gone was
restored again every 5 s, forever, and the tier was down without a word but its freshness."""


NEWEST = "newest"
"""The default checkpoint of :func:`configuration`, :func:`build` and :func:`submit`: the newest one
not marked unrestorable (:func:`checkpoint_to_restore`)."""


def configuration(run: RunOptions, plan: TierPlan, chk: Path | str | None = NEWEST) -> dict[str, str]:
    """Return the Flink configuration of the job (checkpointing, time zone, Python bundles, target).

    ``chk``: the checkpoint to restore when ``run.restore`` (None: none; default:
    :func:`checkpoint_to_restore`).
    """
    folder = run.checkpoint_dir.resolve()
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
        **RESTART_STRATEGY,
        "python.executable": sys.executable,
        "python.client.executable": sys.executable,
        "pipeline.jars": ";".join(jar.as_uri() for jar in job_jars()),
        # records are not kept across calls by any operator of the job, so no defensive copies
        "pipeline.object-reuse": "true",
    }
    if run.restore:
        chk = checkpoint_to_restore(run, plan) if chk == NEWEST else chk
        if isinstance(chk, Path):
            conf["execution.state-recovery.path"] = chk.as_uri()
            # the state of a group (or source) the new plan no longer has is dropped, not an error
            conf["execution.state-recovery.ignore-unclaimed-state"] = "true"
            log.info("restoring from checkpoint %s", chk)
    conf.update(dict(run.extra_conf))
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


def start_gateway(jvm_heap: str | None = None) -> None:
    """Start PyFlink's gateway JVM (``-Xmx jvm_heap`` unless ``JVM_ARGS`` is set) with the job's jars.

    The JVM half (dev.headwater.flink.realtime) is called through the gateway: its jars are loaded
    there too. The heap takes effect only if this call starts the JVM.
    """
    from pyflink.java_gateway import get_gateway
    from pyflink.util.java_utils import add_jars_to_context_class_loader

    jvm.set_flink_java_args(jvm_heap)  # read when PyFlink starts its gateway JVM
    get_gateway()
    add_jars_to_context_class_loader([jar.as_uri() for jar in job_jars()])


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

    start_gateway(jvm_heap)
    config = Configuration()
    for key, value in conf.items():
        config.set_string(key, value)
    env = StreamExecutionEnvironment.get_execution_environment(config)
    settings = EnvironmentSettings.new_instance().in_streaming_mode().with_configuration(config).build()
    return env, StreamTableEnvironment.create(env, environment_settings=settings)


def build(
    plan: TierPlan, options: JobOptions, run: RunOptions, checkpoint: Path | str | None = NEWEST
) -> tuple[StreamExecutionEnvironment, list[RealtimeProgram]]:
    """Build the whole job in a fresh environment: per source its SQL half and JVM half, the DLQ inserts.

    ``checkpoint``: what it restores when ``run.restore`` (None: nothing; default: the newest unmarked one).
    """
    from pyflink.java_gateway import get_gateway

    from headwater.pipelines.realtime import udfs

    store = StoreTarget(run.redis_url, run.namespace, run.flush_ms)
    sources = check_plan(plan, options.sources)
    chosen = checkpoint_to_restore(run, plan) if checkpoint == NEWEST else checkpoint
    chk = chosen if run.restore and isinstance(chosen, Path) else None
    start_gateway(run.jvm_heap)  # the backfill reads the checkpoint's Kafka offsets in the JVM
    backfill = plan_backfill(chk, plan, [s.name for s in sources], options, enabled=run.backfill)
    programs = backfill.apply(
        [compile_program(plan, src, store, reported_dir=run.reported_dir) for src in sources]
    )
    options = replace(options, start_offsets={**options.start_offsets, **backfill.start_offsets()})
    compiled = compile_job(plan, options, programs)
    env, t_env = table_environment(configuration(run, plan, chk), run.jvm_heap)
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


def submit(
    plan: TierPlan, options: JobOptions, run: RunOptions, checkpoint: Path | str | None = NEWEST
) -> tuple[JobClient, list[RealtimeProgram]]:
    """Build the job and submit it; returns at once (the job runs on). Returns the client and the programs.

    ``checkpoint``: as :func:`build`'s.
    """
    env, programs = build(plan, options, run, checkpoint)
    return env.execute_async(f"headwater-realtime-{short_version(plan.registry_hash)}"), programs


def explain(plan: TierPlan, options: JobOptions, run: RunOptions) -> str:
    """Return the job's execution plan (JSON: every operator, SQL and JVM), without running it."""
    env, _ = build(plan, options, run)
    return str(env.get_execution_plan())
