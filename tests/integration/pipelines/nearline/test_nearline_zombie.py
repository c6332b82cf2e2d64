"""A zombie nearline worker is fenced (issue 16): it overwrites neither the changelog nor Redis.

Worker A stops itself (SIGSTOP, the ``HEADWATER_NEARLINE_PAUSE_AT`` test hook) in the middle of a
batch, like a GC pause or a network partition longer than the session timeout. Worker B (its own
state folder: another host) joins, gets the partition once A's session expired, restores it from
the changelog and reads on; a late event then changes the values at the boundary A was about to
publish. B stops; A resumes (SIGCONT) where it was paused:

- ``before_publish``: A had committed its batch and was about to write its values to Redis. Those
  values are stale (they lack the late event) at the same boundary, so without a fence they would
  win (a recomputation at the same event time overwrites). The write is refused (the fence key
  holds B's generation), A's supervisor counts it as ``fenced``.
- ``before_commit``: A had sent its batch into its open transaction. B's ``init_transactions`` (same
  transactional id) aborted it; A's commit fails as fenced. Without transactions, A's pane records
  and meta record would land on the changelog after B's, and the next restore would read them.

A is killed (kill -9) as soon as it reports the fence, so nobody repairs what it might have
written. Then the online values equal the reference over every event, and the changelog, replayed
as a restore replays it, equals B's store record for record.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaProducer
from rocksdict import Options, Rdict

from headwater.pipelines.events.codec import DecodedEvent, EventCodec
from headwater.pipelines.nearline.plan import changelog_topic
from headwater.pipelines.nearline.runner import PAUSE_ENV
from headwater.pipelines.nearline.state import CHANGELOG_POS_KEY
from headwater.pipelines.settings import Settings
from headwater.pipelines.store import OnlineStore
from headwater.pipelines.store.store import fence_key

_spec = importlib.util.spec_from_file_location("nl_harness", Path(__file__).with_name("harness.py"))
assert _spec is not None
assert _spec.loader is not None
h = importlib.util.module_from_spec(_spec)
sys.modules["nl_harness"] = h
_spec.loader.exec_module(h)


@pytest.fixture
def env(settings: Settings, kafka_bootstrap: str, tmp_path: Path) -> Iterator[h.Env]:
    e = h.Env(settings=dataclasses.replace(settings), tmp=tmp_path, partitions=1)
    e.create()
    yield e
    e.cleanup()


def _stopped(pid: int) -> bool:
    """Whether the process is stopped (state T in /proc)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] in ("T", "t")


def _wait(what: str, check: Any, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)


def _start(e: h.Env, name: str, **kwargs: Any) -> tuple[Any, Path]:
    before = set(e.tmp.glob("worker-*.log"))
    proc = e.start(store_dir=e.tmp / f"stores-{name}", **kwargs)
    (log,) = set(e.tmp.glob("worker-*.log")) - before
    return proc, log


def _fence(env: h.Env) -> int:
    """The epoch in the fence of the nl_activity view for partition 0 (0: none yet)."""
    store = OnlineStore.from_url(env.settings.redis_url, namespace=env.namespace)
    try:
        owner = f"{changelog_topic(env.group, 'events')}.p0"
        raw = store.client.get(fence_key("nl_activity", owner, env.namespace))
    finally:
        store.close()
    return int(raw) if raw is not None else 0


def _send_late_clicks(env: h.Env, users: int = 20) -> None:
    """Clicks just before the partition's boundary B: accepted (within the lateness), values at B change."""
    exp = h.expected(env.settings)
    (evs,) = exp.accepted.values()
    max_t = max(e["event_time"] for e in evs)
    boundary = (max_t - h.OOO_MS) // 60_000 * 60_000
    assert boundary - 1 >= max_t - h.OOO_MS - h.LATENESS_MS  # accepted, not late
    codec = EventCodec(h.BEHAVIOUR)
    template = next(r for r in h.read_topic(env.settings, env.settings.events_topic) if r.key != b"malformed")
    decoded = codec.decode(template.value, template.headers)
    assert isinstance(decoded, DecodedEvent)
    seen: list[str] = []
    for e in evs:
        if e["user_id"] not in seen:
            seen.append(e["user_id"])
    producer = KafkaProducer(bootstrap_servers=env.settings.kafka_bootstrap, acks="all")
    for i, user in enumerate(seen[:users]):
        event = {**decoded.event, "event_id": f"late-{i}", "user_id": user, "event_type": "click"}
        event["event_time"] = boundary - 1
        producer.send(
            env.settings.events_topic, key=user.encode(), value=codec.encode(event), headers=codec.headers()
        )
    producer.flush()
    producer.close()


def _values_exact(env: h.Env) -> bool:
    try:
        h.compare_online(env, h.expected(env.settings))
    except AssertionError:
        return False
    return True


def _changelog_state(env: h.Env) -> dict[bytes, bytes]:
    """The changelog replayed as a restore replays it (committed records, last value per key)."""
    state: dict[bytes, bytes] = {}
    for rec in h.read_topic(env.settings, changelog_topic(env.group, "events")):
        if rec.value is None:
            state.pop(rec.key, None)
        else:
            state[rec.key] = rec.value
    return state


def _store_state(folder: Path) -> dict[bytes, bytes]:
    db = Rdict(str(folder / "events" / "p0" / "db"), options=Options(raw_mode=True))
    try:
        return {k: v for k, v in db.items() if k != CHANGELOG_POS_KEY}
    finally:
        db.close()


@pytest.mark.parametrize("pause_at", ["before_publish", "before_commit"])
def test_a_paused_worker_that_lost_its_partition_is_fenced(env: h.Env, pause_at: str) -> None:
    h.produce(env.settings, 2_000, seed=16)
    a, a_log = _start(env, "a", idle_exit_s=600, max_poll=100_000, env={PAUSE_ENV: pause_at})
    b = None
    try:
        _wait(f"worker A to stop itself {pause_at}", lambda: _stopped(a.pid), 120)
        a_epoch = _fence(env)  # A claimed it when the partition was assigned
        assert a_epoch > 0
        b, _ = _start(env, "b", idle_exit_s=600)
        _wait("worker B to own the partition", lambda: _fence(env) > a_epoch, 120)
        _wait("worker B to publish every event", lambda: _values_exact(env), 120)
        _send_late_clicks(env)
        _wait("worker B to publish the late clicks", lambda: _values_exact(env), 120)
        b.send_signal(signal.SIGTERM)
        assert b.wait(timeout=60) == 0
        os.kill(a.pid, signal.SIGCONT)
        _wait("worker A to report the fence", lambda: "(fenced:" in a_log.read_text(errors="replace"), 60)
        a.kill()  # before its restarted worker rejoins and re-publishes: what A wrote stays visible
        a.wait(timeout=30)
    finally:
        for proc in (a, b):
            if proc is not None and proc.poll() is None:
                os.kill(proc.pid, signal.SIGCONT)
                proc.kill()
                proc.wait()
    assert _values_exact(env), "a stale value of the zombie is in Redis"
    changelog = _changelog_state(env)
    assert changelog == _store_state(env.tmp / "stores-b")
    assert len(changelog) > 100
