"""Nearline on the cluster profile: two processes in one group, one killed mid-stream (a lost host).

Both ``headwater run nearline`` processes read the behaviour topic on the 3-broker Kafka (4
partitions, RF 3; their changelog and repartition topics RF 3 too) and write to the profile's Redis
Cluster. Mid-stream one process and its worker get SIGKILL; the group rebalances, the survivor takes
the dead one's partitions (restoring their state from the replicated changelog) and every online
value equals the reference semantics.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from kafka import KafkaConsumer, TopicPartition

from headwater.pipelines.settings import Settings
from headwater.pipelines.store.connect import redis_client

from .conftest import KAFKA, REDIS_CLUSTER, ROOT, record_figure, wait_until

pytestmark = pytest.mark.cluster

_spec = importlib.util.spec_from_file_location(
    "nl_harness", ROOT / "tests" / "integration" / "pipelines" / "nearline" / "harness.py"
)
assert _spec is not None
assert _spec.loader is not None
h = importlib.util.module_from_spec(_spec)
sys.modules["nl_harness"] = h
_spec.loader.exec_module(h)


@pytest.fixture
def env(
    cluster: None, settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[h.Env]:
    """The nearline harness's world on the profile: topics RF 3 on 19092-19094, the store on Redis Cluster."""
    try:
        client = redis_client(REDIS_CLUSTER, socket_timeout=5.0)
        client.ping()
        client.close()
    except redis.RedisError as exc:
        pytest.skip(f"no Redis Cluster answers at {REDIS_CLUSTER} ({exc}): run `make cluster-up`")
    monkeypatch.setenv("HEADWATER_KAFKA_REPLICATION", "3")  # this process's topics and the workers' own
    on_cluster = dataclasses.replace(settings, kafka_bootstrap=KAFKA, redis_url=REDIS_CLUSTER)
    e = h.Env(settings=on_cluster, tmp=tmp_path)
    e.create()
    yield e
    e.cleanup()


def kill_host(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the command and its worker processes at once, as a lost machine would lose them."""
    children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
    for pid in [proc.pid, *map(int, children)]:
        os.kill(pid, signal.SIGKILL)
    proc.wait()


def end_offsets(topic: str) -> int:
    consumer = KafkaConsumer(bootstrap_servers=KAFKA)
    try:
        parts = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or set()]
        return sum(consumer.end_offsets(parts).values())
    finally:
        consumer.close()


def test_two_processes_one_killed_the_other_takes_its_partitions_exact(env: h.Env) -> None:
    h.produce(env.settings, 15_000, seed=19)
    total = end_offsets(env.settings.events_topic)
    a = env.start(6.0, 300, 1)
    b = env.start(6.0, 300, 1)
    try:
        wait_until(lambda: env.committed() >= 2_000, 120, "2000 offsets committed by the two processes")
        kill_host(b)
        killed_at = time.monotonic()
        assert env.committed() < total  # killed mid-stream
        wait_until(lambda: env.committed() >= total, 180, f"all {total} offsets committed by the survivor")
        takeover_s = time.monotonic() - killed_at
        assert a.wait(timeout=60) == 0  # it drained every partition, then went idle and exited
        rows = h.compare_online(env, h.expected(env.settings))
        assert rows > 100
        record_figure("nearline_process_kill", {
            "all_committed_after_kill_s": round(takeover_s, 1), "records": total, "rows_checked": rows,
            "session_timeout_ms": 6000,
        })  # fmt: skip
    finally:
        for proc in (a, b):
            if proc.poll() is None:
                kill_host(proc)
