"""``headwater model train`` and ``headwater serve``.

torch, FastAPI and uvicorn are imported inside the commands so ``headwater --help`` stays fast.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

import click

from headwater.cli.errors import HeadwaterCommand, HeadwaterGroup
from headwater.cli.options import STATE_HELP, models_out_option, training_set_option
from headwater.cli.tls import server_options
from headwater.registry.config import state_dir as resolved_state_dir

if TYPE_CHECKING:
    from headwater.ranking.features import BoundRegistry
    from headwater.serving.config import ServingConfig
    from headwater.serving.recording import Recorder
    from headwater.serving.runtime import LoadedModels

MODELS = "models"
"""The models' folder in the state folder: `model train` writes there, `serve` reads from there."""


@click.group(cls=HeadwaterGroup)
def model() -> None:
    """Train the ranking model from a point-in-time training set."""


@model.command()
@training_set_option("Parquet training set from `headwater training-set` (user.<slot>, item.<slot> columns).")
@models_out_option("the artifacts, the metrics JSON and latest.json")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the training run.")
@click.option("--epochs", type=click.IntRange(min=1), default=8, show_default=True)
@click.option(
    "--holdout", type=click.FloatRange(0.05, 0.5), default=0.2, show_default=True,
    help="Share of the latest slates held out (split by time) for AUC and NDCG@10.",
)  # fmt: skip
@click.option(
    "--device", type=click.Choice(["cpu", "cuda"]), default=None, help="Default: cuda when present."
)
def train(
    training_set: Path, out_dir: Path, seed: int, epochs: int, holdout: float, device: str | None
) -> None:
    """Train the DCN ranker and its linear fallback from a point-in-time training set.

    Prints holdout AUC and NDCG@10 (the latest slates, split by time) next to popularity.
    """
    from headwater.ranking.train import TrainOptions, train_and_save
    from headwater.ranking.trainset import read_parquet

    ts = read_parquet(training_set)
    click.echo(
        f"training set {training_set}: {len(ts)} rows, {len(ts.user_features)} user and"
        f" {len(ts.item_features)} item slots, registry {ts.registry_version},"
        f" positive rate {float(ts.label.mean()):.4f}"
    )
    opts = TrainOptions(seed=seed, epochs=epochs, holdout=holdout, device=device)
    report = train_and_save(ts, out_dir, opts)
    m = report.metrics
    click.echo(
        f"device {m['device']}, {m['seconds']} s;"
        f" train {m['rows']['train']}, holdout {m['rows']['holdout']} rows"
    )
    click.echo(f"{'model':<12}{'AUC':>8}{'NDCG@10':>10}")
    for name, values in m["holdout"].items():
        click.echo(f"{name:<12}{values['auc']:>8.4f}{values['ndcg@10']:>10.4f}")
    click.echo(f"wrote {report.dcn.path} (model_version {report.dcn.version})")
    click.echo(f"wrote {report.linear.path} (linear fallback {report.linear.version})")
    click.echo(f"wrote {report.metrics_path}")


@click.command(cls=HeadwaterCommand)
@click.option("--host", default="127.0.0.1", show_default=True, help="Listen address (loopback by default).")
@click.option("--port", type=click.IntRange(1, 65535), default=8080, show_default=True)
@click.option(
    "--grpc-port", type=click.IntRange(0, 65535), default=None,
    help="Also serve headwater.v1.Ranking over gRPC on this port (same process, engine and metrics).",
)  # fmt: skip
@click.option(
    "--admission/--no-admission", default=None,
    help="Per-user-class quotas and priorities at the edge [default: the config's admission.enabled, off].",
)  # fmt: skip
@click.option(
    "--model",
    "model_path",
    type=click.Path(exists=True, path_type=Path),
    default=None,
    help="Artifact file or training directory [default: models/ in the state folder, when it exists].",
)
@click.option("--redis-url", default=None, help="Default: HEADWATER_REDIS_URL or the local Redis.")
@click.option(
    "--config", "config_path", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None
)
@click.option(
    "--state-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
    help=f"Where `headwater apply` wrote the plans (a --config state_dir first) {STATE_HELP}.",
)  # fmt: skip
@click.option(
    "--device", type=click.Choice(["cpu", "cuda"]), default=None, help="Default: cuda when present."
)
@click.option("--namespace", default=None, help="Key namespace of the online store (default: the store's).")
@click.option(
    "--bootstrap", default=None, help="Kafka for the feedback loop (default: HEADWATER_* settings)."
)
@click.option("--feedback-topic", default=None, help="Topic of impressions and feedback (default: events).")
@click.option("--no-feedback", is_flag=True, help="Do not send impressions and feedback to Kafka.")
@click.option(
    "--no-retrieval", is_flag=True,
    help="Do not build the retrieval index at start-up (/v1/recommend takes popularity candidates).",
)  # fmt: skip
@click.option(
    "--no-auth", is_flag=True,
    help="Run without credentials, as the config's `auth: none` (a loopback --host only).",
)  # fmt: skip
@server_options
@click.option("--log-level", default="info", show_default=True)
def serve(
    host: str,
    port: int,
    grpc_port: int | None,
    admission: bool | None,
    model_path: Path | None,
    redis_url: str | None,
    config_path: Path | None,
    state_dir: Path | None,
    device: str | None,
    namespace: str | None,
    bootstrap: str | None,
    feedback_topic: str | None,
    no_feedback: bool,
    no_retrieval: bool,
    no_auth: bool,
    tls_cert: Path | None,
    tls_key: Path | None,
    tls_client_ca: Path | None,
    log_level: str,
) -> None:
    """Run the ranking service: POST /v1/rank, /v1/recommend, GET /health, /metrics, /openapi.json.

    With --grpc-port, also headwater.v1.Ranking/Rank over gRPC (client/proto) in the same process.
    With --tls-cert and --tls-key (or the config's `tls:`), both ports serve TLS only; with
    --tls-client-ca every client must present a certificate signed by that CA (mTLS).
    """
    import uvicorn

    from headwater.pipelines.freshness.metrics import FreshnessCollector
    from headwater.pipelines.settings import Settings
    from headwater.ranking.features import load_registry
    from headwater.serving.app import create_app, runtimes
    from headwater.serving.config import load_config
    from headwater.serving.feedback import FeedbackProducer, kafka_sink_factory
    from headwater.serving.runtime import configure_switch_interval, configure_torch_threads, load_models
    from headwater.serving.store import OnlineStoreReader
    from headwater.serving.tls import scheme

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config = load_config(config_path)
    if admission is not None:
        edge = config.admission.model_copy(update={"enabled": admission})
        config = config.model_copy(update={"admission": edge})
    if no_auth:
        config = config.model_copy(update={"auth": "none"})
    _check_auth(config, host)
    config = _with_tls(config, host, tls_cert, tls_key, tls_client_ca)
    plans = state_dir or config.state_dir or resolved_state_dir()
    registry = load_registry(plans, config.popularity)
    if model_path is None and (plans / MODELS).is_dir():
        model_path = plans / MODELS
    threads = configure_torch_threads(config.torch_threads)
    switch_ms = configure_switch_interval(config.gil_switch_interval_ms)
    loaded = load_models(model_path, registry, device)
    settings = Settings.from_env()
    arm_loaded, recorder = _experiment_and_recorder(
        config, registry, device, plans, bootstrap or settings.kafka_bootstrap
    )
    reader = OnlineStoreReader.from_url(redis_url or settings.redis_url, namespace=namespace)
    feedback = None
    if config.feedback.enabled and not no_feedback:
        topic = feedback_topic or config.feedback.topic or settings.events_topic
        connect = kafka_sink_factory(bootstrap or settings.kafka_bootstrap, config.feedback.linger_ms)
        feedback = FeedbackProducer(
            topic, connect, config.feedback.max_buffer_events, config.feedback.reconnect_s
        )
    predictions = None
    if config.predictions.enabled:
        from headwater.serving.skew import PredictionLog, kafka_connect

        predictions = PredictionLog(
            config.predictions,
            kafka_connect(bootstrap or settings.kafka_bootstrap, config.predictions.topic),
        )
    from headwater.serving.funnel.build import build_funnel
    from headwater.serving.retrieval.snapshot import SNAPSHOT_FOLDER

    funnel = build_funnel(
        config.funnel, registry, reader.store, model_path, loaded, not no_retrieval, plans / SNAPSHOT_FOLDER
    )
    versions = loaded.models()
    click.echo(
        f"serving on {scheme(config.tls)}://{host}:{port} device={loaded.device} torch_threads={threads}"
        f" batch_rows={config.batcher.rows_for(loaded.device)} switch_interval_ms={switch_ms:g}"
        f" registry={registry.registry_version} user_slots={registry.user.dim} item_slots={registry.item.dim}"
        f" model={versions.neural_version} linear={versions.linear_version}"
        f" feedback={feedback.topic if feedback else 'off'}"
        f" grpc={'off' if grpc_port is None else f'{host}:{grpc_port}'}"
        f" admission={'on' if config.admission.enabled else 'off'}"
        f" max_body_bytes={config.max_body_bytes} max_connections={config.edge.max_connections}"
        f" grpc_max_rpcs={config.edge.grpc_max_rpcs} auth={_auth_line(config)} tls={_tls_line(config)}"
        + "".join(f" {name}={value or 'none'}" for name, value in runtimes(loaded, funnel).items())
    )
    app = create_app(
        config,
        registry,
        reader,
        loaded,
        feedback,
        arm_loaded=arm_loaded,
        recorder=recorder,
        predictions=predictions,
        funnel=funnel,
    )
    if grpc_port is not None:
        from headwater.serving.grpc_server import GrpcEdge

        GrpcEdge.for_app(app, host, grpc_port)  # starts and stops with the app's lifespan
    # /metrics also carries every view's pipeline lag and read-time age (the `headwater freshness` figures).
    app.state.telemetry.registry.register(FreshnessCollector.for_store(reader.store, plans))
    from headwater.serving.edge import uvicorn_options

    # The edge limits: connections, backlog, keep-alive and the header deadline (the body's is the app's).
    limits = uvicorn_options(config.edge)
    from headwater.serving.tls import uvicorn_tls_options

    limits.update(uvicorn_tls_options(config.tls))
    uvicorn.run(app, host=host, port=port, log_level=log_level, access_log=False, **limits)


def _with_tls(
    config: ServingConfig, host: str, cert: Path | None, key: Path | None, client_ca: Path | None
) -> ServingConfig:
    """Return ``config`` with the --tls-* options over its ``tls:``, the files checked; warn if plaintext."""
    from headwater.serving.tls import check, from_options, plaintext_warning

    tls = from_options(config.tls, cert, key, client_ca)
    check(tls)  # a key that is not the certificate's stops the start here, naming the files
    warning = plaintext_warning(host, tls)
    if warning is not None:
        logging.getLogger("headwater.serving.tls").warning("%s", warning)
    return config.model_copy(update={"tls": tls})


def _tls_line(config: ServingConfig) -> str:
    if config.tls is None:
        return "off"
    return "mtls" if config.tls.client_ca_file is not None else "on"


def _check_auth(config: ServingConfig, host: str) -> None:
    """Refuse to start without an explicit auth choice, or open on a non-loopback address; warn when open."""
    from headwater.serving.config import ServingConfigError
    from headwater.serving.tls import is_loopback

    if config.auth is None:
        msg = (
            "the serving config has no `auth:` section: give API keys or JWT there (docs/operations/"
            "security.md), or write `auth: none` (or pass --no-auth) to run without credentials on loopback"
        )
        raise ServingConfigError(msg)
    if config.auth != "none":
        return
    if not is_loopback(host):
        msg = (
            f"auth: none is allowed only on a loopback address; --host {host} is not one: configure API keys"
            " or JWT under `auth:`, or serve on 127.0.0.1"
        )
        raise ServingConfigError(msg)
    logging.getLogger("headwater.serving.auth").warning(
        "auth: none: every caller on %s may rank, post feedback and read /metrics, and chooses its own"
        " user class; configure `auth:` before this address is reachable by anyone else",
        host,
    )


def _auth_line(config: ServingConfig) -> str:
    auth = config.auth
    if auth is None or auth == "none":
        return "none"
    kinds = [k for k, on in (("keys", auth.api_keys_file or auth.api_keys_env), ("jwt", auth.jwt)) if on]
    return "+".join(kinds)


def _experiment_and_recorder(
    config: ServingConfig, registry: BoundRegistry, device: str | None, plans: Path, bootstrap: str
) -> tuple[dict[str, LoadedModels], Recorder | None]:
    """Load the experiment arms' models and make the request recorder the config asks for."""
    from headwater.serving.experiments import load_arm_models
    from headwater.serving.recording import Recorder, recording_path

    arm_loaded = load_arm_models(config.experiment, registry, device)
    if config.experiment is not None:
        shares = ", ".join(f"{k} {v:.1%}" for k, v in config.experiment.shares().items())
        click.echo(f"experiment {config.experiment.name}: {shares}")
    recorder = None
    if config.recording.enabled:
        path = recording_path(config.recording, plans)
        rec = config.recording
        connect = None
        if rec.topic is not None:
            from headwater.serving.skew import kafka_connect

            connect = kafka_connect(bootstrap, rec.topic)
        recorder = Recorder(rec, path, connect=connect)
        where = [f"{path} (rotates at {rec.max_bytes} bytes, keeps {rec.max_files} more)"] if rec.file else []
        where += [f"topic {rec.topic}"] if rec.topic is not None else []
        click.echo(f"recording {rec.sample_rate:.1%} of the ranking requests to {' and '.join(where)}")
    return arm_loaded, recorder
