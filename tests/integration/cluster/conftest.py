"""The cluster profile's failure tests (issue 19): shared pieces.

They run against the processes ``make cluster-up`` (infra/cluster.sh) started: the Flink session
cluster (REST 8281), Spark standalone (7077), the 3-broker Kafka (19092-19094). A test that kills or
stops a part starts it again before it ends, so the next test finds the whole profile. Without the
profile the tests skip, naming the command that starts it.

The realtime job writes to the single Redis (6379) unless a test names the profile's Redis Cluster
(``REDIS_CLUSTER``, 7000-7005): the JVM sink opens a JedisCluster for a ``redis-cluster://`` URL.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
from kafka import KafkaAdminClient
from kafka.admin import NewTopic

ROOT = Path(__file__).resolve().parents[3]
CLUSTER_SH = ROOT / "infra" / "cluster.sh"
STATE = Path(os.environ.get("HEADWATER_SERVICES_DIR", ROOT / "infra" / "state")) / "cluster"
HOST = os.environ.get("HEADWATER_HOST", "127.0.0.1")
FLINK_REST = f"http://{HOST}:{os.environ.get('HEADWATER_FLINK_REST_PORT', '8281')}"
JOBMANAGER = FLINK_REST.removeprefix("http://")
KAFKA_BASE = int(os.environ.get("HEADWATER_KAFKA_CLUSTER_PORT", "19092"))
KAFKA = ",".join(f"{HOST}:{KAFKA_BASE + i}" for i in range(3))
SPARK_MASTER = f"spark://{HOST}:{os.environ.get('HEADWATER_SPARK_MASTER_PORT', '7077')}"
SPARK_UI = f"http://{HOST}:{os.environ.get('HEADWATER_SPARK_UI_PORT', '8380')}"
REDIS_CLUSTER_PORT = int(os.environ.get("HEADWATER_REDIS_CLUSTER_PORT", "7000"))
REDIS_CLUSTER = f"redis-cluster://{HOST}:{REDIS_CLUSTER_PORT}"

# The realtime tier's fixtures and helpers (scratch plan with the test views, Feed, reference checks).
_spec = importlib.util.spec_from_file_location(
    "headwater_rt_conftest", ROOT / "tests" / "integration" / "pipelines" / "realtime" / "conftest.py"
)
assert _spec is not None
assert _spec.loader is not None
rt = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = rt  # its dataclasses look their module up there
_spec.loader.exec_module(rt)
plan = rt.plan  # the module-scoped fixture: a scratch repo with rt_all and rt_items applied


def get_json(url: str, method: str = "GET") -> Any:
    request = urllib.request.Request(url, method=method)
    with urllib.request.urlopen(request, timeout=10) as response:
        body = response.read()
    return json.loads(body) if body else None


def part_pid(name: str) -> int:
    return int((STATE / name / f"{name}.pid").read_text().strip())


def cluster_sh(*args: str) -> None:
    subprocess.run(["bash", str(CLUSTER_SH), *args], check=True, cwd=ROOT)


def flink_taskmanagers() -> list[str]:
    return sorted(tm["id"] for tm in get_json(f"{FLINK_REST}/taskmanagers")["taskmanagers"])


def spark_alive_workers(ids: bool = False) -> Any:
    """The number of ALIVE Spark workers (``ids``: their ids; a killed one stays ALIVE until its timeout)."""
    got = get_json(f"{SPARK_UI}/json/")
    if ids:
        return [w["id"] for w in got["workers"] if w["state"] == "ALIVE"]
    return int(got["aliveworkers"])


def wait_until(check: Callable[[], bool], timeout_s: float, what: str, log: Path | None = None) -> float:
    """Poll ``check`` every 0.25 s; return the seconds it took, or fail naming ``what``."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        try:
            if check():
                return time.monotonic() - started
        except (OSError, ValueError, KeyError):
            pass  # a REST endpoint restarting: try again
        time.sleep(0.25)
    tail = log.read_text(errors="replace")[-4000:] if log and log.exists() else ""
    pytest.fail(f"timed out after {timeout_s:g} s waiting for {what}\n{tail}")


@pytest.fixture(scope="session")
def cluster() -> None:
    """Skip unless the cluster profile answers (2 TaskManagers, a Spark worker, 3 Kafka brokers)."""
    try:
        tms = flink_taskmanagers()
        workers = spark_alive_workers()
        admin = KafkaAdminClient(bootstrap_servers=KAFKA, request_timeout_ms=10_000)
        brokers = len(admin.describe_cluster()["brokers"])
        admin.close()
    except Exception as exc:
        pytest.skip(f"the cluster profile is not up ({exc}): run `make cluster-up` first")
    if len(tms) != 2 or workers != 1 or brokers != 3:
        pytest.skip(f"the cluster profile is incomplete (TaskManagers {tms}, Spark workers {workers}, "
                    f"Kafka brokers {brokers}): run `make cluster-up`")  # fmt: skip


def record_figure(name: str, value: dict[str, Any]) -> None:
    """Print a recovery figure; bench/bench_cluster.py collects them via HEADWATER_CLUSTER_FIGURES."""
    print(f"figure {name}: {value}")
    out = os.environ.get("HEADWATER_CLUSTER_FIGURES")
    if out:
        path = Path(out)
        figures = json.loads(path.read_text()) if path.exists() else {}
        figures[name] = value
        path.write_text(json.dumps(figures, indent=2, sort_keys=True))


@dataclass
class Names:
    topic: str
    dlq: str
    namespace: str


@pytest.fixture
def names(cluster: None, redis_url: str) -> Iterator[Names]:
    """A topic and a DLQ on the 3-broker Kafka (RF 3), and a Redis namespace; removed afterwards."""
    tag = uuid.uuid4().hex[:8]
    n = Names(f"test.cl.{tag}", f"test.cl.{tag}.dlq", f"hwcl{tag}")
    admin = KafkaAdminClient(bootstrap_servers=KAFKA)
    admin.create_topics([NewTopic(n.topic, 1, 3), NewTopic(n.dlq, 1, 3)])
    yield n
    admin.delete_topics([n.topic, n.dlq])
    admin.close()
    client = redis.Redis.from_url(redis_url)
    keys = list(client.scan_iter(match=f"{n.namespace}:*", count=1000))
    if keys:
        client.delete(*keys)
    client.close()


class ClusterJob:
    """``headwater run realtime --jobmanager``: submitted to the session cluster, cancelled at the end."""

    def __init__(
        self, state: Path, names: Names, checkpoints: Path, log: Path, redis_url: str | None = None
    ) -> None:
        cmd = [
            sys.executable, "-m", "headwater.cli.realtime", "--state-dir", str(state),
            "--checkpoint-dir", str(checkpoints), "--source", "events", "--topic", f"events={names.topic}",
            "--dlq-topic", names.dlq, "--namespace", names.namespace, "--group-id", f"g-{names.namespace}",
            "--checkpoint-interval", "2", "--parallelism", "1", "--jobmanager", JOBMANAGER,
        ]  # fmt: skip
        env = {**os.environ, "HEADWATER_KAFKA_BOOTSTRAP": KAFKA}
        if redis_url:
            env["HEADWATER_REDIS_URL"] = redis_url
        done = subprocess.run(
            cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False
        )
        log.write_text(done.stdout + done.stderr)
        assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
        found = re.search(r"realtime job ([0-9a-f]{32}) submitted", done.stdout)
        assert found, done.stdout[-2000:]
        self.job_id = found.group(1)
        self.log = log

    def info(self) -> Any:
        return get_json(f"{FLINK_REST}/jobs/{self.job_id}")

    def all_running(self) -> bool:
        job = self.info()
        return job["state"] == "RUNNING" and all(v["status"] == "RUNNING" for v in job["vertices"])

    def taskmanagers(self) -> set[str]:
        """The TaskManagers that run the job's tasks now."""
        out: set[str] = set()
        for vertex in self.info()["vertices"]:
            got = get_json(f"{FLINK_REST}/jobs/{self.job_id}/vertices/{vertex['id']}/taskmanagers")
            out.update(tm["taskmanager-id"] for tm in got["taskmanagers"] if tm["status"] == "RUNNING")
        return out

    def restored_checkpoint(self) -> int | None:
        latest = get_json(f"{FLINK_REST}/jobs/{self.job_id}/checkpoints")["latest"]
        restored = latest.get("restored")
        return int(restored["id"]) if restored else None

    def cancel(self) -> None:
        with contextlib.suppress(OSError):
            get_json(f"{FLINK_REST}/jobs/{self.job_id}?mode=cancel", method="PATCH")


def realtime_sent_events() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The restore test's events: before the failure, after it (a duplicate, then the clock to T0+30 s)."""
    e = rt.event
    before = [
        e(1, "u1", "impression", 500, position=1, category="c1"),
        e(2, "u1", "click", 1500, position=1, category="c1"),
        e(3, "u2", "impression", 4500, position=3, category="c3"),
        e(4, "u1", "purchase", 11_000, price=7.5, category="c2"),
        e(5, "u1", "click", 12_500, position=2, category="c2"),
        e(6, "u2", "click", 13_000, position=3, category="c3"),
        e(7, "u1", "dwell", 14_000, dwell_ms=2000),
        e(8, "u1", "impression", 16_000, position=4, category="c1"),
        e(9, "u2", "purchase", 18_000, price=3.0, category="c3"),
        e(10, "u1", "click", 19_500, position=4, category="c1"),
    ]
    after = [
        e(7, "u1", "dwell", 14_000, dwell_ms=2000),  # a duplicate of a pre-failure event: counts once
        e(11, "u1", "click", 21_000, position=1, category="c2"),
        e(12, "u1", "dwell", 22_000, dwell_ms=4000),
        e(13, "u2", "impression", 23_000, position=2, category="c1"),
        e(14, "u1", "impression", 24_500, position=5, category="c2"),
        e(15, "u2", "click", 26_000, position=2, category="c1"),
        e(16, "u1", "click", 27_500, position=5, category="c2"),
        e(17, "u1", "purchase", 29_000, price=12.0, category="c2"),
        e(18, "zz", "impression", 30_000),  # moves the job's clock to T0+30 s
    ]
    return before, after
