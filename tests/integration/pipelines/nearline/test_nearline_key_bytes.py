r"""Entity keys holding ``\x1f`` or a newline never stop the nearline tier (issue 33, item 1).

Before the length-prefixed state keys, one event whose user id held the byte 0x1F was processed,
and every later start failed to restore (``ValueError: too many values to unpack``), wiping the
local store included: the key was in the compacted changelog. Here, on real Kafka and Redis, the
worker (a real process) folds events of such users, then restarts three times: from its local
store, from the changelog alone (store folder deleted), and from a changelog rewritten in the old
``\x1f``-separated format (what a store written before the fix holds), which it migrates once.
Every run's online values equal the reference over every event of the topic.
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from kafka import KafkaProducer

from headwater.pipelines.events.codec import EventCodec
from headwater.pipelines.events.generator import EventGenerator, GeneratorConfig
from headwater.pipelines.nearline.state import LEGACY_SEP, decode_dedup_key, decode_pane_key, is_legacy
from headwater.pipelines.settings import Settings
from headwater.pipelines.store import OnlineStore
from headwater.pipelines.windows import compile_view, view_layout

_spec = importlib.util.spec_from_file_location("nl_harness_key_bytes", Path(__file__).with_name("harness.py"))
assert _spec is not None
assert _spec.loader is not None
h = importlib.util.module_from_spec(_spec)
sys.modules["nl_harness_key_bytes"] = h
_spec.loader.exec_module(h)

ODD = ["u\x1fpoison", "u\nnewline", "u\x1f\x1f7\n*[{"]


@pytest.fixture
def env(settings: Settings, kafka_bootstrap: str, redis_url: str, tmp_path: Path) -> Iterator[h.Env]:
    e = h.Env(settings=settings, tmp=tmp_path, partitions=2)
    e.create()
    yield e
    e.cleanup()


def produce(settings: Settings, n: int, seed: int, start_ms: int | None = None) -> int:
    """Produce ``n`` well-formed events, one in five of a user in :data:`ODD`; return the last time."""
    codec = EventCodec()
    extra = {"start_ms": start_ms} if start_ms else {}
    gen = EventGenerator(GeneratorConfig(seed=seed, rate=2.0, users=40, malformed_share=0.0, **extra), codec)
    producer = KafkaProducer(bootstrap_servers=settings.kafka_bootstrap, linger_ms=20, acks="all")
    last = 0
    for i, em in enumerate(gen.take(n)):
        if em.event is None:
            continue
        event = dict(em.event)
        if i % 5 == 0:
            event["user_id"] = ODD[i % len(ODD)]
        producer.send(
            settings.events_topic,
            key=event["user_id"].encode(),
            value=codec.encode(event),
            headers=codec.headers(),
        )
        last = em.sim_time_ms
    producer.flush()
    producer.close()
    return last


def run(env: h.Env) -> str:
    """Run one worker until idle (it must exit 0); return its log."""
    before = set(env.tmp.glob("worker-*.log"))
    assert env.start(6, 2000, 1, "--session-timeout-ms", "30000").wait(timeout=180) == 0
    (log,) = set(env.tmp.glob("worker-*.log")) - before
    return log.read_text(errors="replace")


def check(env: h.Env) -> None:
    """Online values equal the reference over every event; the odd users have theirs."""
    assert h.compare_online(env, h.expected(env.settings)) > 20
    store = OnlineStore.from_url(env.settings.redis_url, namespace=env.namespace)
    try:
        for view in h.nearline_views():
            got = store.read_batch(view_layout(compile_view(view)), ODD)
            assert got.found.all(), view.name
    finally:
        store.close()


def rewrite_changelog_in_old_format(env: h.Env) -> int:
    """Re-key every live pane and dedup record of the changelog the old way (tombstoning the new key)."""
    topic = f"{env.group}-events-changelog"
    last: dict[bytes, tuple[int, bytes | None]] = {}
    for rec in h.read_topic(env.settings, topic):
        last[rec.key] = (rec.partition, rec.value)
    producer = KafkaProducer(bootstrap_servers=env.settings.kafka_bootstrap, acks="all")
    rewritten = 0
    for key, (partition, value) in last.items():
        if value is None or key[:1] not in (b"p", b"d") or is_legacy(key):
            continue
        if key[:1] == b"p":
            view, entity, pane = decode_pane_key(key)
            parts = [view.encode(), entity.encode(), b"%d" % pane]
        else:
            parts = [b"%d" % n for n in decode_dedup_key(key)]
        old = LEGACY_SEP.join([key[:1], *parts])
        producer.send(topic, key=old, value=value, partition=partition)
        producer.send(topic, key=key, value=None, partition=partition)
        rewritten += 1
    producer.flush()
    producer.close()
    return rewritten


def test_separator_and_newline_entities_survive_every_restart(env: h.Env) -> None:
    t = produce(env.settings, 1500, seed=3)
    first = run(env)
    assert "do not decode" not in first
    check(env)

    t = produce(env.settings, 600, seed=4, start_ms=t + 1)
    run(env)  # from its local store
    check(env)

    shutil.rmtree(env.store_dir / "events")  # the compacted changelog alone
    t = produce(env.settings, 600, seed=5, start_ms=t + 1)
    from_changelog = run(env)
    assert "restored from empty" in from_changelog
    assert "do not decode" not in from_changelog
    check(env)

    # A changelog written before the fix: the same records under \x1f-separated keys (entities with
    # \x1f in them too), read on restore and migrated once.
    assert rewrite_changelog_in_old_format(env) > 20
    shutil.rmtree(env.store_dir / "events")
    t = produce(env.settings, 600, seed=6, start_ms=t + 1)
    migrated = run(env)
    assert "rewritten from old-format" in migrated
    assert "do not decode" not in migrated
    check(env)
    live_old = {
        r.key: r.value
        for r in h.read_topic(env.settings, f"{env.group}-events-changelog")
        if is_legacy(r.key)
    }
    assert live_old
    assert all(v is None for v in live_old.values())  # every old key tombstoned by the migration

    shutil.rmtree(env.store_dir / "events")  # and the migrated changelog restores alone
    produce(env.settings, 300, seed=7, start_ms=t + 1)
    again = run(env)
    assert "rewritten from old-format" not in again
    check(env)
