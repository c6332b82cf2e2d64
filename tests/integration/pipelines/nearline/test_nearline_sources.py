"""The nearline tier over every source of the example repo's plan: the behaviour events and payments.

The plan is the example repo's own (``features/``, checked and compiled by the registry), with
each source's topic renamed for the test. ``merchant_risk_nearline`` reads ``payments``, whose
topic is keyed by ``account_id`` while the view is keyed by ``merchant_id``: every payment goes
through the ``payments`` repartition, and ``occurred_at`` is in microseconds on the wire.
"""

from __future__ import annotations

import importlib.util
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from headwater.pipelines.settings import Settings
from headwater.pipelines.windows import compile_view
from headwater.registry.plans import TierPlan

_spec = importlib.util.spec_from_file_location("nl_harness_sources", Path(__file__).with_name("harness.py"))
assert _spec is not None
assert _spec.loader is not None
h = importlib.util.module_from_spec(_spec)
sys.modules["nl_harness_sources"] = h
_spec.loader.exec_module(h)


@pytest.fixture
def example(
    settings: Settings, kafka_bootstrap: str, redis_url: str, tmp_path: Path
) -> Iterator[tuple[h.Env, TierPlan]]:
    e = h.Env(settings=settings, tmp=tmp_path)
    plan = e.create_example()
    yield e, plan
    e.cleanup()


def wait_committed(env: h.Env, topic: str, at_least: int, timeout: float = 60) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done = env.committed(topic)
        if done >= at_least:
            return done
        time.sleep(0.2)
    raise AssertionError(
        f"group {env.group} committed fewer than {at_least} offsets of {topic} in {timeout} s"
    )


def check_source(env: h.Env, plan: TierPlan, name: str, killed: bool = False) -> int:
    """Assert every nearline view of source ``name`` equals the reference, and its dead letters.

    After a kill -9 (``killed``) a dead letter may have been sent twice (at least once, by design),
    so each rejected record is counted once by its source coordinates.
    """
    topic = env.topics[name]
    exp = h.expected(env.settings, h.example_source(name, topic), topic)
    specs = [compile_view(v) for v in plan.views if v.source == name]
    assert specs
    checked = h.compare_views(env, specs, exp)
    reasons = h.dlq_reasons(env.settings, topic, distinct=killed)
    assert reasons.get("late", 0) == exp.late > 0
    assert sum(n for reason, n in reasons.items() if reason != "late") == exp.malformed > 0
    return checked


def test_both_example_sources_equal_the_reference(example: tuple[h.Env, TierPlan]) -> None:
    env, plan = example
    assert {v.source for v in plan.views} == {"events", "payments"}
    h.produce(env.settings, 8_000, seed=21)
    h.produce_payments(env.settings, env.topics["payments"], 6_000, seed=22)
    assert wait(env.start(idle_exit_s=15), 240) == 0
    assert check_source(env, plan, "events") > 300
    assert check_source(env, plan, "payments") > 30  # 40 merchants: every one has a value
    topics = {t for t in h.list_topics(env.settings) if t.startswith(f"{env.group}-")}
    assert topics == {
        f"{env.group}-events-changelog",
        f"{env.group}-events-by-item_id",
        f"{env.group}-events-by-item_id-changelog",
        f"{env.group}-payments-changelog",
        f"{env.group}-payments-by-merchant_id",
        f"{env.group}-payments-by-merchant_id-changelog",
    }


def test_payments_exact_after_repeated_kill_9_at_random_moments(example: tuple[h.Env, TierPlan]) -> None:
    """Only the payments source runs (--source). Small batches and up to three kills -9 at random
    moments (forwarded payments of an uncommitted batch are sent again; a restart may replay the
    changelog tail): the merchant view behind the repartition is exact, nothing lost or doubled."""
    env, plan = example
    topic = env.topics["payments"]
    rng = random.Random(71)
    total, kills = 12_000, 0
    h.produce_payments(env.settings, topic, total, seed=23)
    h.produce(env.settings, 500, seed=24)  # the behaviour source has events, but is not run
    while kills < 3 and (done := env.committed(topic)) < total - 1_500:
        proc = env.start(6.0, 150, 1, "--source", "payments")
        wait_committed(env, topic, done + 300, timeout=90)
        time.sleep(rng.uniform(0.0, 1.0))
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        kills += 1
    assert kills >= 2
    assert env.committed(topic) < total
    assert wait(env.start(15.0, 2000, 1, "--source", "payments"), 180) == 0
    assert check_source(env, plan, "payments", killed=True) > 30
    assert env.committed(env.topics["events"]) == 0
    assert not h.dlq_reasons(env.settings, env.topics["events"])
    logs = "".join(p.read_text(errors="replace") for p in env.tmp.glob("worker-*.log"))
    assert logs.count("restored from local") >= kills * 2 * env.partitions  # each restart resumed its stores


def test_an_unknown_source_is_refused_before_any_worker_starts(example: tuple[h.Env, TierPlan]) -> None:
    env, _ = example
    cmd = [sys.executable, "-m", "headwater.cli.nearline", "--state-dir", str(env.tmp)]
    done = subprocess.run(
        [*cmd, "--source", "payment"], env=env.env(), capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 1
    assert "--source payment: no nearline view reads it" in done.stderr
    assert "['events', 'payments']" in done.stderr


def wait(proc: subprocess.Popen[bytes], timeout: float) -> int:
    return int(proc.wait(timeout=timeout))
