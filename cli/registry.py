"""The registry's commands: ``check``, ``plan``, ``apply`` and ``features list|describe``.

``check`` is the CI gate (exit 0 clean, 1 on errors); ``plan`` shows what ``apply`` would change;
``apply`` writes Feast objects, the tier plans and the snapshot under the state folder; ``config``
shows where everything is. REPO and the state folder default to the resolved ones
(:mod:`headwater.registry.config`: ``--state-dir``, ``$HEADWATER_STATE_DIR``, headwater.yaml).
"""

from __future__ import annotations

import json
import os
import sys
from datetime import UTC, datetime
from pathlib import Path

import click

from headwater.cli.errors import HeadwaterCommand, HeadwaterGroup
from headwater.registry.compiled import CheckResult
from headwater.registry.config import features_dir, resolve, state_dir
from headwater.registry.durations import format_seconds
from headwater.registry.plan import (
    default_state_dir,
    diff_sources,
    diff_views,
    format_plan,
    read_snapshot,
    source_summaries,
)
from headwater.registry.plans import plan_views, registry_hash
from headwater.registry.report import check_json, check_text
from headwater.registry.validate import check_repo
from headwater.registry.validate_on_demand import describe_on_demand, plan_lines

_repo_arg = click.argument("repo", type=click.Path(path_type=Path), default=None, required=False)
_format_opt = click.option(
    "--format",
    "fmt",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    help="Output format.",
)
_state_opt = click.option(
    "--state-dir",
    type=click.Path(path_type=Path),
    default=None,
    help="Where applied state lives [default: $HEADWATER_STATE_DIR, else state_dir in headwater.yaml, "
    "else .headwater/ in the current folder].",
)


def _checked(repo: Path | None, quiet: bool = False) -> CheckResult:
    """Run check; print its findings and exit 1 on errors (used by plan, apply, features)."""
    result = check_repo(features_dir(repo))
    if not result.ok or (result.diagnostics.items and not quiet):
        click.echo(check_text(result), err=not result.ok)
    if not result.ok:
        sys.exit(1)
    return result


@click.command(cls=HeadwaterCommand)
@_repo_arg
@_format_opt
def check(repo: Path | None, fmt: str) -> None:
    """Check the feature definitions REPO: schema, SLAs, cost and budget.

    REPO defaults to the features folder of headwater.yaml (features/ beside it; without a config
    file, ./features). Exits 0 when clean (warnings are printed), 1 when there is any error.
    """
    result = check_repo(features_dir(repo))
    if fmt == "json":
        from headwater.cli.costs import cost_report, reported_root

        doc = check_json(result)
        by_name = {v.name: v for v in result.views}
        # what the running tiers report (their stats files under the state folder; none in a CI checkout)
        stats_root = reported_root()
        for row in doc["views"]:  # the estimate, its basis, the declared, measured and reported cost
            row["cost"] = cost_report(by_name[row["name"]], result, stats_root)
        click.echo(json.dumps(doc, indent=2))
    else:
        click.echo(check_text(result))
    sys.exit(0 if result.ok else 1)


@click.command(cls=HeadwaterCommand)
@_repo_arg
@_state_opt
@_format_opt
def plan(repo: Path | None, state_dir: Path | None, fmt: str) -> None:
    """Show what `apply` would change: views added, changed, removed, with cost and SLA deltas."""
    result = _checked(repo, quiet=True)
    state = state_dir or default_state_dir()
    applied = read_snapshot(state) or {"views": {}, "registry_hash": None}
    new_hash = registry_hash(result)
    current = {v.name: v.model_dump() for v in plan_views(result)}
    changes = diff_views(applied["views"], current)
    # a snapshot written before sources were recorded compares as "no source changes"
    sources = diff_sources(applied.get("sources", source_summaries(result)), source_summaries(result))
    if fmt == "json":
        payload = {
            "applied_hash": applied["registry_hash"],
            "registry_hash": new_hash,
            "changes": [c.to_json() for c in changes],
            "sources": sources,
            "on_demand": [line.strip() for line in plan_lines(result, state)[1:]],
        }
        click.echo(json.dumps(payload, indent=2))
    else:
        click.echo(format_plan(changes, applied["registry_hash"], new_hash, sources))
        for line in plan_lines(result, state):  # request-time views: no tier runs them
            click.echo(line)


@click.command(cls=HeadwaterCommand)
@_repo_arg
@_state_opt
@click.option("--redis-url", default=None, help="Online store for Feast [default: the resolved redis.url].")
@click.option("--no-feast", is_flag=True, help="Write the tier plans and snapshot only, skip Feast.")
def apply(repo: Path | None, state_dir: Path | None, redis_url: str | None, no_feast: bool) -> None:
    """Apply REPO: Feast entities and views (with tags), one plan per tier, and the snapshot."""
    from headwater.pipelines.settings import Settings
    from headwater.pipelines.store.feast_yaml import online_store_section
    from headwater.registry.apply import apply_repo

    os.environ.setdefault("FEAST_USAGE", "False")
    result = _checked(repo)
    state = state_dir or default_state_dir()
    settings = Settings.from_env()
    online = None if no_feast else online_store_section(redis_url or settings.redis_url)
    outcome = apply_repo(result, state, settings.kafka_bootstrap, online)
    click.echo(f"Applied {outcome.views} view(s), registry {outcome.registry_hash}")
    if not no_feast:
        click.echo(f"  feast repo: {state / 'feast'} (feast -c {state / 'feast'} feature-views list)")
    for tier, path in outcome.plan_paths.items():
        click.echo(f"  {tier} plan: {path}")
    for name in outcome.deleted_views:
        click.echo(f"  deleted view: {name}")


@click.group(cls=HeadwaterGroup)
def features() -> None:
    """List and describe the feature views of a repo."""


@features.command("list")
@_repo_arg
def list_views(repo: Path | None) -> None:
    """One line per view: name, tier, SLA, cost, owner, features."""
    result = _checked(repo, quiet=True)
    header = f"{'view':<34} {'tier':<9} {'sla':>6} {'cost':>6} {'est':>6}  {'owner':<18} features"
    click.echo(header)
    for v in sorted(result.views, key=lambda v: (v.tier, v.name)):
        click.echo(
            f"{v.name:<34} {v.tier:<9} {format_seconds(v.freshness_sla.seconds):>6} "
            f"{v.compute_cost:>6.2f} {v.estimated_cost:>6.2f}  {v.owner:<18} {len(v.features)}"
        )
    for od in result.on_demand:  # computed by the service: no SLA, no tier cost
        click.echo(
            f"{od.name:<34} {'on_demand':<9} {'-':>6} {0:>6.2f} {0:>6.2f}  {od.owner:<18} {len(od.features)}"
        )


@features.command()
@click.argument("view")
@_repo_arg
def describe(view: str, repo: Path | None) -> None:
    """Everything about VIEW: entity, source, tier, SLA, cost, each feature with its filter and SQL."""
    from headwater.registry.expr_sql import to_sql

    result = _checked(repo, quiet=True)
    found = {v.name: v for v in result.views}.get(view)
    on_demand = {v.name: v for v in result.on_demand}
    if found is None and view in on_demand:
        click.echo("\n".join(describe_on_demand(on_demand[view])))
        return
    if found is None:
        known = ", ".join(sorted([*(v.name for v in result.views), *on_demand]))
        click.echo(f"no feature view '{view}' in {features_dir(repo)}; known: {known}", err=True)
        sys.exit(1)
    click.echo(f"{found.name}  ({found.file}:{found.line})\n  {found.description}")
    click.echo(
        f"  entity {found.entity} (key {found.join_key}), source {found.source}, tier {found.tier}, "
        f"freshness_sla {found.freshness_sla}, owner {found.owner}"
    )
    from headwater.cli.costs import describe_lines

    click.echo("\n".join(describe_lines(found, result)))
    if found.tier == "nearline":
        click.echo(_history_line(found.name))
    fields = sorted({f.field for f in found.features if f.field and f.agg in ("top_k", "last")})
    if fields:
        click.echo("\n".join(dictionary_lines(fields)))
    for f in found.features:
        extra = f" {f.field}" if f.field else ""
        extra += f" k={f.k}" if f.k else ""
        click.echo(f"  - {f.name}: {f.agg}{extra} over {f.window} (slide {f.slide}) -> {f.dtype}")
        if f.where is not None:
            click.echo(f"      where {f.where_text}\n      sql   {to_sql(f.where, 'flink')}")
        for side, op in (("numerator", f.numerator), ("denominator", f.denominator)):
            if op is not None:
                click.echo(
                    f"      {side}: {op.agg}{' ' + op.field if op.field else ''} where {op.where_text}"
                )


@click.command(cls=HeadwaterCommand)
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
def config(fmt: str) -> None:
    """Show where everything is: the config file used, each folder and address, and where it came from.

    Precedence: command-line option, then HEADWATER_* environment variable, then headwater.yaml
    (found with --repo, $HEADWATER_REPO, or from the current folder up), then the default.
    """
    from headwater.pipelines.store.connect import redact_url

    found = resolve()
    # No secret is shown: the Redis password is masked, kafka.security names only where each is.
    values: dict[str, str | int | None] = {
        "config_file": str(found.config_file) if found.config_file else None,
        "root": str(found.root),
        "features": str(found.features),
        "state_dir": str(found.state_dir),
        "lake": str(found.lake),
        "jvm_lib": str(found.jvm_lib),
        "kafka.bootstrap": found.kafka_bootstrap,
        "kafka.dlq_topic": found.dlq_topic,
        "kafka.partitions": found.partitions,
        "kafka.security": found.kafka_security.describe(),
        "redis.url": redact_url(found.redis_url),
        "redis.eviction": found.redis_eviction,
    }
    if fmt == "json":
        click.echo(json.dumps({"values": values, "origins": found.origins}, indent=2))
        return
    for key, value in values.items():
        origin = f"  [{found.origins[key]}]" if key in found.origins else ""
        click.echo(f"{key:<18} {value if value is not None else '(none: defaults)'}{origin}")


def dictionary_lines(fields: list[str]) -> list[str]:
    """Say how full each field's dictionary is in the online store (a full one refuses new values).

    Text values (``top_k``, ``last`` of a string) are stored as dictionary ids, at most 2^24 per field;
    past that a new value is stored as id 0 and counted, and its feature reads as unknown.
    """
    import redis

    from headwater.pipelines.settings import Settings
    from headwater.pipelines.store.connect import redact_url, redis_client
    from headwater.pipelines.windows.vector import MAX_DICTIONARY_ID, RedisDictionary

    url = Settings.from_env().redis_url
    shown = redact_url(url)
    try:
        client = redis_client(url, socket_connect_timeout=0.5, socket_timeout=2.0)
        dictionary = RedisDictionary(client)
        sizes = {f: (int(client.hlen(dictionary.key(f))), dictionary.overflowed(f)) for f in fields}
        client.close()
    except (redis.RedisError, OSError) as exc:
        names = ", ".join(fields)
        return [f"  dictionaries ({names}): not checked, the online store at {shown} did not answer ({exc})"]
    lines = []
    for field, (size, refused) in sizes.items():
        state = f"FULL, {refused:,} values refused (stored as id 0)" if refused else "not full"
        lines.append(f"  dictionary {field}: {size:,} of {MAX_DICTIONARY_ID:,} values, {state}")
    return lines


def _history_line(view: str) -> str:
    """Say whether the nearline tier's windows of ``view`` are full (its backfill found enough history)."""
    from headwater.pipelines.nearline.versions import short_history

    boundary = short_history(state_dir() / "nearline", view)
    if boundary is None:
        return "  history: full windows (no worker reports a retention shorter than the window)"
    at = datetime.fromtimestamp(boundary / 1000, tz=UTC).isoformat(timespec="seconds")
    return (
        f"  history: partial: Kafka retention was shorter than the longest window when it was backfilled;"
        f" its windows are full from {at}"
    )
