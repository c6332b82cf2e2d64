"""Secured Kafka (SASL_SSL, SCRAM-SHA-512) and Redis (TLS + ACL user) started by the infra/ scripts.

Private ports and state folders, certificates made at test time (infra/certs.sh) in tmp_path: the
shared plaintext services are not touched, and only what this module started is stopped. The
clients are headwater's own: pipelines/kafka.py with kafka.security from a headwater.yaml, and
pipelines/store/connect.py with a rediss:// URL.
"""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from headwater.pipelines import kafka as kafka_clients
from headwater.pipelines.store.connect import redis_client

ROOT = Path(__file__).resolve().parents[3]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _script(
    name: str, action: str, env: dict[str, str], timeout: int = 240
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(ROOT / "infra" / f"{name}.sh"), action],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A throwaway authority and the server certificates, stores and password (infra/certs.sh)."""
    folder = tmp_path_factory.mktemp("certs")
    subprocess.run(["bash", str(ROOT / "infra" / "certs.sh"), str(folder)], check=True, capture_output=True)
    return folder


@pytest.fixture(scope="module")
def secured_redis(secure: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    env = {
        "HEADWATER_SECURE_DIR": str(secure),
        "HEADWATER_SERVICES_DIR": str(tmp_path_factory.mktemp("services-redis")),
        "HEADWATER_REDIS_PORT": str(_free_port()),
    }
    started = _script("redis", "start", env)
    assert started.returncode == 0, started.stderr
    try:
        yield int(env["HEADWATER_REDIS_PORT"])
    finally:
        _script("redis", "stop", env)


@pytest.fixture(scope="module")
def secured_kafka(secure: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    services = tmp_path_factory.mktemp("services-kafka")
    env = {
        "HEADWATER_SECURE_DIR": str(secure),
        "HEADWATER_SERVICES_DIR": str(services),
        "HEADWATER_KAFKA_PORT": str(_free_port()),
        "HEADWATER_KAFKA_CONTROLLER_PORT": str(_free_port()),
    }
    started = _script("kafka", "start", env)
    assert started.returncode == 0, started.stderr
    try:
        yield f"127.0.0.1:{env['HEADWATER_KAFKA_PORT']}", services / "kafka" / "client" / "headwater.yaml"
    finally:
        _script("kafka", "stop", env)


def test_the_store_writes_and_reads_over_tls_as_the_acl_user(secure: Path, secured_redis: int) -> None:
    password = (secure / "password").read_text(encoding="utf-8")
    url = f"rediss://headwater:{password}@127.0.0.1:{secured_redis}/0?ssl_ca_certs={secure / 'ca.pem'}"
    client = redis_client(url, socket_timeout=5.0)
    client.set("tls-pipes:k", "v1")
    assert client.get("tls-pipes:k") == b"v1"
    client.close()


def test_redis_refuses_a_wrong_password_and_a_plaintext_client(secure: Path, secured_redis: int) -> None:
    ca = secure / "ca.pem"
    wrong = redis_client(f"rediss://headwater:wrong@127.0.0.1:{secured_redis}/0?ssl_ca_certs={ca}")
    with pytest.raises(redis.AuthenticationError, match="invalid username-password pair"):
        wrong.ping()
    default_user = redis_client(f"rediss://127.0.0.1:{secured_redis}/0?ssl_ca_certs={ca}")
    with pytest.raises(redis.AuthenticationError):
        default_user.set("tls-pipes:k", "v2")  # the default user is off
    plain = redis_client(f"redis://127.0.0.1:{secured_redis}/0", socket_timeout=5.0)
    with pytest.raises(redis.ConnectionError):
        plain.ping()


def test_kafka_clients_round_trip_over_sasl_ssl_and_others_are_refused(
    secured_kafka: tuple[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    from kafka.admin import NewTopic
    from kafka.errors import KafkaTimeoutError

    bootstrap, client_config = secured_kafka
    monkeypatch.setenv("HEADWATER_REPO", str(client_config))
    monkeypatch.setenv("HEADWATER_KAFKA_BOOTSTRAP", bootstrap)
    admin = kafka_clients.admin(bootstrap)
    admin.create_topics([NewTopic("tls-pipes", 1, 1)])
    admin.close()
    producer = kafka_clients.producer(bootstrap)
    producer.send("tls-pipes", b"from-kafka-python").get(timeout=30)
    producer.close()
    confluent = kafka_clients.confluent_producer(bootstrap)
    confluent.produce("tls-pipes", b"from-librdkafka")
    assert confluent.flush(30) == 0
    consumer = kafka_clients.consumer(
        bootstrap, "tls-pipes", auto_offset_reset="earliest", consumer_timeout_ms=15000, group_id="tls-pipes"
    )
    assert sorted(m.value for m in consumer) == [b"from-kafka-python", b"from-librdkafka"]
    consumer.close()
    for refused in ({"security_protocol": "PLAINTEXT"}, {"sasl_plain_password": "wrong"}):
        with pytest.raises(KafkaTimeoutError, match="Unable to bootstrap"):
            kafka_clients.producer(bootstrap, max_block_ms=5000, request_timeout_ms=5000, **refused)
