"""The realtime job through a Kafka broker restart (issue 16 item 2): every event counted once.

The job reads a private broker (``OwnKafka`` of the landing's restart test: ``infra/kafka.sh`` with
its own state dir and free ports; the shared broker on 9092 is never touched). The broker is
stopped and started again after the first values are out; events sent once it is back
(the ones before the outage were already read) must all count once: the Kafka source reconnects or
the job restarts from its last checkpoint (offsets and state together), and the sink's writes are
idempotent (``test_realtime_kill_after_flush.py``). The values at the end equal the reference.

Slow (a broker started twice and a job start): ``pytest -m slow``.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kafka.admin import KafkaAdminClient, NewTopic

from headwater.registry.plans import TierPlan

from .conftest import (
    T0,
    Feed,
    JobProcess,
    Names,
    assert_store_exact,
    event,
    read_store,
    wait_for,
)
from .test_realtime_outage import B_FINAL, before, during

pytestmark = pytest.mark.slow


def _own_kafka_class() -> Any:
    path = Path(__file__).resolve().parents[1] / "offline" / "test_offline_landing_kafka_restart.py"
    spec = importlib.util.spec_from_file_location("landing_kafka_restart", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["landing_kafka_restart"] = module
    spec.loader.exec_module(module)
    base: Any = module.OwnKafka
    root = Path(__file__).resolve().parents[4]

    class OwnKafka(base):  # type: ignore[misc,valid-type]
        """The landing test's private broker, with time to start on a loaded machine (5 min at load 45)."""

        def _script(self, verb: str) -> None:
            script = ["bash", str(root / "infra" / "kafka.sh"), verb]
            subprocess.run(script, env=self.env, check=True, cwd=root, capture_output=True, timeout=900)

    return OwnKafka


@pytest.fixture
def own_kafka(tmp_path: Path) -> Iterator[Any]:
    broker = _own_kafka_class()(tmp_path / "kafka-state")
    broker.start()
    yield broker
    broker.stop()


def test_kafka_restarted_under_realtime_every_event_counts_once(
    plan: tuple[TierPlan, Path],
    names: Names,
    own_kafka: Any,
    redis_url: str,
    tmp_path: Path,
    monkeypatch: Any,
) -> None:
    tier_plan, state = plan
    admin = KafkaAdminClient(bootstrap_servers=own_kafka.bootstrap)
    admin.create_topics([NewTopic(names.topic, 1, 1), NewTopic(names.dlq, 1, 1)])
    admin.close()
    monkeypatch.setenv("HEADWATER_KAFKA_BOOTSTRAP", own_kafka.bootstrap)  # the job's environment
    log = tmp_path / "job.log"

    def published(b_ms: int, user: str) -> bool:
        _, res = read_store(redis_url, names.namespace, tier_plan, "rt_all", [user])
        return bool(res.found[0]) and int(res.event_time_ms[0]) >= b_ms

    feed = Feed(own_kafka.bootstrap, names.topic)
    job = JobProcess(state, names, tmp_path / "checkpoints", log)
    try:
        feed.send(*before())
        wait_for(lambda: published(T0 + 5_000, "u2"), 300, "u2's value at T0+5 s (clock T0+9 s)", log)
        feed.close()
        own_kafka.stop()
        own_kafka.start()
        feed = Feed(own_kafka.bootstrap, names.topic)
        feed.send(*during(), event(10, "zz", "impression", 30_000))  # the last moves the clock to T0+30 s
        wait_for(lambda: published(B_FINAL, "u1"), 300, "boundary T0+30 s after the broker restart", log)
    finally:
        job.kill()
        feed.close()

    events = [*before(), *during()]
    assert_store_exact(redis_url, names.namespace, tier_plan, events, B_FINAL)
