"""Credentials and roles at the edge (issue 32 items 1 and 2), in process.

- API keys are stored as SHA-256, compared with every entry; a rewritten key file rotates them
  without a restart (and a broken rewrite keeps the last good keys);
- JWTs against a JWKS generated here: good, expired, not yet valid, wrong audience, wrong issuer,
  ``alg: none``, an HMAC signed with the public key, an unknown kid, an algorithm off the list;
- the class comes from the credential; a caller's ``x-user-class`` and body ``user_class`` are
  ignored unless the credential is a trusted gateway's; a credential's own quota, feedback included;
- REST: 401 without a credential, 403 without the role, 415 for a write that is not JSON, /health
  open, /metrics for admin; hypothesis over the Authorization and class headers: 200, 401 or 403,
  never a 5xx.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from fastapi.testclient import TestClient
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import generate_latest

from headwater.ranking.synthetic import small_registry
from headwater.serving.admission import Admission, Throttled
from headwater.serving.app import create_app
from headwater.serving.auth import (
    INVALID,
    MISSING,
    OPEN,
    AuthConfigError,
    Authenticator,
    AuthError,
    Forbidden,
    Identity,
    Unauthenticated,
    key_hash,
    new_api_key,
)
from headwater.serving.config import AdmissionConfig, AuthConfig, JwtConfig, ServingConfig
from headwater.serving.runtime import LoadedModels
from headwater.serving.store import InMemoryFeatureStore

REGISTRY = small_registry({"u": ["a", "b"]}, {"i": ["x"]}, "i.x", registry_hash="sha256:" + "57" * 32)
NO_MODELS = LoadedModels(None, None, None, None, "cpu")
BODY: dict[str, Any] = {"user_id": "u1", "candidates": ["i0", "i1", "i2"], "k": 2}
RANKER, ADMIN, GATEWAY, LIMITED = (new_api_key() for _ in range(4))
ISSUER, AUDIENCE = "https://idp.example", "headwater"
PRIVATE = rsa.generate_private_key(public_exponent=65537, key_size=2048)
OTHER = rsa.generate_private_key(public_exponent=65537, key_size=2048)
EC_PRIVATE = ec.generate_private_key(ec.SECP256R1())


def key_doc(*entries: tuple[str, str, list[str], str | None, dict[str, float] | None]) -> str:
    keys = [
        {
            "id": i,
            "sha256": h,
            "roles": roles,
            **({"user_class": c} if c else {}),
            **({"quota": q} if q else {}),
        }
        for i, h, roles, c, q in entries
    ]
    return json.dumps({"keys": keys})


DOC = key_doc(
    ("ranker", RANKER[1], ["rank"], "new", None),
    ("admin", ADMIN[1], ["admin", "rank", "feedback"], "vip", None),
    ("edge-gw", GATEWAY[1], ["rank", "feedback", "gateway"], "regular", None),
    ("limited", LIMITED[1], ["rank", "feedback"], None, {"rate_per_s": 1.0, "burst": 2.0}),
)


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


@pytest.fixture
def keys_file(tmp_path: Path) -> Path:
    path = tmp_path / "keys.yaml"
    path.write_text(DOC)
    return path


def jwks_file(tmp_path: Path) -> Path:
    rsa_jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(PRIVATE.public_key()))
    ec_jwk = json.loads(jwt.algorithms.ECAlgorithm.to_jwk(EC_PRIVATE.public_key()))
    path = tmp_path / "jwks.json"
    path.write_text(json.dumps({"keys": [{**rsa_jwk, "kid": "k1", "use": "sig"}, {**ec_jwk, "kid": "k2"}]}))
    return path


def token(
    claims: dict[str, Any] | None = None, key: Any = PRIVATE, alg: str = "RS256", kid: str = "k1"
) -> str:
    now = int(time.time())
    body = {"sub": "alice", "iss": ISSUER, "aud": AUDIENCE, "exp": now + 300, "iat": now, "roles": ["rank"],
            "user_class": "vip", **(claims or {})}  # fmt: skip
    return jwt.encode(body, key, algorithm=alg, headers={"kid": kid})


def jwt_auth(tmp_path: Path) -> Authenticator:
    config = JwtConfig(jwks=str(jwks_file(tmp_path)), issuer=ISSUER, audience=AUDIENCE, leeway_s=0)
    return Authenticator(AuthConfig(jwt=config, reload_check_s=0))


# --- API keys -------------------------------------------------------------------------------------------


def test_a_key_is_found_by_its_hash_with_its_roles_class_and_quota(keys_file: Path) -> None:
    auth = Authenticator(AuthConfig(api_keys_file=keys_file))
    assert RANKER[1] == key_hash(RANKER[0])
    assert RANKER[0].startswith("hw_")
    assert RANKER[0] not in DOC
    got = auth.authenticate(bearer(RANKER[0]), "rank")
    assert got == Identity("key:ranker", frozenset({"rank"}), "new", None, "credential")
    limited = auth.authenticate(bearer(LIMITED[0]), "feedback")
    assert limited.quota is not None
    assert (limited.quota.rate_per_s, limited.quota.capacity) == (1.0, 2.0)
    assert auth.authenticate(bearer(GATEWAY[0]), "rank").class_source == "gateway"
    assert auth.authenticate({"authorization": f"bearer   {ADMIN[0]}  "}, "admin").subject == "key:admin"


def test_no_wrong_or_malformed_credential_is_401_and_a_missing_role_403(keys_file: Path) -> None:
    auth = Authenticator(AuthConfig(api_keys_file=keys_file))
    for headers, message in [
        ({}, MISSING), ({"authorization": "  "}, MISSING), (bearer(RANKER[0] + "x"), INVALID),
        ({"authorization": RANKER[0]}, INVALID), ({"authorization": f"Basic {RANKER[0]}"}, INVALID),
        ({"authorization": "Bearer"}, INVALID), (bearer(RANKER[1]), INVALID),  # the hash is not the key
        (bearer(token()), INVALID),  # a JWT where no JWKS is configured
    ]:  # fmt: skip
        with pytest.raises(Unauthenticated) as refused:
            auth.authenticate(headers, "rank")
        assert str(refused.value) == message
    with pytest.raises(Forbidden, match="'feedback' role needed"):
        auth.authenticate(bearer(RANKER[0]), "feedback")
    counts = {r: auth.refused.labels(r)._value.get() for r in ("missing", "invalid", "forbidden")}
    assert counts == {"missing": 2.0, "invalid": 6.0, "forbidden": 1.0}


def test_rewriting_the_key_file_rotates_keys_without_a_restart(keys_file: Path) -> None:
    auth = Authenticator(AuthConfig(api_keys_file=keys_file, reload_check_s=0))
    assert auth.authenticate(bearer(RANKER[0]), "rank").user_class == "new"
    fresh = new_api_key()
    keys_file.write_text(key_doc(("ranker", fresh[1], ["rank"], "regular", None)))
    with pytest.raises(Unauthenticated):
        auth.authenticate(bearer(RANKER[0]), "rank")  # the old key is gone at once
    assert auth.authenticate(bearer(fresh[0]), "rank").user_class == "regular"
    keys_file.write_text("keys: [{id: x, sha256: nothex, roles: [rank]}]\n")  # a broken rewrite
    assert auth.authenticate(bearer(fresh[0]), "rank").subject == "key:ranker"  # the last good keys stay


def test_the_key_file_is_looked_at_only_every_reload_check_s(keys_file: Path) -> None:
    now = [0.0]
    auth = Authenticator(AuthConfig(api_keys_file=keys_file, reload_check_s=1.0), clock=lambda: now[0])
    keys_file.write_text(key_doc())
    auth.authenticate(bearer(RANKER[0]), "rank")  # not looked at yet
    now[0] = 1.5
    with pytest.raises(Unauthenticated):
        auth.authenticate(bearer(RANKER[0]), "rank")


def test_keys_from_the_environment_and_clear_errors_for_bad_documents(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("HW_TEST_KEYS", DOC)
    auth = Authenticator(AuthConfig(api_keys_env="HW_TEST_KEYS"))
    assert auth.authenticate(bearer(ADMIN[0]), "admin").user_class == "vip"
    with pytest.raises(AuthConfigError, match="HW_TEST_UNSET is not set"):
        Authenticator(AuthConfig(api_keys_env="HW_TEST_UNSET"))
    bad = tmp_path / "bad.yaml"
    bad.write_text("keys:\n  - id: a\n    sha256: abc\n    roles: [rank]\n")
    with pytest.raises(AuthConfigError, match=r"bad.yaml: line 3: keys.0.sha256"):
        Authenticator(AuthConfig(api_keys_file=bad))
    with pytest.raises(AuthConfigError, match="cannot be read"):
        Authenticator(AuthConfig(api_keys_file=tmp_path / "missing.yaml"))
    twice = tmp_path / "twice.yaml"
    twice.write_text(key_doc(("a", RANKER[1], ["rank"], None, None), ("a", ADMIN[1], ["rank"], None, None)))
    with pytest.raises(AuthConfigError, match="unique"):
        Authenticator(AuthConfig(api_keys_file=twice))


def test_the_auth_section_needs_a_credential_source_and_safe_algorithms() -> None:
    with pytest.raises(ValueError, match="api_keys_file, api_keys_env or jwt"):
        AuthConfig()
    for algorithms in (("none",), ("HS256",), ()):
        with pytest.raises(ValueError, match="not allowed"):
            JwtConfig(jwks="x.json", issuer=ISSUER, audience=AUDIENCE, algorithms=algorithms)
    assert ServingConfig.model_validate({"auth": "none"}).auth == "none"
    assert ServingConfig().auth is None


# --- JWT -----------------------------------------------------------------------------------------------


def test_a_valid_token_gives_its_subject_roles_and_class(tmp_path: Path) -> None:
    auth = jwt_auth(tmp_path)
    got = auth.authenticate(bearer(token()), "rank")
    assert got == Identity("sub:alice", frozenset({"rank"}), "vip", None, "credential")
    scoped = auth.authenticate(bearer(token({"roles": "rank feedback bogus"})), "feedback")
    assert scoped.roles == frozenset({"rank", "feedback"})
    es = auth.authenticate(bearer(token(key=EC_PRIVATE, alg="ES256", kid="k2")), "rank")
    assert es.subject == "sub:alice"
    with pytest.raises(Forbidden):
        auth.authenticate(bearer(token({"roles": []})), "rank")


@pytest.mark.parametrize(
    "bad",
    [
        "expired", "not_yet", "audience", "issuer", "alg_none", "hmac_with_public_key", "unknown_kid",
        "other_key", "no_exp", "off_list", "garbage",
    ],
)  # fmt: skip
def test_an_invalid_token_is_401_with_one_message(tmp_path: Path, bad: str) -> None:
    auth = jwt_auth(tmp_path)
    now = int(time.time())
    public_pem = PRIVATE.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    tokens: dict[str, Callable[[], str]] = {
        "expired": lambda: token({"exp": now - 10}),
        "not_yet": lambda: token({"nbf": now + 600}),
        "audience": lambda: token({"aud": "someone-else"}),
        "issuer": lambda: token({"iss": "https://evil.example"}),
        "alg_none": lambda: jwt.encode({"sub": "x", "iss": ISSUER, "aud": AUDIENCE, "exp": now + 60,
                                        "roles": ["rank"]}, "", algorithm="none", headers={"kid": "k1"}),
        "hmac_with_public_key": lambda: _hs256(public_pem, now),
        "unknown_kid": lambda: token(kid="k9"),
        "other_key": lambda: token(key=OTHER),
        "no_exp": lambda: jwt.encode({"sub": "x", "iss": ISSUER, "aud": AUDIENCE, "roles": ["rank"]}, PRIVATE,
                                     algorithm="RS256", headers={"kid": "k1"}),
        "off_list": lambda: token(alg="RS512"),
        "garbage": lambda: "a.b.c",
    }  # fmt: skip
    made: Callable[[], str] = tokens[bad]
    with pytest.raises(Unauthenticated) as refused:
        auth.authenticate(bearer(made()), "rank")
    assert str(refused.value) == INVALID  # nothing of why
    reason = "expired" if bad == "expired" else "invalid"
    assert auth.refused.labels(reason)._value.get() == 1.0


def _hs256(secret: bytes, now: int) -> str:
    """A token signed HS256 with the public key's PEM as the secret (the classic key-confusion attack)."""
    import base64
    import hashlib
    import hmac

    def b64(raw: bytes) -> bytes:
        return base64.urlsafe_b64encode(raw).rstrip(b"=")

    head = b64(json.dumps({"alg": "HS256", "kid": "k1", "typ": "JWT"}).encode())
    claims = {"sub": "x", "iss": ISSUER, "aud": AUDIENCE, "exp": now + 60, "roles": ["rank"]}
    body = b64(json.dumps(claims).encode())
    signature = b64(hmac.new(secret, head + b"." + body, hashlib.sha256).digest())
    return (head + b"." + body + b"." + signature).decode()


def test_a_rotated_jwks_file_is_read_again(tmp_path: Path) -> None:
    auth = jwt_auth(tmp_path)
    with pytest.raises(Unauthenticated):
        auth.authenticate(bearer(token(key=OTHER, kid="k3")), "rank")
    other = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(OTHER.public_key()))
    (tmp_path / "jwks.json").write_text(json.dumps({"keys": [{**other, "kid": "k3"}]}))
    assert auth.authenticate(bearer(token(key=OTHER, kid="k3")), "rank").subject == "sub:alice"


# --- the class comes from the identity ------------------------------------------------------------------


def test_the_class_is_the_credentials_unless_a_gateway_says_otherwise() -> None:
    admission = Admission(AdmissionConfig(enabled=True))
    key = Identity("key:a", frozenset({"rank"}), "new")
    gateway = Identity("key:gw", frozenset({"rank", "gateway"}), "regular", None, "gateway")
    assert admission.admit("vip", "vip", "high", key) == admission.admit(None, None, None, key)
    assert admission.admit("vip", "vip", "high", key).priority == "low"  # spoofed header and body ignored
    assert admission.classify("VIP", "new", gateway) == "vip"  # the gateway's header
    assert admission.classify(None, "vip", gateway) == "regular"  # a body claim is not the gateway's
    assert admission.classify("gold", None, gateway) == "regular"
    assert admission.classify(None, None, Identity("key:b", frozenset({"rank"}))) == "regular"
    assert admission.classify("vip", None, OPEN) == "vip"  # auth: none: the caller's claim


def test_a_credentials_own_quota_applies_even_with_admission_off() -> None:
    now = [0.0]
    admission = Admission(AdmissionConfig(enabled=False), clock=lambda: now[0])
    limited = Identity("key:l", frozenset({"rank"}), None, AuthConfigQuota(rate_per_s=1.0, burst=2.0))
    admission.admit(None, None, None, limited)
    admission.admit(None, None, None, limited)
    with pytest.raises(Throttled, match="credential 'key:l' is over its quota of 1 requests/s") as over:
        admission.admit(None, None, None, limited)
    assert over.value.credential == "key:l"
    assert over.value.retry_after_header == "1"
    admission.admit(None, None, None, Identity("key:other", frozenset({"rank"})))  # others are not held
    now[0] = 1.0
    admission.admit(None, None, None, limited)


def AuthConfigQuota(**fields: float) -> Any:
    from headwater.serving.config import CredentialQuota

    return CredentialQuota(**fields)


# --- REST in process ------------------------------------------------------------------------------------


def _client(keys_file: Path, **admission: Any) -> TestClient:
    config = ServingConfig(
        editorial_items=("i2",), item_cache_ttl_s=0.0, io_threads=2,
        auth=AuthConfig(api_keys_file=keys_file, reload_check_s=0),
        admission=AdmissionConfig(**admission),
    )  # fmt: skip
    return TestClient(
        create_app(config, REGISTRY, InMemoryFeatureStore(), NO_MODELS), raise_server_exceptions=False
    )


def _admitted(client: TestClient, user_class: str) -> float:
    text = generate_latest(client.app.state.telemetry.registry).decode()  # type: ignore[attr-defined]
    want = f'headwater_admission_requests_total{{result="admitted",user_class="{user_class}"}} '
    return next((float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(want)), 0.0)


def test_rest_refuses_without_a_credential_or_role_and_serves_with_one(keys_file: Path) -> None:
    with _client(keys_file) as client:
        for path in ("/v1/rank", "/v1/recommend", "/v1/feedback"):
            got = client.post(path, json=BODY)
            assert (got.status_code, got.json()) == (401, {"detail": MISSING, "errors": []})
            assert got.headers["www-authenticate"] == "Bearer"
        got = client.post("/v1/rank", json=BODY, headers=bearer("hw_not-a-key"))
        assert (got.status_code, got.json()["detail"]) == (401, INVALID)
        feedback = {"user_id": "u1", "item_id": "i1", "event_type": "click"}
        got = client.post("/v1/feedback", json=feedback, headers=bearer(RANKER[0]))
        assert got.status_code == 403
        assert "'feedback' role needed" in got.json()["detail"]
        assert client.post("/v1/rank", json=BODY, headers=bearer(RANKER[0])).status_code == 200
        assert client.get("/health").status_code == 200  # liveness stays open
        assert client.get("/openapi.json").status_code == 200
        assert client.get("/metrics").status_code == 401
        assert client.get("/metrics", headers=bearer(RANKER[0])).status_code == 403
        metrics = client.get("/metrics", headers=bearer(ADMIN[0]))
        assert metrics.status_code == 200
        assert 'headwater_auth_refused_total{reason="missing"} 4.0' in metrics.text
        assert 'headwater_auth_refused_total{reason="forbidden"} 2.0' in metrics.text


def test_a_write_that_is_not_json_is_415_the_browser_csrf_case(keys_file: Path) -> None:
    raw = json.dumps(BODY).encode()
    with _client(keys_file) as client:
        for content_type in (None, "text/plain", "application/x-www-form-urlencoded", "multipart/form-data"):
            headers = bearer(ADMIN[0]) | ({"content-type": content_type} if content_type else {})
            got = client.post("/v1/rank", content=raw, headers=headers)
            assert got.status_code == 415, content_type
            assert "Content-Type: application/json" in got.json()["detail"]
        ok = client.post(
            "/v1/rank", content=raw, headers=bearer(ADMIN[0]) | {"content-type": "application/json"}
        )
        assert ok.status_code == 200


def test_a_spoofed_class_is_ignored_and_a_gateways_honoured(keys_file: Path) -> None:
    with _client(keys_file) as client:
        spoofed = client.post("/v1/rank", json={**BODY, "user_class": "vip"},
                              headers=bearer(RANKER[0]) | {"x-user-class": "vip"})  # fmt: skip
        assert spoofed.status_code == 200
        assert (_admitted(client, "vip"), _admitted(client, "new")) == (0.0, 1.0)  # the key's class: new
        via = client.post("/v1/rank", json=BODY, headers=bearer(GATEWAY[0]) | {"x-user-class": "vip"})
        assert via.status_code == 200
        assert _admitted(client, "vip") == 1.0
        plain = client.post("/v1/rank", json=BODY, headers=bearer(GATEWAY[0]))
        assert plain.status_code == 200
        assert _admitted(client, "regular") == 1.0  # the gateway's own class


def test_a_credentials_quota_covers_feedback_too(keys_file: Path) -> None:
    feedback = {"user_id": "u1", "item_id": "i1", "event_type": "click"}
    with _client(keys_file) as client:
        answers = [
            client.post("/v1/rank", json=BODY, headers=bearer(LIMITED[0])).status_code for _ in range(2)
        ]
        got = client.post("/v1/feedback", json=feedback, headers=bearer(LIMITED[0]))
        assert answers == [200, 200]
        assert got.status_code == 429
        assert got.headers["retry-after"] == "1"
        assert "credential 'key:limited' is over its quota" in got.json()["detail"]
        assert client.post("/v1/rank", json=BODY, headers=bearer(RANKER[0])).status_code == 200


HEADER_TEXT = st.text(
    st.characters(min_codepoint=0x20, max_codepoint=0xFF, exclude_characters="\x7f"), max_size=80
)


@pytest.fixture(scope="module")
def shared_client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Authenticator, TestClient]]:
    path = tmp_path_factory.mktemp("keys") / "keys.yaml"
    path.write_text(DOC)
    with _client(path) as client:
        yield Authenticator(AuthConfig(api_keys_file=path)), client


@settings(max_examples=150, deadline=None)
@given(
    scheme=st.sampled_from(["Bearer ", "bearer ", "Basic ", "", "Bearer  "]),
    value=st.one_of(HEADER_TEXT, st.sampled_from([RANKER[0], ADMIN[0], GATEWAY[0], "a.b.c", "e30.e30.e30"])),
    user_class=st.one_of(st.none(), HEADER_TEXT, st.sampled_from(["vip", "VIP", "new", " regular "])),
)
def test_any_authorization_and_class_header_is_200_401_or_403_never_5xx(
    shared_client: tuple[Authenticator, TestClient], scheme: str, value: str, user_class: str | None
) -> None:
    auth, client = shared_client
    headers = {"authorization": scheme + value} | (
        {"x-user-class": user_class} if user_class is not None else {}
    )
    try:
        got = auth.authenticate(headers, "rank")
    except AuthError:
        pass
    else:
        assert got.subject.startswith("key:")
    sent = {name: text.encode("latin-1") for name, text in headers.items()}  # any byte a header may hold
    answer = client.post("/v1/rank", json=BODY, headers=sent)
    assert answer.status_code in (200, 401, 403), answer.text


# --- headwater serve: an explicit choice -----------------------------------------------------------------


def test_serve_refuses_to_start_without_an_auth_choice_or_open_off_loopback(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from click.testing import CliRunner

    from headwater.cli.serve import serve

    runner = CliRunner()
    empty = tmp_path / "serving.yaml"
    empty.write_text("{}\n")
    got = runner.invoke(serve, ["--config", str(empty), "--state-dir", str(tmp_path / "none")])
    assert got.exit_code == 1
    assert "no `auth:` section" in got.output
    assert "auth: none" in got.output
    got = runner.invoke(serve, ["--no-auth", "--host", "0.0.0.0", "--state-dir", str(tmp_path / "none")])
    assert got.exit_code == 1
    assert "allowed only on a loopback address; --host 0.0.0.0" in got.output
    opened = tmp_path / "open.yaml"
    opened.write_text("auth: none\n")
    with caplog.at_level("WARNING"):  # on loopback it goes on (and fails later: no plans here)
        nowhere = str(tmp_path / "none")
        runner.invoke(serve, ["--config", str(opened), "--host", "::1", "--state-dir", nowhere])
    assert any("auth: none: every caller on ::1" in r.getMessage() for r in caplog.records)


def test_a_jwks_url_is_fetched_once_and_an_unknown_kid_refetches_at_most_every_30_s() -> None:
    import http.server
    import threading

    rsa_jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(PRIVATE.public_key()))
    served: dict[str, Any] = {"doc": json.dumps({"keys": [{**rsa_jwk, "kid": "k1"}]}), "fetches": 0}

    class Issuer(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            served["fetches"] += 1
            body = served["doc"].encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: Any) -> None:
            return None

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Issuer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    now = [0.0]
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/jwks.json"
        config = JwtConfig(jwks=url, issuer=ISSUER, audience=AUDIENCE)
        auth = Authenticator(AuthConfig(jwt=config), clock=lambda: now[0])
        for _ in range(3):
            assert auth.authenticate(bearer(token()), "rank").subject == "sub:alice"
        assert served["fetches"] == 1  # at start; then from the cache
        for _ in range(5):  # random kids cannot make the service hammer the issuer
            with pytest.raises(Unauthenticated):
                auth.authenticate(bearer(token(kid="rotated")), "rank")
        assert served["fetches"] == 1
        other = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(OTHER.public_key()))
        served["doc"] = json.dumps({"keys": [{**rsa_jwk, "kid": "k1"}, {**other, "kid": "rotated"}]})
        now[0] = 31.0  # the issuer rotated: the next unknown kid fetches the set again
        assert auth.authenticate(bearer(token(key=OTHER, kid="rotated")), "rank").subject == "sub:alice"
        assert served["fetches"] == 2
    finally:
        server.shutdown()
        server.server_close()


def test_a_verified_token_is_remembered_for_a_minute_at_most(tmp_path: Path) -> None:
    now = [0.0]
    config = JwtConfig(jwks=str(jwks_file(tmp_path)), issuer=ISSUER, audience=AUDIENCE, leeway_s=0)
    auth = Authenticator(AuthConfig(jwt=config, reload_check_s=0), clock=lambda: now[0])
    good, short = token(), token({"exp": int(time.time()) + 1})
    assert auth.authenticate(bearer(good), "rank").subject == "sub:alice"
    assert auth.authenticate(bearer(short), "rank").subject == "sub:alice"
    other = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(OTHER.public_key()))
    (tmp_path / "jwks.json").write_text(json.dumps({"keys": [{**other, "kid": "k9"}]}))  # k1 withdrawn
    now[0] = 59.0
    assert auth.authenticate(bearer(good), "rank").subject == "sub:alice"  # remembered, not checked
    now[0] = 61.0
    with pytest.raises(Unauthenticated):
        auth.authenticate(bearer(good), "rank")  # checked again: its key is gone
    time.sleep(max(0.0, int(time.time()) + 1.05 - time.time()) + 1.0)
    now[0] = 1.0  # within the minute, but past the token's exp
    with pytest.raises(Unauthenticated):
        auth.authenticate(bearer(short), "rank")


def test_the_command_line_client_sends_headwater_api_key(monkeypatch: pytest.MonkeyPatch) -> None:
    import io
    import urllib.request

    from headwater.cli import client as cli_client

    seen: dict[str, str] = {}

    class Answer:
        def __enter__(self) -> io.BytesIO:
            return io.BytesIO(b'{"ok": true}')

        def __exit__(self, *_: object) -> None:
            return None

    def urlopen(request: Any, timeout: float, context: Any = None) -> Answer:
        assert context is None  # no TLS options given: the default trust store (an http:// URL here)
        seen.update(dict(request.header_items()))
        return Answer()

    monkeypatch.setattr(urllib.request, "urlopen", urlopen)  # the module cli.client calls
    monkeypatch.delenv("HEADWATER_API_KEY", raising=False)
    assert cli_client.post("http://127.0.0.1:1", "/v1/rank", {}) == {"ok": True}
    assert "Authorization" not in seen
    monkeypatch.setenv("HEADWATER_API_KEY", "hw_demo")
    cli_client.post("http://127.0.0.1:1", "/v1/rank", {})
    assert seen["Authorization"] == "Bearer hw_demo"
    assert seen["Content-type"] == "application/json"
