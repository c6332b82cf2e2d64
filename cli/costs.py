"""The cost report: per view, declared vs estimated vs measured CPU, and the state and memory estimates.

``headwater costs`` prints one row per view; ``features describe VIEW`` and ``check --format json``
show the same report for one view (:func:`cost_report`). The estimate carries its basis: the
source's declared rate, the view's shape (aggregations, filters, panes, keys) and where the
constants come from (``registry/calibration/<tier>.json``: machine, date, command).

Measured CPU: the calibration run's, that view run alone in its tier on the calibration stream
(``bench/bench_calibrate.py``), scaled to the source's declared rate; it says so (``measured.how``).
Reported CPU: what the running tier says of the view itself. The nearline tasks time each view's
folds (``fold_s`` in the workers' stats files, :func:`reported_cost`); the realtime job's operator
subtasks time each event's fold and each run of fires and split it across their group's views by
feature operations (``ViewCpuStats``, files of the same format in ``<state>/realtime/reported``); the
offline job records each run's CPU (:func:`offline_reported_cost`).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from headwater.cli.errors import HeadwaterCommand
from headwater.registry.budget import view_footprint
from headwater.registry.calibration import Calibration, load_calibration
from headwater.registry.compiled import CheckResult, CompiledView
from headwater.registry.cost import (
    SECONDS_PER_DAY,
    CostEstimate,
    JobShare,
    estimate_view,
    format_bytes,
    job_share,
    run_reads,
    tile_rows_per_day,
    view_shape,
)
from headwater.registry.tiers import TIER_NAMES, TIERS

NOT_REPORTED = "the calibration run's figure for this view alone (running tiers: see `reported`)"


def measured_cost(
    view: CompiledView, rate_per_s: float, cal: Calibration, entities: float | None = None
) -> dict[str, Any] | None:
    """Return the calibration run's CPU of ``view`` alone, in CPU-h/day at ``rate_per_s`` (None: not run).

    Offline, the calibration ran each view from bronze: its per-event slope is scaled to the events
    a daily run reads now (a tiled view: one day, plus its tile rows at ``tile_row_us`` for
    ``entities``, as the estimate charges them; any other view its window).
    """
    got = cal.measured.get(view.name)
    if not got:
        return None
    if "us_per_record" in got:
        hours = got["us_per_record"] * rate_per_s * SECONDS_PER_DAY / 1e6 / 3600
        hours += cal.scalar("fixed_cores") * 24
        basis = f"{got['us_per_record']:g} us/record measured, x {rate_per_s:g} events/s + fixed cores"
    elif got.get("cores") and got.get("rates"):
        rates, cores = got["rates"], got["cores"]
        slope = 0.0
        if len(rates) >= 2 and rates[1] != rates[0]:
            slope = (cores[1] - cores[0]) / (rates[1] - rates[0])
        if slope > 0:
            at_rate = cores[0] + slope * (rate_per_s - rates[0])
            basis = (
                f"job cores {cores} measured at {rates} events/s, at {rate_per_s:g} events/s: {at_rate:.3f}"
            )
        else:  # no slope seen (a loaded machine, or a fixed cost that hides it): no extrapolation
            at_rate = sum(cores) / len(cores)
            basis = f"job cores {cores} measured at {rates} events/s (no per-event slope seen: their mean)"
        hours = at_rate * 24
    elif got.get("cpu_s_per_day") and got.get("events_per_day"):  # offline: daily runs of a stream
        # events_per_day: what each run read; a daily run reads its window where reads_window says so,
        # one day where the view is tiled (its tiles stand for the rest of the window)
        per_day, seconds = got["events_per_day"], got["cpu_s_per_day"]
        shape = view_shape(view.features)
        window, tiled = run_reads(shape, cal)
        events = rate_per_s * SECONDS_PER_DAY * window
        slope = 0.0
        if len(per_day) >= 2 and per_day[1] != per_day[0]:
            slope = max(0.0, (seconds[1] - seconds[0]) / (per_day[1] - per_day[0]))
        fixed = seconds[0] - slope * per_day[0] if slope else sum(seconds) / len(seconds)
        hours = (max(fixed, 0.0) + slope * events) / 3600
        basis = (
            f"CPU s a day {seconds} measured at {per_day} events/day, at {events:,.0f} events/day: "
            f"{hours * 3600:,.0f} s"
        )
        if tiled:
            tiles = tile_rows_per_day(shape, rate_per_s, entities)
            hours += tiles * cal.scalar("tile_row_us") / 1e6 / 3600
            basis += f" + {tiles:,.0f} tile rows x {cal.scalar('tile_row_us'):g} us (tiled: one day read)"
    else:
        return None
    return {
        "cpu_hours_per_day": round(hours, 4),
        "basis": basis,
        "how": NOT_REPORTED,
        "measured_at": cal.measured_at,
        "state_bytes": got.get("state_bytes"),
        "online_bytes": got.get("online_bytes"),
    }


REPORTED_HOW = (
    "the nearline workers' stats files: seconds in this view's folds (pipelines/nearline/task.py, wall "
    "time: a fold preempted on a busy machine counts its wait) per second since each task began; the "
    "worker's shared work (Kafka, decode, commits) is not in it"
)


REALTIME_REPORTED_HOW = (
    "the realtime job's operator subtasks (ViewOperator, ViewCpuStats): the wall time of each event's fold "
    "and each run of fires, split across the group's views by their feature operations, per second since "
    "each subtask began; Kafka, decode, the SQL rules and the Redis sink's thread are in no view"
)
REALTIME_FRESH_S = 60.0
"""Realtime stats files older than the newest by more than this are a previous run's (another
parallelism, a group since renamed): not added. The job rewrites its files every 5 s."""


def reported_cost(
    view: str, stats_root: Path, how: str = REPORTED_HOW, fresh_s: float | None = None
) -> dict[str, Any] | None:
    """Return a streaming tier's own figure for ``view``: its folds' CPU-h/day (None: no task reports it).

    ``stats_root``: ``<state>/nearline`` (or ``<state>/realtime``); every ``*/stats-*.json`` (one per
    worker and group, or per operator subtask) lists its tasks' ``fold_s`` per view since ``fold_since``
    (epoch seconds); the file's time is when it was written. Each task's seconds per second are added
    (a view's partitions run in parallel). A task that counts the ``events`` it read gives
    ``us_per_event``: the view's seconds per event of its source. ``fresh_s``: only the files written
    within that many seconds of the newest count (None: all).
    """
    docs: list[tuple[float, Any]] = []
    for path in sorted(stats_root.glob("*/stats-*.json")):
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
            written = path.stat().st_mtime
        except (OSError, ValueError):  # a worker rewriting its file right now: the next call reads it
            continue
        docs.append((written, doc))
    if fresh_s is not None and docs:
        newest = max(w for w, _ in docs)
        docs = [(w, d) for w, d in docs if w >= newest - fresh_s]
    cores = seconds = 0.0
    tasks = events = 0
    for written, doc in docs:
        for task in doc.get("tasks", []) if isinstance(doc, dict) else []:
            fold = (task.get("fold_s") or {}).get(view) if isinstance(task, dict) else None
            since = task.get("fold_since") if isinstance(task, dict) else None
            if isinstance(fold, (int, float)) and isinstance(since, (int, float)) and written > since:
                cores += fold / (written - since)
                seconds += fold
                tasks += 1
                read = task.get("events")
                events += read if isinstance(read, int) else 0
    if not tasks:
        return None
    out: dict[str, Any] = {
        "cpu_hours_per_day": round(cores * 24, 4),
        "fold_s": round(seconds, 3),
        "tasks": tasks,
        "how": how,
    }
    if events:
        out["events"] = events
        out["us_per_event"] = round(seconds / events * 1e6, 3)
    return out


def view_share(view: CompiledView, result: CheckResult) -> JobShare:
    """Return the views of ``result`` sharing ``view``'s job (tier and source) and group (and entity)."""
    return job_share(
        ((v.tier, v.source, v.entity) for v in result.views), view.tier, view.source, view.entity
    )


def view_estimate(view: CompiledView, result: CheckResult, alone: bool = False) -> CostEstimate:
    """Return the CPU estimate of a checked view at its source's declared rate (``alone``: its own job)."""
    source = result.sources[view.source]
    entities = result.budget.entities.get(view.entity) if result.budget else None
    rekeyed = view.join_key != source.spec.key
    share = None if alone else view_share(view, result)
    return estimate_view(
        view.features, source.spec.expected_rate_per_s, TIERS[view.tier], rekeyed, entities, share=share
    )


OFFLINE_REPORTED_HOW = (
    "the offline job's own CPU per day computed (pipelines/offline/job.py record_cpu: the driver process "
    "and its children, the local Spark JVM and Python workers, over each run of the view; on a cluster "
    "the driver's share only), newest runs"
)


def offline_reported_cost(view: str, folder: Path) -> dict[str, Any] | None:
    """Return the offline job's own figure for ``view``: CPU-h/day from its recorded runs (None: none).

    ``folder``: ``<state>/offline/reported``, where each run of the job adds the CPU seconds of the
    view's chunk and the days it computed; a daily run computes one day, so CPU seconds per day
    computed / 3,600 is its CPU-h a day.
    """
    try:
        doc = json.loads((folder / f"{view}.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    runs = [
        r
        for r in (doc.get("runs") or [] if isinstance(doc, dict) else [])
        if isinstance(r, dict) and isinstance(r.get("cpu_s"), int | float) and isinstance(r.get("days"), int)
        and r["days"] > 0
    ]  # fmt: skip
    if not runs:
        return None
    cpu = sum(float(r["cpu_s"]) for r in runs)
    days = sum(int(r["days"]) for r in runs)
    return {
        "cpu_hours_per_day": round(cpu / days / 3600, 4),
        "cpu_s": round(cpu, 3),
        "days": days,
        "runs": len(runs),
        "last": runs[-1].get("at"),
        "how": OFFLINE_REPORTED_HOW,
    }


def reported_root() -> Path:
    """Return the default ``stats_root``: ``<state>/nearline`` (the other tiers' reports are beside it)."""
    from headwater.registry.config import state_dir

    return state_dir() / "nearline"


def tier_reported(view: CompiledView, stats_root: Path | None) -> dict[str, Any] | None:
    """Return what the running tier reports of ``view`` (nearline workers, realtime operators, offline runs).

    ``stats_root``: ``<state>/nearline``; the realtime operators' files (``<state>/realtime/reported``)
    and the offline job's runs (``<state>/offline/reported``) are beside it. None: nothing reported.
    """
    if stats_root is None:
        return None
    if view.tier == "nearline":
        return reported_cost(view.name, stats_root)
    if view.tier == "realtime":
        root = stats_root.parent / "realtime"
        return reported_cost(view.name, root, how=REALTIME_REPORTED_HOW, fresh_s=REALTIME_FRESH_S)
    if view.tier == "offline":
        return offline_reported_cost(view.name, stats_root.parent / "offline" / "reported")
    return None


def cost_report(view: CompiledView, result: CheckResult, stats_root: Path | None = None) -> dict[str, Any]:
    """Everything about the cost of one checked view (JSON-ready).

    ``estimate``: the view's charge, its marginal cost plus its share of its job's fixed cost (the
    views of its job and group split it equally); ``estimate_alone``: the view alone in its job (what
    the calibration run of the view alone measures, ``measured``); ``reported``: what the running
    nearline workers report of its folds (:func:`reported_cost`, from ``stats_root``), the realtime
    job's operators of its share of their work, or the offline job of its runs
    (:func:`offline_reported_cost`; both beside it).
    """
    source = result.sources[view.source]
    rate = source.spec.expected_rate_per_s
    cal = load_calibration(view.tier)
    entities = result.budget.entities.get(view.entity) if result.budget else None
    rekeyed = view.join_key != source.spec.key
    est = view_estimate(view, result)
    fp = view_footprint(view, result)
    return {
        "declared_cpu_hours_per_day": view.compute_cost,
        "estimate": est.as_dict(),
        "estimate_alone_cpu_hours_per_day": round(
            view_estimate(view, result, alone=True).cpu_hours_per_day, 4
        ),
        "attribution": (
            "marginal (the view's own per-event and fixed work) + an equal share of its job's fixed cost "
            f"(1/{est.share.job_views} of the job's views) and of its group's (1/{est.share.group_views})"
        ),
        "basis": {
            "rate_per_s": rate,
            "entities": entities,
            "shape": view_shape(view.features, rekeyed).as_dict(),
            "constants": cal.source_text(),
            "constants_file": str(cal.path) if cal.path else None,
            "measured_on": cal.machine,
            "command": cal.command,
        },
        "footprint": fp.as_dict() if fp else None,
        "measured": measured_cost(view, rate, cal, entities),
        "reported": _at_rate(tier_reported(view, stats_root), rate),
    }


def _at_rate(told: dict[str, Any] | None, rate_per_s: float) -> dict[str, Any] | None:
    """Add the reported us/event at the source's declared rate (CPU-h/day), beside the running rate's."""
    if told and "us_per_event" in told:
        told["at_declared_rate_cpu_hours_per_day"] = round(told["us_per_event"] * rate_per_s * 24 / 1e6, 4)
    return told


def describe_lines(view: CompiledView, result: CheckResult, stats_root: Path | None = None) -> list[str]:
    """Return the cost lines of ``features describe``.

    ``stats_root``: the nearline workers' stats (``None``: ``<state>/nearline``; the other tiers' reports
    are beside it).
    """
    if stats_root is None and view.tier in TIER_NAMES:
        stats_root = reported_root()
    rep = cost_report(view, result, stats_root)
    est, basis, fp, meas = rep["estimate"], rep["basis"], rep["footprint"], rep["measured"]
    lines = [
        f"  cost: declared {view.compute_cost:g}, estimated {est['cpu_hours_per_day']:.2f} CPU-h/day "
        f"({basis['rate_per_s']:g} events/s x {est['us_per_event']:.2f} us/event"
        + (f" + {est['fixed_cores']:g} cores fixed" if est["fixed_cores"] else "")
        + ")",
    ]
    if est["shared_cpu_hours_per_day"]:
        lines.append(
            f"        = {est['marginal_cpu_hours_per_day']:.2f} marginal"
            f" + {est['shared_cpu_hours_per_day']:.2f} share of the job's {est['job_fixed_cores']:.3g} fixed"
            f" cores (1/{est['job_views']} of the job's views, 1/{est['group_views']} of the group's);"
            " alone in its job "
            f"{rep['estimate_alone_cpu_hours_per_day']:.2f}"
        )
    lines.append(f"        constants: {basis['constants']}")
    if basis["command"]:
        lines.append(f"        measured by: {basis['command']}")
    if meas:
        lines.append(
            f"        measured {meas['cpu_hours_per_day']:.2f} CPU-h/day ({meas['basis']}; {meas['how']})"
        )
    else:
        lines.append("        measured: none (no calibration run of this view)")
    if rep["reported"] and "runs" in rep["reported"]:  # the offline job's runs
        told = rep["reported"]
        lines.append(
            f"        reported {told['cpu_hours_per_day']:.2f} CPU-h/day by the offline job "
            f"({told['cpu_s']:g} CPU s over {told['days']} day(s) computed in {told['runs']} run(s); "
            f"{told['how']})"
        )
    elif rep["reported"] and view.tier == "realtime":
        told = rep["reported"]
        per_event = ""
        if "us_per_event" in told:
            per_event = (
                f", {told['us_per_event']:.1f} us/event: {told['at_declared_rate_cpu_hours_per_day']:.2f} "
                f"CPU-h/day at {basis['rate_per_s']:g} events/s"
            )
        lines.append(
            f"        reported {told['cpu_hours_per_day']:.2f} CPU-h/day by {told['tasks']} operator "
            f"subtask(s) ({told['fold_s']:g} s in its folds and fires{per_event}; {told['how']})"
        )
    elif rep["reported"]:
        told = rep["reported"]
        lines.append(
            f"        reported {told['cpu_hours_per_day']:.2f} CPU-h/day by {told['tasks']} running task(s) "
            f"({told['fold_s']:g} s in its folds; {told['how']})"
        )
    if fp:
        lines.append(f"  state {format_bytes(fp['state_bytes'])}: {_basis(view, result, 'state')}")
        lines.append(f"  online memory {format_bytes(fp['online_bytes'])}: {_basis(view, result, 'online')}")
    return lines


def _basis(view: CompiledView, result: CheckResult, which: str) -> str:
    fp = view_footprint(view, result)
    if fp is None:
        return ""
    text = fp.state_basis if which == "state" else fp.online_basis
    return text + ("" if fp.entities_declared else " (entities not declared in budget.yaml: an upper bound)")


@click.command(cls=HeadwaterCommand)
@click.argument("repo", type=click.Path(path_type=Path), default=None, required=False)
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
def costs(repo: Path | None, fmt: str) -> None:
    """Per view: declared vs estimated vs measured CPU-h/day, state and online memory estimates."""
    from headwater.registry.config import features_dir
    from headwater.registry.validate import check_repo

    result = check_repo(features_dir(repo))
    if not result.views:
        click.echo("no view checked (run `headwater check` for the errors)", err=True)
        sys.exit(1)
    stats_root = reported_root()
    views = sorted(result.views, key=lambda v: (v.tier, v.name))
    reports = {v.name: cost_report(v, result, stats_root) for v in views}
    if fmt == "json":
        click.echo(json.dumps({"views": reports}, indent=2))
        return
    rows = [("view", "tier", "declared", "estimated", "measured", "reported", "state", "online", "constants")]
    for name, rep in reports.items():
        meas, told = rep["measured"], rep["reported"]
        fp = rep["footprint"] or {}
        rows.append(
            (
                name,
                next(v.tier for v in result.views if v.name == name),
                f"{rep['declared_cpu_hours_per_day']:.2f}",
                f"{rep['estimate']['cpu_hours_per_day']:.2f}",
                f"{meas['cpu_hours_per_day']:.2f}" if meas else "-",
                f"{told['cpu_hours_per_day']:.2f}" if told else "-",
                format_bytes(fp.get("state_bytes", 0)),
                format_bytes(fp.get("online_bytes", 0)),
                _short(rep["basis"]["constants"]),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        click.echo("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
    click.echo(
        "CPU in CPU-h/day at each source's declared rate; measured: the calibration run of the view alone"
        "; reported: what the running nearline workers' stats files say of the view's own folds "
        "(the realtime operators' files: its share of their folds and fires; shared work not in it), "
        "or the offline job's CPU per day computed (- where none reported)"
        "; state and online memory are estimates "
        "(budget.yaml entities)."
    )


def _short(text: str) -> str:
    return text.split(" on ")[0] if " measured " in text else text.split(" (")[0]


@click.command(cls=HeadwaterCommand, context_settings={"ignore_unknown_options": True})
@click.argument("bench_args", nargs=-1, type=click.UNPROCESSED)
def calibrate(bench_args: tuple[str, ...]) -> None:
    """Measure the cost model's constants: run bench/bench_calibrate.py (BENCH_ARGS passed on).

    It runs each tier on a fixed generated stream for a set of view shapes (Kafka and Redis must be
    up), fits registry/calibration/<tier>.json and checks every example view's estimate against a run
    of it alone. Needs a source checkout (the benchmark is not shipped in the wheel).
    """
    import subprocess

    script = Path(__file__).resolve().parents[1] / "bench" / "bench_calibrate.py"
    if not script.is_file():
        raise click.ClickException(
            f"no {script}: calibration runs from a headwater source checkout (bench/ is not in the wheel)"
        )
    sys.exit(subprocess.call([sys.executable, str(script), *bench_args], cwd=script.parents[1]))
