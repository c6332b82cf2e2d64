"""The nearline tier on real Kafka and Redis dead-letters ids against the source's id policy and goes on.

The behaviour source runs with ``ids: {max_bytes: 64, charset: printable}``. Among good generator
events (with their usual late, duplicate and malformed ones) go an event whose key is 300 bytes, one
whose key holds a control character (BEL), and one whose event id holds a line separator: each lands
in the dead-letter topic as ``invalid_id`` with the text of pipelines/events/ids.py, and the views over
the good events before and after them equal the reference.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaProducer

from headwater.pipelines.events.codec import EventCodec, parse_dead_letter
from headwater.pipelines.settings import Settings

_spec = importlib.util.spec_from_file_location("nl_harness_ids", Path(__file__).with_name("harness.py"))
assert _spec is not None
assert _spec.loader is not None
h = importlib.util.module_from_spec(_spec)
sys.modules["nl_harness_ids"] = h
_spec.loader.exec_module(h)

BAD: list[tuple[dict[str, Any], str]] = [
    ({"user_id": "u" * 300}, "id-too-long: key user_id is 300 bytes, limit 64"),
    (
        {"user_id": "bad\x07user"},
        "id-not-printable: key user_id has U+0007 at character 3 (ids.charset printable)",
    ),
    (
        {"event_id": "e\u2028x"},
        "id-not-printable: event_id event_id has U+2028 at character 1 (ids.charset printable)",
    ),
]


@pytest.fixture
def env(settings: Settings, kafka_bootstrap: str, redis_url: str, tmp_path: Path) -> Iterator[h.Env]:
    e = h.Env(settings=settings, tmp=tmp_path)
    e.create()
    plan = h.write_plan(e.tmp, topic=e.settings.events_topic)
    strict = [s.model_copy(update={"id_max_bytes": 64, "id_charset": "printable"}) for s in plan.sources]
    h._write(e.tmp, plan.model_copy(update={"sources": strict}))
    yield e
    e.cleanup()


def test_bad_ids_go_to_the_dlq_with_their_reason_and_the_good_events_count(env: h.Env) -> None:
    source = h.example_source("events", env.settings.events_topic).model_copy(
        update={"id_max_bytes": 64, "id_charset": "printable"}
    )
    codec = EventCodec(source)
    last = h.produce(env.settings, 3_000, seed=41)
    producer = KafkaProducer(bootstrap_servers=env.settings.kafka_bootstrap, acks="all")
    base = {
        "event_id": "", "user_id": "u-ids", "item_id": "i1", "event_type": "click", "event_time": last,
        "session_id": "s-ids", "category": None, "price": None, "dwell_ms": None, "query": None,
        "position": None, "device": "web",
    }  # fmt: skip
    sent: dict[bytes, str] = {}
    for i, (change, detail) in enumerate(BAD):
        bad = {**base, "event_id": f"ids-{i}", **change}
        sent[codec.encode(bad)] = detail
        producer.send(
            env.settings.events_topic, key=codec.key(bad), value=codec.encode(bad), headers=codec.headers()
        )
    producer.flush()
    producer.close()
    h.produce(env.settings, 3_000, seed=42, start_ms=last + 1)
    proc = env.start(idle_exit_s=10)
    try:
        assert proc.wait(timeout=240) == 0
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    dead = [
        parse_dead_letter(r.value, r.key, r.headers)
        for r in h.read_topic(env.settings, env.settings.dlq_topic)
    ]
    # the generator's own broken events may be invalid_id too (an empty event id): ours are found by bytes
    ours = {d.value: (d.reason, d.detail) for d in dead if d.value in sent}
    assert ours == {value: ("invalid_id", detail) for value, detail in sent.items()}
    exp = h.expected(env.settings, source)
    assert sum(1 for d in dead if d.reason != "late") == exp.malformed >= len(BAD)
    assert sum(len(v) for v in exp.accepted.values()) > 5_000
    assert h.compare_online(env, exp) > 100  # the good events on both sides of the bad ones are counted
