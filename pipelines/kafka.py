"""The one module that builds Kafka clients: every producer, consumer and admin client of headwater.

Each factory takes the bootstrap string and the call site's own options and merges, in one place
(:func:`client_options`): the bootstrap servers, a ``client_id`` per role (when the call site names
none), the security settings of :func:`security_options` and, last and winning, the call site's
options unchanged. So partitioning, acks, idempotence, transactional ids, compression, group ids,
offsets and timeouts stay where their reasons are written (the nearline tier's exactly-once in
``nearline/fence.py`` and ``nearline/runner.py`` depends on them); only what every client shares is
here.

``kafka`` (kafka-python) and ``confluent_kafka`` (librdkafka, the serving tier's impressions
producer) are imported when a client is built, not with this module: the CLI's ``--help`` imports
neither.

A unit test (``tests/unit/pipelines/test_kafka_clients.py``) fails when a module outside this one
constructs ``KafkaProducer``, ``KafkaConsumer``, ``KafkaAdminClient`` or a confluent ``Producer``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from headwater.pipelines.settings import Settings
from headwater.registry.security import KafkaSecurity, read_secret

if TYPE_CHECKING:
    from confluent_kafka import Producer as ConfluentProducer
    from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer

Role = Literal["producer", "consumer", "admin"]

CLIENT_IDS: dict[Role, str] = {
    "producer": "headwater-producer",
    "consumer": "headwater-consumer",
    "admin": "headwater-admin",
}
"""The ``client_id`` of a client whose call site names none (broker logs, quotas and metrics)."""

_LIBRDKAFKA_NAMES = {
    "bootstrap_servers": "bootstrap.servers",
    "client_id": "client.id",
    "security_protocol": "security.protocol",
    "sasl_mechanism": "sasl.mechanisms",
    "sasl_plain_username": "sasl.username",
    "sasl_plain_password": "sasl.password",
    "ssl_cafile": "ssl.ca.location",
    "ssl_certfile": "ssl.certificate.location",
    "ssl_keyfile": "ssl.key.location",
    "ssl_password": "ssl.key.password",
}
"""kafka-python's option names -> librdkafka's, for the options this module adds to a confluent client."""


# --- SECURITY HOOK (issue 32) ------------------------------------------------------------------------
def security_options() -> dict[str, Any]:
    """Return the security settings every client gets, from ``kafka.security`` of headwater.yaml.

    In kafka-python's option names (:func:`tls_sasl_options`); :func:`confluent_options` translates
    them to librdkafka's. Every factory of this module applies them (a unit test checks it); a call
    site's explicit option still wins. The default (``PLAINTEXT``) adds none.

    Raises:
        headwater.registry.config.ConfigError: the headwater.yaml in use is invalid.
        headwater.registry.security.SecretError: the SASL password's variable or file is missing.
    """
    settings = Settings.from_env()
    return tls_sasl_options(settings.kafka_security, settings.kafka_security_where)


def tls_sasl_options(security: KafkaSecurity, where: str) -> dict[str, Any]:
    """Return kafka-python's options for ``security``; the password is read now, its repr masked.

    ``where`` (the setting's ``file:line``) goes into the message when the password cannot be read.
    """
    if security.protocol == "PLAINTEXT":
        return {}
    options: dict[str, Any] = {"security_protocol": security.protocol}
    files = {
        "ssl_cafile": security.ca_file,
        "ssl_certfile": security.cert_file,
        "ssl_keyfile": security.key_file,
    }
    options |= {name: path for name, path in files.items() if path is not None}
    if security.sasl is not None:
        options |= {
            "sasl_mechanism": security.sasl.mechanism,
            "sasl_plain_username": security.sasl.username,
            "sasl_plain_password": read_secret(security.sasl, where),
        }
    return options


def client_options(role: Role, bootstrap: str, overrides: dict[str, Any]) -> dict[str, Any]:
    """Return a kafka-python client's keyword arguments: common options < security < ``overrides``.

    Raises:
        ValueError: ``overrides`` names ``bootstrap_servers`` (the ``bootstrap`` argument is the one).
    """
    if "bootstrap_servers" in overrides:
        msg = "pass the bootstrap servers as the bootstrap argument, not as an option"
        raise ValueError(msg)
    return {"bootstrap_servers": bootstrap, "client_id": CLIENT_IDS[role], **security_options(), **overrides}


def producer(bootstrap: str, **options: Any) -> KafkaProducer:
    """Build a kafka-python ``KafkaProducer``; ``options`` are its keyword arguments, passed unchanged."""
    from kafka import KafkaProducer

    return KafkaProducer(**client_options("producer", bootstrap, options))


def consumer(bootstrap: str, *topics: str, **options: Any) -> KafkaConsumer:
    """Build a kafka-python ``KafkaConsumer`` (subscribed to ``topics`` if any), ``options`` unchanged."""
    from kafka import KafkaConsumer

    return KafkaConsumer(*topics, **client_options("consumer", bootstrap, options))


def admin(bootstrap: str, **options: Any) -> KafkaAdminClient:
    """Build a kafka-python ``KafkaAdminClient``; ``options`` are its keyword arguments, unchanged."""
    from kafka import KafkaAdminClient

    return KafkaAdminClient(**client_options("admin", bootstrap, options))


def confluent_options(bootstrap: str, config: dict[str, Any]) -> dict[str, Any]:
    """Return a librdkafka producer's configuration: common options < security < ``config``.

    Raises:
        ValueError: ``config`` names ``bootstrap.servers`` (the ``bootstrap`` argument is the one).
    """
    if "bootstrap.servers" in config:
        msg = "pass the bootstrap servers as the bootstrap argument, not as bootstrap.servers"
        raise ValueError(msg)
    common = client_options("producer", bootstrap, {})
    return {_LIBRDKAFKA_NAMES.get(k, k.replace("_", ".")): v for k, v in common.items()} | config


def confluent_producer(bootstrap: str, **config: Any) -> ConfluentProducer:
    """Build a confluent-kafka (librdkafka) ``Producer``; ``config`` holds its dotted keys, unchanged.

    Dotted keys are not Python names: pass them as ``**{"linger.ms": 5, ...}``.
    """
    from confluent_kafka import Producer

    return Producer(confluent_options(bootstrap, config))
