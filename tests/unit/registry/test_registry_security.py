"""kafka.security of headwater.yaml: parsed with the other settings, secrets never in the file or output."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import assume, given
from hypothesis import strategies as st

from headwater.cli.main import main
from headwater.registry import config as cfg
from headwater.registry.security import (
    MASK,
    KafkaSecurity,
    SaslConfig,
    Secret,
    SecretError,
    read_secret,
    redact_url,
)

SASL = """kafka:
  bootstrap: 127.0.0.1:9092
  security:
    protocol: SASL_SSL
    ca_file: certs/ca.pem
    sasl:
      username: headwater
      password_env: HW_TEST_KAFKA_PASSWORD
redis:
  url: rediss://headwater:r3d1s-pw@127.0.0.1:6380/0?ssl_ca_certs=/certs/ca.pem
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "headwater.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def test_sasl_ssl_is_parsed_and_its_paths_resolve_against_the_file(tmp_path: Path) -> None:
    loaded = cfg.load_config(write(tmp_path, SASL))
    security = loaded.config.kafka.security.resolved(tmp_path)
    assert security.protocol == "SASL_SSL"
    assert security.ca_file == str(tmp_path / "certs" / "ca.pem")
    assert security.sasl == SaslConfig(username="headwater", password_env="HW_TEST_KAFKA_PASSWORD")
    assert loaded.where("kafka", "security") == f"{tmp_path / 'headwater.yaml'}:3"


def test_the_default_is_plaintext() -> None:
    assert cfg.RepoConfig().kafka.security == KafkaSecurity(protocol="PLAINTEXT")


@pytest.mark.parametrize(
    ("block", "line", "expected"),
    [
        ("    protocol: SASL_SSL\n", 3, "protocol SASL_SSL needs sasl"),
        ("    protocol: PLAINTEXT\n    ca_file: ca.pem\n", 3, "need protocol SSL or SASL_SSL"),
        ("    protocol: SSL\n    cert_file: c.pem\n", 3, "cert_file and key_file go together"),
        ("    protocol: TLS\n", 4, "kafka.security.protocol"),
        (
            "    protocol: SASL_SSL\n    sasl:\n      username: u\n",
            5,
            "name the password's source exactly once",
        ),
    ],
)
def test_invalid_settings_name_the_file_and_line(
    tmp_path: Path, block: str, line: int, expected: str
) -> None:
    path = write(
        tmp_path, "kafka:\n  security:\n" + block.replace("    protocol: TLS", "\n    protocol: TLS")
    )
    with pytest.raises(cfg.ConfigError, match=expected) as caught:
        cfg.load_config(path)
    assert f"{path}:" in str(caught.value)


def test_a_password_written_in_the_file_is_refused_and_not_echoed(tmp_path: Path) -> None:
    text = (
        "kafka:\n  security:\n    protocol: SASL_SSL\n    sasl:\n      username: u\n"
        "      password: hunter2-xyz\n"
    )
    path = write(tmp_path, text)
    with pytest.raises(cfg.ConfigError) as caught:
        cfg.load_config(path)
    message = str(caught.value)
    assert f"{path}:6: unknown key 'kafka.security.sasl.password'" in message
    assert "password_env or password_file" in message
    assert "hunter2-xyz" not in message


def test_a_bad_value_under_security_is_not_echoed(tmp_path: Path) -> None:
    path = write(
        tmp_path, "kafka:\n  security:\n    protocol: SASL_SSL\n    sasl:\n      username: [s3cret-value]\n"
    )
    with pytest.raises(cfg.ConfigError) as caught:
        cfg.load_config(path)
    assert "s3cret-value" not in str(caught.value)


def test_a_bad_redis_url_error_masks_its_password(tmp_path: Path) -> None:
    path = write(tmp_path, "redis:\n  url: http://u:pw-leak@host:1/0\n")
    with pytest.raises(cfg.ConfigError) as caught:
        cfg.load_config(path)
    assert "pw-leak" not in str(caught.value)
    assert f"http://u:{MASK}@host:1/0" in str(caught.value)


def test_the_secret_comes_from_the_environment_or_a_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HW_TEST_KAFKA_PASSWORD", "from-env")
    secret = read_secret(SaslConfig(username="u", password_env="HW_TEST_KAFKA_PASSWORD"), "f:1")
    assert secret == "from-env"
    assert repr(secret) == "'***'"
    assert repr({"p": secret}) == "{'p': '***'}"
    (tmp_path / "pw").write_text("from-file\n", encoding="utf-8")
    assert read_secret(SaslConfig(username="u", password_file=str(tmp_path / "pw")), "f:1") == "from-file"


def test_a_missing_secret_says_where_and_what_to_do(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HW_TEST_KAFKA_PASSWORD", raising=False)
    with pytest.raises(SecretError, match=r"headwater.yaml:3: .*\$HW_TEST_KAFKA_PASSWORD, which is not set"):
        read_secret(SaslConfig(username="u", password_env="HW_TEST_KAFKA_PASSWORD"), "headwater.yaml:3")
    (tmp_path / "empty").write_text("", encoding="utf-8")
    with pytest.raises(SecretError, match="is empty"):
        read_secret(SaslConfig(username="u", password_file=str(tmp_path / "empty")), "f:1")
    with pytest.raises(SecretError, match="cannot be read"):
        read_secret(SaslConfig(username="u", password_file=str(tmp_path / "none")), "f:1")


def test_headwater_config_shows_no_secret(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path, SASL)
    for name in ("HEADWATER_REDIS_URL", "HEADWATER_HOST", "HEADWATER_REDIS_PORT", "HEADWATER_KAFKA_PORT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HEADWATER_REPO", str(path))
    monkeypatch.setenv("HW_TEST_KAFKA_PASSWORD", "kafka-pw-value")
    for fmt in ("text", "json"):
        result = CliRunner().invoke(main, ["config", "--format", fmt])
        assert result.exit_code == 0, result.output
        assert "r3d1s-pw" not in result.output
        assert "kafka-pw-value" not in result.output
    values = json.loads(result.output)["values"]
    assert values["redis.url"] == f"rediss://headwater:{MASK}@127.0.0.1:6380/0?ssl_ca_certs=/certs/ca.pem"
    assert values["kafka.security"] == (
        f"SASL_SSL, ca {tmp_path / 'certs' / 'ca.pem'}, SCRAM-SHA-512 user headwater "
        "(password from $HW_TEST_KAFKA_PASSWORD)"
    )


_PASSWORDS = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), min_size=6).filter(
    lambda p: p.strip() == p and p.lower() not in "redis://user@127.0.0.1:6379/0?ssl_ca_certs=/ca.pem"
)


@given(
    scheme=st.sampled_from(["redis", "rediss", "redis-cluster", "rediss-cluster", "unix"]),
    user=st.text(st.characters(categories=["L", "N"]), max_size=8),
    password=_PASSWORDS,
    query=st.sampled_from(["", "?ssl_ca_certs=/ca.pem", "?db=0&socket_timeout=1"]),
)
def test_redact_url_never_shows_the_password(scheme: str, user: str, password: str, query: str) -> None:
    url = f"{scheme}://{user}:{password}@127.0.0.1:6379/0{query}"
    assume(password not in url.replace(f":{password}@", ":@"))  # not a part of the rest of the URL
    shown = redact_url(url)
    assert password not in shown
    assert shown.startswith(f"{scheme}://{user}:{MASK}@")


@given(password=_PASSWORDS.filter(lambda p: "&" not in p))  # "&" ends a query value (redis-py too)
def test_redact_url_masks_a_password_query_option(password: str) -> None:
    shown = redact_url(f"redis://127.0.0.1:6379/0?db=0&password={password}")
    assert password not in shown


@given(st.text())
def test_redact_url_takes_any_text(text: str) -> None:
    assert isinstance(redact_url(text), str)


def test_secret_is_a_str() -> None:
    assert Secret("x") + "y" == "xy"
