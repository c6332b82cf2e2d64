"""Shared pieces of the realtime tier's integration tests: a scratch plan, topics, a job process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import NewTopic

from headwater.pipelines.events.codec import EventCodec
from headwater.pipelines.realtime.testing import ALL_KINDS_VIEW, ITEM_VIEW
from headwater.pipelines.store import OnlineStore
from headwater.pipelines.windows import (
    RedisDictionary,
    compile_view,
    empty_values,
    reference_values,
    to_vectors,
    view_layout,
)
from headwater.registry.plans import TierPlan, read_plan
from headwater.registry.testing import ScratchRepo

ROOT = Path(__file__).resolve().parents[4]
T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z, a multiple of every slide


@pytest.fixture(scope="module")
def plan(tmp_path_factory: pytest.TempPathFactory) -> tuple[TierPlan, Path]:
    base = tmp_path_factory.mktemp("rt_plan")
    repo = ScratchRepo(base / "features", template=ROOT / "features")
    repo.write("rt_all.yaml", ALL_KINDS_VIEW)
    repo.write("rt_items.yaml", ITEM_VIEW)
    # the payments source's realtime view too: one job runs both sources (test_realtime_sources.py)
    payments_view = "account_payments_realtime.yaml"
    repo.write(payments_view, (ROOT / "features" / payments_view).read_text(encoding="utf-8"))
    state = base / "state"
    cmd = [str(Path(sys.executable).parent / "headwater"), "apply", str(repo.root), "--state-dir", str(state)]
    done = subprocess.run([*cmd, "--no-feast"], capture_output=True, text=True, cwd=ROOT, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    return read_plan(state, "realtime"), state


@dataclass
class Names:
    topic: str
    dlq: str
    namespace: str


@pytest.fixture
def names(kafka_bootstrap: str, redis_url: str) -> Iterator[Names]:
    tag = uuid.uuid4().hex[:8]
    n = Names(f"test.rt.{tag}", f"test.rt.{tag}.dlq", f"hwtest{tag}")
    admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    admin.create_topics([NewTopic(n.topic, 1, 1), NewTopic(n.dlq, 1, 1)])
    yield n
    admin.delete_topics([n.topic, n.dlq])
    admin.close()
    client = redis.Redis.from_url(redis_url)
    keys = list(client.scan_iter(match=f"{n.namespace}:*", count=1000))
    if keys:
        client.delete(*keys)
    client.close()


def event(i: int, user: str, kind: str, t_ms: int, **fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "event_id": f"e{i}",
        "user_id": user,
        "item_id": None if kind == "search" else f"i{i % 3}",
        "event_type": kind,
        "event_time": T0 + t_ms,
        "session_id": f"s-{user}-{i % 2}",
        "category": None,
        "price": None,
        "dwell_ms": None,
        "query": "q" if kind == "search" else None,
        "position": None,
        "device": "web",
    }
    base.update(fields)
    return base


class Feed:
    """Produces scripted events (and raw bad records) to one topic, remembering what it sent.

    ``codec``: the source's codec (default: the behaviour events); records are keyed by its key field.
    """

    def __init__(self, bootstrap: str, topic: str, codec: EventCodec | None = None) -> None:
        self.codec = codec or EventCodec()
        self.topic = topic
        # zstd, as the platform producer sends: proves the connector reads compressed batches.
        self.producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", compression_type="zstd")
        self.sent: list[dict[str, Any]] = []
        self.offset = 0

    def send(self, *events: dict[str, Any]) -> None:
        for e in events:
            self.producer.send(
                self.topic, self.codec.encode(e), key=self.codec.key(e), headers=self.codec.headers()
            )
            self.sent.append(e)
            self.offset += 1
        self.producer.flush()

    def send_raw(self, value: bytes, headers: list[tuple[str, bytes]]) -> int:
        self.producer.send(self.topic, value, key=b"bad", headers=headers)
        self.producer.flush()
        self.offset += 1
        return self.offset - 1

    def close(self) -> None:
        self.producer.close()


class JobProcess:
    """``headwater run realtime`` in its own process group, so kill -9 takes the JVM with it.

    ``sources``: the sources the job runs and the topic of each (default: the behaviour events from
    ``names.topic``): one job, a pipeline per source. ``extra``: more arguments of the command.
    """

    def __init__(
        self,
        state: Path,
        names: Names,
        checkpoints: Path,
        log: Path,
        redis_url: str | None = None,
        flink_log_dir: Path | None = None,
        sources: dict[str, str] | None = None,
        extra: tuple[str, ...] = (),
    ) -> None:
        chosen = sources or {"events": names.topic}
        picks = [
            arg for name, topic in chosen.items() for arg in ("--source", name, "--topic", f"{name}={topic}")
        ]
        cmd = [
            sys.executable, "-m", "headwater.cli.realtime", "--state-dir", str(state),
            "--checkpoint-dir", str(checkpoints), *picks, "--dlq-topic", names.dlq,
            "--namespace", names.namespace, "--group-id", f"g-{names.namespace}",
            "--checkpoint-interval", "2", "--parallelism", "1", *extra,
        ]  # fmt: skip
        self.log = log.open("ab")
        env = dict(os.environ)
        if redis_url:
            env["HEADWATER_REDIS_URL"] = redis_url
        if flink_log_dir:  # the mini-cluster's own log (operators, sink), else pyflink/log/ in the venv
            env["FLINK_LOG_DIR"] = str(flink_log_dir)
        self.proc = subprocess.Popen(
            cmd, cwd=ROOT, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True, env=env
        )

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)
        self.log.close()


def read_store(redis_url: str, namespace: str, plan: TierPlan, view: str, ids: list[str]) -> Any:
    spec = compile_view(next(v for v in plan.views if v.name == view))
    store = OnlineStore.from_url(redis_url, namespace=namespace)
    try:
        return spec, store.read_batch(view_layout(spec), ids)
    finally:
        store.close()


def wait_for(check: Callable[[], bool], timeout_s: float, what: str, log: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.5)
    tail = log.read_text(errors="replace")[-4000:] if log.exists() else ""
    pytest.fail(f"timed out after {timeout_s:g} s waiting for {what}; job log tail:\n{tail}")


def dead_letters(bootstrap: str, topic: str, expected: int, timeout_s: float = 30.0) -> list[Any]:
    """The committed dead letters of ``topic``, read until ``expected`` of them came or ``timeout_s``.

    ``read_committed``: the job's dead-letter sink is exactly once, a Kafka transaction committed at each
    completed checkpoint (the tests checkpoint every 2 s), so a letter shows up at that checkpoint, and
    the letters of a transaction a kill -9 left open are never read (the restored job writes them again).
    """
    from headwater.pipelines.events.codec import parse_dead_letter

    consumer = KafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                             enable_auto_commit=False, consumer_timeout_ms=1000,
                             isolation_level="read_committed")  # fmt: skip
    out: list[Any] = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(out) < expected and time.monotonic() < deadline:
            for record in consumer:
                out.append(parse_dead_letter(record.value, record.key, record.headers))
    finally:
        consumer.close()
    return out


def committed(bootstrap: str, group: str, topic: str, partitions: int) -> int:
    """The job's committed offsets over ``topic``'s partitions, summed: the records a completed checkpoint
    holds (the Kafka source commits its offsets when a checkpoint completes)."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    try:
        return sum(consumer.committed(TopicPartition(topic, p)) or 0 for p in range(partitions))
    finally:
        consumer.close()


def expected_vectors(
    plan: TierPlan,
    view: str,
    events: list[dict[str, Any]],
    ids: list[str],
    client: Any,
    namespace: str,
    b_ms: int,
) -> Any:
    """The reference values of ``ids`` at boundary ``b_ms`` and their online vectors (same dictionary)."""
    spec = compile_view(next(v for v in plan.views if v.name == view))
    ref = reference_values(spec, events, b_ms)
    empty = empty_values(spec)
    rows = [[ref.get(i, empty)[f.name] for f in spec.features] for i in ids]
    return ref, to_vectors(spec, rows, RedisDictionary(client, namespace=namespace).ids)


def last_change_ms(
    plan: TierPlan,
    view: str,
    events: list[dict[str, Any]],
    ids: list[str],
    client: Any,
    namespace: str,
    b_ms: int,
) -> list[int]:
    """Per id, the latest boundary <= ``b_ms`` whose reference value differs from the boundary before.

    The job writes a value only when it changes, so that boundary is the event time the store holds.
    """
    slide_ms = round(next(v for v in plan.views if v.name == view).features[0].slide_s * 1000)
    out = []
    for entity in ids:
        b = b_ms
        _, now = expected_vectors(plan, view, events, [entity], client, namespace, b)
        while b > T0:
            _, before = expected_vectors(plan, view, events, [entity], client, namespace, b - slide_ms)
            if not np.allclose(before, now, rtol=1e-6, equal_nan=True):
                break
            b, now = b - slide_ms, before
        out.append(b)
    return out


STORE_IDS = (("rt_all", ["u1", "u2"]), ("rt_items", ["i0", "i1", "i2"]))
"""The entities the restart and outage tests check, per view of the test plan."""


def assert_store_exact(
    redis_url: str, namespace: str, plan: TierPlan, events: list[dict[str, Any]], b_ms: int
) -> None:
    """Assert every :data:`STORE_IDS` row is stored with the reference value at ``b_ms`` and its event time.

    The job writes a value only when it changes, so the stored event time must be the boundary of its last
    change (:func:`last_change_ms`): an earlier one means a lost write, a later one a replay that rewrote it.
    """
    client = redis.Redis.from_url(redis_url)
    try:
        for view, ids in STORE_IDS:
            _, res = read_store(redis_url, namespace, plan, view, ids)
            assert res.found.all(), (view, res.found)
            changed = last_change_ms(plan, view, events, ids, client, namespace, b_ms)
            assert res.event_time_ms.tolist() == changed, (view, changed)
            _, want = expected_vectors(plan, view, events, ids, client, namespace, b_ms)
            np.testing.assert_allclose(res.values, want, rtol=1e-6, equal_nan=True, err_msg=view)
    finally:
        client.close()


def apply(base: Path, name: str, views: dict[str, str]) -> tuple[TierPlan, Path]:
    """``headwater apply`` a scratch repo with ``views``; return its realtime plan and state folder."""
    repo = ScratchRepo(base / name / "features", template=ROOT / "features")
    for file, text in views.items():
        repo.write(file, text)
    state = base / name / "state"
    cmd = [str(Path(sys.executable).parent / "headwater"), "apply", str(repo.root), "--state-dir", str(state)]
    done = subprocess.run([*cmd, "--no-feast"], capture_output=True, text=True, cwd=ROOT, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    return read_plan(state, "realtime"), state


def checkpoints(folder: Path) -> list[tuple[int, str, float]]:
    """Complete checkpoints of the job folder: (N of chk-N, job id, mtime of _metadata)."""
    out = []
    for meta in folder.glob("*/chk-*/_metadata"):
        out.append(
            (int(meta.parent.name.removeprefix("chk-")), meta.parent.parent.name, meta.stat().st_mtime)
        )
    return out


def unique(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return list({e["event_id"]: e for e in events}.values())


class Run:
    """The job across its restarts: one checkpoint folder, one log, one topic."""

    def __init__(self, names: Names, feed: Feed, redis_url: str, tmp: Path) -> None:
        self.names, self.feed, self.redis_url = names, feed, redis_url
        self.chk = tmp / "checkpoints"
        self.log = tmp / "job.log"
        self.job: JobProcess | None = None
        self.jobs_before: set[str] = set()
        self.newest = -1

    def phase(self, plan: TierPlan, state: Path, events: list[dict[str, Any]], end_ms: int) -> None:
        """Send ``events`` (the job down), (re)start it on ``plan``, wait for ``end_ms`` and a checkpoint."""
        self.feed.send(*events)
        extra = ("--from-latest",) if self.job is not None else ()
        started = time.monotonic()
        self.job = JobProcess(state, self.names, self.chk, self.log, extra=extra)
        wait_for(
            lambda: self.u1_at(plan, end_ms), 240, f"u1's rt_all at T0+{(end_ms - T0) / 1000:g} s", self.log
        )
        # a figure for the report, not an assertion: (re)start to the phase's last value written
        print(f"{plan.registry_hash[7:19]}: started -> u1 at T0+{(end_ms - T0) / 1000:g} s written in "
              f"{time.monotonic() - started:.1f} s (load {os.getloadavg()[0]:.1f})")  # fmt: skip
        # a checkpoint triggered after the value was seen, so it holds every event read: a checkpoint
        # completed after it may have been triggered before (its _metadata is written at completion,
        # which takes long under load); the one after the next visible one is triggered later
        after = max([n for n, _, _ in checkpoints(self.chk)] + [self.newest, 0]) + 2
        wait_for(
            lambda: any(n >= after for n, _, _ in checkpoints(self.chk)),
            60,
            "a checkpoint after it",
            self.log,
        )
        self.job.kill()
        found = checkpoints(self.chk)
        mine = [n for n, j, _ in found if j not in self.jobs_before]
        # Flink numbers a restored job's checkpoints after the one it loaded: proof the state was loaded
        assert min(mine) > self.newest, (mine, self.newest)
        self.newest = max(mine)
        self.jobs_before = {j for _, j, _ in found}

    def u1_at(self, plan: TierPlan, b_ms: int) -> bool:
        _, res = read_store(self.redis_url, self.names.namespace, plan, "rt_all", ["u1"])
        return bool(res.found[0]) and int(res.event_time_ms[0]) >= b_ms

    def check(self, plan: TierPlan, view: str, ids: list[str], events: list[Any], b_ms: int) -> Any:
        """``view``'s stored values of ``ids`` equal the reference over ``events`` at ``b_ms``."""
        spec_version = next(v.version for v in plan.views if v.name == view)
        _, res = read_store(self.redis_url, self.names.namespace, plan, view, ids)
        assert res.found.all(), (view, res.found)
        assert res.versions == [spec_version] * len(ids), (view, res.versions, spec_version)
        client = redis.Redis.from_url(self.redis_url)
        try:
            ref, want = expected_vectors(plan, view, unique(events), ids, client, self.names.namespace, b_ms)
        finally:
            client.close()
        np.testing.assert_allclose(res.values, want, rtol=1e-6, equal_nan=True, err_msg=view)
        return ref
