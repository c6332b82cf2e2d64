"""``run_nearline``: start N nearline worker processes in one consumer group (``headwater run nearline``).

The lead attaches this command under a ``run`` group of the root CLI. Each worker is a separate
process (``spawn``): a consumer-group member owning the state of its partitions. A worker that
dies (Kafka or Redis down, a crash) is restarted after a back-off; its partitions resume from
their stores.
"""

from __future__ import annotations

import multiprocessing as mp
import signal
import time
from pathlib import Path
from types import FrameType

import click

from headwater.cli.errors import HeadwaterCommand
from headwater.cli.options import STATE_HELP, resolved_state_dir
from headwater.pipelines.nearline.plan import NearlinePlan
from headwater.pipelines.nearline.runner import NearlineConfig, run_worker
from headwater.pipelines.settings import Settings
from headwater.registry.plans import read_plan

RESTART_BACKOFF_S = 5.0


@click.command("nearline", cls=HeadwaterCommand)
@click.option(
    "--processes",
    type=click.IntRange(1, 64),
    default=1,
    show_default=True,
    help="Worker processes in the consumer group (more than the partitions leaves some idle).",
)
@click.option(
    "--state-dir",
    type=click.Path(path_type=Path),
    default=None,
    callback=resolved_state_dir,
    help=f"Where `headwater apply` wrote the plans {STATE_HELP}.",
)
@click.option(
    "--store-dir",
    type=click.Path(path_type=Path),
    default=None,
    help="RocksDB stores, one per partition (default: <state-dir>/nearline/<group>).",
)
@click.option(
    "--group",
    "group_id",
    default="headwater-nearline",
    show_default=True,
    help="Consumer group id; internal topics are <group>-<source>-changelog and <group>-<source>-by-<field>.",
)
@click.option(
    "--source",
    "sources",
    multiple=True,
    metavar="NAME",
    help="Run only this source's views (repeatable; default: every source with a nearline view).",
)
@click.option("--namespace", default="hw", show_default=True, help="Redis key namespace of the online store.")
@click.option("--max-poll-records", type=click.IntRange(1), default=20_000, show_default=True)
@click.option(
    "--session-timeout-ms",
    type=click.IntRange(6000),
    default=NearlineConfig.session_timeout_ms,
    show_default=True,
    help="Consumer-group session timeout: how soon a dead worker's partitions move.",
)
@click.option(
    "--refresh-unchanged/--changed-only",
    default=True,
    show_default=True,
    help="At each new window boundary re-write every live entity (stored time = the boundary), "
    "or only those whose value changed.",
)
@click.option(
    "--check-crcs",
    type=click.Choice(["auto", "on", "off"]),
    default="auto",
    show_default=True,
    help="Verify consumed record CRCs; auto: only when the C crc32c module is installed.",
)
@click.option(
    "--idle-timeout",
    "idle_timeout_s",
    type=click.FloatRange(0),
    default=60.0,
    show_default=True,
    help="Seconds after which a caught-up source partition without events stops holding back the "
    "boundary of views keyed by another field (0: never).",
)
@click.option(
    "--idle-exit",
    "idle_exit_s",
    type=float,
    default=None,
    help="Exit after this many seconds without records (tests, backfills).",
)
def run_nearline(
    processes: int,
    state_dir: Path,
    store_dir: Path | None,
    group_id: str,
    sources: tuple[str, ...],
    namespace: str,
    max_poll_records: int,
    session_timeout_ms: int,
    refresh_unchanged: bool,
    check_crcs: str,
    idle_timeout_s: float,
    idle_exit_s: float | None,
) -> None:
    """Run the nearline tier: window aggregates over every source of the plan, in RocksDB, to Redis.

    Reads the nearline plan applied with `headwater apply`: each source's topic, schema, key and
    event-time rules come from it. Stop with Ctrl-C (each worker finishes its batch). Stats per
    worker go to <store-dir>/stats-<i>.json.
    """
    # a plan that cannot run stops here, not in a worker the supervisor restarts forever
    NearlinePlan.from_plan(read_plan(state_dir, "nearline"), sources)
    root = store_dir if store_dir is not None else state_dir / "nearline" / group_id
    root.mkdir(parents=True, exist_ok=True)
    configs = [
        NearlineConfig(
            settings=Settings.from_env(),
            plan_dir=state_dir,
            state_root=root,
            group_id=group_id,
            namespace=namespace,
            max_poll_records=max_poll_records,
            session_timeout_ms=session_timeout_ms,
            stats_path=root / f"stats-{i}.json",
            refresh_unchanged=refresh_unchanged,
            check_crcs=None if check_crcs == "auto" else check_crcs == "on",
            idle_timeout_s=idle_timeout_s or None,
            sources=tuple(sources),
        )
        for i in range(processes)
    ]
    if processes == 1:
        run_worker(configs[0], idle_exit_s)
        return
    supervise(configs, idle_exit_s)


def supervise(configs: list[NearlineConfig], idle_exit_s: float | None) -> None:
    """Run one process per config; restart a crashed one; forward SIGTERM/SIGINT; return when all stop."""
    ctx = mp.get_context("spawn")
    stopping = False

    def stop(_sig: int, _frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True
        for proc in procs.values():
            if proc.is_alive() and proc.pid is not None:
                proc.terminate()

    procs = {i: ctx.Process(target=run_worker, args=(c, idle_exit_s)) for i, c in enumerate(configs)}
    for proc in procs.values():
        proc.start()
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    while procs:
        time.sleep(0.5)
        for i, proc in list(procs.items()):
            if proc.is_alive():
                continue
            proc.join()
            if stopping or proc.exitcode == 0:
                del procs[i]
                continue
            click.echo(
                f"nearline worker {i} exited with {proc.exitcode}; restarting in {RESTART_BACKOFF_S} s",
                err=True,
            )
            time.sleep(RESTART_BACKOFF_S)
            procs[i] = ctx.Process(target=run_worker, args=(configs[i], idle_exit_s))
            procs[i].start()


if __name__ == "__main__":
    run_nearline()
