"""``headwater model train|seed-features`` and ``headwater serve``.

torch, FastAPI and uvicorn are imported inside the commands so ``headwater --help`` stays fast.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import click

DEFAULT_MODEL_DIR = Path(".headwater/models")


@click.group()
def model() -> None:
    """Train the ranking model and fill the demo features it reads."""


@model.command()
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=DEFAULT_MODEL_DIR,
    show_default=True,
    help="Directory for the artifacts, the metrics JSON and latest.json.",
)
@click.option(
    "--training-set",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="Parquet training set (see headwater.serving.trainset); default: built from the event generator.",
)
@click.option(
    "--events",
    type=click.IntRange(min=1000),
    default=400_000,
    show_default=True,
    help="Generator events to build the training set from (without --training-set).",
)
@click.option(
    "--seed", type=int, default=0, show_default=True, help="Seed of the training run (and generator)."
)
@click.option("--epochs", type=click.IntRange(min=1), default=4, show_default=True)
@click.option(
    "--device", type=click.Choice(["cpu", "cuda"]), default=None, help="Default: cuda when present."
)
@click.option(
    "--config",
    "config_path",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="Serving config YAML (the views the model is bound to).",
)
def train(
    out_dir: Path,
    training_set: Path | None,
    events: int,
    seed: int,
    epochs: int,
    device: str | None,
    config_path: Path | None,
) -> None:
    """Train the DCN ranker and its linear fallback; print holdout AUC and NDCG@10 next to popularity."""
    from headwater.serving.config import load_config
    from headwater.serving.train import TrainOptions, train_and_save
    from headwater.serving.trainset import from_events, generated_events, read_parquet

    config = load_config(config_path)
    if training_set is not None:
        ts = read_parquet(training_set)
        click.echo(f"training set {training_set}: {len(ts)} rows")
    else:
        click.echo(f"building a training set from {events} generator events (seed {seed + 7}) ...")
        ts = from_events(generated_events(events, seed + 7), config.item_view.version)
    click.echo(f"training on {len(ts)} impressions, positive rate {float(ts.label.mean()):.4f} ...")
    report = train_and_save(ts, out_dir, TrainOptions(seed=seed, epochs=epochs, device=device), config)
    m = report.metrics
    click.echo(f"device {m['device']}, {m['seconds']} s; holdout {m['rows']['holdout']} rows")
    click.echo(f"{'model':<12}{'AUC':>8}{'NDCG@10':>10}")
    for name, values in m["holdout"].items():
        click.echo(f"{name:<12}{values['auc']:>8.4f}{values['ndcg@10']:>10.4f}")
    click.echo(f"wrote {report.dcn.path} (model_version {report.dcn.version})")
    click.echo(f"wrote {report.linear.path} (linear fallback {report.linear.version})")
    click.echo(f"wrote {report.metrics_path}")


@model.command("seed-features")
@click.option("--redis-url", default=None, help="Default: HEADWATER_REDIS_URL or the local Redis.")
@click.option("--events", type=click.IntRange(min=1000), default=200_000, show_default=True)
@click.option("--seed", type=int, default=7, show_default=True)
@click.option(
    "--config", "config_path", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None
)
def seed_features(redis_url: str | None, events: int, seed: int, config_path: Path | None) -> None:
    """Write demo user, item and popularity features (counted from generator events) to the store."""
    from headwater.pipelines.settings import Settings
    from headwater.serving.config import load_config
    from headwater.serving.demo import demo_rows, write_demo
    from headwater.serving.store import OnlineStoreReader

    config = load_config(config_path)
    store = OnlineStoreReader.from_url(redis_url or Settings.from_env().redis_url, timeout_s=5.0)
    rows = demo_rows(events, seed)
    written = write_demo(store, config, rows)
    click.echo(
        json.dumps({"rows_written": written, "users": len(rows.user_ids), "items": len(rows.item_ids)})
    )


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Listen address (loopback by default).")
@click.option("--port", type=click.IntRange(1, 65535), default=8080, show_default=True)
@click.option(
    "--model",
    "model_path",
    type=click.Path(exists=True, path_type=Path),
    default=None,
    help=f"Artifact file or training directory; default {DEFAULT_MODEL_DIR} when it exists.",
)
@click.option("--redis-url", default=None, help="Default: HEADWATER_REDIS_URL or the local Redis.")
@click.option(
    "--config", "config_path", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None
)
@click.option(
    "--device", type=click.Choice(["cpu", "cuda"]), default=None, help="Default: cuda when present."
)
@click.option("--namespace", default=None, help="Key namespace of the online store (default: the store's).")
@click.option("--log-level", default="info", show_default=True)
def serve(
    host: str,
    port: int,
    model_path: Path | None,
    redis_url: str | None,
    config_path: Path | None,
    device: str | None,
    namespace: str | None,
    log_level: str,
) -> None:
    """Run the ranking service: POST /v1/rank, GET /health, GET /metrics, GET /openapi.json."""
    import uvicorn

    from headwater.pipelines.settings import Settings
    from headwater.serving.app import create_app
    from headwater.serving.config import load_config
    from headwater.serving.runtime import configure_switch_interval, configure_torch_threads, load_models
    from headwater.serving.store import OnlineStoreReader

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config = load_config(config_path)
    if model_path is None and DEFAULT_MODEL_DIR.is_dir():
        model_path = DEFAULT_MODEL_DIR
    threads = configure_torch_threads(config.torch_threads)
    switch_ms = configure_switch_interval(config.gil_switch_interval_ms)
    loaded = load_models(model_path, config, device)
    reader = OnlineStoreReader.from_url(redis_url or Settings.from_env().redis_url, namespace=namespace)
    versions = loaded.models()
    click.echo(
        f"serving on http://{host}:{port} device={loaded.device} torch_threads={threads}"
        f" batch_rows={config.batcher.rows_for(loaded.device)} switch_interval_ms={switch_ms:g}"
        f" model={versions.neural_version} linear={versions.linear_version}"
    )
    uvicorn.run(
        create_app(config, reader, loaded), host=host, port=port, log_level=log_level, access_log=False
    )
