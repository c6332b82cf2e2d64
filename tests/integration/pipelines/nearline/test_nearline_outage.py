"""The nearline tier through a Redis outage (issue 16 item 5): supervised, exact afterwards.

The test runs its own redis-server (``own_redis``) and stops it for about 5 s while one worker
process is mid-stream. Before the supervisor, the worker died on the first failed online write
and nothing restarted it (``headwater run nearline`` with the default single process); now the
failed worker is replaced after a back-off, retries until Redis answers again, and the values
are the reference values: nothing lost, nothing counted twice, every dead letter sent once.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from headwater.pipelines.settings import Settings
from headwater.pipelines.store.testing import OwnRedis

_spec = importlib.util.spec_from_file_location("nl_harness", Path(__file__).with_name("harness.py"))
assert _spec is not None
assert _spec.loader is not None
h = importlib.util.module_from_spec(_spec)
sys.modules["nl_harness"] = h
_spec.loader.exec_module(h)


@pytest.fixture
def env(settings: Settings, kafka_bootstrap: str, own_redis: OwnRedis, tmp_path: Path) -> Iterator[h.Env]:
    import dataclasses

    e = h.Env(settings=dataclasses.replace(settings, redis_url=own_redis.url), tmp=tmp_path)
    e.create()
    yield e
    if own_redis.proc is None:
        own_redis.start()  # cleanup reads it
    e.cleanup()


def _wait_committed(env: h.Env, at_least: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while env.committed() < at_least:
        if time.monotonic() > deadline:
            pytest.fail(f"group {env.group} committed fewer than {at_least} offsets in {timeout} s")
        time.sleep(0.2)


def test_redis_stopped_5_s_under_nearline_the_worker_restarts_and_values_are_exact(
    env: h.Env, own_redis: OwnRedis
) -> None:
    total = 20_000
    h.produce(env.settings, total, seed=21)
    proc = env.start(max_poll=300, idle_exit_s=10)
    try:
        _wait_committed(env, 3_000)
        own_redis.stop()
        time.sleep(5)
        down_at_restart = env.committed()
        own_redis.start()
        assert proc.wait(timeout=180) == 0
    except BaseException:
        if proc.poll() is None:
            proc.kill()
        raise
    assert down_at_restart < total  # the outage was mid-stream
    exp = h.expected(env.settings)
    assert h.compare_online(env, exp) > 100
    reasons = h.dlq_reasons(env.settings)  # not distinct: a Redis failure replays no batch
    assert reasons.get("late", 0) == exp.late > 0
    assert sum(v for k, v in reasons.items() if k != "late") == exp.malformed > 0
    counters = json.loads((env.store_dir / "stats-0.json").read_text())["counters"]
    assert counters["restarts"] >= 1
    assert counters["errors_redis"] + counters["errors_setup"] == counters["restarts"]
    assert counters.get("setup_failures", 0) == counters["errors_setup"]  # restores that met Redis down
    log = "".join(p.read_text(errors="replace") for p in env.tmp.glob("worker-*.log"))
    assert "nearline worker failed (" in log


def test_a_worker_that_cannot_reach_redis_at_start_waits_for_it(env: h.Env, own_redis: OwnRedis) -> None:
    """Redis down before the worker starts: the restore's publish fails in the rebalance callback
    (counted as a setup failure, raised, the worker replaced) until Redis is back."""
    h.produce(env.settings, 6_000, seed=22)
    own_redis.stop()
    proc = env.start(max_poll=1000, idle_exit_s=8)
    try:
        time.sleep(6)
        assert proc.poll() is None  # still trying, not dead
        own_redis.start()
        assert proc.wait(timeout=120) == 0
    except (AssertionError, subprocess.TimeoutExpired):
        if proc.poll() is None:
            proc.kill()
        raise
    assert h.compare_online(env, h.expected(env.settings)) > 100
    counters = json.loads((env.store_dir / "stats-0.json").read_text())["counters"]
    assert counters["restarts"] >= 1
