"""Steps 1 and 2 of the commit protocol: a batch's meta record reaches the changelog last.

The runner's producer is replaced by a recorder of sends and flushes (no broker): the test asserts
the order the protocol promises, which is what made the item view lose a batch after a kill -9
(the meta record on the changelog before the forwarded events and markers were acknowledged).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from kafka import TopicPartition

from headwater.pipelines.events.codec import DeadLetter
from headwater.pipelines.events.schema import behavior_source
from headwater.pipelines.nearline.plan import SourcePlan
from headwater.pipelines.nearline.runner import NearlineCommitError, NearlineConfig, NearlineWorker
from headwater.pipelines.nearline.state import META_KEY, OUTBOX_KEY, pane_key
from headwater.pipelines.nearline.task import BatchOutput, SourceTiming
from headwater.pipelines.settings import Settings


@dataclass
class Future:
    offset: int
    exception: Exception | None = None

    def failed(self) -> bool:
        return self.exception is not None

    def get(self, timeout: float) -> Future:
        return self


@dataclass
class Recorder:
    """Records sends and flushes in order; records to ``fail_topic`` fail."""

    log: list[tuple[str, Any, Any]] = field(default_factory=list)
    fail_topic: str | None = None

    def send(self, topic: str, key: bytes | None = None, value: bytes | None = None, **kw: Any) -> Future:
        self.log.append(("send", topic, key))
        exc = RuntimeError("not leader") if topic == self.fail_topic else None
        return Future(len(self.log), exc)

    def flush(self) -> None:
        self.log.append(("flush", None, None))

    def partitions_for(self, topic: str) -> set[int]:
        return {0, 1}


def _worker(producer: Recorder, tmp: Path) -> NearlineWorker:
    worker = object.__new__(NearlineWorker)  # no consumer, no Redis: only the send path is exercised
    worker.config = NearlineConfig(Settings.from_env(), tmp, tmp, group_id="g")
    worker.producer = producer  # type: ignore[assignment]
    source = SourcePlan(behavior_source(), SourceTiming(0, 0, 0), (), {"item_id": ()})
    worker.sources = {"events": source}
    worker.forwards = {"events": ["g-events-by-item_id"]}
    worker.by_key = {"g-events-by-item_id": (source, "item_id")}
    worker.changelogs = {
        TopicPartition("events", 0): "g-events-changelog",
        TopicPartition("g-events-by-item_id", 1): "g-b-cl",
    }
    return worker


def _outputs() -> dict[TopicPartition, BatchOutput]:
    dead = DeadLetter(b"x", b"k", "late", "too late", "events", 0, 5, 0)
    changes = {pane_key("v", "u1", 0): b"[1]", OUTBOX_KEY: b"{}", META_KEY: b'{"offset": 9}'}
    event = {"event_id": "e1", "item_id": "i1", "event_time": 1}
    a = BatchOutput(changes=dict(changes), dead=[dead], forward=[("item_id", "i1", event, 7)], watermark=0)
    b = BatchOutput(changes=dict(changes))
    return {TopicPartition("events", 0): a, TopicPartition("g-events-by-item_id", 1): b}


def test_meta_records_are_sent_after_everything_else_is_flushed(tmp_path: Path) -> None:
    rec = Recorder()
    positions = _worker(rec, tmp_path)._send(_outputs())
    first_flush = rec.log.index(("flush", None, None))
    before, after = rec.log[:first_flush], rec.log[first_flush + 1 :]
    topics = [t for _, t, _ in before]
    assert topics.count("g-events-by-item_id") == 1 + 2  # the forwarded event, a marker per partition
    assert topics.count(Settings.from_env().dlq_topic) == 1
    assert [k for _, t, k in before if t in ("g-events-changelog", "g-b-cl")] == [
        pane_key("v", "u1", 0),
        OUTBOX_KEY,
    ] * 2
    assert all(k != META_KEY for _, _, k in before)
    assert after == [
        ("send", "g-events-changelog", META_KEY),
        ("send", "g-b-cl", META_KEY),
        ("flush", None, None),
    ]
    # the store remembers the changelog offset of each task's meta record
    assert positions == {
        TopicPartition("events", 0): len(before) + 2,
        TopicPartition("g-events-by-item_id", 1): len(before) + 3,
    }


def test_an_unacknowledged_forward_stops_the_batch_before_its_meta_record(tmp_path: Path) -> None:
    rec = Recorder(fail_topic="g-events-by-item_id")
    with pytest.raises(NearlineCommitError, match="3 of 8 records"):
        _worker(rec, tmp_path)._send(_outputs())
    assert all(k != META_KEY for _, _, k in rec.log)
