"""The online store on a real Redis Cluster (3 primaries, 3 replicas) started by infra/redis-cluster.sh.

The cluster is private to this module (its own ports and state folder), so killing one of its
primaries never touches the shared Redis the other tests use.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import redis

from headwater.pipelines.freshness.samples import read_entries
from headwater.pipelines.store import OnlineStore, StoreError, ViewLayout, view_slot
from headwater.pipelines.store.connect import StoreURLError, redis_client
from headwater.pipelines.windows import RedisDictionary

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[4]
SCRIPT = ROOT / "infra" / "redis-cluster.sh"
T0 = 1_767_225_600_000


def _free_base() -> int:
    """A base port whose 6 node ports and 6 cluster-bus ports (+10000) are all free."""
    for base in range(21000, 29000, 100):
        ports = [p + d for p in range(base, base + 6) for d in (0, 10000)]
        if all(_free(p) for p in ports):
            return base
    pytest.fail("no free port range for a private Redis Cluster")


def _free(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, str]]]:
    base = _free_base()
    env = {
        **os.environ,
        "HEADWATER_SERVICES_DIR": str(tmp_path_factory.mktemp("redis-cluster")),
        "HEADWATER_REDIS_CLUSTER_PORT": str(base),
    }
    subprocess.run(["bash", str(SCRIPT), "start"], env=env, check=True, timeout=120)
    try:
        yield f"redis-cluster://127.0.0.1:{base}", env
    finally:
        subprocess.run(["bash", str(SCRIPT), "wipe"], env=env, check=False, timeout=120)


def layout(view: str, version: str = "v1") -> ViewLayout:
    return ViewLayout(view=view, entity="user", features=("a", "b", "c"), ttl_s=3600, version=version)


def test_cluster_urls_open_a_cluster_client_and_bad_ones_say_what_to_write() -> None:
    with pytest.raises(StoreURLError, match="only database 0"):
        redis_client("redis-cluster://127.0.0.1:7000/3")
    with pytest.raises(StoreURLError, match=r"expected redis-cluster://\[USER:PASSWORD@\]HOST:PORT"):
        redis_client("redis-cluster://")


def test_views_in_different_slots_round_trip_through_the_cluster(cluster: tuple[str, dict[str, str]]) -> None:
    url, _ = cluster
    store = OnlineStore.from_url(url, namespace="hwc")
    assert isinstance(store.client, redis.RedisCluster)
    views = [layout(f"view_{i}") for i in range(8)]
    slots = {view_slot(v.view) for v in views}
    owners = {store.client.get_node_from_key(f"{{{v.view}}}").name for v in views}
    assert len(slots) == 8
    assert len(owners) >= 2  # the views really live on different primaries
    rng = np.random.default_rng(3)
    written = {}
    for v in views:
        ids = [f"u{j}" for j in range(50)]
        values = rng.random((50, 3), dtype=np.float32)
        assert store.write_batch(v, ids, values, T0).written == 50
        written[v.view] = (ids, values)
    results = store.read_many([(v, written[v.view][0]) for v in views])
    for v, got in zip(views, results, strict=True):
        assert got.found.all()
        np.testing.assert_array_equal(got.values, written[v.view][1])
        assert got.versions == ["v1"] * 50
        assert got.other_version_rows() == 0
    # a replay is a no-op, an older event time loses: the same write script, per slot
    assert store.write_batch(views[0], ["u0"], written["view_0"][1][:1], T0).unchanged == 1
    assert store.write_batch(views[0], ["u0"], np.zeros((1, 3), np.float32), T0 - 1000).stale == 1
    entries, _ = read_entries(store.client, "view_3", "hwc")
    assert [(e.rows, e.version) for e in entries] == [(50, "v1")]
    store.close()


def test_dictionary_ids_are_assigned_once_on_the_cluster(cluster: tuple[str, dict[str, str]]) -> None:
    url, _ = cluster
    client = redis_client(url)
    first = RedisDictionary(client, "hwc").ids("category", ["books", "games", "books"])
    again = RedisDictionary(client, "hwc").ids("category", ["games", "toys"])
    assert first == [1, 2, 1]
    assert again == [2, 3]
    client.close()


def test_a_killed_primary_fails_over_and_the_store_keeps_its_values(
    cluster: tuple[str, dict[str, str]],
) -> None:
    url, env = cluster
    store = OnlineStore.from_url(url, namespace="hwf")
    view = layout("failover_view")
    ids = [f"u{j}" for j in range(100)]
    values = np.arange(300, dtype=np.float32).reshape(100, 3)
    assert store.write_batch(view, ids, values, T0).written == 100
    primary = store.client.get_node_from_key(f"{{{view.view}}}")
    # the write is on the replica before the primary dies (replication is asynchronous; a new
    # cluster's replica may still be making its first sync: ask again until it has acknowledged)
    acked = 0
    for _ in range(30):
        acked = store.client.execute_command("WAIT", 1, 1000, target_nodes=primary)
        if acked == 1:
            break
    assert acked == 1
    port = primary.port
    services = Path(env["HEADWATER_SERVICES_DIR"])
    pid = int((services / f"redis-cluster-{port}" / f"redis-cluster-{port}.pid").read_text())
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    got = None
    while time.monotonic() < deadline:  # the replica takes over after the node timeout (2 s)
        try:
            got = store.read_batch(view, ids)
            if store.client.get_node_from_key(f"{{{view.view}}}").port != port:
                break
        except StoreError:  # unavailable until the replica has taken over
            time.sleep(0.5)
            continue
        time.sleep(0.5)
    assert got is not None
    assert store.client.get_node_from_key(f"{{{view.view}}}").port != port
    again = store.read_batch(view, ids)
    assert again.found.all()
    np.testing.assert_array_equal(again.values, values)
    # writes go on against the new primary; a newer event time replaces, no value goes backwards
    newer = values + 1
    assert store.write_batch(view, ids, newer, T0 + 1000).written == 100
    assert store.write_batch(view, ids, values, T0).stale == 100
    np.testing.assert_array_equal(store.read_batch(view, ids).values, newer)
    store.close()
