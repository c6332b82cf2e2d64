"""`RankingClient` against a real `headwater serve` (real Redis) that is made slow, stalled and stopped.

The service is made slow by stopping its process (SIGSTOP) and resuming it (SIGCONT) a while later,
so an answer arrives late; stalled by stopping it for longer than the client's timeout; and stopped
for good by terminating it. The client's clock is the real one plus a skew the test moves to get
past the breaker's cool-down without waiting for it.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from headwater.client import BreakerConfig, RankingClient
from headwater.serving.config import DEFAULT_POPULARITY
from headwater.serving.registry import load_registry
from headwater.serving.store import OnlineStoreReader, now_ms
from headwater.serving.synthetic import make_world, write_world

ROOT = Path(__file__).resolve().parents[3]
HEADWATER = str(Path(sys.executable).with_name("headwater"))
SLOW_MS = 1500.0
"""Generous, so a loaded test machine's ordinary answers stay "good"; a stall lasts well over it."""
STALL_S = 2.5


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[dict[str, Any]]:
    """Apply features/, write a small world to a fresh namespace, start `headwater serve` (no model)."""
    tmp = tmp_path_factory.mktemp("client-lib")
    state = tmp / "state"
    cmd = [HEADWATER, "apply", str(ROOT / "features"), "--state-dir", str(state), "--no-feast"]
    subprocess.run(cmd, check=True, cwd=ROOT, capture_output=True)
    registry = load_registry(state, DEFAULT_POPULARITY)
    world = make_world(registry, users=20, items=60, seed=3)
    namespace = f"t{uuid.uuid4().hex[:8]}"
    reader = OnlineStoreReader.from_url(redis_url, namespace=namespace)
    write_world(reader, registry, world, now_ms())
    port = _free_port()
    serve = [HEADWATER, "serve", "--port", str(port), "--state-dir", str(state), "--redis-url", redis_url,
             "--namespace", namespace, "--no-feedback", "--device", "cpu"]  # fmt: skip
    log = (tmp / "serve.log").open("wb")
    proc = subprocess.Popen(serve, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, (tmp / "serve.log").read_text()[-3000:]
            assert time.monotonic() < deadline, (tmp / "serve.log").read_text()[-3000:]
            try:
                urllib.request.urlopen(f"{url}/health", timeout=2).read()
                break
            except (urllib.error.URLError, OSError):
                time.sleep(0.5)
        yield {"url": url, "world": world, "proc": proc}
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)
            proc.terminate()
            proc.wait(30)
        client = redis.Redis.from_url(redis_url)
        for key in client.scan_iter(match=f"{namespace}:*", count=1000):
            client.delete(key)
        reader.close()


def _stall(pid: int, seconds: float) -> threading.Timer:
    """Stop the service's process now and resume it ``seconds`` later."""
    os.kill(pid, signal.SIGSTOP)
    timer = threading.Timer(seconds, os.kill, (pid, signal.SIGCONT))
    timer.start()
    return timer


def test_the_client_degrades_when_the_service_is_slow_stalled_and_stopped(served: dict[str, Any]) -> None:
    world, proc = served["world"], served["proc"]
    user, candidates = world.user_ids[0], world.item_ids[:30]
    popular = list(reversed(world.item_ids))
    skew = [0.0]
    client = RankingClient(
        served["url"],
        timeout_s=30.0,
        retries=1,
        breaker=BreakerConfig(failures=3, slow_ms=SLOW_MS, cool_down_s=60.0),
        fallback=popular,
        clock=lambda: time.monotonic() + skew[0],
    )

    good = client.rank(user, candidates, k=5, log_impressions=False)
    assert good.source == "service", good.reason
    assert good.breaker == "closed"
    assert len(good.items) == 5
    assert set(good.item_ids) <= set(candidates)

    # Made slow: three answers that each wait out a stall are answers, and open the breaker.
    for n in range(3):
        timer = _stall(proc.pid, STALL_S)
        slow = client.rank(user, candidates, k=5, log_impressions=False)
        timer.join()
        assert slow.source == "service", slow.reason
        assert "slow: over 1500 ms" in slow.reason
        assert slow.breaker == ("open" if n == 2 else "closed")
    last = slow.item_ids

    # Open: no call; the last good result less what the caller marks unavailable, order kept.
    cached = client.rank(user, candidates, k=5, unavailable={last[0]})
    assert cached.source == "cache"
    assert cached.attempts == 0
    assert cached.item_ids[:4] == last[1:]
    assert cached.item_ids[4] == next(i for i in popular if i in candidates and i not in last)
    assert "circuit open after 3 consecutive slow or failed answers" in cached.reason

    # Stalled past the timeout: the probe fails and the breaker opens again.
    skew[0] += 60.0
    timer = _stall(proc.pid, STALL_S)
    probe = client.rank(user, candidates, k=5, timeout_s=0.5)
    timer.join()
    assert probe.attempts == 1
    assert probe.source == "cache"
    assert probe.breaker == "open"
    assert "the probe timed out after 0.5 s" in probe.reason

    # Resumed: the next probe is answered and closes the breaker.
    skew[0] += 60.0
    back = client.rank(user, candidates, k=5, log_impressions=False)
    assert back.source == "service", back.reason
    assert back.breaker == "closed"

    # Stopped: connections are refused; retried once, then a user never seen gets popularity.
    proc.terminate()
    proc.wait(30)
    stranger = client.rank(world.user_ids[1], candidates, k=3)
    assert stranger.attempts == 2
    assert stranger.source == "fallback"
    assert stranger.item_ids == [i for i in popular if i in candidates][:3]
    assert "ConnectError" in stranger.reason
    assert "no last good result for the user" in stranger.reason
    client.close()
