"""``headwater monitor``: served feature values against the training set and the day before; expectations."""

from __future__ import annotations

import json
from datetime import date
from pathlib import Path
from typing import TYPE_CHECKING

import click

from headwater.cli.errors import HeadwaterCommand
from headwater.cli.offline import LAKE, MASTER
from headwater.serving.skew import DEFAULT_TOPIC

if TYPE_CHECKING:
    import pyarrow as pa

    from headwater.ranking.monitor import Served


def _day(_ctx: click.Context, _param: click.Parameter, value: str | None) -> date | None:
    if value is None:
        return None
    try:
        return date.fromisoformat(value)
    except ValueError as exc:
        msg = f"{value!r} is not a day; expected YYYY-MM-DD (a UTC day, e.g. 2026-12-04)"
        raise click.BadParameter(msg) from exc


@click.command("monitor", cls=HeadwaterCommand)
@click.option(
    "--baseline", type=click.Path(path_type=Path), default=None,
    help="The training set (Parquet from `headwater training-set`) the live model was trained on:"
         " served values are compared with its columns. Without it: the previous day only.",
)  # fmt: skip
@click.option(
    "--served", "served_path", type=click.Path(path_type=Path), default=None,
    help="A Parquet file of served vectors (at_ms and user./item./pair. columns) instead of the"
         " prediction log landed by `headwater skew`.",
)  # fmt: skip
@click.option(
    "--day", callback=_day, default=None, help="The UTC day monitored, YYYY-MM-DD [default: the last served]."
)
@click.option("--topic", default=DEFAULT_TOPIC, show_default=True, help="The prediction log's topic.")
@click.option(
    "--models", "models_dir", type=click.Path(path_type=Path), default=None,
    help="Folder of the model artifacts (their input slots name the logged values)"
         " [default: models/ in the state folder].",
)  # fmt: skip
@click.option("--features", "features", type=click.Path(path_type=Path), default=None,
              help="The feature repo whose expect: blocks are checked"
                   " [default: headwater.yaml's].")  # fmt: skip
@click.option(
    "--metrics-file", type=click.Path(path_type=Path), default=None,
    help="Also write the report as Prometheus gauges to this file (written to a temporary file, then"
         " renamed: point it at node_exporter's textfile folder, a name ending .prom).",
)  # fmt: skip
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
@LAKE
@MASTER
def monitor_command(
    baseline: Path | None, served_path: Path | None, day: date | None, topic: str, models_dir: Path | None,
    features: Path | None, metrics_file: Path | None, fmt: str, lake: Path | None, master: str | None,
) -> None:  # fmt: skip
    """Check the served feature values: statistics, drift and each feature's `expect:` block.

    The values served on --day (from the prediction log `headwater skew` landed, or --served) are
    summarised per feature column (count, missing rate, mean, std, quantiles, top ids), compared
    with the training set (--baseline) and with the day before (PSI and KS), and checked against
    the expectations of the view YAML (min, max, max_missing_rate, max_drift_psi, max_drift_ks).
    Prints one line per breach and a summary line; --metrics-file also writes the figures as
    Prometheus gauges (PSI, KS, missing rate, limits, breaches, the day). Exit 1: an expectation
    is breached; exit 2: no figures (a missing file or table, nothing served that day).
    """
    from headwater.ranking.monitor import (
        MonitorError,
        baseline_columns,
        monitor,
        served_from_table,
        trained_versions,
        version_notes,
        watched_columns,
    )
    from headwater.registry.config import features_dir
    from headwater.registry.validate import check_repo

    registry = check_repo(features_dir(features))
    if not registry.ok:
        msg = f"the feature repo {registry.root} has errors: run `headwater check` and fix them first"
        raise MonitorError(msg)
    watched = watched_columns(registry.views)
    notes: list[str] = []
    if served_path is not None:
        served = served_from_table(_parquet(served_path, "--served"), str(served_path))
    else:
        served, notes = _landed(
            topic, models_dir, lake, master, {f.name for v in registry.on_demand for f in v.features}
        )
    base = None
    if baseline is not None:
        table = _parquet(baseline, "--baseline")
        base = baseline_columns(table, str(baseline))
        notes += version_notes(served.versions, trained_versions(table))
    report = monitor(served, base, watched, day)
    report.notes[:0] = notes
    if metrics_file is not None:
        from headwater.ranking.monitor_metrics import write_metrics_file

        write_metrics_file(report, metrics_file)  # before the verdict: a breach is what it must show
    if fmt == "json":
        click.echo(json.dumps(report.as_dict(), indent=2))
    else:
        for b in report.breaches:
            click.echo(b.line())
        for note in report.notes[:10]:
            click.echo(f"note: {note}")
        click.echo(report.summary_line())
    if report.breaches:
        raise SystemExit(1)


def _parquet(path: Path, option: str) -> pa.Table:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from headwater.ranking.monitor import MonitorError

    if not path.is_file():
        msg = f"{option} {path}: no such file; give a Parquet file (`headwater training-set --out FILE`)"
        raise MonitorError(msg)
    try:
        return pq.read_table(path)
    except (OSError, pa.ArrowInvalid) as exc:
        msg = f"{option} {path}: not a readable Parquet file ({exc})"
        raise MonitorError(msg) from exc


def _landed(
    topic: str, models_dir: Path | None, lake: Path | None, master: str | None, pairs: set[str]
) -> tuple[Served, list[str]]:
    """Read the landed prediction log's records, parsed, named by the models' slots."""
    from headwater.pipelines.offline.lake import lake_root
    from headwater.pipelines.offline.session import offline_session
    from headwater.pipelines.offline.skew_land import PredictionLandingError, predictions_path, read_landed
    from headwater.ranking.monitor import MonitorError, model_slots, served_from_logged
    from headwater.ranking.skew_pit import parse_logged
    from headwater.registry.config import state_dir

    models = models_dir or state_dir(None) / "models"
    slots, notes = model_slots(models) if models.is_dir() else ({}, [f"{models}: no such folder"])
    if not slots:
        msg = (
            f"no model artifact (*.pt) in {models} says which slots the logged values are; pass --models DIR"
        )
        raise MonitorError(msg)
    spark = offline_session("headwater-monitor", master)
    try:
        frame = read_landed(spark, predictions_path(lake_root(lake), topic))
        texts = [r["record"] for r in frame.select("record").collect()]
    except PredictionLandingError as exc:
        raise MonitorError(str(exc)) from exc
    logged, parse_notes = parse_logged(texts)
    served, slot_notes = served_from_logged(logged, slots, pairs)
    return served, notes + parse_notes + slot_notes
