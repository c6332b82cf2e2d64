"""Step 1 of the commit protocol: one Kafka transaction per task holds everything the batch sends.

Each task's transactional producer is replaced by a recorder (no broker): the test asserts that a
task's dead letters, forwarded events, watermark markers and changelog records all go into that
task's own transaction, the meta record last, and that the commit carries the consumed offset; a
refused commit stops the batch (``NearlineCommitError``), a fenced one says so
(``NearlineFencedError``). Before transactions, the meta record had to wait for a flush of the rest
(a kill -9 in between lost the item view's forwarded events); a transaction makes the order moot.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from kafka import TopicPartition
from kafka.errors import KafkaTimeoutError, ProducerFencedError

from headwater.pipelines.events.codec import DeadLetter
from headwater.pipelines.events.schema import behavior_source
from headwater.pipelines.events.timing import SourceTiming
from headwater.pipelines.nearline.fence import NearlineFencedError, TaskProducer
from headwater.pipelines.nearline.plan import SourcePlan
from headwater.pipelines.nearline.runner import NearlineCommitError, NearlineConfig, NearlineWorker
from headwater.pipelines.nearline.state import META_KEY, OUTBOX_KEY, pane_key
from headwater.pipelines.nearline.task import BatchOutput
from headwater.pipelines.settings import Settings


@dataclass
class Future:
    offset: int

    def get(self, timeout: float) -> Future:
        return self


@dataclass
class FakeKafkaProducer:
    """What TaskProducer calls on kafka-python's producer, recorded; ``fail``: raised by the commit."""

    log: list[tuple[str, Any, Any]] = field(default_factory=list)
    fail: Exception | None = None

    def begin_transaction(self) -> None:
        self.log.append(("begin", None, None))

    def send(self, topic: str, key: bytes | None = None, value: bytes | None = None, **kw: Any) -> Future:
        self.log.append(("send", topic, key))
        return Future(len(self.log))

    def send_offsets_to_transaction(self, offsets: dict[Any, Any], group: Any) -> None:
        self.log.append(("offsets", {tp: o.offset for tp, o in offsets.items()}, group))

    def commit_transaction(self) -> None:
        if self.fail is not None:
            raise self.fail
        self.log.append(("commit", None, None))

    def abort_transaction(self) -> None:
        self.log.append(("abort", None, None))

    def partitions_for(self, topic: str) -> set[int]:
        return {0, 1}


def _task_producer(fake: FakeKafkaProducer) -> TaskProducer:
    producer = object.__new__(TaskProducer)
    producer.txn_id, producer.producer, producer.open = "t", fake, False
    return producer


class Consumer:
    def group_metadata(self) -> str:
        return "generation-7"


def _worker(tmp: Path, fakes: dict[TopicPartition, FakeKafkaProducer]) -> NearlineWorker:
    worker = object.__new__(NearlineWorker)  # no consumer, no Redis: only the send path is exercised
    worker.config = NearlineConfig(Settings.from_env(), tmp, tmp, group_id="g")
    worker.producer = FakeKafkaProducer()  # type: ignore[assignment]  # metadata only
    worker.consumer = Consumer()  # type: ignore[assignment]
    source = SourcePlan(behavior_source(), SourceTiming(0, 0, 0), (), {"item_id": ()})
    worker.sources = {"events": source}
    worker.forwards = {"events": ["g-events-by-item_id"]}
    worker.by_key = {"g-events-by-item_id": (source, "item_id")}
    worker.changelogs = {
        TopicPartition("events", 0): "g-events-changelog",
        TopicPartition("g-events-by-item_id", 1): "g-b-cl",
    }
    worker.txn = {tp: _task_producer(fake) for tp, fake in fakes.items()}
    return worker


def _outputs() -> dict[TopicPartition, BatchOutput]:
    dead = DeadLetter(b"x", b"k", "late", "too late", "events", 0, 5, 0)
    changes = {pane_key("v", "u1", 0): b"[1]", OUTBOX_KEY: b"{}", META_KEY: b'{"offset": 9}'}
    event = {"event_id": "e1", "item_id": "i1", "event_time": 1}
    a = BatchOutput(
        changes=dict(changes), dead=[dead], forward=[("item_id", "i1", event, 7)], watermark=0, next_offset=9
    )
    b = BatchOutput(changes=dict(changes), next_offset=4)
    return {TopicPartition("events", 0): a, TopicPartition("g-events-by-item_id", 1): b}


def test_each_task_sends_its_whole_batch_in_its_own_transaction_meta_last(tmp_path: Path) -> None:
    a, b = TopicPartition("events", 0), TopicPartition("g-events-by-item_id", 1)
    fakes = {a: FakeKafkaProducer(), b: FakeKafkaProducer()}
    positions = _worker(tmp_path, fakes)._transact(_outputs())
    log_a = fakes[a].log
    assert log_a[0] == ("begin", None, None)
    topics = [t for kind, t, _ in log_a if kind == "send"]
    assert topics.count("g-events-by-item_id") == 1 + 2  # the forwarded event, a marker per partition
    assert topics.count(Settings.from_env().dlq_topic) == 1
    sends = [(t, k) for kind, t, k in log_a if kind == "send" and t == "g-events-changelog"]
    assert sends == [("g-events-changelog", pane_key("v", "u1", 0)), ("g-events-changelog", OUTBOX_KEY),
                     ("g-events-changelog", META_KEY)]  # fmt: skip
    assert log_a[-2:] == [("offsets", {a: 9}, "generation-7"), ("commit", None, None)]
    # stage B's task: only its changelog, in its own transaction
    assert [(kind, t, k) for kind, t, k in fakes[b].log if kind == "send"] == [
        ("send", "g-b-cl", pane_key("v", "u1", 0)),
        ("send", "g-b-cl", OUTBOX_KEY),
        ("send", "g-b-cl", META_KEY),
    ]
    assert fakes[b].log[-2:] == [("offsets", {b: 4}, "generation-7"), ("commit", None, None)]
    # the store remembers the changelog offset of each task's meta record
    meta_at = next(i for i, (kind, _, k) in enumerate(log_a) if kind == "send" and k == META_KEY) + 1
    assert positions[a] == meta_at


def test_a_refused_commit_stops_the_batch_and_a_fenced_one_says_so(tmp_path: Path) -> None:
    a, b = TopicPartition("events", 0), TopicPartition("g-events-by-item_id", 1)
    fakes = {a: FakeKafkaProducer(fail=KafkaTimeoutError("no broker")), b: FakeKafkaProducer()}
    with pytest.raises(NearlineCommitError, match="did not commit the transaction"):
        _worker(tmp_path, fakes)._transact(_outputs())
    assert ("abort", None, None) in fakes[a].log
    fakes = {a: FakeKafkaProducer(fail=ProducerFencedError()), b: FakeKafkaProducer()}
    with pytest.raises(NearlineFencedError, match="newer owner"):
        _worker(tmp_path, fakes)._transact(_outputs())
