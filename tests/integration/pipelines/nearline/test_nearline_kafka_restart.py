"""The nearline tier through a Kafka broker restart (issue 16 item 2): every event counted once.

The test runs its own broker (``OwnKafka`` of the landing's restart test: ``infra/kafka.sh`` with a
private state dir and free ports; the shared broker on 9092 is never touched) and stops it for 5 s
plus its restart while one worker process is mid-stream. The worker's transactions in flight fail
or time out (nothing of those batches is committed), the supervisor restarts it after a back-off
until the broker answers, and it resumes from its stores: the values equal the reference and
every dead letter is on the dead-letter topic exactly once (read_committed, not de-duplicated).

Slow (a broker started twice: minutes under load): ``pytest -m slow``; not in the default suite.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from headwater.pipelines.settings import Settings

pytestmark = pytest.mark.slow


def _load(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


h = _load("nl_harness", Path(__file__).with_name("harness.py"))
_offline = Path(__file__).resolve().parents[1] / "offline" / "test_offline_landing_kafka_restart.py"
_OwnKafka: Any = _load("landing_kafka_restart", _offline).OwnKafka
ROOT = Path(__file__).resolve().parents[4]


class OwnKafka(_OwnKafka):  # type: ignore[misc,valid-type]
    """The landing test's private broker, with time to start on a loaded machine (5 min at load 45)."""

    def _script(self, verb: str) -> None:
        subprocess.run(["bash", str(ROOT / "infra" / "kafka.sh"), verb], env=self.env, check=True, cwd=ROOT,
                       capture_output=True, timeout=900)  # fmt: skip


@pytest.fixture
def own_kafka(tmp_path: Path) -> Iterator[Any]:
    broker = OwnKafka(tmp_path / "kafka-state")
    broker.start()
    yield broker
    broker.stop()


@pytest.fixture
def env(settings: Settings, own_kafka: Any, tmp_path: Path) -> Iterator[h.Env]:
    e = h.Env(settings=dataclasses.replace(settings, kafka_bootstrap=own_kafka.bootstrap), tmp=tmp_path)
    e.create()
    yield e
    e.cleanup()


def test_kafka_restarted_under_nearline_every_event_counts_once(env: h.Env, own_kafka: Any) -> None:
    total = 20_000
    h.produce(env.settings, total, seed=22)
    proc = env.start(max_poll=300, idle_exit_s=20)
    try:
        deadline = time.monotonic() + 120
        while env.committed() < 3_000:
            assert time.monotonic() < deadline, "the worker committed fewer than 3000 offsets in 120 s"
            time.sleep(0.2)
        own_kafka.stop()
        time.sleep(5)
        own_kafka.start()
        assert proc.wait(timeout=300) == 0
    except BaseException:
        if proc.poll() is None:
            proc.kill()
        raise
    exp = h.expected(env.settings)
    assert h.compare_online(env, exp) > 100
    reasons = h.dlq_reasons(env.settings)  # not de-duplicated: one transaction per batch
    assert reasons.get("late", 0) == exp.late > 0
    assert sum(v for k, v in reasons.items() if k != "late") == exp.malformed > 0
    records = sum(1 for _ in h.read_topic(env.settings, env.settings.events_topic))
    assert env.committed() == records  # every offset committed (in the batches' transactions)
    counters = json.loads((env.store_dir / "stats-0.json").read_text())["counters"]
    print(
        "worker restarts",
        counters["restarts"],
        {k: v for k, v in counters.items() if k.startswith("errors_")},
    )
