"""The real `headwater serve` and `headwater ingest serve` over HTTPS and gRPC TLS, with and without mTLS.

Certificates come from ``infra/certs.sh`` at test time (a throwaway CA; the server's SAN is
127.0.0.1 and localhost), plus a second, unrelated CA for the "wrong CA" cases. `headwater serve`
runs on real Redis (a fresh namespace, no model: the popularity step answers) with ``--tls-cert
--tls-key`` (and ``--tls-client-ca`` for mTLS) on both its ports; `headwater ingest serve` on real
Kafka over the example plan's sources, with mTLS on REST and gRPC. Each case asserts the answer's
values or the refusal's reason: a call with the CA gets the same ranking over REST and gRPC, a
plaintext call or one trusting another CA gets no answer, and with mTLS a client without a
certificate is refused while one with it passes.
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import ssl
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from headwater.client import IngestClient, RankingClient
from headwater.client.ingest import IngestUnavailable
from headwater.client.tls import ENV_CA, ENV_CERT, ENV_KEY, ClientTls
from headwater.client.transport import GrpcTransport, NoAnswer, RestTransport
from headwater.ranking.features import load_registry
from headwater.ranking.synthetic import make_world, write_world
from headwater.serving.config import DEFAULT_POPULARITY
from headwater.serving.store import OnlineStoreReader, now_ms

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]
HEADWATER = str(Path(sys.executable).with_name("headwater"))

_spec = importlib.util.spec_from_file_location("edge_service", Path(__file__).with_name("edge_service.py"))
assert _spec is not None
assert _spec.loader is not None
edge = sys.modules.setdefault("edge_service", importlib.util.module_from_spec(_spec))
_spec.loader.exec_module(edge)


@dataclass(frozen=True)
class Certs:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path
    """An authority that signed nothing of the server's: trusting only it must fail."""

    def client(self, with_cert: bool = True) -> ClientTls:
        return ClientTls(self.ca, self.client_cert, self.client_key) if with_cert else ClientTls(self.ca)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    root = tmp_path_factory.mktemp("certs")
    for name in ("a", "b"):
        subprocess.run(
            ["bash", str(ROOT / "infra" / "certs.sh"), str(root / name)], check=True, capture_output=True
        )
    a = root / "a"
    return Certs(a / "ca.pem", a / "server.pem", a / "server.key", a / "client.pem", a / "client.key",
                 root / "b" / "ca.pem")  # fmt: skip


def _https_health(url: str, context: ssl.SSLContext) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=2, verify=context).status_code == 200
    except httpx.HTTPError:
        return False


def _listens(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


@contextmanager
def _process(cmd: list[str], log: Path, url: str, grpc_port: int, context: ssl.SSLContext,
             env: dict[str, str] | None = None) -> Iterator[subprocess.Popen[bytes]]:  # fmt: skip
    """Run ``cmd`` until the block ends; wait for its HTTPS /health (with ``context``) and gRPC port."""
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + 180
        while not (_https_health(url, context) and _listens(grpc_port)):
            assert proc.poll() is None, log.read_text(errors="replace")[-3000:]
            assert time.monotonic() < deadline, log.read_text(errors="replace")[-3000:]
            time.sleep(0.3)
        yield proc
    finally:
        proc.terminate()
        proc.wait(30)


@dataclass
class Served:
    url: str
    grpc: str
    world: Any
    log: Path


@contextmanager
def _ranking_service(tmp: Path, redis_url: str, certs: Certs, mtls: bool) -> Iterator[Served]:
    """`headwater serve` with TLS on REST and gRPC (mTLS with ``mtls``) over a small world in real Redis."""
    state = tmp / "state"
    cmd = [HEADWATER, "apply", str(ROOT / "features"), "--state-dir", str(state), "--no-feast"]
    subprocess.run(cmd, check=True, cwd=ROOT, capture_output=True)
    registry = load_registry(state, DEFAULT_POPULARITY)
    world = make_world(registry, users=10, items=40, seed=5)
    namespace = f"t{uuid.uuid4().hex[:8]}"
    reader = OnlineStoreReader.from_url(redis_url, namespace=namespace)
    write_world(reader, registry, world, now_ms())
    port, grpc_port = edge.free_port(), edge.free_port()
    serve = [HEADWATER, "serve", "--no-auth", "--port", str(port), "--grpc-port", str(grpc_port),
             "--state-dir", str(state), "--redis-url", redis_url, "--namespace", namespace, "--no-feedback",
             "--no-retrieval", "--device", "cpu", "--tls-cert", str(certs.server_cert),
             "--tls-key", str(certs.server_key)]  # fmt: skip
    if mtls:
        serve += ["--tls-client-ca", str(certs.ca)]
    url = f"https://127.0.0.1:{port}"
    log = tmp / "serve.log"
    try:
        with _process(serve, log, url, grpc_port, certs.client(with_cert=True).ssl_context()):
            yield Served(url, f"127.0.0.1:{grpc_port}", world, log)
    finally:
        edge.drop_namespace(redis_url, namespace)
        reader.close()


@pytest.fixture(scope="module")
def tls_service(tmp_path_factory: pytest.TempPathFactory, redis_url: str, certs: Certs) -> Iterator[Served]:
    with _ranking_service(tmp_path_factory.mktemp("tls"), redis_url, certs, mtls=False) as served:
        yield served


@pytest.fixture(scope="module")
def mtls_service(tmp_path_factory: pytest.TempPathFactory, redis_url: str, certs: Certs) -> Iterator[Served]:
    with _ranking_service(tmp_path_factory.mktemp("mtls"), redis_url, certs, mtls=True) as served:
        yield served


def _body(served: Served) -> dict[str, Any]:
    return {"user_id": served.world.user_ids[0], "candidates": served.world.item_ids[:30], "k": 5}


def _ranked(reply: Any) -> list[str]:
    assert reply.status == 200, reply.detail
    return [item["item_id"] for item in reply.body["items"]]


def test_https_and_grpc_tls_with_the_ca_answer_the_same_ranking(tls_service: Served, certs: Certs) -> None:
    body = _body(tls_service)
    tls = ClientTls(certs.ca)
    rest = RestTransport(tls_service.url, tls=tls)
    grpc = GrpcTransport(tls_service.grpc, tls=tls)
    try:
        over_rest = _ranked(rest.call(body, 30.0))
        over_grpc = _ranked(grpc.call(body, 30.0))
    finally:
        rest.close()
        grpc.close()
    assert len(over_rest) == 5
    assert set(over_rest) <= set(body["candidates"])
    assert over_rest == over_grpc
    # the client library over both protocols, and the start line says TLS is on
    for protocol, target in (("rest", tls_service.url), ("grpc", tls_service.grpc)):
        with RankingClient(target, protocol=protocol, tls=tls, timeout_s=30.0, retries=0) as client:  # type: ignore[arg-type]
            result = client.rank(body["user_id"], body["candidates"], k=5)
        assert (result.source, result.item_ids) == ("service", over_rest)
    log = tls_service.log.read_text(errors="replace")
    assert f"serving on {tls_service.url}" in log
    assert "tls=on" in log


def test_plaintext_and_a_wrong_ca_get_no_answer(tls_service: Served, certs: Certs) -> None:
    body = _body(tls_service)
    plain_url = tls_service.url.replace("https://", "http://")
    cases: list[tuple[Any, str]] = [
        (RestTransport(plain_url), "RemoteProtocolError|ReadError|ConnectError"),
        (GrpcTransport(tls_service.grpc), "UNAVAILABLE"),
        (RestTransport(tls_service.url, tls=ClientTls(certs.other_ca)), "CERTIFICATE_VERIFY_FAILED"),
        (GrpcTransport(tls_service.grpc, tls=ClientTls(certs.other_ca)), "UNAVAILABLE"),
    ]
    for transport, reason in cases:
        try:
            with pytest.raises(NoAnswer) as refused:
                transport.call(body, 10.0)
        finally:
            transport.close()
        assert any(word in str(refused.value) for word in reason.split("|")), str(refused.value)


def test_mtls_refuses_a_client_without_a_certificate_and_serves_one_with_it(
    mtls_service: Served, certs: Certs
) -> None:
    body = _body(mtls_service)
    with_cert, without = certs.client(with_cert=True), certs.client(with_cert=False)
    rest = RestTransport(mtls_service.url, tls=with_cert)
    grpc = GrpcTransport(mtls_service.grpc, tls=with_cert)
    try:
        over_rest, over_grpc = _ranked(rest.call(body, 30.0)), _ranked(grpc.call(body, 30.0))
    finally:
        rest.close()
        grpc.close()
    assert len(over_rest) == 5
    assert over_rest == over_grpc
    refused: list[Any] = [
        RestTransport(mtls_service.url, tls=without),
        GrpcTransport(mtls_service.grpc, tls=without),
    ]
    for transport in refused:
        try:
            with pytest.raises(NoAnswer):
                transport.call(body, 10.0)
        finally:
            transport.close()
    assert "tls=mtls" in mtls_service.log.read_text(errors="replace")


def test_the_rank_command_takes_the_tls_files_from_the_environment(
    mtls_service: Served, certs: Certs
) -> None:
    body = _body(mtls_service)
    cmd = [HEADWATER, "rank", body["user_id"], *body["candidates"], "-k", "5", "--json"]
    cmd += ["--url", mtls_service.url]
    env = {**os.environ, ENV_CA: str(certs.ca), ENV_CERT: str(certs.client_cert)}
    env[ENV_KEY] = str(certs.client_key)
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    with RankingClient(mtls_service.url, tls=certs.client(), timeout_s=30.0, retries=0) as client:
        expected = client.rank(body["user_id"], body["candidates"], k=5).item_ids
    assert [i["item_id"] for i in answer["items"]] == expected
    # without the client certificate the command says it reached no service, without a traceback
    env.pop(ENV_CERT)
    env.pop(ENV_KEY)
    refused = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 1
    assert "no ranking service at" in refused.stderr
    assert "Traceback" not in refused.stderr


# -- the push API ------------------------------------------------------------------------------------------

_HARNESS = Path(__file__).parents[1] / "pipelines" / "nearline" / "harness.py"
_hspec = importlib.util.spec_from_file_location("nl_harness_tls", _HARNESS)
assert _hspec is not None
assert _hspec.loader is not None
h = importlib.util.module_from_spec(_hspec)
sys.modules["nl_harness_tls"] = h
_hspec.loader.exec_module(h)


@pytest.fixture
def ingest_service(
    settings: Any, kafka_bootstrap: str, redis_url: str, tmp_path: Path, certs: Certs
) -> Iterator[dict[str, str]]:
    """`headwater ingest serve` with mTLS on REST and gRPC, over the example plan's sources on real Kafka."""
    from headwater.registry.plans import build_plans, plan_path, registry_hash

    env = h.Env(settings=settings, tmp=tmp_path)
    env.create_example()
    result = h.example_check()
    offline = build_plans(result, registry_hash(result))["offline"]
    sources = [s.model_copy(update={"topic": env.topics.get(s.name, s.topic)}) for s in offline.sources]
    plan_path(tmp_path, "offline").write_text(
        offline.model_copy(update={"sources": sources}).model_dump_json(), encoding="utf-8"
    )
    port, grpc_port = edge.free_port(), edge.free_port()
    cmd = [HEADWATER, "ingest", "serve", "--state-dir", str(tmp_path), "--port", str(port),
           "--grpc-port", str(grpc_port), "--no-auth", "--tls-cert", str(certs.server_cert),
           "--tls-key", str(certs.server_key), "--tls-client-ca", str(certs.ca)]  # fmt: skip
    url = f"https://127.0.0.1:{port}"
    try:
        with _process(cmd, tmp_path / "ingest.log", url, grpc_port, certs.client().ssl_context(), env.env()):
            yield {"url": url, "grpc": f"127.0.0.1:{grpc_port}", "log": str(tmp_path / "ingest.log")}
    finally:
        env.cleanup()


def _payments(n: int, tag: str) -> list[dict[str, Any]]:
    start_us = time.time_ns() // 1000 - 60_000_000
    return [
        {"payment_id": f"tls-{tag}-{i:04d}", "account_id": f"acct-{i % 7:04d}", "merchant_id": "m-001",
         "method": "card", "status": "captured", "amount": 10.0 + i, "currency": "EUR", "risk_score": 0.1,
         "occurred_at": start_us + i * 1000}
        for i in range(n)
    ]  # fmt: skip


def test_ingest_serve_over_mtls_accepts_a_certified_client_only(
    ingest_service: dict[str, str], certs: Certs
) -> None:
    bad = {**_payments(1, "bad")[0], "amount": "not a number"}
    with IngestClient(ingest_service["url"], "payments", tls=certs.client(), batch_size=50) as client:
        outcomes = client.send([*_payments(20, "rest"), bad])
    assert [o.status for o in outcomes] == ["accepted"] * 20 + ["rejected"]
    assert outcomes[-1].field == "amount"
    with IngestClient(ingest_service["grpc"], "payments", tls=certs.client(), protocol="grpc",
                      event_id_field="payment_id") as client:  # fmt: skip
        outcomes = client.send(_payments(10, "grpc"))
    assert [o.status for o in outcomes] == ["accepted"] * 10
    refused: list[dict[str, Any]] = [
        {"url": ingest_service["url"], "tls": certs.client(with_cert=False)},
        {"url": ingest_service["url"].replace("https://", "http://"), "tls": None},
        {"url": ingest_service["url"], "tls": ClientTls(certs.other_ca, certs.client_cert, certs.client_key)},
        {"url": ingest_service["grpc"], "tls": certs.client(with_cert=False), "protocol": "grpc"},
    ]
    for case in refused:
        client = IngestClient(case["url"], "payments", tls=case["tls"], protocol=case.get("protocol", "rest"),
                              event_id_field="payment_id", max_attempts=1)  # fmt: skip
        with pytest.raises(IngestUnavailable):
            client.send(_payments(3, "refused"))
        client._pending.clear()  # nothing to flush on close: the point is that it was refused
        client.close()
    log = Path(ingest_service["log"]).read_text(errors="replace")
    assert f"push API on {ingest_service['url']}" in log
    assert "push API over gRPC TLS" in log
