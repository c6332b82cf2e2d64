"""The realtime job on the Flink session cluster, through a TaskManager kill and a Kafka broker stop.

Each test submits ``headwater run realtime --jobmanager`` (2 s checkpoints to a local folder, which
every process of the loopback cluster reaches), feeds the restore test's events over the 3-broker
Kafka (topic RF 3, min.insync.replicas 2), fails one part mid-stream, and checks that the online
values equal the reference semantics over the distinct events (duplicates count once, nothing lost).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import redis
from kafka import KafkaAdminClient

from headwater.registry.plans import TierPlan

from .conftest import (
    KAFKA,
    ClusterJob,
    Names,
    cluster_sh,
    flink_taskmanagers,
    part_pid,
    realtime_sent_events,
    record_figure,
    rt,
    wait_until,
)

pytestmark = pytest.mark.cluster

B_FINAL = rt.T0 + 30_000


def published(redis_url: str, names: Names, plan: TierPlan, b_ms: int, user: str = "u1") -> bool:
    _, res = rt.read_store(redis_url, names.namespace, plan, "rt_all", [user])
    return bool(res.found[0]) and int(res.event_time_ms[0]) >= b_ms


def checkpoint_after(folder: Path, since: float) -> bool:
    return any(meta.stat().st_mtime > since for meta in folder.glob("*/chk-*/_metadata"))


def assert_reference_values(
    redis_url: str, names: Names, plan: TierPlan, events: list[dict[str, Any]]
) -> None:
    accepted = list({e["event_id"]: e for e in events}.values())
    rt.assert_store_exact(redis_url, names.namespace, plan, accepted, B_FINAL)
    client = redis.Redis.from_url(redis_url)
    try:
        ref = rt.expected_vectors(plan, "rt_all", accepted, ["u1"], client, names.namespace, B_FINAL)[0]
        assert ref["u1"]["sessions_20s"] == 2.0  # the reference itself is not empty
    finally:
        client.close()


def test_taskmanager_killed_job_restarts_from_checkpoint_on_the_other(
    plan: tuple[TierPlan, Path], names: Names, redis_url: str, tmp_path: Path
) -> None:
    tier_plan, state = plan
    before, after = realtime_sent_events()
    chk = tmp_path / "checkpoints"
    log = tmp_path / "submit.log"
    feed = rt.Feed(KAFKA, names.topic)
    job = ClusterJob(state, names, chk, log)
    killed = None
    try:
        feed.send(*before)
        wait_until(lambda: published(redis_url, names, tier_plan, rt.T0 + 14_000, "u2"), 240,
                   "boundary T0+14 s on the session cluster", log)  # fmt: skip
        seen = time.time()
        wait_until(lambda: checkpoint_after(chk, seen), 60, "a checkpoint after T0+14 s was published")
        running_on = job.taskmanagers()
        assert len(running_on) == 1, running_on  # parallelism 1: one slot, one TaskManager
        killed = running_on.pop()
        os.kill(part_pid(killed), signal.SIGKILL)
        killed_at = time.monotonic()
        feed.send(*after)
        other = next(tm for tm in ("flink-tm1", "flink-tm2") if tm != killed)
        wait_until(lambda: job.all_running() and job.taskmanagers() == {other}, 180,
                   f"the job running again on {other}")  # fmt: skip
        running_s = time.monotonic() - killed_at
        final = "boundary T0+30 s after the kill"
        wait_until(lambda: published(redis_url, names, tier_plan, B_FINAL), 180, final)
        values_s = time.monotonic() - killed_at
        restored = job.restored_checkpoint()
        assert restored is not None  # the restarted tasks loaded a checkpoint, not an empty state
        assert_reference_values(redis_url, names, tier_plan, [*before, *after])
        record_figure("flink_taskmanager_kill", {
            "job_running_again_s": round(running_s, 1), "values_published_s": round(values_s, 1),
            "restored_checkpoint": restored, "restart_delay_s": 5, "heartbeat_timeout_s": 10,
        })  # fmt: skip
    finally:
        job.cancel()
        feed.close()
        if killed is not None:  # leave the profile whole for the next test
            cluster_sh("start", killed)
            wait_until(lambda: len(flink_taskmanagers()) == 2, 180, f"{killed} registered again")


def brokers() -> int:
    admin = KafkaAdminClient(bootstrap_servers=KAFKA)
    try:
        return len(admin.describe_cluster()["brokers"])
    finally:
        admin.close()


def leader_broker(topic: str) -> int:
    admin = KafkaAdminClient(bootstrap_servers=KAFKA)
    try:
        (described,) = admin.describe_topics([topic])
        return int(described["partitions"][0]["leader_id"])
    finally:
        admin.close()


def test_kafka_broker_stopped_nothing_lost_job_keeps_running(
    plan: tuple[TierPlan, Path], names: Names, redis_url: str, tmp_path: Path
) -> None:
    tier_plan, state = plan
    before, after = realtime_sent_events()
    log = tmp_path / "submit.log"
    feed = rt.Feed(KAFKA, names.topic)
    job = ClusterJob(state, names, tmp_path / "checkpoints", log)
    stopped = None
    try:
        feed.send(*before)
        wait_until(lambda: published(redis_url, names, tier_plan, rt.T0 + 14_000, "u2"), 240,
                   "boundary T0+14 s on the session cluster", log)  # fmt: skip
        stopped = f"kafka-{leader_broker(names.topic)}"  # the partition's leader: the worst one to lose
        stopped_at = time.monotonic()
        cluster_sh("stop", stopped)
        stop_s = time.monotonic() - stopped_at
        # acks=all with min.insync.replicas 2: each send returns once the 2 live replicas have it
        feed.send(*after)
        produce_s = time.monotonic() - stopped_at
        assert f"kafka-{leader_broker(names.topic)}" != stopped  # a live replica leads the partition now
        final = "boundary T0+30 s with a broker down"
        wait_until(lambda: published(redis_url, names, tier_plan, B_FINAL), 180, final)
        values_s = time.monotonic() - stopped_at
        assert job.all_running()
        assert job.restored_checkpoint() is None  # the job never restarted: the Kafka client moved on
        assert_reference_values(redis_url, names, tier_plan, [*before, *after])
        dead = rt.dead_letters(KAFKA, names.dlq, expected=1, timeout_s=5)
        assert dead == []  # nothing was routed away either
        record_figure("kafka_broker_stop", {
            "broker_stop_s": round(stop_s, 1), "produce_after_stop_s": round(produce_s, 1),
            "values_published_s": round(values_s, 1), "job_restarts": 0,
        })  # fmt: skip
    finally:
        job.cancel()
        feed.close()
        if stopped is not None:
            cluster_sh("start", stopped)
            wait_until(lambda: brokers() == 3, 120, f"{stopped} back in the cluster")
