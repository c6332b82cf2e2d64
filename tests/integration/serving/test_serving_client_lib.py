"""`RankingClient` against a real `headwater serve` (real Redis) that is made slow, stalled and stopped.

The service is made slow by stopping its process (SIGSTOP) and resuming it (SIGCONT) a while later,
so an answer arrives late; stalled by stopping it for longer than the client's timeout; and stopped
for good by terminating it. The client's clock is the real one plus a skew the test moves to get
past the breaker's cool-down without waiting for it.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from headwater.client import BreakerConfig, RankingClient

_spec = importlib.util.spec_from_file_location("edge_service", Path(__file__).with_name("edge_service.py"))
assert _spec is not None
assert _spec.loader is not None
edge = sys.modules.setdefault("edge_service", importlib.util.module_from_spec(_spec))
_spec.loader.exec_module(edge)

SLOW_MS = 1500.0
"""Generous, so a loaded test machine's ordinary answers stay "good"; a stall lasts well over it."""
STALL_S = 2.5


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[dict[str, Any]]:
    """`headwater serve` (no model) on a small world in a fresh namespace of the real Redis."""
    with edge.running_service(tmp_path_factory.mktemp("client-lib"), redis_url) as service:
        yield {"url": service.url, "world": service.world, "proc": service.proc}


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
