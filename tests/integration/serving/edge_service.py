"""A real `headwater serve` for the edge tests (client library, gRPC, admission): one way to start one.

`running_service` applies features/ into a temporary state folder, writes a small synthetic world to
a fresh namespace of the real Redis, starts `headwater serve` (no model: the popularity step answers,
deterministically) with the given extra arguments, waits for /health (and the gRPC port), and on
exit stops the process and deletes the namespace. Loaded by path (importlib), as the nearline
harness is.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from headwater.ranking.features import load_registry
from headwater.ranking.synthetic import make_world, write_world
from headwater.serving.config import DEFAULT_POPULARITY
from headwater.serving.store import OnlineStoreReader, now_ms

ROOT = Path(__file__).resolve().parents[3]
HEADWATER = str(Path(sys.executable).with_name("headwater"))


@dataclass
class Service:
    url: str
    grpc_target: str | None
    world: Any
    proc: subprocess.Popen[bytes]
    log: Path

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _grpc_listens(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


@contextmanager
def serve_process(
    tmp: Path,
    *args: str,
    grpc_port: int | None = None,
    timeout_s: float = 120.0,
    auth: tuple[str, ...] = ("--no-auth",),
) -> Iterator[Service]:
    """Run `headwater serve --port P *auth *args` (log in ``tmp``) until /health (and gRPC) answer.

    ``auth``: the credentials flags; by default ``--no-auth`` (loopback, explicit); ``()`` when the
    test's serving config has an ``auth:`` section. Stops the process on exit. Fails with the log's
    tail when the process exits or does not answer within ``timeout_s``.
    """
    port = free_port()
    serve = [HEADWATER, "serve", "--port", str(port), *auth, *args]
    if grpc_port is not None:
        serve += ["--grpc-port", str(grpc_port)]
    log = tmp / "serve.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(serve, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    service = Service(
        f"http://127.0.0.1:{port}", None if grpc_port is None else f"127.0.0.1:{grpc_port}", None, proc, log
    )
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            assert proc.poll() is None, service.tail()
            assert time.monotonic() < deadline, service.tail()
            try:
                urllib.request.urlopen(f"{service.url}/health", timeout=2).read()
                if grpc_port is None or _grpc_listens(grpc_port):
                    break
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.3)
        yield service
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)  # a test may have stopped it
            proc.terminate()
            proc.wait(30)


def drop_namespace(redis_url: str, namespace: str) -> None:
    """Delete every key of ``namespace`` from the shared Redis."""
    client = redis.Redis.from_url(redis_url)
    try:
        for key in client.scan_iter(match=f"{namespace}:*", count=1000):
            client.delete(key)
    finally:
        client.close()


@contextmanager
def running_service(
    tmp: Path,
    redis_url: str,
    *extra: str,
    grpc: bool = False,
    users: int = 20,
    items: int = 60,
    auth: tuple[str, ...] = ("--no-auth",),
) -> Iterator[Service]:
    """Apply features/, write a synthetic world to a fresh namespace and serve it (no model: popularity)."""
    state = tmp / "state"
    cmd = [HEADWATER, "apply", str(ROOT / "features"), "--state-dir", str(state), "--no-feast"]
    subprocess.run(cmd, check=True, cwd=ROOT, capture_output=True)
    registry = load_registry(state, DEFAULT_POPULARITY)
    world = make_world(registry, users=users, items=items, seed=3)
    namespace = f"t{uuid.uuid4().hex[:8]}"
    reader = OnlineStoreReader.from_url(redis_url, namespace=namespace)
    write_world(reader, registry, world, now_ms())
    args = ["--state-dir", str(state), "--redis-url", redis_url, "--namespace", namespace, "--no-feedback",
            "--device", "cpu", *extra]  # fmt: skip
    try:
        with serve_process(tmp, *args, grpc_port=free_port() if grpc else None, auth=auth) as service:
            service.world = world
            yield service
    finally:
        drop_namespace(redis_url, namespace)
        reader.close()


def metric(url: str, name: str, **labels: str) -> float:
    """One sample of /metrics (0.0 when absent)."""
    text = urllib.request.urlopen(f"{url}/metrics", timeout=10).read().decode()
    want = name + ("{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}" if labels else "")
    for line in text.splitlines():
        if line.startswith(want + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0
