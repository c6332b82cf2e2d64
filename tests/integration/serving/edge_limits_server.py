"""A real uvicorn + gRPC server of the service over an in-memory store, for the edge-limit tests.

Run as a script: ``python edge_limits_server.py CONFIG.json REST_PORT GRPC_PORT``. It serves the app
of ``create_app`` (no model: the popularity and editorial steps answer) with the same uvicorn options
and gRPC edge as ``headwater serve`` (:func:`headwater.serving.edge.uvicorn_options`,
:class:`~headwater.serving.grpc_server.GrpcEdge`). A rank or recommend for user ``boom`` raises an
exception whose text holds a fake secret (:data:`SECRET`): the net under a bug must not echo it.
"""

from __future__ import annotations

import json
import logging
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from headwater.ranking.synthetic import small_registry
from headwater.serving.app import create_app
from headwater.serving.config import ServingConfig
from headwater.serving.edge import uvicorn_options
from headwater.serving.grpc_server import GrpcEdge
from headwater.serving.runtime import LoadedModels
from headwater.serving.store import InMemoryFeatureStore

SECRET = "password=hunter2 at /srv/secret/path"
REGISTRY = small_registry({"u": ["a", "b"]}, {"i": ["x"]}, "i.x", registry_hash="sha256:" + "34" * 32)


def main(config_path: str, port: int, grpc_port: int) -> None:
    """Serve until killed."""
    logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config = ServingConfig.model_validate(json.loads(Path(config_path).read_text()))
    app = create_app(config, REGISTRY, InMemoryFeatureStore(), LoadedModels(None, None, None, None, "cpu"))
    service = app.state.service
    rank, recommend = service.rank, service.recommend

    async def broken_rank(body: Any, *args: Any) -> Any:
        if body.user_id == "boom":
            raise RuntimeError(SECRET)
        return await rank(body, *args)

    async def broken_recommend(body: Any, *args: Any) -> Any:
        if body.user_id == "boom":
            raise RuntimeError(SECRET)
        return await recommend(body, *args)

    service.rank, service.recommend = broken_rank, broken_recommend
    GrpcEdge.for_app(app, "127.0.0.1", grpc_port)
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="info", **uvicorn_options(config.edge))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def running(tmp: Path, config: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Run this script as a process over ``config`` until the block ends; wait for its /health first.

    Yields the REST ``url`` and ``port``, the ``grpc`` target and the server's ``log`` file. Fails the
    test with the log's tail when the server exits or does not answer within 60 s.
    """
    (tmp / "config.json").write_text(json.dumps(config))
    port, grpc_port = _free_port(), _free_port()
    log_path = tmp / "server.log"
    log = log_path.open("wb")
    cmd = [sys.executable, __file__, str(tmp / "config.json"), str(port), str(grpc_port)]
    proc = subprocess.Popen(cmd, stdout=log, stderr=log)
    url = f"http://127.0.0.1:{port}"
    try:
        end = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                pytest.fail(f"the server exited: {log_path.read_text()[-3000:]}")
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:  # liveness: no credential
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > end:
                pytest.fail(f"the server did not start: {log_path.read_text()[-3000:]}")
            time.sleep(0.2)
        yield {"url": url, "port": port, "grpc": f"127.0.0.1:{grpc_port}", "log": log_path}
    finally:
        proc.terminate()
        proc.wait(10)
        log.close()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
