"""Credentials on a real server process (issue 32 items 1, 2 and 4): REST and gRPC, API keys and JWTs.

The server is ``edge_limits_server.py`` (uvicorn with ``headwater serve``'s options and the gRPC
edge over an in-memory store) with an ``auth:`` section: a key file and a JWKS file generated here.

- no credential: 401 / UNAUTHENTICATED; an expired token and an unknown key the same, with one
  message; a credential without the role: 403 / PERMISSION_DENIED;
- a caller's ``x-user-class`` (REST header, gRPC metadata) is ignored: the request is counted under
  the credential's class; a trusted gateway's header is honoured;
- a non-JSON write is 415; /health is open, /metrics needs admin;
- the Python client sends its token over both protocols;
- a key added to the running server's key file works at once, one removed is refused at once;
- hypothesis over the gRPC authorization and class metadata: OK, UNAUTHENTICATED or
  PERMISSION_DENIED, never another code.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from hypothesis import given, settings
from hypothesis import strategies as st

from headwater.client import RankingClient, RankingRequestError
from headwater.client.proto.headwater.v1 import ranking_pb2 as pb
from headwater.serving.auth import INVALID, MISSING, new_api_key

HERE = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location("edge_limits_server", HERE / "edge_limits_server.py")
assert _spec is not None
assert _spec.loader is not None
edge_server = sys.modules.setdefault("edge_limits_server", importlib.util.module_from_spec(_spec))
_spec.loader.exec_module(edge_server)
RANKER, ADMIN, GATEWAY = new_api_key(), new_api_key(), new_api_key()
PRIVATE = rsa.generate_private_key(public_exponent=65537, key_size=2048)
ISSUER, AUDIENCE = "https://idp.test", "headwater-test"
BODY: dict[str, Any] = {"user_id": "u1", "candidates": ["i0", "i1", "i2"], "k": 2, "log_impressions": False}


def _keys(*extra: dict[str, Any]) -> str:
    return json.dumps({"keys": [
        {"id": "ranker", "sha256": RANKER[1], "roles": ["rank"], "user_class": "new"},
        {"id": "admin", "sha256": ADMIN[1], "roles": ["rank", "feedback", "admin"], "user_class": "vip"},
        {"id": "gw", "sha256": GATEWAY[1], "roles": ["rank", "gateway"]},
        *extra,
    ]})  # fmt: skip


def _token(**claims: Any) -> str:
    now = int(time.time())
    body = {"sub": "svc-a", "iss": ISSUER, "aud": AUDIENCE, "exp": now + 300, "roles": ["rank"], **claims}
    return jwt.encode(body, PRIVATE, algorithm="RS256", headers={"kid": "main"})


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("auth")
    keys = tmp / "keys.yaml"
    keys.write_text(_keys())
    jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(PRIVATE.public_key()))
    (tmp / "jwks.json").write_text(json.dumps({"keys": [{**jwk, "kid": "main"}]}))
    config = {
        "editorial_items": ["i2"], "item_cache_ttl_s": 0.0, "io_threads": 2, "feedback": {"enabled": False},
        "auth": {"api_keys_file": str(keys), "reload_check_s": 0.0,
                 "jwt": {"jwks": str(tmp / "jwks.json"), "issuer": ISSUER, "audience": AUDIENCE}},
    }  # fmt: skip
    with edge_server.running(tmp, config) as running:
        yield {**running, "keys": keys}


def _bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


def _admitted(url: str, user_class: str) -> float:
    text = httpx.get(f"{url}/metrics", headers=_bearer(ADMIN[0]), timeout=10).text
    want = f'headwater_admission_requests_total{{result="admitted",user_class="{user_class}"}} '
    return next((float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(want)), 0.0)


def _grpc_rank(target: str, metadata: tuple[tuple[str, str], ...]) -> tuple[grpc.StatusCode, str]:
    with grpc.insecure_channel(target) as channel:
        rank = channel.unary_unary(
            "/headwater.v1.Ranking/Rank",
            request_serializer=pb.RankRequest.SerializeToString,
            response_deserializer=pb.RankResponse.FromString,
        )
        try:
            rank(pb.RankRequest(**BODY), timeout=30, metadata=metadata)
        except grpc.RpcError as exc:
            return exc.code(), exc.details() or ""
        return grpc.StatusCode.OK, ""


def test_rest_refusals_say_only_what_they_must(server: dict[str, Any]) -> None:
    url = server["url"]
    expired = _token(exp=int(time.time()) - 60)
    cases = [
        ({}, 401, MISSING), (_bearer(expired), 401, INVALID), (_bearer("hw_nope"), 401, INVALID),
        (_bearer(_token(aud="other")), 401, INVALID), (_bearer(_token(roles=["feedback"])), 403, None),
    ]  # fmt: skip
    for headers, status, detail in cases:
        got = httpx.post(f"{url}/v1/rank", json=BODY, headers=headers, timeout=10)
        assert got.status_code == status, (headers, got.text)
        assert set(got.json()) == {"detail", "errors"}
        if detail is not None:
            assert got.json()["detail"] == detail
    feedback = {"user_id": "u1", "item_id": "i1", "event_type": "click"}
    got = httpx.post(f"{url}/v1/feedback", json=feedback, headers=_bearer(RANKER[0]), timeout=10)
    assert got.status_code == 403
    raw = httpx.post(f"{url}/v1/rank", content=json.dumps(BODY), headers=_bearer(RANKER[0]), timeout=10)
    assert raw.status_code == 415  # the browser's no-preflight POST
    assert httpx.get(f"{url}/metrics", timeout=10).status_code == 401
    assert httpx.get(f"{url}/metrics", headers=_bearer(RANKER[0]), timeout=10).status_code == 403
    assert httpx.post(f"{url}/v1/rank", json=BODY, headers=_bearer(_token()), timeout=10).status_code == 200


def test_grpc_refusals_are_unauthenticated_and_permission_denied(server: dict[str, Any]) -> None:
    target = server["grpc"]
    expired = _token(exp=int(time.time()) - 60)
    assert _grpc_rank(target, ()) == (grpc.StatusCode.UNAUTHENTICATED, MISSING)
    assert _grpc_rank(target, (("authorization", f"Bearer {expired}"),)) == (
        grpc.StatusCode.UNAUTHENTICATED, INVALID,
    )  # fmt: skip
    code, _ = _grpc_rank(target, (("authorization", f"Bearer {_token(roles=['feedback'])}"),))
    assert code == grpc.StatusCode.PERMISSION_DENIED
    assert _grpc_rank(target, (("authorization", f"Bearer {RANKER[0]}"),)) == (grpc.StatusCode.OK, "")


def test_a_spoofed_class_is_ignored_and_the_gateways_honoured(server: dict[str, Any]) -> None:
    url, target = server["url"], server["grpc"]
    before = {c: _admitted(url, c) for c in ("vip", "new", "regular")}
    spoofed = _bearer(RANKER[0]) | {"x-user-class": "vip"}
    claimed = {**BODY, "user_class": "vip"}
    assert httpx.post(f"{url}/v1/rank", json=claimed, headers=spoofed, timeout=10).is_success
    assert _grpc_rank(target, tuple(spoofed.items()))[0] == grpc.StatusCode.OK
    after = {c: _admitted(url, c) for c in ("vip", "new", "regular")}
    assert (after["vip"] - before["vip"], after["new"] - before["new"]) == (0.0, 2.0)
    via = _bearer(GATEWAY[0]) | {"x-user-class": "vip"}
    assert httpx.post(f"{url}/v1/rank", json=BODY, headers=via, timeout=10).is_success
    assert _grpc_rank(target, tuple(via.items()))[0] == grpc.StatusCode.OK
    assert _admitted(url, "vip") - after["vip"] == 2.0


def test_the_client_sends_its_token_over_rest_and_grpc(server: dict[str, Any]) -> None:
    for protocol, where in (("rest", server["url"]), ("grpc", server["grpc"])):
        with RankingClient(where, protocol=protocol, token=RANKER[0], timeout_s=10) as client:  # type: ignore[arg-type]
            result = client.rank("u1", ["i0", "i1", "i2"], k=2, log_impressions=False)
            assert result.source == "service"
            assert result.item_ids == ["i2", "i0"]
        with RankingClient(where, protocol=protocol, timeout_s=10) as client:  # type: ignore[arg-type]
            with pytest.raises(RankingRequestError) as refused:
                client.rank("u1", ["i0", "i1", "i2"], k=2)
            assert refused.value.status == 401
            assert client.breaker.state == "closed"


def test_keys_rotate_in_the_running_server(server: dict[str, Any]) -> None:
    url, keys = server["url"], server["keys"]
    fresh = new_api_key()
    keys.write_text(_keys({"id": "fresh", "sha256": fresh[1], "roles": ["rank"]}))
    time.sleep(0.05)
    assert httpx.post(f"{url}/v1/rank", json=BODY, headers=_bearer(fresh[0]), timeout=10).status_code == 200
    keys.write_text(_keys())  # revoked
    time.sleep(0.05)
    assert httpx.post(f"{url}/v1/rank", json=BODY, headers=_bearer(fresh[0]), timeout=10).status_code == 401
    assert httpx.post(f"{url}/v1/rank", json=BODY, headers=_bearer(RANKER[0]), timeout=10).status_code == 200


METADATA_TEXT = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=60)


@settings(max_examples=60, deadline=None)
@given(
    scheme=st.sampled_from(["Bearer ", "bearer ", "Basic ", ""]),
    value=st.one_of(METADATA_TEXT, st.sampled_from([RANKER[0], GATEWAY[0], "a.b.c", "e30.e30.e30"])),
    user_class=st.one_of(st.none(), METADATA_TEXT, st.sampled_from(["vip", "VIP", " new "])),
)
def test_any_grpc_authorization_and_class_metadata_is_ok_or_refused_never_an_error(
    server: dict[str, Any], scheme: str, value: str, user_class: str | None
) -> None:
    metadata: tuple[tuple[str, str], ...] = (("authorization", scheme + value),)
    if user_class is not None:
        metadata += (("x-user-class", user_class),)
    code, _ = _grpc_rank(server["grpc"], metadata)
    allowed = (grpc.StatusCode.OK, grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED)
    assert code in allowed
