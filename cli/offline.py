"""Command line of the offline tier: landing, the daily/backfill job, training sets, materialize, consistency.

``landing`` and ``offline`` are meant for ``headwater run landing|offline``; ``training_set``,
``materialize`` and ``consistency`` are top-level commands. Spark is started inside each command.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import click

from headwater.cli.errors import HeadwaterCommand
from headwater.registry.config import state_dir as resolved_state_dir
from headwater.registry.tiers import TIER_NAMES

if TYPE_CHECKING:
    from headwater.pipelines.offline.job import BronzeTables
    from headwater.pipelines.store import OnlineStore
    from headwater.registry.plans import PlanSource, PlanView, TierPlan

LAKE = click.option("--lake", type=click.Path(path_type=Path), default=None,
                    help="Lake folder (default: $HEADWATER_LAKE, else headwater.yaml's).")  # fmt: skip
STATE = click.option("--state-dir", type=click.Path(path_type=Path), default=None,
                     help="Plans folder (default: $HEADWATER_STATE_DIR, else headwater.yaml's).")  # fmt: skip
MASTER = click.option(
    "--master", default=None, help="Spark master (default local[2]; a cluster URL scales out)."
)
TIER_CHOICE = click.Choice(TIER_NAMES)
REDIS = click.option(
    "--redis-url", default=None, help="Online store (default: HEADWATER_REDIS_URL or local Redis)."
)
VALUES = ("as-served", "as-corrected")
"""``training-set --values`` (:data:`headwater.ranking.training_set.AS_SERVED`, ``AS_CORRECTED``)."""
MISMATCH_TARGET = 0.001
"""`headwater consistency` exits 1 when a view's mismatch rate is above this (0.1%)."""
NAMESPACE = click.option(
    "--namespace", default=None, help="Key prefix of the online store (default: the store's own)."
)


def _state(state_dir: Path | None) -> Path:
    return resolved_state_dir(state_dir)


def tier_plan(state_dir: Path | None, tier: str) -> TierPlan:
    """Return the applied plan of ``tier``; raises NoPlanError or PlanError (the CLI prints them)."""
    from headwater.registry.plans import read_plan

    return read_plan(_state(state_dir), tier)


def tier_views(state_dir: Path | None, tier: str) -> list[PlanView]:
    """Return the views of one tier's applied plan (none when that tier has no plan, or none readable)."""
    from headwater.registry.plans import NoPlanError, PlanError

    try:
        return list(tier_plan(state_dir, tier).views)
    except (NoPlanError, PlanError):
        return []


def _views(plan: TierPlan, names: tuple[str, ...]) -> list[PlanView]:
    """Return the plan's views named ``names`` (all of them when none is named)."""
    return _named(plan.views, names, "view(s)", plan.tier)


_Named = TypeVar("_Named", "PlanView", "PlanSource")


def _named(items: list[_Named], names: tuple[str, ...], what: str, tier: str) -> list[_Named]:
    """Pick ``names`` out of ``items`` in the order asked; an unknown name is an error listing the known."""
    if not names:
        return list(items)
    known = {item.name: item for item in items}
    unknown = [n for n in names if n not in known]
    if unknown:
        msg = f"unknown {what} {unknown} in the {tier} plan; known: {sorted(known)}"
        raise click.ClickException(msg)
    return [known[n] for n in names]


@click.command("landing", cls=HeadwaterCommand)
@LAKE
@STATE
@MASTER
@click.option("--source", "source_names", multiple=True,
              help="Only this source of the plan (repeatable; default: every source).")  # fmt: skip
@click.option("--batch", "batch_records", type=click.IntRange(min=1), default=1_000_000, show_default=True,
              help="Records per Delta commit (few large files).")  # fmt: skip
@click.option("--workers", type=click.IntRange(min=1), default=2, show_default=True,
              help="Processes per source that consume and decode partitions (1: in-process).")  # fmt: skip
@click.option("--follow", is_flag=True, help="Keep landing new events (default: stop when caught up).")
def landing(
    lake: Path | None, state_dir: Path | None, master: str | None, source_names: tuple[str, ...],
    batch_records: int, workers: int, follow: bool,
) -> None:  # fmt: skip
    """Land each source's topic in its bronze Delta table (exactly once; malformed, future, late -> DLQ)."""
    from headwater.pipelines.offline.lake import bronze_path, is_delta_table, lake_root
    from headwater.pipelines.offline.landing import LandingConfig, LandingError, LandingStats, land_sources
    from headwater.pipelines.offline.session import offline_session
    from headwater.pipelines.settings import Settings

    settings = Settings.from_env()
    sources = _sources(tier_plan(state_dir, "offline"), source_names)
    root = lake_root(lake)
    configs = [
        LandingConfig(bootstrap=settings.kafka_bootstrap, source=source, dlq_topic=settings.dlq_topic,
                      table=bronze_path(root, source.name), batch_records=batch_records, workers=workers)
        for source in sources
    ]  # fmt: skip

    def report(name: str, s: LandingStats) -> None:
        click.echo(f"{name} batch {s.batches}: {s.records} records, {s.landed} landed, "
                   f"{s.malformed} malformed, {s.future} future-dated, {s.late} late "
                   f"({s.records_per_s:,.0f} records/s)")  # fmt: skip

    spark = offline_session("headwater-landing", master)
    done = land_sources(spark, configs, follow=follow, progress=report)
    for config in configs:
        stats = done[config.source.name]
        if stats.skipped is not None:
            click.echo(f"warning: skipping {stats.skipped}; the views of source {config.source.name!r} "
                       "are skipped by `headwater run offline` until it has data", err=True)  # fmt: skip
            continue
        if not stats.records and not is_delta_table(config.table):
            click.echo(f"warning: source {config.source.name!r}: topic {config.topic!r} has no events yet, "
                       f"so it has no bronze table; produce some with `headwater events produce --source "
                       f"{config.source.name}`", err=True)  # fmt: skip
        click.echo(json.dumps({"source": config.source.name, "table": str(config.table),
                               "batches": stats.batches, "records": stats.records, "landed": stats.landed,
                               "malformed": stats.malformed,
                               "future_dated": stats.future, "late": stats.late,
                               "seconds": round(stats.seconds, 2)}))  # fmt: skip
    if configs and all(done[c.source.name].skipped is not None for c in configs):
        msg = "no source landed: none of their topics exists yet; produce events first"
        raise LandingError(msg)


def _sources(plan: TierPlan, names: tuple[str, ...]) -> list[PlanSource]:
    """Return the plan's sources named ``names`` (all of them when none is named)."""
    return _named(plan.sources, names, "source(s)", plan.tier)


def _days(day: str | None, backfill: tuple[str, str] | None) -> list[date]:
    from headwater.pipelines.offline.lake import days

    today = datetime.now(UTC).date()
    try:
        if backfill:
            chosen = days(date.fromisoformat(backfill[0]), date.fromisoformat(backfill[1]))
        elif day:
            chosen = [date.fromisoformat(day)]
        else:
            return [today - timedelta(days=1)]
    except ValueError as exc:
        raise click.BadParameter(f"{exc} (dates are YYYY-MM-DD)") from exc
    if chosen[-1] >= today:
        # A day's values are "as of its end": before midnight UTC they would be stamped with a future
        # event time and change as the day goes on, so serving and training would see unfinished values.
        msg = (f"day {chosen[-1]} has not ended yet (it ends at {chosen[-1] + timedelta(days=1)} 00:00 UTC); "
               f"compute days up to {today - timedelta(days=1)}")  # fmt: skip
        raise click.BadParameter(msg)
    return chosen


@click.command("offline", cls=HeadwaterCommand)
@click.option(
    "--date", "day", default=None, help="Day D to compute, values as of its end (default: yesterday UTC)."
)
@click.option(
    "--backfill", nargs=2, default=None, metavar="FROM TO", help="Every day from FROM to TO inclusive."
)
@click.option("--tier", type=TIER_CHOICE, default="offline", show_default=True,
              help="Whose views to compute (any tier's view can be backfilled).")  # fmt: skip
@click.option("--view", "view_names", multiple=True, help="Only this view (repeatable).")
@click.option("--chunk-days", type=click.IntRange(min=1), default=7, show_default=True)
@click.option("--no-zorder", is_flag=True, help="Skip OPTIMIZE ZORDER BY (entity id).")
@click.option(
    "--full",
    is_flag=True,
    help="Recompute from bronze; a tiled view's tiles are all rebuilt (default: changed days).",
)
@LAKE
@STATE
@MASTER
def offline(
    day: str | None, backfill: tuple[str, str] | None, tier: str, view_names: tuple[str, ...],
    chunk_days: int, no_zorder: bool, full: bool, lake: Path | None, state_dir: Path | None,
    master: str | None,
) -> None:  # fmt: skip
    """Compute the views of a tier plan per day into Delta tables (partitioned by date, Z-ordered)."""
    from headwater.pipelines.offline.heal import heal_view, heals
    from headwater.pipelines.offline.job import BronzeTables, DayRun, record_cpu, run_view
    from headwater.pipelines.offline.lake import lake_root
    from headwater.pipelines.offline.session import offline_session

    if day and backfill:
        msg = "give --date or --backfill, not both"
        raise click.UsageError(msg)
    days = _days(day, backfill)
    plan = tier_plan(state_dir, tier)
    views = _views(plan, view_names)
    root = lake_root(lake)

    def report(run: DayRun) -> None:
        tiles = f", {len(run.retiled)} day(s) re-tiled from bronze" if run.tiled or run.retiled else ""
        click.echo(f"  {run.view}: {run.first}..{run.last} {run.rows} rows in {run.seconds:.1f} s{tiles}")
        record_cpu(_state(state_dir) / "offline" / "reported", run)  # `headwater costs`: reported

    spark = offline_session("headwater-offline", master)
    bronze = BronzeTables(spark, root, plan.sources)
    views = _with_data(views, bronze, named=bool(view_names))
    for i, view in enumerate(views, start=1):
        click.echo(f"[{i}/{len(views)}] {view.name} (source {view.source}): {len(days)} day(s) "
                   f"{days[0]}..{days[-1]}")  # fmt: skip
        table, source = bronze.for_view(view)
        run_view(spark, table, view, source, root, days, chunk_days, not no_zorder, report, full)
        if heals(view):  # late: heal: the corrected values too, and the old days late events reached
            healed = heal_view(spark, table, view, source, root, days, chunk_days, not no_zorder, full)
            again = ", ".join(map(str, healed.rehealed)) or "none"
            click.echo(f"  {view.name} (late: heal): {healed.rows} healed rows; earlier days healed again "
                       f"because late events reached them: {again}")  # fmt: skip


def _with_data(views: list[PlanView], bronze: BronzeTables, named: bool) -> list[PlanView]:
    """Drop the views whose source has no bronze table yet, with one warning each (stderr).

    A view the user named (``--view``) is not dropped: its run fails with the reason. When every
    view would be dropped the command fails too: nothing to compute is not a success.
    """
    if named:
        return views

    def has_data(view: PlanView) -> bool:  # an unknown source is kept: it fails in the run with its reason
        return bronze.has_data(view.source) or view.source not in bronze.sources

    fix = "with `headwater run landing` (or `headwater events import --source NAME`)"
    return _keep(views, has_data, "no view has data to compute", fix)


def _keep(
    views: list[PlanView], has_data: Callable[[PlanView], bool], nothing: str, fix: str
) -> list[PlanView]:
    """Return the views ``has_data`` keeps, warning of each other one; raise NoBronzeError if none is left."""
    from headwater.pipelines.offline.job import NoBronzeError, skip_warning

    kept = []
    for view in views:
        if has_data(view):
            kept.append(view)
        else:
            click.echo(skip_warning(view.name, view.source), err=True)
    if views and not kept:
        sources = sorted({v.source for v in views})
        msg = f"{nothing}: no bronze table for source(s) {sources}; land events first {fix}"
        raise NoBronzeError(msg, sources[0])
    return kept


@click.command("training-set", cls=HeadwaterCommand)
@click.option("--labels", required=True, help="Parquet/Delta labels (user_id, item_id, event_time ms, label,"
              " [group]) as `headwater labels` writes them, or `bronze` to derive them here from the"
              " behaviour source (all landed days, default horizon).")  # fmt: skip
@click.option(
    "--out", type=click.Path(path_type=Path, dir_okay=False), required=True, help="Parquet file to write."
)
@click.option(
    "--view", "view_names", multiple=True, help="Views to join (default: every user/item view of every tier)."
)
@click.option("--values", "values", type=click.Choice(VALUES), default="as-served", show_default=True,
              help="as-served: the values the tiers served (late events dropped); as-corrected: the"
              " healed values of late: heal views (late events counted), others as served.")  # fmt: skip
@LAKE
@STATE
@MASTER
@REDIS
def training_set(
    labels: str, out: Path, view_names: tuple[str, ...], values: str, lake: Path | None,
    state_dir: Path | None, master: str | None, redis_url: str | None,
) -> None:  # fmt: skip
    """Build a point-in-time training set (never a future value) for `headwater model train`."""
    from headwater.pipelines.offline.job import BronzeTables
    from headwater.pipelines.offline.labels import derive_labels, labels_source
    from headwater.pipelines.offline.lake import lake_root
    from headwater.pipelines.offline.session import offline_session
    from headwater.pipelines.windows import RedisDictionary
    from headwater.ranking.training_set import build_training_set, read_labels

    plan = tier_plan(state_dir, "offline")
    every = [v for tier in TIER_NAMES for v in tier_views(state_dir, tier)]
    views = _views(plan.model_copy(update={"views": every}), view_names)
    root = lake_root(lake)
    store = online_store(redis_url)
    spark = offline_session("headwater-training-set", master)
    bronze = BronzeTables(spark, root, plan.sources)
    if labels == "bronze":
        behaviour = labels_source(plan.sources)
        frame = derive_labels(bronze.table(behaviour.name), behaviour)
    else:
        frame = read_labels(spark, Path(labels))
    ids = RedisDictionary(store.client, store.namespace).ids
    result = build_training_set(
        spark, frame, views, root, out, plan.registry_hash, ids, bronze, plan.on_demand, values
    )
    click.echo(json.dumps({"out": str(result.path), "rows": result.rows, "positives": result.positives,
                           "columns": len(result.columns)}))  # fmt: skip


def online_store(redis_url: str | None, namespace: str | None = None, *, writes: bool = False) -> OnlineStore:
    """Return the online store at ``redis_url`` (default: the resolved settings).

    ``writes``: the caller writes values, so an evicting Redis is refused unless declared
    (:func:`headwater.pipelines.store.connect.check_eviction_policy`).
    """
    from headwater.pipelines.settings import Settings
    from headwater.pipelines.store import OnlineStore
    from headwater.pipelines.store.connect import check_eviction_policy

    settings = Settings.from_env()
    url = redis_url or settings.redis_url
    store = OnlineStore.from_url(url) if namespace is None else OnlineStore.from_url(url, namespace=namespace)
    if writes:
        check_eviction_policy(store.client, allowed=settings.redis_eviction, tier="the offline tier")
    return store


@click.command("materialize", cls=HeadwaterCommand)
@click.option("--tier", type=TIER_CHOICE, default="offline", show_default=True)
@click.option("--view", "view_names", multiple=True, help="Only this view (repeatable).")
@LAKE
@STATE
@MASTER
@REDIS
@NAMESPACE
@click.option("--heal", is_flag=True, help="Write the healed values (late events counted) of the late:"
              " heal views instead; a key holding a newer value keeps it (counted).")  # fmt: skip
def materialize(
    tier: str, view_names: tuple[str, ...], lake: Path | None, state_dir: Path | None, master: str | None,
    redis_url: str | None, namespace: str | None, heal: bool,
) -> None:  # fmt: skip
    """Write the latest offline values of each view into the online store."""
    from headwater.pipelines.offline.lake import lake_root
    from headwater.pipelines.offline.materialize import Materialized
    from headwater.pipelines.offline.materialize import materialize as run
    from headwater.pipelines.offline.session import offline_session

    plan = tier_plan(state_dir, tier)
    views = _views(plan, view_names)
    root = lake_root(lake)
    if heal:
        _heal_online(plan.tier, views, root, master, redis_url, namespace, named=bool(view_names))
        return
    if not view_names:
        views = _materializable(views, root)

    def report(m: Materialized) -> None:
        click.echo(f"{m.view}: {m.rows} rows of {m.date}, {m.written} written, {m.rows_per_s:,.0f} rows/s")

    spark = offline_session("headwater-materialize", master)
    run(spark, online_store(redis_url, namespace, writes=True), views, root, report)


def _heal_online(
    tier: str, views: list[PlanView], root: Path, master: str | None, redis_url: str | None,
    namespace: str | None, named: bool,
) -> None:  # fmt: skip
    """``materialize --heal``: the newest healed day of each late: heal view, one count line per view."""
    from headwater.pipelines.offline.heal import heal_online, heals
    from headwater.pipelines.offline.session import offline_session

    healing = [v for v in views if heals(v) or named]  # a view named with --view fails with the reason
    if not healing:
        msg = (f"no view of the {tier} plan has late: heal, so none has healed values; set late: heal in "
               "a view's YAML and run `headwater apply`, then `headwater run offline`")  # fmt: skip
        raise click.ClickException(msg)
    spark = offline_session("headwater-materialize-heal", master)
    store = online_store(redis_url, namespace, writes=True)
    for view in healing:
        h = heal_online(spark, store, view, root)
        click.echo(f"{h.view}: {h.rows} healed rows of {h.date}: {h.healed} healed, {h.kept} kept (a newer "
                   f"value is stored), {h.unchanged} unchanged")  # fmt: skip


def _materializable(views: list[PlanView], root: Path) -> list[PlanView]:
    """Drop the views that have no feature table because their source has no data yet (one warning each).

    A view whose source has data but no feature table still fails (run ``headwater run offline``).
    """
    from headwater.pipelines.offline.lake import bronze_path, feature_path, is_delta_table

    def has_data(view: PlanView) -> bool:
        return is_delta_table(feature_path(root, view.name)) or is_delta_table(bronze_path(root, view.source))

    fix = "with `headwater run landing`, then `headwater run offline`"
    return _keep(views, has_data, "no view to materialize", fix)


@click.command("consistency", cls=HeadwaterCommand)
@click.option("--tier", "tiers", multiple=True, type=TIER_CHOICE,
              help="Tiers whose views to check (default: realtime and nearline).")  # fmt: skip
@click.option("--view", "view_names", multiple=True, help="Only this view (repeatable).")
@click.option(
    "--sample", type=click.IntRange(min=1), default=500, show_default=True, help="Entities per view."
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@LAKE
@STATE
@MASTER
@REDIS
@NAMESPACE
def consistency(
    tiers: tuple[str, ...], view_names: tuple[str, ...], sample: int, as_json: bool, lake: Path | None,
    state_dir: Path | None, master: str | None, redis_url: str | None, namespace: str | None,
) -> None:  # fmt: skip
    """Recompute sampled online values offline at their own boundary; report mismatch rates."""
    from headwater.pipelines.offline.consistency import check_view
    from headwater.pipelines.offline.job import BronzeTables
    from headwater.pipelines.offline.lake import lake_root
    from headwater.pipelines.offline.session import offline_session

    root = lake_root(lake)
    store = online_store(redis_url, namespace)
    spark = offline_session("headwater-consistency", master)
    results = []
    for tier in tiers or ("realtime", "nearline"):
        plan = tier_plan(state_dir, tier)
        bronze = BronzeTables(spark, root, plan.sources)
        for view in [v for v in plan.views if not view_names or v.name in view_names]:
            table, source = bronze.for_view(view)
            results.append(check_view(spark, table, store, view, source, root, sample))
    if as_json:
        click.echo(json.dumps([r.to_json() for r in results], indent=2))
    else:
        for r in results:
            click.echo("\n".join(r.report_lines()))
    if any(r.mismatch_rate > MISMATCH_TARGET for r in results):
        sys.exit(1)
