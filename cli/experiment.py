"""``headwater experiment report``: counts and figures per experiment arm from the landed events."""

from __future__ import annotations

import json
from pathlib import Path

import click

from headwater.cli.errors import HeadwaterGroup
from headwater.cli.offline import LAKE, MASTER, STATE, tier_plan
from headwater.cli.options import NotComputed
from headwater.ranking.experiment_report import (
    ARM_FIELD,
    ExperimentReportError,
    arm_counts,
    build_report,
    experiments_landed,
    parse_weights,
    report_source,
)


def _expected(
    config: Path | None, weights: str | None, experiment: str | None
) -> tuple[str | None, dict[str, float] | None, str]:
    """Return the experiment named by the config (if any), the weights and where they came from."""
    if weights is not None:
        return experiment, parse_weights(weights), "--weights"
    if config is None:
        return experiment, None, "equal weights over the arms landed (no --config or --weights)"
    from headwater.serving.config import ServingConfigError, load_config

    try:
        declared = load_config(config).experiment
    except ServingConfigError as exc:
        raise ExperimentReportError(str(exc)) from exc
    if declared is None:
        raise ExperimentReportError(f"serving config {config}: declares no experiment")
    if experiment is not None and experiment != declared.name:
        msg = f"serving config {config}: declares experiment {declared.name!r}, not {experiment!r}"
        raise ExperimentReportError(msg)
    return declared.name, {a.name: a.weight for a in declared.arms}, f"weights of {config}"


@click.group("experiment", cls=HeadwaterGroup)
def experiment() -> None:
    """Experiments of the ranking service (arms declared in its serving config)."""


@experiment.command("report")
@click.option(
    "--experiment", "name", default=None, help="Experiment name (default: the config's, else the one landed)."
)
@click.option(
    "--config", "config_path", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
    help="The serving config that declares the experiment: its arms' weights are the expected split.",
)  # fmt: skip
@click.option("--weights", default=None, help="Expected split instead of a config: control=50,treatment=50.")
@click.option("--from", "first", default=None, help="First UTC day (YYYY-MM-DD, inclusive).")
@click.option("--to", "last", default=None, help="Last UTC day (YYYY-MM-DD, inclusive).")
@click.option(
    "--source", "source_name", default=None, help="Behaviour source (default: the one with an arm)."
)
@click.option(
    "--format", "fmt", type=click.Choice(["text", "json", "line"]), default="text", show_default=True
)
@LAKE
@STATE
@MASTER
def report(
    name: str | None, config_path: Path | None, weights: str | None, first: str | None, last: str | None,
    source_name: str | None, fmt: str, lake: Path | None, state_dir: Path | None, master: str | None,
) -> None:  # fmt: skip
    """Each arm's users, impressions, clicks and CTR (95% interval, users as the unit) from the landed events.

    Also tests the split for a sample-ratio mismatch (chi-square of users per arm against the
    weights); exits 1 when an arm is off by more than 0.5% of its share with p < 0.001.
    """
    from headwater.cli.labels import day_range
    from headwater.pipelines.offline.job import OfflineJobError, read_bronze
    from headwater.pipelines.offline.lake import lake_root
    from headwater.pipelines.offline.session import offline_session
    from headwater.registry.plans import NoPlanError, PlanError

    lo, hi = day_range(None, first, last)
    try:
        name, expected, weights_from = _expected(config_path, weights, name)
        source = report_source(tier_plan(state_dir, "offline").sources, source_name)
    except click.ClickException as exc:
        raise NotComputed(exc.message) from exc
    except (NoPlanError, PlanError, ExperimentReportError) as exc:  # exit 2: no figures, not a verdict
        raise NotComputed(str(exc)) from exc
    spark = offline_session("headwater-experiment-report", master)
    try:
        bronze = read_bronze(spark, lake_root(lake), source)
        if ARM_FIELD not in bronze.columns:
            msg = (
                f"the bronze table of source {source.name!r} has no {ARM_FIELD!r} column: no event of"
                " schema version 2 has landed yet (serve with an experiment, then `headwater run landing`)"
            )
            raise ExperimentReportError(msg)
        if name is None:
            found = experiments_landed(bronze)
            if len(found) != 1:
                landed = ", ".join(found) or "none"
                msg = f"{len(found)} experiments landed ({landed}); name one with --experiment"
                raise ExperimentReportError(msg)
            name = found[0]
        counts = arm_counts(bronze, source, name, lo, hi)
    except (OfflineJobError, ExperimentReportError) as exc:
        raise NotComputed(str(exc)) from exc
    if expected is None:
        if not counts:
            raise NotComputed(f"no event of experiment {name!r} has landed")
        expected = {arm: 1.0 for arm in sorted(counts)}
    try:
        result = build_report(name, counts, expected, weights_from)
    except ExperimentReportError as exc:
        raise NotComputed(str(exc)) from exc
    if fmt == "json":
        click.echo(json.dumps(result.as_dict(), indent=2))
    else:
        click.echo(result.line() if fmt == "line" else result.text())
    if result.srm.flagged:
        raise SystemExit(1)
