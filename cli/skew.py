"""``headwater skew``: rescore logged predictions offline; split skew into value skew, staleness, drift."""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

import click

from headwater.cli.errors import HeadwaterCommand
from headwater.cli.offline import LAKE, MASTER, NAMESPACE, REDIS, STATE
from headwater.ranking.skew_pit import DEFAULT_THRESHOLD
from headwater.ranking.skew_values import (
    DRIFT_THRESHOLD,
    drift_line,
    staleness_line,
    value_line,
    value_times_line,
)
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
    help="Exit 1 when a model version's largest |online - offline at the values' times| is above this.",
)  # fmt: skip
@click.option(
    "--max-drift", type=click.FloatRange(0.0, 1.0), default=DRIFT_THRESHOLD, show_default=True,
    help="Exit 1 when a larger share of the answers was scored by a model trained on another view version.",
)  # fmt: skip
@click.option("--since", "since_min", type=click.FloatRange(min=0.0), default=None,
              help="Only the answers logged in the last N minutes (default: all landed).")  # fmt: skip
@click.option("--top", type=click.IntRange(1, 100), default=5, show_default=True, help="Features named.")
@click.option("--bootstrap", default=None, help="Kafka (default: HEADWATER_* settings).")
@click.option(
    "--format", "fmt", type=click.Choice(["text", "json", "line"]), default="text", show_default=True,
    help="line: one line per part (value skew, staleness, prediction skew at value and request times,"
         " version drift) for every model version together (the demo prints them).",
)  # fmt: skip
@LAKE
@STATE
@MASTER
@REDIS
@NAMESPACE
def skew_command(
    topic: str, models_dir: Path | None, threshold: float, max_drift: float, since_min: float | None,
    top: int, bootstrap: str | None, fmt: str, lake: Path | None, state_dir: Path | None, master: str | None,
    redis_url: str | None, namespace: str | None,
) -> None:  # fmt: skip
    """Land the prediction log; compare each served value with its rebuild at its own event time.

    Steps: the topic's new records are appended to the Delta table <lake>/predictions/<topic>
    (exactly once); every served value (a view's row for the user or an item) becomes a label row at
    that value's own event time, and each logged (request, item) one at the request's time, joined to
    every user and item view by the training-set path (`headwater training-set`). Reported: value
    skew (served values that differ from their rebuild, the worst named by view, feature, entity and
    time), staleness per view against its SLA, the model rescored on the rebuild at the values' times
    and on the logged vector, the rebuild at the request time (what staleness costs in score: not
    judged) and version drift. Exit 1: a value differs, a version's value-times skew is over
    --threshold or the drift over --max-drift; exit 2: no figures (an error). A log of version 1
    records only (no value times) is judged on the request-time line, as before.
    """
    import numpy as np
    import pyarrow as pa

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
    from headwater.pipelines.windows import RedisDictionary, compile_view, slot_names
    from headwater.ranking.skew_pit import (
        SkewError,
        compare,
        labels_table,
        load_scorers,
        parse_logged,
        point_in_time,
    )
    from headwater.ranking.skew_values import (
        staleness,
        value_labels,
        value_skew,
        version_drift,
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
        at_request = labels_table(logged)
        at_values, value_rows = value_labels(logged, first_group=at_request.num_rows)
        with tempfile.TemporaryDirectory(prefix="hw-skew-") as tmp:  # one build: both sets of times
            bronze = BronzeTables(spark, root, plan.sources)
            out = Path(tmp) / "pit.parquet"
            both = point_in_time(spark, pa.concat_tables([at_request, at_values]), views, root,
                                 plan.registry_hash, ids, bronze, out, plan.on_demand)  # fmt: skip
        n = at_request.num_rows
        pit = both.take(np.arange(n, dtype=np.intp))
        rebuilt = both.take(np.arange(n, n + len(value_rows), dtype=np.intp))
        result, compare_notes = compare(logged, pit, scorers, top)
        notes += compare_notes
        slots = {v.name: slot_names(compile_view(v)) for v in views if v.join_key in ("user_id", "item_id")}
        values, at_values_result = value_skew(logged, value_rows, rebuilt, scorers, slots)
        stale = staleness(logged, {v.name: v.freshness_sla_s for v in views})
        drift = version_drift(logged, scorers)
    except (PredictionLandingError, LandingError, SkewError, OfflineJobError) as exc:
        raise NotComputed(str(exc)) from exc
    finally:
        store.close()
    with_times = sum(1 for a in logged if a.has_value_times)
    if not with_times:
        notes.insert(0, "no record says its values' event times (version 1): judged at the request's time")
    logged_max = {r.model_version: r.logged_max for r in result}
    if fmt == "json":
        data = {
            "topic": topic,
            "table": str(landed.path),
            "landed": landed.landed,
            "rows": landed.total,
            "answers": len(logged),
            "answers_with_value_times": with_times,
            "threshold": threshold,
            "value_skew": values.as_dict(),
            "staleness": [v.as_dict() for v in stale],
            "at_value_times": [r.as_dict(threshold) for r in at_values_result],
            "versions": [r.as_dict(threshold) for r in result],
            "version_drift": drift.as_dict(max_drift),
            "notes": notes[:20],
        }
        click.echo(json.dumps(data, indent=2))
    elif fmt == "line":
        click.echo(value_line(values))
        click.echo(staleness_line(stale))
        click.echo(value_times_line(at_values_result, threshold, logged_max))
        click.echo(summary_line(result, threshold, len(logged)) + " (at request time: what staleness costs)")
        click.echo(drift_line(drift, max_drift))
    else:
        click.echo(
            f"prediction log {topic}: {landed.landed} new record(s) landed in {landed.path}"
            f" ({landed.total} in all); {len(logged)} answer(s), {with_times} with their values' event times"
        )
        click.echo(value_line(values))
        for f in values.features[:top]:
            if f.differ:
                click.echo(
                    f"  {f.view}.{f.feature}: {f.differ} of {f.compared} differ,"
                    f" max |diff| {f.max_abs_diff:.3g}"
                )
        click.echo(staleness_line(stale))
        click.echo(value_times_line(at_values_result, threshold, logged_max))
        click.echo("at request time (counts what the tiers had not folded in yet; not judged):")
        for r in result:
            click.echo("  " + r.line(threshold))
        click.echo(drift_line(drift, max_drift))
        for note in notes[:5]:
            click.echo(f"note: {note}")
    if not result:
        raise NotComputed(f"no logged answer of a model in {models} on topic {topic!r}")
    if with_times:
        breached = (values.breached() or drift.breached(max_drift)
                    or any(r.breached(threshold) for r in at_values_result))  # fmt: skip
    else:
        breached = any(r.breached(threshold) for r in result)
    if breached:
        raise SystemExit(1)
