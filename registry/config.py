"""One resolver for where everything is: the feature repo's ``headwater.yaml``.

A feature repo is a folder with one config file, ``headwater.yaml`` (what Feast's
``feature_store.yaml`` is to a Feast repo), naming the feature definitions, the state folder, the
lake, Kafka and Redis. Every command asks this module, and only this module, where those are:

1. an explicit command-line option (``--state-dir``, ``--lake``, ``--redis-url``...) wins;
2. then a ``HEADWATER_*`` environment variable (``HEADWATER_STATE_DIR``, ``HEADWATER_LAKE``,
   ``HEADWATER_KAFKA_BOOTSTRAP``, ``HEADWATER_REDIS_URL``, or ``HEADWATER_HOST`` with
   ``HEADWATER_KAFKA_PORT`` / ``HEADWATER_REDIS_PORT``, ``HEADWATER_JVM_LIB``);
3. then the config file: the one ``headwater --repo DIR`` or ``$HEADWATER_REPO`` names, else the
   first ``headwater.yaml`` found in the current folder or above it; its relative paths resolve
   against the folder it is in;
4. without any config file, the defaults below, relative to the current folder.

The lake defaults to ``<state folder>/lake``, so moving the state folder moves everything the
platform writes (plans, Feast repo, checkpoints, nearline stores, lake, models) together.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, ValidationError, field_validator

from headwater.registry import resources
from headwater.registry.errors import HeadwaterError
from headwater.registry.security import KafkaSecurity, redact_url
from headwater.registry.yamlsrc import YamlDoc, YamlSyntaxError, parse_yaml

CONFIG_FILE = "headwater.yaml"
REPO_ENV = "HEADWATER_REPO"
STATE_ENV = "HEADWATER_STATE_DIR"
LAKE_ENV = "HEADWATER_LAKE"
JVM_LIB_ENV = "HEADWATER_JVM_LIB"
KAFKA_ENV = "HEADWATER_KAFKA_BOOTSTRAP"
DLQ_ENV = "HEADWATER_DLQ_TOPIC"
PARTITIONS_ENV = "HEADWATER_PARTITIONS"
REDIS_ENV = "HEADWATER_REDIS_URL"
DEFAULT_HOST = "127.0.0.1"
DEFAULT_KAFKA_PORT = "9092"
DEFAULT_REDIS_PORT = "6379"
DEFAULT_FEATURES = "features"
DEFAULT_STATE_DIR = ".headwater"
DEFAULT_DLQ_TOPIC = "events.dlq"


class ConfigError(HeadwaterError, ValueError):
    """The config file is missing, unreadable or invalid; the message names the file, line and fix."""


class KafkaConfig(BaseModel):
    """Where the event topics are."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    bootstrap: StrictStr = f"{DEFAULT_HOST}:{DEFAULT_KAFKA_PORT}"
    """Comma-separated ``host:port`` list of brokers."""
    dlq_topic: StrictStr = DEFAULT_DLQ_TOPIC
    """The dead letters of every source (invalid, late, future-dated events), with their reason."""
    partitions: StrictInt = Field(default=4, ge=1)
    """Partitions of the topics ``headwater topics create`` makes."""
    security: KafkaSecurity = KafkaSecurity()
    """How every client authenticates and encrypts (:mod:`headwater.registry.security`)."""

    @field_validator("bootstrap")
    @classmethod
    def _host_ports(cls, value: str) -> str:
        for part in value.split(","):
            host, sep, port = part.strip().rpartition(":")
            if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
                msg = f"{part.strip()!r} is not host:port (e.g. 127.0.0.1:9092; several: a,b)"
                raise ValueError(msg)
        return value


class RedisConfig(BaseModel):
    """Where the online store is."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    url: StrictStr = f"redis://{DEFAULT_HOST}:{DEFAULT_REDIS_PORT}/0"
    """``redis://host:port/db`` (``rediss://`` for TLS, ``unix:///path.sock``)."""
    eviction: Literal["refuse", "allow"] = "refuse"
    """Whether the tiers may write to a Redis whose ``maxmemory-policy`` evicts keys. ``refuse`` (the
    default): a tier that finds an evicting policy with a memory limit does not start, since an evicted
    value stays missing until its entity changes again. ``allow``: eviction is accepted (a cache)."""

    @field_validator("url")
    @classmethod
    def _scheme(cls, value: str) -> str:
        if not value.startswith(("redis://", "rediss://", "unix://")):
            shown = redact_url(value)
            msg = f"{shown!r} is not a Redis URL: write redis://host:port/db (rediss:// or unix:// also)"
            raise ValueError(msg)
        return value


class RepairConfig(BaseModel):
    """``nearline.repair``: the nearline tier's reconciliation pass (``pipelines/nearline/repair.py``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    interval_s: float = Field(default=120.0, ge=0)
    """Seconds between the starts of two passes over every owned key (0: no repair)."""
    max_keys: StrictInt = Field(default=2000, ge=1)
    """Keys a pass checks per step (one step between two polls), so a pass never stalls the worker."""


class NearlineTierConfig(BaseModel):
    """The nearline tier's settings."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    repair: RepairConfig = RepairConfig()


class RepoConfig(BaseModel):
    """The content of ``headwater.yaml``. Paths are relative to the file's folder unless absolute."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    version: Literal[1] = 1
    """Format of this file."""
    features: StrictStr = DEFAULT_FEATURES
    """The feature definitions: entities.yaml, sources.yaml, budget.yaml, views, schemas/."""
    state_dir: StrictStr = DEFAULT_STATE_DIR
    """What ``apply`` and the tiers write: plans, Feast repo, checkpoints, nearline stores, models."""
    lake: StrictStr | None = None
    """The offline tier's Delta tables; None: ``<state_dir>/lake``."""
    jvm_lib: StrictStr | None = None
    """The tiers' jars (``headwater setup jars`` fills it); None: the tool's default (see jvm_lib_dir)."""
    kafka: KafkaConfig = KafkaConfig()
    redis: RedisConfig = RedisConfig()
    nearline: NearlineTierConfig = NearlineTierConfig()


@dataclass(frozen=True)
class Resolved:
    """Where everything is, after options, environment, config file and defaults were applied."""

    config_file: Path | None
    """The ``headwater.yaml`` used, or None when none was found."""
    root: Path
    """The feature repo's folder: the config file's, else the current folder."""
    features: Path
    state_dir: Path
    lake: Path
    jvm_lib: Path
    kafka_bootstrap: str
    redis_url: str
    dlq_topic: str
    partitions: int
    origins: dict[str, str] = field(default_factory=dict)
    """Where each value came from: ``headwater.yaml:5``, ``$HEADWATER_STATE_DIR``, ``default``."""
    redis_eviction: str = "refuse"
    """``redis.eviction`` of the config file: whether the tiers accept an evicting Redis."""
    kafka_security: KafkaSecurity = field(default_factory=KafkaSecurity)
    """``kafka.security`` of the config file, its paths absolute (no secret: only where each one is)."""
    nearline_repair: RepairConfig = field(default_factory=RepairConfig)
    """``nearline.repair`` of the config file: the nearline tier's reconciliation pass."""


def find_config(start: Path) -> Path | None:
    """Return the first ``headwater.yaml`` in ``start`` or one of its parents, or None."""
    here = start.resolve()
    for folder in (here, *here.parents):
        candidate = folder / CONFIG_FILE
        if candidate.is_file():
            return candidate
    return None


def config_path(repo: str | os.PathLike[str]) -> Path:
    """Return the config file of ``repo``: a ``headwater.yaml`` itself, or a folder that holds one.

    Raises:
        ConfigError: there is none.
    """
    path = Path(repo).expanduser()
    if path.is_file():
        return path.resolve()
    if (path / CONFIG_FILE).is_file():
        return (path / CONFIG_FILE).resolve()
    msg = (
        f"{path}: no {CONFIG_FILE} there; create a feature repo with `headwater init {path}`, "
        f"or point --repo / ${REPO_ENV} at the folder that has one"
    )
    raise ConfigError(msg)


def use_repo(repo: str | os.PathLike[str]) -> Path:
    """Make ``repo``'s config the one every command (and every process it starts) resolves from.

    Returns the config file. Raises ConfigError when ``repo`` has none or it is invalid.
    """
    path = config_path(repo)
    load_config(path)
    os.environ[REPO_ENV] = str(path)
    return path


def current_config_file() -> Path | None:
    """Return the config file in use: ``$HEADWATER_REPO``'s, else the nearest one from the current folder."""
    named = os.environ.get(REPO_ENV)
    if named:
        return config_path(named)
    return find_config(Path.cwd())


@dataclass(frozen=True)
class LoadedConfig:
    """A parsed config file: the model and the line of every key (for messages)."""

    path: Path
    config: RepoConfig
    doc: YamlDoc

    def where(self, *keys: str) -> str:
        """``file:line`` of a key of the file (``where("kafka", "bootstrap")``)."""
        return f"{self.path}:{self.doc.line_of(keys)}"


def load_config(path: Path) -> LoadedConfig:
    """Read and validate a ``headwater.yaml``.

    Raises:
        ConfigError: unreadable, not YAML, or invalid; the message names the file, line, key and fix.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        msg = f"{path}: cannot be read ({exc.strerror}); pass an existing {CONFIG_FILE}"
        raise ConfigError(msg) from exc
    except UnicodeDecodeError as exc:
        msg = f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start}); save {CONFIG_FILE} as UTF-8"
        raise ConfigError(msg) from exc
    return _parse(path.resolve(), text)


@lru_cache(maxsize=8)
def _parse(path: Path, text: str) -> LoadedConfig:
    # Keyed by the text: every command resolves several times, the file is parsed once per content.
    try:
        doc = parse_yaml(text)
    except YamlSyntaxError as exc:
        msg = f"{path}:{exc.line}: not valid YAML: {exc}"
        raise ConfigError(msg) from exc
    data: Any = {} if doc.data is None else doc.data
    if not isinstance(data, dict):
        msg = f"{path}:1: {CONFIG_FILE} must be a mapping of keys (features, state_dir, kafka, ...)"
        raise ConfigError(msg)
    try:
        config = RepoConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_validation_message(path, doc, exc)) from exc
    return LoadedConfig(path, config, doc)


def _validation_message(path: Path, doc: YamlDoc, exc: ValidationError) -> str:
    lines = []
    for error in exc.errors():
        loc = tuple(error["loc"])
        key = ".".join(str(part) for part in loc) or "(top level)"
        if error["type"] == "extra_forbidden":
            parent = loc[:-1]
            model: type[BaseModel] = RepoConfig
            for part in parent:
                sub = model.model_fields[str(part)].annotation
                for candidate in (sub, *get_args(sub)):  # an optional section: SaslConfig | None
                    if isinstance(candidate, type) and issubclass(candidate, BaseModel):
                        model = candidate
                        break
            known = ", ".join(model.model_fields)
            text = f"unknown key {key!r}: remove it or fix its spelling (known: {known})"
            if "security" in loc and str(loc[-1]) == "password":
                text += "; a secret never goes in headwater.yaml: name password_env or password_file"
        elif loc[:2] == ("redis", "url") and isinstance(error.get("input"), str):
            text = f"{key}: {error['msg']} (found {redact_url(error['input'])!r})"
        elif "security" in loc:
            # The value found may be a secret written where it does not belong: never echo it.
            text = f"{key}: {error['msg']}"
        else:
            text = f"{key}: {error['msg']} (found {error.get('input')!r})"
        lines.append(f"{path}:{doc.line_of(loc)}: {text}")
    return "\n".join(lines)


def cache_dir() -> Path:
    """Return headwater's per-user cache: ``$XDG_CACHE_HOME/headwater``, else ``~/.cache/headwater``."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "headwater"


def resolve() -> Resolved:
    """Resolve every location and address from the environment, the config file and the defaults.

    Raises:
        ConfigError: the config file in use is invalid, or ``$HEADWATER_REPO`` names none.
    """
    file = current_config_file()
    loaded = load_config(file) if file is not None else None
    config = loaded.config if loaded is not None else RepoConfig()
    root = file.parent if file is not None else Path.cwd()
    origins: dict[str, str] = {}

    def from_file(key: str, *sub: str) -> str:
        return loaded.where(key, *sub) if loaded is not None and _has(loaded.doc, key, *sub) else "default"

    def path_of(key: str, env: str | None, value: str | None, fallback: Path) -> Path:
        if env and os.environ.get(env):
            origins[key] = f"${env}"
            return _absolute(Path(os.environ[env]), Path.cwd())
        if value is not None:
            origins[key] = from_file(key)
            return _absolute(Path(value), root)
        origins[key] = "default"
        return fallback

    features = path_of("features", None, config.features, root / DEFAULT_FEATURES)
    if file is not None and loaded is not None and features.resolve() == file.parent.resolve():
        # Every YAML file of the features folder is read as a definition: this one would be too.
        msg = (
            f"{loaded.where('features')}: features must be a folder of its own (e.g. features/), not the "
            f"folder of {file.name}, which would be read as a feature view"
        )
        raise ConfigError(msg)
    state = path_of("state_dir", STATE_ENV, config.state_dir, root / DEFAULT_STATE_DIR)
    lake = path_of("lake", LAKE_ENV, config.lake, state / "lake")
    if origins["lake"] == "default":
        origins["lake"] = "default: lake/ in the state folder"
    jvm_lib = path_of("jvm_lib", JVM_LIB_ENV, config.jvm_lib, _default_jvm_lib())
    kafka, origins["kafka.bootstrap"] = _address(
        KAFKA_ENV, "HEADWATER_KAFKA_PORT", DEFAULT_KAFKA_PORT, "{host}:{port}", config.kafka.bootstrap
    )
    redis, origins["redis.url"] = _address(
        REDIS_ENV, "HEADWATER_REDIS_PORT", DEFAULT_REDIS_PORT, "redis://{host}:{port}/0", config.redis.url
    )
    for key, value in (("kafka.bootstrap", ("kafka", "bootstrap")), ("redis.url", ("redis", "url"))):
        if origins[key] == "file":
            origins[key] = from_file(*value)
    dlq, origins["kafka.dlq_topic"] = _setting(
        DLQ_ENV, config.kafka.dlq_topic, from_file("kafka", "dlq_topic")
    )
    partitions_text, origins["kafka.partitions"] = _setting(
        PARTITIONS_ENV, str(config.kafka.partitions), from_file("kafka", "partitions")
    )
    partitions = _positive_int(partitions_text, PARTITIONS_ENV)
    origins["redis.eviction"] = from_file("redis", "eviction")
    origins["kafka.security"] = from_file("kafka", "security")
    return Resolved(
        file,
        root,
        features,
        state,
        lake,
        jvm_lib,
        kafka,
        redis,
        dlq,
        partitions,
        origins,
        config.redis.eviction,
        config.kafka.security.resolved(root),
        nearline_repair=config.nearline.repair,
    )


def _setting(env: str, configured: str, where: str) -> tuple[str, str]:
    """Return a value and its origin: its environment variable, else the file's (or the default)."""
    if os.environ.get(env):
        return os.environ[env], f"${env}"
    return configured, where


def _positive_int(text: str, env: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        msg = f"${env}={text!r}: expected a whole number >= 1"
        raise ConfigError(msg)
    return value


def _address(env: str, port_env: str, default_port: str, pattern: str, configured: str) -> tuple[str, str]:
    """Return an address and its origin: its own variable, else HEADWATER_HOST/port ones, else the file."""
    if os.environ.get(env):
        return os.environ[env], f"${env}"
    host, port = os.environ.get("HEADWATER_HOST"), os.environ.get(port_env)
    if host or port:
        # The infra/ scripts move a service by its port (tests run private ones): that beats the file.
        which = " ".join(f"${name}" for name, v in (("HEADWATER_HOST", host), (port_env, port)) if v)
        return pattern.format(host=host or DEFAULT_HOST, port=port or default_port), which
    return configured, "file"


def _has(doc: YamlDoc, *keys: str) -> bool:
    node: Any = doc.data
    for key in keys:
        if not isinstance(node, dict) or key not in node:
            return False
        node = node[key]
    return True


def _absolute(path: Path, base: Path) -> Path:
    path = path.expanduser()
    return path if path.is_absolute() else base / path


def _default_jvm_lib() -> Path:
    """Return a source checkout's ``infra/lib`` (``make setup``), else the user cache's ``lib``."""
    checkout = resources.checkout_root()
    if checkout is not None:
        return checkout / "infra" / "lib"
    return cache_dir() / "lib"


def state_dir(given: Path | None = None) -> Path:
    """Return the state folder: ``given`` (a ``--state-dir``), else the resolved one."""
    return given if given is not None else resolve().state_dir


def lake_dir(given: str | os.PathLike[str] | None = None) -> Path:
    """Return the lake folder: ``given`` (a ``--lake``), else the resolved one."""
    return Path(given) if given is not None else resolve().lake


def features_dir(given: Path | None = None) -> Path:
    """Return the feature definitions folder: ``given`` (a REPO argument), else the resolved one."""
    return given if given is not None else resolve().features


def jvm_lib_dir() -> Path:
    """Return the folder whose ``kafka/``, ``flink/``, ``flink-udfs/``, ``delta/`` hold the jars."""
    return resolve().jvm_lib
