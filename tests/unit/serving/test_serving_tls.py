"""The serving config's ``tls:`` section and the TLS helpers: errors that name the file, never a traceback.

Certificates come from ``infra/certs.sh`` once per module (openssl); a second run gives a key that
is not the first certificate's.
"""

from __future__ import annotations

import ssl
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from headwater.client.tls import ENV_CA, ENV_CERT, ENV_KEY, ClientTls, ClientTlsError
from headwater.serving.config import ServingConfigError, TlsConfig, load_config
from headwater.serving.tls import (
    check,
    from_options,
    plaintext_warning,
    server_context,
    uvicorn_tls_options,
)

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def pem(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("certs")
    for name in ("a", "b"):
        subprocess.run(
            ["bash", str(ROOT / "infra" / "certs.sh"), str(root / name)], check=True, capture_output=True
        )
    a, b = root / "a", root / "b"
    return {"cert": a / "server.pem", "key": a / "server.key", "ca": a / "ca.pem",
            "other_key": b / "server.key", "client_cert": a / "client.pem",
            "client_key": a / "client.key"}  # fmt: skip


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "serving.yaml"
    path.write_text(text)
    return path


def test_a_tls_section_is_read_and_checked(tmp_path: Path, pem: dict[str, Path]) -> None:
    path = _write(tmp_path, f"auth: none\ntls:\n  cert_file: {pem['cert']}\n  key_file: {pem['key']}\n"
                            f"  client_ca_file: {pem['ca']}\n")  # fmt: skip
    tls = load_config(path).tls
    assert tls == TlsConfig(cert_file=pem["cert"], key_file=pem["key"], client_ca_file=pem["ca"])
    assert server_context(tls).verify_mode == ssl.CERT_REQUIRED
    options = uvicorn_tls_options(tls)
    assert options == {"ssl_certfile": str(pem["cert"]), "ssl_keyfile": str(pem["key"]),
                       "ssl_ca_certs": str(pem["ca"]), "ssl_cert_reqs": ssl.CERT_REQUIRED}  # fmt: skip
    assert uvicorn_tls_options(None) == {}


def test_a_missing_key_names_the_line_and_the_field(tmp_path: Path, pem: dict[str, Path]) -> None:
    path = _write(tmp_path, f"auth: none\ntls:\n  cert_file: {pem['cert']}\n")
    with pytest.raises(ServingConfigError) as err:
        load_config(path)
    assert f"serving config {path}: line 2: tls.key_file: Field required" in str(err.value)


def test_a_path_that_does_not_exist_is_named(tmp_path: Path, pem: dict[str, Path]) -> None:
    missing = tmp_path / "nope.pem"
    path = _write(tmp_path, f"tls:\n  cert_file: {missing}\n  key_file: {pem['key']}\n")
    with pytest.raises(ServingConfigError) as err:
        load_config(path)
    assert (
        f"line 1: tls: Value error, cert_file {missing}: cannot be read (No such file or directory)"
        in str(err.value)
    )


def test_a_key_of_another_certificate_is_refused_naming_both_files(pem: dict[str, Path]) -> None:
    tls = TlsConfig(cert_file=pem["cert"], key_file=pem["other_key"])
    with pytest.raises(ServingConfigError) as err:
        check(tls)
    assert str(err.value) == (
        f"tls: key_file {pem['other_key']} is not the private key of cert_file {pem['cert']}: give the key"
        " the certificate was issued for"
    )


def test_a_file_that_is_not_pem_is_refused(tmp_path: Path, pem: dict[str, Path]) -> None:
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    with pytest.raises(ServingConfigError, match=f"cert_file {junk} and key_file"):
        check(TlsConfig(cert_file=junk, key_file=pem["key"]))
    with pytest.raises(ServingConfigError, match=f"client_ca_file {junk} is not a readable PEM"):
        check(TlsConfig(cert_file=pem["cert"], key_file=pem["key"], client_ca_file=junk))


def test_the_options_lay_over_the_config(pem: dict[str, Path]) -> None:
    configured = TlsConfig(cert_file=pem["cert"], key_file=pem["key"])
    assert from_options(configured, None, None, None) is configured
    assert from_options(None, None, None, None) is None
    with_ca = from_options(configured, None, None, pem["ca"])
    assert with_ca == TlsConfig(cert_file=pem["cert"], key_file=pem["key"], client_ca_file=pem["ca"])
    with pytest.raises(ServingConfigError, match="--tls-key missing"):
        from_options(None, pem["cert"], None, None)
    with pytest.raises(ServingConfigError, match=r"TLS options: cert_file /nope\.pem: cannot be read"):
        from_options(None, Path("/nope.pem"), pem["key"], None)


def test_plaintext_off_loopback_warns() -> None:
    assert plaintext_warning("127.0.0.1", None) is None
    assert plaintext_warning("localhost", None) is None
    warning = plaintext_warning("0.0.0.0", None)
    assert warning is not None
    assert warning.startswith("no TLS on 0.0.0.0: ")


def test_client_tls_from_the_environment(pem: dict[str, Path]) -> None:
    assert ClientTls.from_env({}) is None
    env = {ENV_CA: str(pem["ca"]), ENV_CERT: str(pem["client_cert"]), ENV_KEY: str(pem["client_key"])}
    tls = ClientTls.from_env(env)
    assert tls == ClientTls(pem["ca"], pem["client_cert"], pem["client_key"])
    assert tls is not None
    assert tls.ssl_context().verify_mode == ssl.CERT_REQUIRED
    with pytest.raises(ClientTlsError, match="give both cert_file and key_file"):
        ClientTls.from_env({ENV_CERT: str(pem["client_cert"])})
    with pytest.raises(ClientTlsError, match=r"TLS ca_file /nope\.pem: no such file"):
        ClientTls(Path("/nope.pem"))


_VALUE = st.one_of(
    st.none(),
    st.integers(),
    st.text(max_size=30),
    st.lists(st.text(max_size=5), max_size=3),
    st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=2),
    st.sampled_from(["/dev/null", "/", "/etc/hostname", "/nonexistent/x.pem", "", "."]),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    section=st.one_of(
        _VALUE,
        st.dictionaries(
            st.sampled_from(["cert_file", "key_file", "client_ca_file", "other"]), _VALUE, max_size=4
        ),
    )
)
def test_any_tls_section_is_a_diagnostic_never_a_traceback(tmp_path: Path, section: object) -> None:
    import json

    path = tmp_path / "serving.json.yaml"
    path.write_text(json.dumps({"tls": section}))
    message = ""
    try:
        check(load_config(path).tls)
    except ServingConfigError as exc:
        message = str(exc)
    # refused in the file's reading (naming the file) or at the check of the PEM files (naming the field)
    assert message == "" or message.startswith((f"serving config {path}", "tls: "))
