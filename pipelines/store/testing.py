"""A redis-server of one test, on a free loopback port, that the test may stop and start again.

Tests of what happens when the online store goes away (the serving fallbacks, the realtime sink's
retries) run their own server instead of stopping the shared one. ``tests/conftest.py`` offers it
as the ``own_redis`` fixture.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

import redis

from headwater.registry.errors import HeadwaterError


class OwnRedisError(HeadwaterError, RuntimeError):
    """The private redis-server could not be started."""


class OwnRedis:
    """A private redis-server that keeps its data across a restart (append-only file in ``workdir``).

    A production Redis with persistence behaves so: a writer that retried through an outage finds the
    data it wrote before (the dictionary ids among them) when the server is back.
    """

    def __init__(self, workdir: Path) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = int(s.getsockname()[1])
        self.workdir = workdir
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 5.0) -> None:
        """Start the server and wait until it answers PING."""
        server = shutil.which("redis-server")
        if server is None:
            msg = "redis-server is not on PATH: install it (apt-get install redis-server, or `make setup`)"
            raise OwnRedisError(msg)
        cmd = [server, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "yes",
               "--dir", str(self.workdir)]  # fmt: skip
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis(port=self.port)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                if client.ping():
                    return
            except redis.ConnectionError:
                time.sleep(0.05)
        self.stop()
        msg = f"own redis-server on port {self.port} did not answer PING within {timeout_s:g} s"
        raise OwnRedisError(msg)

    def stop(self) -> None:
        """Stop the server (SIGTERM: it writes its append-only file first)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)
        self.proc = None
