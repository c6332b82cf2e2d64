"""kafka.security -> every client's options: kafka-python's names, librdkafka's names, the secret masked."""

from __future__ import annotations

from pathlib import Path

import pytest

from headwater.pipelines import kafka as kafka_clients
from headwater.registry.security import KafkaSecurity, SaslConfig, SecretError

SASL = KafkaSecurity(
    protocol="SASL_SSL",
    ca_file="/certs/ca.pem",
    sasl=SaslConfig(username="headwater", password_env="HW_TEST_KAFKA_PASSWORD"),
)


def test_plaintext_adds_nothing() -> None:
    assert kafka_clients.tls_sasl_options(KafkaSecurity(), "default") == {}


def test_ssl_with_a_client_certificate() -> None:
    security = KafkaSecurity(protocol="SSL", ca_file="/ca.pem", cert_file="/c.pem", key_file="/c.key")
    assert kafka_clients.tls_sasl_options(security, "f:1") == {
        "security_protocol": "SSL",
        "ssl_cafile": "/ca.pem",
        "ssl_certfile": "/c.pem",
        "ssl_keyfile": "/c.key",
    }


def test_sasl_ssl_reads_the_password_and_masks_its_repr(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HW_TEST_KAFKA_PASSWORD", "pw-value-1")
    options = kafka_clients.tls_sasl_options(SASL, "f:1")
    assert options == {
        "security_protocol": "SASL_SSL",
        "ssl_cafile": "/certs/ca.pem",
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": "headwater",
        "sasl_plain_password": "pw-value-1",
    }
    assert "pw-value-1" not in repr(options)


def test_the_config_file_reaches_every_client(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "headwater.yaml").write_text(
        "kafka:\n  security:\n    protocol: SASL_SSL\n    ca_file: ca.pem\n    sasl:\n"
        "      username: headwater\n      password_file: kafka-password\n",
        encoding="utf-8",
    )
    (tmp_path / "kafka-password").write_text("pw-from-file\n", encoding="utf-8")
    monkeypatch.setenv("HEADWATER_REPO", str(tmp_path))
    options = kafka_clients.client_options("consumer", "b:1", {"group_id": "g"})
    assert options["security_protocol"] == "SASL_SSL"
    assert options["ssl_cafile"] == str(tmp_path / "ca.pem")
    assert options["sasl_plain_password"] == "pw-from-file"
    assert options["group_id"] == "g"
    config = kafka_clients.confluent_options("b:1", {"acks": "all"})
    assert {k: config[k] for k in config if k.startswith(("security", "ssl", "sasl"))} == {
        "security.protocol": "SASL_SSL",
        "ssl.ca.location": str(tmp_path / "ca.pem"),
        "sasl.mechanisms": "SCRAM-SHA-512",
        "sasl.username": "headwater",
        "sasl.password": "pw-from-file",
    }
    assert "pw-from-file" not in repr(config)


def test_a_missing_password_names_the_setting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HW_TEST_KAFKA_PASSWORD", raising=False)
    with pytest.raises(SecretError, match=r"headwater.yaml:3: .*HW_TEST_KAFKA_PASSWORD"):
        kafka_clients.tls_sasl_options(SASL, "headwater.yaml:3")
