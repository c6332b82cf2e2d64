"""What the online store loses, the nearline repair pass writes again within an interval (issue 33).

A private redis-server (own port and folder, ``appendonly yes``, ``appendfsync everysec``) and the
shared Kafka with this test's topics. The worker runs with ``nearline.repair.interval_s: 2`` from a
headwater.yaml of the test. Once its values equal the reference, Redis is killed with SIGKILL right
after the batch and started again from its append-only file; then keys are deleted by hand and one
value is put back dated one tick earlier with other numbers (what a lost write, a failover to a
replica behind, or an eviction leaves: a kill -9 of the process alone may lose nothing, as the kernel
has the file's pages). Without a new event, the pass must bring every key back: 0 mismatches against
the reference, and the repair counters in Redis say so.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import redis

from headwater.pipelines.freshness.repairs import read_repair_status
from headwater.pipelines.settings import Settings
from headwater.pipelines.store import OnlineStore

_spec = importlib.util.spec_from_file_location("nl_harness", Path(__file__).with_name("harness.py"))
assert _spec is not None
assert _spec.loader is not None
h = importlib.util.module_from_spec(_spec)
sys.modules["nl_harness"] = h
_spec.loader.exec_module(h)


class PrivateRedis:
    """A redis-server of this test's own, with AOF fsync every second, that it may kill -9."""

    def __init__(self, workdir: Path) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = int(s.getsockname()[1])
        self.workdir = workdir
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        cmd = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
               "--appendonly", "yes", "--appendfsync", "everysec", "--dir", str(self.workdir)]  # fmt: skip
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis(port=self.port)
        for _ in range(200):
            try:
                if client.ping():
                    client.close()
                    return
            except redis.ConnectionError:
                time.sleep(0.05)
        raise AssertionError(f"private redis-server on {self.port} did not answer PING")

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)


@pytest.fixture
def own(tmp_path: Path) -> Iterator[PrivateRedis]:
    server = PrivateRedis(tmp_path / "redis")
    server.workdir.mkdir()
    server.start()
    yield server
    server.stop()


@pytest.fixture
def env(settings: Settings, kafka_bootstrap: str, own: PrivateRedis, tmp_path: Path) -> Iterator[h.Env]:
    e = h.Env(settings=dataclasses.replace(settings, redis_url=own.url), tmp=tmp_path, partitions=2)
    e.create()
    yield e
    e.cleanup()


def _mismatches(env: h.Env, exp: h.Expected) -> tuple[int, int]:
    """Return (mismatches, rows checked) of the user views against the reference at each boundary."""
    store = OnlineStore.from_url(env.settings.redis_url, namespace=env.namespace)
    dictionary = h.RedisDictionary(store.client, namespace=env.namespace)
    bad = checked = 0
    try:
        for spec in [h.compile_view(v) for v in h.nearline_views()]:
            for evs in exp.accepted.values():
                boundary = (max(e["event_time"] for e in evs) - h.OOO_MS) // spec.tick_ms * spec.tick_ms
                ref = h.reference_values(spec, evs, boundary)
                users = sorted(ref)
                got = store.read_batch(h.view_layout(spec), users)
                want = h.to_vectors(spec, [list(ref[u].values()) for u in users], dictionary.ids)
                for i in range(len(users)):
                    checked += 1
                    same = got.found[i] and got.event_time_ms[i] == boundary
                    same = same and np.allclose(got.values[i], want[i], rtol=1e-6, atol=1e-6, equal_nan=True)
                    bad += not same
    finally:
        store.close()
    return bad, checked


def _wait_consistent(env: h.Env, exp: h.Expected, timeout_s: float) -> tuple[int, int]:
    deadline = time.monotonic() + timeout_s
    while True:
        bad, checked = _mismatches(env, exp)
        if bad == 0 or time.monotonic() > deadline:
            return bad, checked
        time.sleep(1.0)


def test_a_kill_9_and_lost_keys_are_repaired_within_an_interval(env: h.Env, own: PrivateRedis) -> None:
    repo = env.tmp / "repo"
    repo.mkdir()
    (repo / "headwater.yaml").write_text(
        "version: 1\nnearline:\n  repair:\n    interval_s: 2\n    max_keys: 500\n"
    )
    h.produce(env.settings, 2_500, seed=71)
    worker = env.start(300.0, env={"HEADWATER_REPO": str(repo)})
    try:
        exp = h.expected(env.settings)
        bad, checked = _wait_consistent(env, exp, 120)
        assert bad == 0, checked
        assert checked > 30, checked

        own.kill9()  # right after the batch: the worker is idle, its last writes a moment old
        own.start()  # from the append-only file
        client = redis.Redis.from_url(own.url)
        store = OnlineStore.from_url(own.url, namespace=env.namespace)
        try:
            layout = h.view_layout(h.compile_view(h.nearline_views()[0]))
            keys = sorted(client.scan_iter(match=f"{env.namespace}:{{{layout.view}}}:*", count=1000))
            assert len(keys) > 20
            lost = keys[:15]
            client.delete(*lost)  # lost by hand
            prefix = f"{env.namespace}:{{{layout.view}}}:".encode()
            victim = keys[20][len(prefix) :].decode()
            old = store.read_batch(layout, [victim])
            client.delete(keys[20])  # ... and one put back older, with other numbers
            store.write_batch(layout, [victim], old.values + 1, int(old.event_time_ms[0]) - 60_000)
        finally:
            store.close()
        damaged, _ = _mismatches(env, exp)
        assert damaged >= 1  # the pass may already have repaired some; never all before it ran

        bad, checked = _wait_consistent(env, exp, 60)
        assert bad == 0
        status = read_repair_status(client, [layout.view], env.namespace)[layout.view]
        client.close()
        assert status.counts.repaired >= 16
        assert status.counts.missing >= 15
        assert status.counts.stale >= 1
        assert status.passes >= 1
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(60)
    logs = "".join(p.read_text(errors="replace") for p in env.tmp.glob("worker-*.log"))
    assert "repair pass in" in logs
    assert "fenced" not in logs
    assert os.environ.get("HEADWATER_REPO") != str(repo)
