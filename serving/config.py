"""Serving configuration: where the applied registry is, the popularity slot, the service's bounds.

The views the ranker reads are not configured here: they are every user and item view of the
applied registry (:mod:`headwater.ranking.features`). A YAML file can override any field
(``headwater serve --config FILE``); unknown keys are errors that name the file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from headwater.registry.errors import HeadwaterError
from headwater.registry.yamlsrc import YamlSyntaxError, parse_yaml
from headwater.serving.experiments import ExperimentConfig
from headwater.serving.funnel.config import FunnelConfig
from headwater.serving.recording import RecordingConfig
from headwater.serving.served import FeedbackTrustConfig
from headwater.serving.skew import PredictionLogConfig

DEFAULT_POPULARITY = "item_popularity_offline.item_clicks_1d"
CPU_BATCH_ROWS = 1024
CUDA_BATCH_ROWS = 8192


class ServingConfigError(HeadwaterError, ValueError):
    """The serving configuration file is missing or not valid."""


class BatcherConfig(BaseModel):
    """Bounds of the micro-batcher."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_delay_ms: float = Field(default=1.0, ge=0.0, le=100.0)
    """How long the first request of a batch waits for others to join it."""
    max_batch_rows: int | None = Field(default=None, ge=1)
    """Candidate rows in one model forward (one request is never split); None = by device.

    On the CPU merging saves nothing: one thread's forward over 2,000 rows costs more per row
    than over 500 (activations leave the L2 cache), and a big batch makes the requests behind
    it wait. Default 1,024 rows (two 500-candidate requests). On CUDA a forward of 8,192 rows
    costs little more than one of 500: 8,192."""
    max_queue_requests: int = Field(default=128, ge=1)
    """Requests waiting per priority class; one more is answered 429."""
    retry_after_s: int = Field(default=1, ge=1)

    def rows_for(self, device: str) -> int:
        """Return ``max_batch_rows``, or the default for ``device`` (``cpu``, ``cuda``, ``cuda:N``)."""
        if self.max_batch_rows is not None:
            return self.max_batch_rows
        return CUDA_BATCH_ROWS if device.startswith("cuda") else CPU_BATCH_ROWS


class FeedbackConfig(BaseModel):
    """The loop back to Kafka: impressions served and posted feedback become behaviour events."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = True
    topic: str | None = None
    """Target topic; None = the settings' events topic (``HEADWATER_EVENTS_TOPIC`` or ``events``)."""
    max_buffer_events: int = Field(default=50_000, ge=1)
    """Events waiting for Kafka; when full, new events are dropped (and counted), requests never wait."""
    linger_ms: int = Field(default=5, ge=0, le=1000)
    reconnect_s: float = Field(default=2.0, gt=0.0)
    """Pause between attempts to reach a Kafka that is down."""
    trust: FeedbackTrustConfig = FeedbackTrustConfig()
    """Which feedback is accepted: items served to the user (the served ledger's bounds), in the catalog."""


class ClassQuota(BaseModel):
    """One user class's share of the service: a token bucket and the batcher priority it ranks at."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rate_per_s: float = Field(gt=0.0)
    """Requests per second the whole class may make (tokens added per second)."""
    burst: float | None = Field(default=None, ge=1.0)
    """Tokens the bucket holds (requests a quiet class may send at once); None = one second's worth."""
    priority: Literal["high", "normal", "low"] = "normal"
    """The batcher queue (and the in-flight gate) the class's requests wait in; a request may ask lower."""

    @property
    def capacity(self) -> float:
        """The bucket's size: ``burst``, else one second of ``rate_per_s`` (at least one request)."""
        return self.burst if self.burst is not None else max(1.0, self.rate_per_s)


def _default_classes() -> dict[str, ClassQuota]:
    return {
        "vip": ClassQuota(rate_per_s=50.0, priority="high"),
        "regular": ClassQuota(rate_per_s=20.0, priority="normal"),
        "new": ClassQuota(rate_per_s=5.0, priority="low"),
    }


class AdmissionConfig(BaseModel):
    """Admission by user class at the edge (REST and gRPC alike): quotas, priorities, the in-flight gate.

    The class of a request is the ``X-User-Class`` header (gRPC: ``x-user-class`` metadata), else
    the body's ``user_class``; one not in ``classes`` (or none) is ``default_class``. Off by default:
    the quotas are per class, for the whole service, and the service's own benchmarks drive more
    than the regular class's 20 requests/s; turn it on here or with ``headwater serve --admission``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = False
    """Apply the quotas and the class priorities; off, every request is admitted (and counted by class)."""
    classes: dict[str, ClassQuota] = Field(default_factory=_default_classes)
    default_class: str = "regular"
    max_in_flight: int = Field(default=16, ge=1)
    """Requests ranked at once; more wait at the gate and go in by priority (high first), then arrival.

    Measured (bench/bench_edge.py; 2 cores at load 19-28 from other jobs; 500 candidates; 80
    requests/s offered, 55 within quota; two runs): at 64 nothing waits at the gate, every class
    has the same p99 (9 s; 22 s) and the buckets see requests late, once the loop reaches them
    (2-4% of regular throttled, not ~45%); at 16 VIP's p99 was 3.6 s; 7.4 s, regular's 5.8; 8.1,
    new's 9.8; 13.5; at 8 VIP's 3.8; 4.8 but new's 18; 23 s (starved)."""

    @model_validator(mode="after")
    def _default_is_a_class(self) -> AdmissionConfig:
        if self.default_class not in self.classes:
            known = ", ".join(self.classes)
            msg = f"default_class: {self.default_class!r} is not one of the classes ({known})"
            raise ValueError(msg)
        return self


class EdgeConfig(BaseModel):
    """Limits at the service's edges (REST and gRPC) beyond the body size (``max_body_bytes``).

    A client holds a worker only as long as these allow: a connection must send its request's
    headers within ``header_timeout_s`` and its body within ``body_timeout_s`` (else 408 and the
    connection is closed); at most ``max_connections`` REST connections and ``grpc_max_rpcs`` gRPC
    calls are served at once (REST: 503 past it; gRPC: RESOURCE_EXHAUSTED). The gRPC message limit
    is ``max_body_bytes``, the same as REST's body limit.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_connections: int = Field(default=512, ge=1)
    """REST connections (and requests in flight) at once (uvicorn ``limit_concurrency``); past it 503."""
    backlog: int = Field(default=256, ge=1)
    """Connections the kernel queues before the service accepts them (``listen`` backlog)."""
    keep_alive_s: float = Field(default=5.0, gt=0.0, le=300.0)
    """An idle keep-alive connection is closed after this long (uvicorn ``timeout_keep_alive``)."""
    header_timeout_s: float = Field(default=10.0, gt=0.0, le=300.0)
    """From a connection's first byte (or its accept) to the end of the request's headers; then closed."""
    body_timeout_s: float = Field(default=10.0, gt=0.0, le=300.0)
    """From the end of the headers to the end of the body; a body still arriving then is answered 408."""
    grpc_max_rpcs: int = Field(default=256, ge=1)
    """gRPC calls served at once (``grpc.aio`` ``maximum_concurrent_rpcs``); past it RESOURCE_EXHAUSTED."""
    grpc_max_connections: int = Field(default=256, ge=1)
    """gRPC connections at once (``grpc.max_allowed_incoming_connections``); more are refused."""
    grpc_max_streams: int = Field(default=64, ge=1)
    """Concurrent calls on one gRPC connection (HTTP/2 ``SETTINGS_MAX_CONCURRENT_STREAMS``)."""
    request_id_ttl_s: float = Field(default=300.0, gt=0.0, le=86_400.0)
    """How long a caller's ``X-Request-Id`` is remembered: a retry within it logs no impressions again."""
    request_id_entries: int = Field(default=100_000, ge=1)
    """Request ids remembered at most; past it the oldest is forgotten early (counted and logged)."""


Role = Literal["rank", "feedback", "unsolicited", "ingest", "admin", "gateway"]
ROLES: tuple[Role, ...] = ("rank", "feedback", "unsolicited", "ingest", "admin", "gateway")
"""What a credential may do: ``rank`` (rank, recommend), ``feedback`` (post feedback), ``unsolicited``
(with ``feedback``: post feedback for catalog items the service did not serve to that user, e.g. an
order system's purchases; see docs/operations/feedback-trust.md), ``ingest`` (push events), ``admin``
(metrics), ``gateway`` (a trusted gateway: its ``x-user-class`` is honoured)."""
JWT_ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA")
"""The asymmetric algorithms a token may be signed with (never ``none``, never a shared-secret HS*)."""


class CredentialQuota(BaseModel):
    """One credential's own token bucket (on top of its class's): requests a second and the burst."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rate_per_s: float = Field(gt=0.0)
    burst: float | None = Field(default=None, ge=1.0)
    """Tokens the bucket holds; None = one second's worth (at least one request)."""

    @property
    def capacity(self) -> float:
        """The bucket's size: ``burst``, else one second of ``rate_per_s`` (at least one request)."""
        return self.burst if self.burst is not None else max(1.0, self.rate_per_s)


class JwtConfig(BaseModel):
    """Bearer tokens (OIDC access tokens) verified against a JWKS: signature, issuer, audience, exp, nbf."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    jwks: str = Field(min_length=1)
    """The issuer's keys: an ``https://`` (or ``http://``) URL, fetched and cached, or a local JSON file."""
    issuer: str = Field(min_length=1)
    audience: str = Field(min_length=1)
    algorithms: tuple[str, ...] = ("RS256", "ES256")
    """Allowed signing algorithms, a subset of :data:`JWT_ALGORITHMS`."""
    roles_claim: str = "roles"
    """The claim holding the roles: a list, or one space-separated string (like ``scope``)."""
    class_claim: str = "user_class"
    """The claim naming the caller's user class (absent or unknown: the admission's default class)."""
    leeway_s: float = Field(default=30.0, ge=0.0, le=300.0)
    """Clock skew allowed on ``exp`` and ``nbf``."""
    jwks_cache_s: float = Field(default=300.0, gt=0.0)
    """How long fetched keys are kept (an unknown ``kid`` fetches the set again)."""
    subject_quota: CredentialQuota | None = None
    """Each token subject's own bucket; None: only the class's quota."""

    @model_validator(mode="after")
    def _algorithms(self) -> JwtConfig:
        bad = [a for a in self.algorithms if a not in JWT_ALGORITHMS]
        if bad or not self.algorithms:
            msg = f"jwt.algorithms: {bad or 'none given'} not allowed; pick from {', '.join(JWT_ALGORITHMS)}"
            raise ValueError(msg)
        return self


class AuthConfig(BaseModel):
    """Who may call the service: API keys (hashed, from a file or a variable) and/or JWT bearer tokens.

    ``auth: none`` instead of this mapping runs without credentials: allowed only on a loopback
    address, and `headwater serve` says so at start (see docs/operations/security.md).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    api_keys_file: Path | None = None
    """A YAML file of hashed keys (``keys: [{id, sha256, roles, user_class, quota, gateway}]``);
    re-read when its modification time changes, so keys rotate without a restart."""
    api_keys_env: str | None = Field(default=None, min_length=1)
    """The name of an environment variable holding the same document (read once at start)."""
    jwt: JwtConfig | None = None
    metrics: Literal["admin", "open"] = "admin"
    """``/metrics``: for the ``admin`` role only, or open to anyone who reaches the service."""
    reload_check_s: float = Field(default=1.0, ge=0.0, le=60.0)
    """How often the key file's (and a local JWKS file's) modification time is looked at."""

    @model_validator(mode="after")
    def _some_credential(self) -> AuthConfig:
        if self.api_keys_file is None and self.api_keys_env is None and self.jwt is None:
            msg = (
                "auth: name api_keys_file, api_keys_env or jwt (or write `auth: none` to run without"
                " credentials, on loopback only)"
            )
            raise ValueError(msg)
        return self


class TlsConfig(BaseModel):
    """TLS on the service's ports (HTTPS and gRPC): the certificate, its key, and for mTLS a client CA.

    The files are PEM. With ``client_ca_file`` every client must present a certificate signed by
    that authority (mutual TLS); without it any client that trusts the certificate may connect
    (and then authenticates with its credential, ``auth:``). Paths relative to the working directory.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    cert_file: Path
    """The service's certificate chain (PEM), leaf first; its SAN must name the address clients dial."""
    key_file: Path
    """The private key of ``cert_file`` (PEM, unencrypted): readable by the service's user only."""
    client_ca_file: Path | None = None
    """The authority (PEM) client certificates must be signed by: set, every client needs one (mTLS)."""

    @model_validator(mode="after")
    def _files_readable(self) -> TlsConfig:
        for name in ("cert_file", "key_file", "client_ca_file"):
            path: Path | None = getattr(self, name)
            if path is None:
                continue
            try:
                with path.open("rb") as handle:
                    handle.read(1)
            except OSError as exc:
                msg = f"{name} {path}: cannot be read ({exc.strerror or exc}); give an existing PEM file"
                raise ValueError(msg) from None
        return self


class ServingConfig(BaseModel):
    """Everything ``headwater serve`` needs besides the model and the store address."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    state_dir: Path | None = None
    """Where ``headwater apply`` wrote the plans; None: ``$HEADWATER_STATE_DIR``, else ``.headwater``."""

    popularity: str = DEFAULT_POPULARITY
    """``<item view>.<slot>`` the popularity fallback ranks by."""
    batcher: BatcherConfig = BatcherConfig()
    feedback: FeedbackConfig = FeedbackConfig()
    experiment: ExperimentConfig | None = None
    """Users split into arms by a stable hash, each scored by its arm (serving/experiments.py)."""
    recording: RecordingConfig = RecordingConfig()
    """A sample of the ranking requests and answers to JSON Lines, for `headwater replay`."""
    predictions: PredictionLogConfig = PredictionLogConfig()
    """A sample of the answers with their model inputs and scores to Kafka, for `headwater skew`."""
    admission: AdmissionConfig = AdmissionConfig()
    funnel: FunnelConfig = FunnelConfig()
    """``/v1/recommend``: stage sizes, the seen window, diversity and pins (serving/funnel/config.py)."""
    default_deadline_ms: float = Field(default=100.0, gt=0.0)
    max_deadline_ms: float = Field(default=10_000.0, gt=0.0)
    fallback_reserve_ms: float = Field(default=2.0, ge=0.0)
    """Time kept back from the deadline for the fallback steps once the model is late."""
    max_missing_item_fraction: float = Field(default=0.5, ge=0.0, le=1.0)
    """Above this share of candidates without item features the model steps are skipped."""
    item_cache_entries: int = Field(default=200_000, ge=0)
    item_cache_ttl_s: float = Field(default=5.0, ge=0.0)
    editorial_items: tuple[str, ...] = ()
    """The last resort: items ranked first in this order; other candidates follow as given."""
    torch_threads: int | None = Field(default=None, ge=1)
    """Intra-op threads of the model; None = one fewer than the cores (at least 1, at most 4).

    The event loop needs a core of its own: on 2 cores 2 intra-op threads make a 500-row
    forward many times slower as soon as anything else runs."""
    gil_switch_interval_ms: float | None = Field(default=1.0, gt=0.0, le=100.0)
    """``sys.setswitchinterval`` of the service process; None keeps Python's 5 ms.

    The model and I/O threads hand their results back through the GIL; while the event loop
    runs Python, each hand-back can wait a whole interval, which lands in the tail latency."""
    io_threads: int = Field(default=4, ge=1)
    max_body_bytes: int = Field(default=512 * 1024, ge=1024)
    """The one size limit of a request: REST bodies (413 past it) and gRPC messages, received and sent."""
    edge: EdgeConfig = EdgeConfig()
    """Connections, concurrency, read timeouts and the request-id ledger at the edges."""
    auth: AuthConfig | Literal["none"] | None = None
    """Credentials and roles (serving/auth.py); ``none``: no credentials (loopback only). Absent: an
    in-process app runs open; `headwater serve` refuses to start until one of the two is written."""
    tls: TlsConfig | None = None
    """HTTPS and gRPC TLS (serving/tls.py); None: plaintext (a warning at start off loopback)."""

    @model_validator(mode="after")
    def _deadlines(self) -> ServingConfig:
        if self.default_deadline_ms > self.max_deadline_ms:
            msg = (
                f"default_deadline_ms ({self.default_deadline_ms}) must not exceed max_deadline_ms"
                f" ({self.max_deadline_ms})"
            )
            raise ValueError(msg)
        return self

    def plans_dir(self) -> Path:
        """Return the state directory whose plans the service binds to."""
        from headwater.registry.config import state_dir

        return state_dir(self.state_dir)


def load_config(path: str | Path | None) -> ServingConfig:
    """Read a YAML serving config (``None`` = the defaults); errors name the file and the field."""
    if path is None:
        return ServingConfig()
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        msg = f"serving config {file}: cannot be read ({exc.strerror}); pass an existing YAML file"
        raise ServingConfigError(msg) from exc
    except UnicodeDecodeError as exc:
        msg = f"serving config {file}: byte {exc.start} is not UTF-8; save the file as UTF-8"
        raise ServingConfigError(msg) from exc
    try:
        # The registry's reader: aliases, nesting and long integers are capped, and every node has a line.
        doc = parse_yaml(text)
    except YamlSyntaxError as exc:
        msg = f"serving config {file}:{exc.line}: {exc}"
        raise ServingConfigError(msg) from exc
    raw: Any = {} if doc.data is None else doc.data
    if not isinstance(raw, dict):
        msg = f"serving config {file}: expected a mapping of fields at the top; found {type(raw).__name__}"
        raise ServingConfigError(msg)
    if "experiments" in raw or isinstance(raw.get("experiment"), list):
        where = doc.line_of(("experiments",) if "experiments" in raw else ("experiment",))
        msg = (
            f"serving config {file}, line {where}: one experiment runs at a time; declare it as one"
            " mapping under `experiment:`. Its arms pick each request's model and funnel, which a second"
            " (layered) experiment would pick as well: run them one after the other, or as arms of one"
            " experiment"
        )
        raise ServingConfigError(msg)
    try:
        return ServingConfig.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(
            f"line {doc.line_of(tuple(err['loc']))}: {'.'.join(map(str, err['loc'])) or 'top'}: {err['msg']}"
            for err in exc.errors()
        )
        msg = f"serving config {file}: {problems}"
        raise ServingConfigError(msg) from exc
