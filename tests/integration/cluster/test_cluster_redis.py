"""The realtime job on the session cluster writing to the profile's Redis Cluster, through a failover.

``headwater run realtime --jobmanager`` with ``HEADWATER_REDIS_URL=redis-cluster://...``: the JVM sink
(RedisStore) opens a JedisCluster; each view's keys share one hash slot, so each write chunk goes to
one primary. Mid-stream the primary that owns ``rt_all``'s slot is killed (SIGKILL): its replica is
promoted, the sink retries until it writes again (the job does not restart), and the values equal
the reference semantics over the distinct events; a value read during the outage never goes back in
event time.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis

from headwater.pipelines.store.connect import redis_client
from headwater.pipelines.store.transport import StoreUnavailableError
from headwater.registry.plans import TierPlan

from .conftest import (
    KAFKA,
    REDIS_CLUSTER,
    ROOT,
    ClusterJob,
    Names,
    realtime_sent_events,
    record_figure,
    rt,
    wait_until,
)

pytestmark = pytest.mark.cluster

B_FINAL = rt.T0 + 30_000
STATE_DIR = Path(os.environ.get("HEADWATER_SERVICES_DIR", ROOT / "infra" / "state"))


@pytest.fixture
def cluster_store(names: Names) -> Iterator[redis.RedisCluster]:  # type: ignore[type-arg]
    """A client of the profile's Redis Cluster (skip if it is not up); the test namespace is dropped after."""
    try:
        client = redis_client(REDIS_CLUSTER, socket_timeout=5.0)
        client.ping()
    except redis.RedisError as exc:
        pytest.skip(f"no Redis Cluster answers at {REDIS_CLUSTER} ({exc}): run `make cluster-up`")
    assert isinstance(client, redis.RedisCluster)
    yield client
    try:
        for key in list(client.scan_iter(match=f"{names.namespace}:*", count=1000)):
            client.delete(key)
    finally:
        client.close()


def event_time(names: Names, plan: TierPlan, view: str, entity: str) -> int | None:
    _, res = rt.read_store(REDIS_CLUSTER, names.namespace, plan, view, [entity])
    return int(res.event_time_ms[0]) if res.found[0] else None


def assert_reference_values(client: Any, names: Names, plan: TierPlan, events: list[dict[str, Any]]) -> None:
    accepted = list({e["event_id"]: e for e in events}.values())
    for view, ids in (("rt_all", ["u1", "u2"]), ("rt_items", ["i0", "i1", "i2"])):
        _, res = rt.read_store(REDIS_CLUSTER, names.namespace, plan, view, ids)
        assert res.found.all(), (view, res.found)
        changed = rt.last_change_ms(plan, view, accepted, ids, client, names.namespace, B_FINAL)
        assert res.event_time_ms.tolist() == changed, (view, changed)
        _, want = rt.expected_vectors(plan, view, accepted, ids, client, names.namespace, B_FINAL)
        np.testing.assert_allclose(res.values, want, rtol=1e-6, equal_nan=True, err_msg=view)
    ref = rt.expected_vectors(plan, "rt_all", accepted, ["u1"], client, names.namespace, B_FINAL)[0]
    assert ref["u1"]["sessions_20s"] == 2.0  # the reference itself is not empty


def test_realtime_job_writes_to_redis_cluster_through_a_primary_failover(
    plan: tuple[TierPlan, Path], names: Names, cluster_store: Any, tmp_path: Path
) -> None:
    tier_plan, state = plan
    before, after = realtime_sent_events()
    log = tmp_path / "submit.log"
    feed = rt.Feed(KAFKA, names.topic)
    job = ClusterJob(state, names, tmp_path / "checkpoints", log, redis_url=REDIS_CLUSTER)
    killed_port = None
    try:
        feed.send(*before)
        wait_until(lambda: (event_time(names, tier_plan, "rt_all", "u2") or 0) >= rt.T0 + 14_000, 240,
                   "boundary T0+14 s in the Redis Cluster", log)  # fmt: skip
        primary = cluster_store.get_node_from_key("{rt_all}")
        killed_port = int(primary.port)
        node = f"redis-cluster-{killed_port}"
        seen_before = event_time(names, tier_plan, "rt_all", "u1")
        assert seen_before is not None
        os.kill(int((STATE_DIR / node / f"{node}.pid").read_text().strip()), signal.SIGKILL)
        killed_at = time.monotonic()
        feed.send(*after)
        # While the replica takes over, every value read is at least as new as before the kill.
        seen: list[int] = []

        def caught_up() -> bool:
            try:
                got = event_time(names, tier_plan, "rt_all", "u1")
            except StoreUnavailableError:
                return False  # the reader's own client during the failover; the writer is what is tested
            if got is not None:
                seen.append(got)
            return got is not None and got >= B_FINAL

        wait_until(caught_up, 180, "boundary T0+30 s after the primary was killed", log)
        values_s = time.monotonic() - killed_at
        assert all(t >= seen_before for t in seen), (seen_before, seen)
        assert seen == sorted(seen)  # no value went back in event time
        promoted = redis_client(REDIS_CLUSTER).get_node_from_key("{rt_all}")
        assert int(promoted.port) != killed_port  # a replica owns the slot now
        assert job.all_running()
        assert job.restored_checkpoint() is None  # the sink waited the failover out: no job restart
        assert_reference_values(cluster_store, names, tier_plan, [*before, *after])
        assert rt.dead_letters(KAFKA, names.dlq, expected=1, timeout_s=5) == []
        record_figure("redis_primary_kill_realtime", {
            "values_published_s": round(values_s, 1), "killed_port": killed_port,
            "promoted_port": int(promoted.port), "node_timeout_ms": 2000,
            "job_restarts": 0,
        })  # fmt: skip
    finally:
        job.cancel()
        feed.close()
        if killed_port is not None:  # back as a replica of the promoted node: the profile stays whole
            subprocess.run(["bash", str(ROOT / "infra" / "redis-cluster.sh"), "start"], check=True, cwd=ROOT,
                           timeout=120)  # fmt: skip
