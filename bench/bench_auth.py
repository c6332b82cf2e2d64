"""CPU per ``/v1/rank`` request with credentials on and off (issue 32), in process.

One app per variant (``create_app`` over an in-memory store, no model: the popularity and editorial
steps answer, so the figure is the edge's own cost), driven by Starlette's TestClient from one
thread; CPU is ``time.process_time`` of the whole process over ``--requests`` calls, after a warm-up.
Variants: ``auth: none``; an API key among ``--keys`` entries; an RS256 JWT; an ES256 JWT. Also the
authenticator alone (``authenticate`` per call: what the edge adds; a JWT's verification is
remembered for a minute) and a JWT's signature and claims check without that memory.

    .venv/bin/python bench/bench_auth.py --requests 2000

``--server``: the real ``headwater serve`` process instead (features/ applied, a small world in a
fresh namespace of the real Redis, no model), once plaintext with ``--no-auth`` and once with an
API key and TLS (``--tls-cert``/``--tls-key`` from ``infra/certs.sh``), side by side in one run:
requests/s and p50/p99 of ``/v1/rank`` with 100 candidates over one kept-alive connection, the
server's CPU per request (``/proc/PID/stat``), and a new connection's cost (connect + TLS
handshake, ``/health``) against a kept-alive call. Prints the table with ``uptime``'s load and
writes ``bench/results/bench_auth_server.json``.

    .venv/bin/python bench/bench_auth.py --server --requests 1000
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import jwt
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from fastapi.testclient import TestClient

from headwater.client.tls import ClientTls
from headwater.ranking.synthetic import small_registry
from headwater.serving.app import create_app
from headwater.serving.auth import Authenticator, new_api_key
from headwater.serving.config import AuthConfig, JwtConfig, ServingConfig
from headwater.serving.runtime import LoadedModels
from headwater.serving.store import InMemoryFeatureStore

REGISTRY = small_registry({"u": ["a", "b"]}, {"i": ["x"]}, "i.x", registry_hash="sha256:" + "58" * 32)
BODY: dict[str, Any] = {"user_id": "u1", "candidates": [f"i{n}" for n in range(100)], "k": 10,
                        "log_impressions": False}  # fmt: skip
ISSUER, AUDIENCE = "https://idp.bench", "headwater"


def _setup(folder: Path, keys: int) -> tuple[AuthConfig, dict[str, str]]:
    made = [new_api_key() for _ in range(keys)]
    entries = [{"id": f"k{n}", "sha256": h, "roles": ["rank"]} for n, (_, h) in enumerate(made)]
    (folder / "keys.yaml").write_text(json.dumps({"keys": entries}))
    rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    ec_key = ec.generate_private_key(ec.SECP256R1())
    jwks = [
        {**json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(rsa_key.public_key())), "kid": "r"},
        {**json.loads(jwt.algorithms.ECAlgorithm.to_jwk(ec_key.public_key())), "kid": "e"},
    ]
    (folder / "jwks.json").write_text(json.dumps({"keys": jwks}))
    claims = {
        "sub": "bench",
        "iss": ISSUER,
        "aud": AUDIENCE,
        "exp": int(time.time()) + 3600,
        "roles": ["rank"],
    }
    tokens = {
        "api_key": made[-1][0],  # the last entry: every entry is compared anyway
        "jwt_rs256": jwt.encode(claims, rsa_key, algorithm="RS256", headers={"kid": "r"}),
        "jwt_es256": jwt.encode(claims, ec_key, algorithm="ES256", headers={"kid": "e"}),
    }
    jwt_config = JwtConfig(jwks=str(folder / "jwks.json"), issuer=ISSUER, audience=AUDIENCE)
    return AuthConfig(api_keys_file=folder / "keys.yaml", jwt=jwt_config), tokens


def _cpu_per_request(config: ServingConfig, headers: dict[str, str], requests: int) -> float:
    app = create_app(config, REGISTRY, InMemoryFeatureStore(), LoadedModels(None, None, None, None, "cpu"))
    with TestClient(app) as client:
        for _ in range(200):
            assert client.post("/v1/rank", json=BODY, headers=headers).status_code == 200
        start = time.process_time()
        for _ in range(requests):
            client.post("/v1/rank", json=BODY, headers=headers)
        return (time.process_time() - start) / requests * 1e6


ROOT = Path(__file__).resolve().parents[1]
HEADWATER = str(Path(sys.executable).with_name("headwater"))
SERVER_RESULTS = ROOT / "bench" / "results" / "bench_auth_server.json"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (``/proc/PID/stat`` fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _measure(
    url: str, headers: dict[str, str], verify: Any, pid: int, body: dict[str, Any], n: int
) -> dict[str, Any]:
    with httpx.Client(base_url=url, headers=headers, verify=verify, timeout=30) as client:
        for _ in range(50):
            assert client.post("/v1/rank", json=body).status_code == 200
        times: list[float] = []
        cpu0, wall0 = _cpu_s(pid), time.perf_counter()
        for _ in range(n):
            t = time.perf_counter()
            answer = client.post("/v1/rank", json=body)
            times.append(time.perf_counter() - t)
            assert answer.status_code == 200, answer.text
        wall, cpu = time.perf_counter() - wall0, _cpu_s(pid) - cpu0
        kept = [0.0] * 30
        for i in range(30):
            t = time.perf_counter()
            client.get("/health")
            kept[i] = time.perf_counter() - t
    fresh = [0.0] * 30
    for i in range(30):
        with httpx.Client(base_url=url, verify=verify, timeout=30) as one:
            t = time.perf_counter()
            one.get("/health")
            fresh[i] = time.perf_counter() - t
    times.sort()
    return {
        "requests_per_s": round(n / wall, 1),
        "p50_ms": round(statistics.median(times) * 1e3, 2),
        "p99_ms": round(times[int(0.99 * (n - 1))] * 1e3, 2),
        "server_cpu_ms_per_request": round(cpu / n * 1e3, 3),
        "new_connection_ms_p50": round(statistics.median(fresh) * 1e3, 2),
        "kept_alive_health_ms_p50": round(statistics.median(kept) * 1e3, 2),
    }


def server_main(requests: int) -> None:
    """Measure the real `headwater serve`: plaintext without auth, then API key + TLS (see the module)."""
    import redis

    from headwater.ranking.features import load_registry
    from headwater.ranking.synthetic import make_world, write_world
    from headwater.serving.config import DEFAULT_POPULARITY
    from headwater.serving.store import OnlineStoreReader, now_ms

    redis_url = os.environ.get("HEADWATER_REDIS_URL", "redis://127.0.0.1:6379/0")
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        subprocess.run(
            ["bash", str(ROOT / "infra" / "certs.sh"), str(tmp / "certs")], check=True, capture_output=True
        )
        state = tmp / "state"
        subprocess.run([HEADWATER, "apply", str(ROOT / "features"), "--state-dir", str(state), "--no-feast"],
                       check=True, cwd=ROOT, capture_output=True)  # fmt: skip
        registry = load_registry(state, DEFAULT_POPULARITY)
        world = make_world(registry, users=20, items=120, seed=3)
        namespace = f"bench{uuid.uuid4().hex[:8]}"
        reader = OnlineStoreReader.from_url(redis_url, namespace=namespace)
        write_world(reader, registry, world, now_ms())
        key, digest = new_api_key()
        (tmp / "keys.yaml").write_text(
            json.dumps({"keys": [{"id": "bench", "sha256": digest, "roles": ["rank"]}]})
        )
        (tmp / "serving.yaml").write_text(json.dumps({"auth": {"api_keys_file": str(tmp / "keys.yaml")}}))
        certs = tmp / "certs"
        body = {
            "user_id": world.user_ids[0],
            "candidates": world.item_ids[:100],
            "k": 10,
            "log_impressions": False,
        }
        base = [HEADWATER, "serve", "--state-dir", str(state), "--redis-url", redis_url,
                "--namespace", namespace, "--no-feedback", "--no-retrieval", "--device", "cpu",
                "--log-level", "warning"]  # fmt: skip
        variants: dict[str, tuple[list[str], str, dict[str, str], Any]] = {
            "plaintext_no_auth": (["--no-auth"], "http", {}, True),
            "tls_api_key": (["--config", str(tmp / "serving.yaml"), "--tls-cert", str(certs / "server.pem"),
                             "--tls-key", str(certs / "server.key")], "https",
                            {"authorization": f"Bearer {key}"}, ClientTls(certs / "ca.pem").ssl_context()),
        }  # fmt: skip
        results: dict[str, Any] = {}
        try:
            for name, (extra, scheme, headers, verify) in variants.items():
                port = _free_port()
                proc = subprocess.Popen([*base, "--port", str(port), *extra], cwd=ROOT)
                url = f"{scheme}://127.0.0.1:{port}"
                try:
                    deadline = time.monotonic() + 180
                    while True:
                        assert proc.poll() is None, f"{name}: the server exited"
                        assert time.monotonic() < deadline, f"{name}: the server did not start"
                        try:
                            if httpx.get(f"{url}/health", verify=verify, timeout=2).status_code == 200:
                                break
                        except httpx.HTTPError:
                            time.sleep(0.3)
                    results[name] = _measure(url, headers, verify, proc.pid, body, requests)
                finally:
                    proc.terminate()
                    proc.wait(30)
        finally:
            client = redis.Redis.from_url(redis_url)
            for found in client.scan_iter(match=f"{namespace}:*", count=1000):
                client.delete(found)
            client.close()
            reader.close()
    load = os.getloadavg()
    out = {"date": datetime.now(UTC).isoformat(timespec="seconds"), "load": [round(x, 2) for x in load],
           "requests": requests, "candidates": 100,
           "command": f".venv/bin/python bench/bench_auth.py --server --requests {requests}",
           "variants": results}  # fmt: skip
    names = list(results)
    print(
        f"load {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; {requests} requests, 100 candidates, 1 connection"
    )
    print(f"{'figure':<28}" + "".join(f"{n:>20}" for n in names))
    for figure in next(iter(results.values())):
        print(f"{figure:<28}" + "".join(f"{results[n][figure]:>20}" for n in names))
    SERVER_RESULTS.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {SERVER_RESULTS}")


def main() -> None:
    """Print µs of CPU per request for each variant, and per ``authenticate`` call."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--keys", type=int, default=20)
    parser.add_argument(
        "--server", action="store_true", help="The real server process, auth + TLS on and off."
    )
    args = parser.parse_args()
    if args.server:
        server_main(args.requests)
        return
    base = ServingConfig(editorial_items=("i2",), item_cache_ttl_s=0.0, io_threads=2)
    with tempfile.TemporaryDirectory() as tmp:
        auth, tokens = _setup(Path(tmp), args.keys)
        results: dict[str, Any] = {}
        results["none"] = _cpu_per_request(base.model_copy(update={"auth": "none"}), {}, args.requests)
        on = base.model_copy(update={"auth": auth})
        for name, token in tokens.items():
            header = {"authorization": f"Bearer {token}"}
            results[name] = _cpu_per_request(on, header, args.requests)
            authenticator = Authenticator(auth)
            start = time.process_time()
            for _ in range(args.requests):
                authenticator.authenticate(header, "rank")
            results[f"{name}_authenticate_only"] = (time.process_time() - start) / args.requests * 1e6
            verifier = authenticator._jwt  # the signature check without the token memory
            if name.startswith("jwt") and verifier is not None:
                start = time.process_time()
                for _ in range(args.requests):
                    verifier.claims(token)
                results[f"{name}_verify_uncached"] = (time.process_time() - start) / args.requests * 1e6
    for name, us in results.items():
        print(f"{name:<32} {us:8.1f} us CPU/request")


if __name__ == "__main__":
    main()
