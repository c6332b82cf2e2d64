"""``headwater skew``: rescore logged predictions offline and split skew by feature."""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

import click

from headwater.cli.errors import HeadwaterCommand
from headwater.cli.offline import LAKE, MASTER, NAMESPACE, REDIS, STATE
from headwater.ranking.skew_pit import DEFAULT_THRESHOLD
from headwater.registry.tiers import TIER_NAMES
from headwater.serving.skew import DEFAULT_TOPIC, summary_line


@click.command("skew", cls=HeadwaterCommand)
@click.option("--topic", default=DEFAULT_TOPIC, show_default=True, help="The service's prediction log topic.")
@click.option(
    "--models", "models_dir", type=click.Path(exists=True, file_okay=False, path_type=Path), default=None,
    help="Folder of the model artifacts [default: models/ in the state folder].",
)  # fmt: skip
@click.option(
    "--threshold", type=click.FloatRange(min=0.0), default=DEFAULT_THRESHOLD, show_default=True,
    help="Exit 1 when a model version's largest |online - offline| is above this.",
)  # fmt: skip
@click.option("--since", "since_min", type=click.FloatRange(min=0.0), default=None,
              help="Only the answers logged in the last N minutes (default: all landed).")  # fmt: skip
@click.option("--top", type=click.IntRange(1, 100), default=5, show_default=True, help="Features named.")
@click.option("--bootstrap", default=None, help="Kafka (default: HEADWATER_* settings).")
@click.option(
    "--format", "fmt", type=click.Choice(["text", "json", "line"]), default="text", show_default=True,
    help="line: one line for every model version together (the demo prints it).",
)  # fmt: skip
@LAKE
@STATE
@MASTER
@REDIS
@NAMESPACE
def skew_command(
    topic: str, models_dir: Path | None, threshold: float, since_min: float | None, top: int,
    bootstrap: str | None, fmt: str, lake: Path | None, state_dir: Path | None, master: str | None,
    redis_url: str | None, namespace: str | None,
) -> None:  # fmt: skip
    """Land the prediction log, rescore it from the point-in-time features, exit 1 above --threshold.

    Steps: the topic's new records are appended to the Delta table <lake>/predictions/<topic>
    (exactly once); each logged (request, item) becomes a label row at the request's time, joined
    to every user and item view by the training-set path (`headwater training-set`); the model
    version the service used rescores those features. Reports per model version the p50, p99 and
    largest |online - offline| score and the features whose served values differ most from the
    point-in-time ones. Exit 1: a version is over --threshold; exit 2: no figures (an error).
    """
    from headwater.cli.offline import online_store, tier_plan, tier_views
    from headwater.cli.options import NotComputed
    from headwater.pipelines.offline.job import BronzeTables, OfflineJobError
    from headwater.pipelines.offline.lake import lake_root
    from headwater.pipelines.offline.landing_state import LandingError
    from headwater.pipelines.offline.session import offline_session
    from headwater.pipelines.offline.skew_land import (
        PredictionLandingError,
        land_predictions,
        predictions_path,
        read_landed,
    )
    from headwater.pipelines.settings import Settings
    from headwater.pipelines.windows import RedisDictionary
    from headwater.ranking.skew_pit import (
        SkewError,
        compare,
        labels_table,
        load_scorers,
        parse_logged,
        point_in_time,
    )
    from headwater.registry.config import state_dir as resolved_state
    from headwater.registry.plans import NoPlanError, PlanError

    models = models_dir or resolved_state(state_dir) / "models"
    try:
        plan = tier_plan(state_dir, "offline")
    except (NoPlanError, PlanError) as exc:
        raise NotComputed(str(exc)) from exc
    views = [v for tier in TIER_NAMES for v in tier_views(state_dir, tier)]
    root = lake_root(lake)
    scorers, notes = load_scorers(models)
    if not scorers:
        raise NotComputed(f"no model artifact (*.pt) loads from {models}; pass --models DIR")
    store = online_store(redis_url, namespace)
    spark = offline_session("headwater-skew", master)
    try:
        landed = land_predictions(spark, bootstrap or Settings.from_env().kafka_bootstrap, topic, root)
        since_ms = None if since_min is None else int(time.time() * 1000 - since_min * 60_000)
        frame = read_landed(spark, predictions_path(root, topic), since_ms)
        texts = [r["record"] for r in frame.select("record", "kafka_partition", "kafka_offset")
                 .orderBy("kafka_partition", "kafka_offset").collect()]  # fmt: skip
        logged, parse_notes = parse_logged(texts)
        notes += parse_notes
        if not logged:
            raise NotComputed(
                f"no logged answer of a model in {landed.path} ({landed.total} rows landed); serve with"
                " `predictions: {enabled: true}` and rank some requests"
            )
        ids = RedisDictionary(store.client, store.namespace).ids
        with tempfile.TemporaryDirectory(prefix="hw-skew-") as tmp:
            bronze = BronzeTables(spark, root, plan.sources)
            out = Path(tmp) / "pit.parquet"
            pit = point_in_time(
                spark, labels_table(logged), views, root, plan.registry_hash, ids, bronze, out, plan.on_demand
            )
        result, compare_notes = compare(logged, pit, scorers, top)
        notes += compare_notes
    except (PredictionLandingError, LandingError, SkewError, OfflineJobError) as exc:
        raise NotComputed(str(exc)) from exc
    finally:
        store.close()
    if fmt == "json":
        data = {
            "topic": topic,
            "table": str(landed.path),
            "landed": landed.landed,
            "rows": landed.total,
            "answers": len(logged),
            "threshold": threshold,
            "versions": [r.as_dict(threshold) for r in result],
            "notes": notes[:20],
        }
        click.echo(json.dumps(data, indent=2))
    elif fmt == "line":
        click.echo(summary_line(result, threshold, len(logged)))
    else:
        click.echo(
            f"prediction log {topic}: {landed.landed} new record(s) landed in {landed.path}"
            f" ({landed.total} in all); {len(logged)} answer(s) rescored from the point-in-time features"
        )
        for r in result:
            click.echo(r.line(threshold))
        for note in notes[:5]:
            click.echo(f"note: {note}")
    if not result:
        raise NotComputed(f"no logged answer of a model in {models} on topic {topic!r}")
    if any(r.breached(threshold) for r in result):
        raise SystemExit(1)
