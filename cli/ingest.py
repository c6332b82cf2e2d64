"""``headwater ingest serve``: the push API, a process of its own beside the ranking service.

A separate process, not routes of ``headwater serve``: ingestion scales, restarts and is granted
(the ``ingest`` role) apart from ranking, and a burst of pushed events never takes CPU from a
ranking request. FastAPI and uvicorn are imported inside the command so ``headwater --help`` stays fast.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from headwater.cli.errors import HeadwaterGroup
from headwater.cli.tls import client_options, client_tls, server_options

if TYPE_CHECKING:
    from headwater.registry.plans import PlanSource
    from headwater.serving.config import TlsConfig

DEFAULT_PORT = 8090
REJECTS_SHOWN = 5
"""Rejects `ingest push` prints on stderr; the rest are counted."""


@click.group(cls=HeadwaterGroup)
def ingest() -> None:
    """Push any source's events over HTTP: checked, keyed and acknowledged like `events produce`.

    `headwater ingest serve` answers POST /v1/sources/NAME/events (a JSON array, JSON Lines, or Avro
    with X-Schema-Fp) with one result per event, and POST /push (a Feast push payload). Python
    clients use headwater.client.IngestClient (batching, retries that count once).
    """


def _feast_mapping(pairs: tuple[str, ...]) -> dict[str, str]:
    mapping: dict[str, str] = {}
    for pair in pairs:
        push, sep, source = pair.partition("=")
        if not sep or not push or not source:
            msg = f"--feast-push {pair!r}: expected PUSH_SOURCE=SOURCE, e.g. payments_push=payments"
            raise click.BadParameter(msg)
        mapping[push] = source
    return mapping


@ingest.command(name="serve")
@click.option(
    "--host", default="127.0.0.1", show_default=True, help="Address to listen on (loopback by default)."
)
@click.option("--port", type=click.IntRange(1, 65535), default=DEFAULT_PORT, show_default=True)
@click.option(
    "--grpc-port", type=click.IntRange(1, 65535), default=None,
    help="Also serve headwater.v1.Ingest/Ingest (client streaming, client/proto/headwater/v1/ingest.proto).",
)  # fmt: skip
@click.option("--bootstrap", default=None, help="Kafka bootstrap [default: from HEADWATER_* settings].")
@click.option(
    "--state-dir",
    type=click.Path(path_type=Path),
    default=None,
    help="Where `headwater apply` wrote the plans [default: $HEADWATER_STATE_DIR, else headwater.yaml's].",
)
@click.option(
    "--rejects-to",
    type=click.Choice(["answer", "dlq"]),
    default="answer",
    show_default=True,
    help="Rejected events: only in the answer, or also as dead letters on the DLQ topic.",
)
@click.option(
    "--max-batch", type=click.IntRange(min=1), default=10_000, show_default=True, help="Events per request."
)
@click.option(
    "--max-body-bytes", type=click.IntRange(min=1024), default=16 * 1024 * 1024, show_default=True,
    help="A larger body gets 413.",
)  # fmt: skip
@click.option(
    "--buffer", type=click.IntRange(min=1), default=200_000, show_default=True,
    help="Records the producer holds unacknowledged; a batch that does not fit gets 429 with Retry-After.",
)  # fmt: skip
@click.option(
    "--linger-ms", type=click.IntRange(min=0), default=5, show_default=True, help="Producer batching delay."
)
@click.option(
    "--feast-push", multiple=True, metavar="PUSH=SOURCE",
    help="Map a Feast push source to a headwater source for POST /push (repeatable; default: same name).",
)  # fmt: skip
@click.option(
    "--config", "config_path", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
    help="The serving config whose `auth:` section (API keys or JWT) grants the `ingest` role.",
)  # fmt: skip
@click.option(
    "--no-auth", is_flag=True, help="Run without credentials, as `auth: none` (a loopback --host only)."
)
@server_options
@click.option(
    "--log-level", type=click.Choice(["critical", "error", "warning", "info", "debug"]), default="warning",
    show_default=True,
)  # fmt: skip
def serve_cmd(
    host: str,
    port: int,
    grpc_port: int | None,
    bootstrap: str | None,
    state_dir: Path | None,
    rejects_to: str,
    max_batch: int,
    max_body_bytes: int,
    buffer: int,
    linger_ms: int,
    feast_push: tuple[str, ...],
    config_path: Path | None,
    no_auth: bool,
    tls_cert: Path | None,
    tls_key: Path | None,
    tls_client_ca: Path | None,
    log_level: str,
) -> None:
    """Serve the push API for every source of the applied plan (a new `headwater apply` is read within 2 s).

    Each event is checked against its source's current schema and rules with the codec of `events
    produce --from`, keyed by the source's key (murmur2) and sent with acks=all and idempotence;
    the answer says per event accepted, or rejected with field and reason. Resending a batch with
    the same event ids is safe: every tier counts an event id once.

    Auth: every push needs a credential with the `ingest` role (Authorization: Bearer <API key or
    JWT>, REST and gRPC), from the `auth:` section of --config, as `headwater serve` checks it;
    --no-auth (or `auth: none`) runs open, on a loopback --host only.

    TLS: --tls-cert and --tls-key (or the `tls:` section of --config) serve HTTPS and gRPC TLS
    only; --tls-client-ca requires client certificates signed by that CA (mTLS).
    """
    import uvicorn

    from headwater.pipelines.settings import Settings
    from headwater.serving.ingest.core import IngestService
    from headwater.serving.ingest.rest import ingest_app
    from headwater.serving.ingest.sink import KafkaIngestSink
    from headwater.serving.tls import scheme, uvicorn_tls_options

    mapping = _feast_mapping(feast_push)
    authorize = _authorizer(config_path, no_auth, host)
    tls = _tls(config_path, host, tls_cert, tls_key, tls_client_ca)
    settings = Settings.from_env()
    watcher = PlanWatcher(state_dir)
    sources = watcher.sources()
    unknown = sorted(set(mapping.values()) - set(sources))
    if unknown:
        known = ", ".join(sorted(sources))
        msg = f"--feast-push names source(s) {', '.join(unknown)} not in the applied plan ({known})"
        raise click.BadParameter(msg)
    dlq = settings.dlq_topic if rejects_to == "dlq" else None
    topics = sorted({s.topic for s in sources.values()} | ({dlq} if dlq else set()))
    sink = KafkaIngestSink(bootstrap or settings.kafka_bootstrap, topics, buffer=buffer, linger_ms=linger_ms)
    service = IngestService(
        sources, sink, dlq_topic=dlq, max_batch=max_batch, reload=watcher.changed, authorize=authorize
    )
    app = ingest_app(service, max_body_bytes=max_body_bytes, feast_sources=mapping)
    grpc = None
    if grpc_port is not None:
        from headwater.serving.ingest.grpc_adapter import grpc_server

        grpc = grpc_server(service, host, grpc_port, tls=tls)
        click.echo(f"push API over gRPC{'' if tls is None else ' TLS'} on {host}:{grpc_port}", err=True)
    where = f"{scheme(tls)}://{host}:{port}"
    click.echo(f"push API on {where} for source(s) {', '.join(sorted(sources))}", err=True)
    try:
        uvicorn.run(
            app, host=host, port=port, log_level=log_level, access_log=False, **uvicorn_tls_options(tls)
        )
    finally:
        if grpc is not None:
            grpc.stop(1.0)


def _tls(
    config_path: Path | None, host: str, cert: Path | None, key: Path | None, client_ca: Path | None
) -> TlsConfig | None:
    """Return --config's ``tls:`` with the --tls-* options over it, the files checked; warn if none."""
    from headwater.serving.config import load_config
    from headwater.serving.tls import check, from_options, plaintext_warning

    configured = load_config(config_path).tls if config_path is not None else None
    tls = from_options(configured, cert, key, client_ca)
    check(tls)  # a key that is not the certificate's stops the start here, naming the files
    warning = plaintext_warning(host, tls)
    if warning is not None:
        click.echo(f"warning: {warning}", err=True)
    return tls


class IngestRole:
    """The push API's auth hook: the caller's credential must carry the ``ingest`` role (serving/auth.py)."""

    def __init__(self, authenticator: Any) -> None:
        self.authenticator = authenticator

    def __call__(self, headers: Mapping[str, str]) -> None:
        """Pass, or raise NotAuthorized (401: no or a bad credential, 403: no ``ingest`` role)."""
        from headwater.serving.auth import Forbidden, Unauthenticated
        from headwater.serving.ingest.core import NotAuthorized

        try:
            self.authenticator.authenticate(headers, "ingest")
        except Unauthenticated as exc:
            raise NotAuthorized(str(exc), 401) from None
        except Forbidden as exc:
            raise NotAuthorized(str(exc), 403) from None


def _authorizer(config_path: Path | None, no_auth: bool, host: str) -> IngestRole | None:
    """Return the auth hook of --config's ``auth:`` section; None when open (refused off loopback)."""
    from headwater.serving.auth import Authenticator
    from headwater.serving.config import load_config
    from headwater.serving.tls import is_loopback

    auth = "none" if no_auth else load_config(config_path).auth
    if auth is None:
        msg = (
            "ingest serve needs an auth choice: --config FILE whose `auth:` section gives API keys or JWT "
            "(the `ingest` role; docs/operations/security.md), or --no-auth to run open on loopback"
        )
        raise click.UsageError(msg)
    if auth != "none":
        return IngestRole(Authenticator(auth))
    if not is_loopback(host):
        msg = f"--no-auth (auth: none) is allowed only on a loopback address; --host {host} is not one"
        raise click.UsageError(msg)
    click.echo(f"warning: no credentials: every caller on {host} may push events of every source", err=True)
    return None


class PlanWatcher:
    """The applied plan's sources, read again when ``headwater apply`` rewrote the plan file."""

    def __init__(self, state_dir: Path | None) -> None:
        from headwater.pipelines.events.sources import PLAN_TIER, default_state
        from headwater.registry.plans import plan_path

        self.path = plan_path(state_dir if state_dir is not None else default_state(), PLAN_TIER)
        self.state_dir = state_dir
        self._stamp: int | None = None

    def sources(self) -> dict[str, PlanSource]:
        """Read the sources now.

        Raises:
            SourceError: no applied plan (or an unreadable one).
        """
        from headwater.pipelines.events.sources import applied_sources

        self._stamp = self._mtime()
        return {s.name: s for s in applied_sources(self.state_dir)}

    def changed(self) -> dict[str, PlanSource] | None:
        """Return the sources when the plan file changed since the last read, else None.

        A plan that cannot be read now (being written, or broken) keeps the previous sources and is
        tried again at the next call.
        """
        from headwater.pipelines.events.sources import SourceError

        if self._mtime() == self._stamp:
            return None
        try:
            return self.sources()
        except SourceError as exc:
            self._stamp = None
            click.echo(
                f"warning: the applied plan changed but cannot be read ({exc}); kept the last", err=True
            )
            return None

    def _mtime(self) -> int | None:
        try:
            return self.path.stat().st_mtime_ns
        except OSError:
            return None


@ingest.command(name="push")
@click.option("--source", "source_name", required=True, help="A source of the applied plan.")
@click.option(
    "--from", "from_file", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
    help="Push the rows of FILE (JSON Lines, CSV, Parquet); without it, random valid events of the source.",
)  # fmt: skip
@click.option("--url", default=f"http://127.0.0.1:{DEFAULT_PORT}", show_default=True, help="The push API.")
@click.option("--protocol", type=click.Choice(["rest", "grpc"]), default="rest", show_default=True)
@click.option(
    "--rate", type=click.FloatRange(min=0), default=0.0, show_default=True, help="Events/s; 0: at once."
)
@click.option(
    "--duration", type=click.FloatRange(min=0), default=10.0, show_default=True, help="Seconds (generated)."
)
@click.option("--max-events", type=click.IntRange(min=1), default=None, help="Stop after N events.")
@click.option("--seed", type=int, default=7, show_default=True, help="Seed of the generated events.")
@click.option("--batch-size", type=click.IntRange(1, 10_000), default=500, show_default=True)
@click.option(
    "--token", envvar="HEADWATER_API_KEY", default=None,
    help="A credential with the `ingest` role, sent as Authorization: Bearer [default: $HEADWATER_API_KEY].",
)  # fmt: skip
@click.option(
    "--state-dir", type=click.Path(path_type=Path), default=None,
    help="Where `headwater apply` wrote the plans [default: $HEADWATER_STATE_DIR, else headwater.yaml's].",
)  # fmt: skip
@client_options
def push_cmd(
    source_name: str,
    from_file: Path | None,
    url: str,
    protocol: str,
    rate: float,
    duration: float,
    max_events: int | None,
    seed: int,
    batch_size: int,
    token: str | None,
    state_dir: Path | None,
    tls_ca: Path | None,
    tls_cert: Path | None,
    tls_key: Path | None,
) -> None:
    """Push events to `headwater ingest serve` through headwater.client.IngestClient (demos, smoke tests).

    `headwater ingest push --source payments --rate 50 --duration 30` pushes random valid payments
    at 50/s; `--from payments.jsonl` pushes your rows. Retries resend an event with the id it was
    given once, so they count once. Prints the first rejects on stderr and the counts as JSON.
    A service with TLS: an https:// --url (gRPC: any), --tls-ca (and --tls-cert/--tls-key for mTLS).
    """
    from headwater.client import IngestClient
    from headwater.client.ingest import IngestError, IngestRequestError
    from headwater.pipelines.events.sources import applied_source

    source = applied_source(source_name, state_dir)
    events = _file_rows(from_file) if from_file is not None else _generated(source, rate, duration, seed)
    tls = client_tls(tls_ca, tls_cert, tls_key)
    target = url.removeprefix("http://").removeprefix("https://") if protocol == "grpc" else url
    id_field = source.event_id if protocol == "grpc" else "auto"
    shown = 0
    headers = {"authorization": f"Bearer {token}"} if token else None
    try:
        with IngestClient(
            target,
            source.name,
            batch_size=batch_size,
            protocol=protocol,
            event_id_field=id_field,
            headers=headers,
            tls=tls,
        ) as client:
            started = last_flush = time.monotonic()
            outcomes = []
            for count, event in enumerate(events, start=1):
                if rate > 0:  # one reading of the clock: a second one could be past `due` already
                    wait = started + count / rate - time.monotonic()
                    if wait > 0:
                        time.sleep(wait)
                outcomes = client.add(event)
                # paced: no event waits long for its batch
                if rate > 0 and time.monotonic() - last_flush >= 1.0:
                    outcomes += client.flush()
                    last_flush = time.monotonic()
                shown = _show_rejects(outcomes, shown)
                if max_events is not None and count >= max_events:
                    break
            shown = _show_rejects(client.flush(), shown)
    except IngestRequestError as exc:  # refused whole (401, 403, 404...): say so, no traceback
        raise click.ClickException(f"the push API at {url} refused the batch: {exc}") from exc
    except IngestError as exc:
        msg = f"the push API at {url} did not take the events: {exc}; is `headwater ingest serve` running?"
        raise click.ClickException(msg) from exc
    out = {"source": source.name, "url": url, "protocol": protocol, **vars(client.stats)}
    click.echo(json.dumps(out))


def _show_rejects(outcomes: list[Any], shown: int) -> int:
    for outcome in outcomes:
        if outcome.status == "rejected" and shown < REJECTS_SHOWN:
            shown += 1
            field = f"{outcome.field}: " if outcome.field else ""
            click.echo(f"rejected: {field}{outcome.reason}", err=True)
    return shown


def _file_rows(path: Path) -> Iterator[dict[str, Any]]:
    from headwater.pipelines.events.readers import open_rows

    with open_rows(path, None) as reader:
        for row in reader:
            if row.error is not None:
                click.echo(f"{path}:{row.line}: {row.error} (not sent)", err=True)
                continue
            # JSON-safe: Parquet dates and decimals as text, which the service coerces like the file path
            yield json.loads(json.dumps(row.values, default=str))


def _generated(source: PlanSource, rate: float, duration: float, seed: int) -> Iterator[dict[str, Any]]:
    from headwater.pipelines.events.synthetic import SchemaGenerator

    generator = SchemaGenerator(source, seed)
    deadline = time.monotonic() + duration
    while time.monotonic() < deadline:
        event = generator.event(time.time_ns() // 1_000_000)
        if event is not None:
            yield event
