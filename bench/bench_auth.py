"""CPU per ``/v1/rank`` request with credentials on and off (issue 32), in process.

One app per variant (``create_app`` over an in-memory store, no model: the popularity and editorial
steps answer, so the figure is the edge's own cost), driven by Starlette's TestClient from one
thread; CPU is ``time.process_time`` of the whole process over ``--requests`` calls, after a warm-up.
Variants: ``auth: none``; an API key among ``--keys`` entries; an RS256 JWT; an ES256 JWT. Also the
authenticator alone (``authenticate`` per call: what the edge adds; a JWT's verification is
remembered for a minute) and a JWT's signature and claims check without that memory.

    .venv/bin/python bench/bench_auth.py --requests 2000
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import jwt
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from fastapi.testclient import TestClient

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


def main() -> None:
    """Print µs of CPU per request for each variant, and per ``authenticate`` call."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--keys", type=int, default=20)
    args = parser.parse_args()
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
