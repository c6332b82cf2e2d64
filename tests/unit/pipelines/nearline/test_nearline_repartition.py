"""Stage A forwards item events, stage B computes the item view: equals the reference, skips re-forwards."""

from __future__ import annotations

import importlib.util
import sys
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from headwater.pipelines.events.codec import EventCodec
from headwater.pipelines.events.generator import EventGenerator, GeneratorConfig
from headwater.pipelines.events.testing import Record as Rec
from headwater.pipelines.events.timing import SourceTiming
from headwater.pipelines.nearline.repartition import (
    MARKER_HEADER,
    RepartitionedTask,
    forwarded_record,
    marker_headers,
)
from headwater.pipelines.nearline.state import PartitionStore
from headwater.pipelines.nearline.task import PartitionTask
from headwater.pipelines.windows import compile_view, empty_values, reference_values, split_late

_path = Path(__file__).parents[3] / "integration/pipelines/nearline/harness.py"
_spec = importlib.util.spec_from_file_location("nl_harness_rep", _path)
assert _spec is not None
assert _spec.loader is not None
h = importlib.util.module_from_spec(_spec)
sys.modules["nl_harness_rep"] = h
_spec.loader.exec_module(h)

TIMING = SourceTiming.of(h.BEHAVIOUR)


@dataclass
class Topic:
    """An in-memory partitioned log."""

    partitions: int
    logs: list[list[Rec]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.logs = [[] for _ in range(self.partitions)]

    def append(
        self, q: int, value: bytes, headers: list[tuple[str, bytes]], key: bytes | None = None
    ) -> None:
        self.logs[q].append(Rec(len(self.logs[q]), value, headers, key, "by-item", q))


def _forward(out: Any, p: int, topic: Topic) -> None:
    for _, value, event, offset in out.forward:
        payload, headers = forwarded_record(event, p, offset)
        topic.append(zlib.crc32(str(value).encode()) % topic.partitions, payload, headers)
    if out.watermark is not None:
        for q in range(topic.partitions):
            topic.append(q, b"", marker_headers(p, out.watermark))


def test_item_view_behind_a_repartition_equals_reference_with_re_forwards(tmp_path: Path) -> None:
    codec = EventCodec()
    gen = EventGenerator(GeneratorConfig(seed=4, rate=20.0, users=40, items=60), codec)
    source: list[list[Rec]] = [[], []]
    events: list[list[dict[str, Any]]] = [[], []]
    for em in gen.take(5000):
        if em.event is None:
            continue
        p = zlib.crc32(em.event["user_id"].encode()) % 2
        if p == 1 and em.sim_time_ms > gen.config.start_ms + 150_000:
            continue  # partition 1 ends earlier: the repartitioned watermark is its, not partition 0's
        source[p].append(Rec(len(source[p]), codec.encode(em.event), codec.headers(), partition=p))
        events[p].append(dict(em.event))
    user_specs = [compile_view(v) for v in h.nearline_views()]
    item_spec = compile_view(h.item_views()[0])
    stage_a = [
        PartitionTask(
            p, PartitionStore(tmp_path / "a", p), user_specs, TIMING, codec, forward_keys=["item_id"]
        )
        for p in (0, 1)
    ]
    topic = Topic(2)
    now = max(e["event_time"] for evs in events for e in evs)
    for s in range(0, max(len(r) for r in source), 400):
        for p, task in enumerate(stage_a):
            out = task.process(source[p][s : s + 400], now)
            _forward(out, p, topic)
            if s == 800:  # stage A crashed after step 1: the batch is forwarded a second time
                _forward(out, p, topic)
    stage_b = [
        RepartitionedTask(q, PartitionStore(tmp_path / "b", q), [item_spec], TIMING, codec, 2) for q in (0, 1)
    ]
    duplicates = 0
    for q, task in enumerate(stage_b):
        for s in range(0, len(topic.logs[q]), 333):
            out = task.process(topic.logs[q][s : s + 333], now)
            task.store.commit(out.changes, s)
            duplicates += out.duplicates
    assert duplicates == 0  # re-forwarded events were skipped by source offset, before deduplication
    accepted = [e for evs in events for e in split_late(evs, 5_000, 60_000)[0]]
    wm = min(max(e["event_time"] for e in evs) for evs in events) - 5_000
    boundary = wm // item_spec.tick_ms * item_spec.tick_ms
    ref = reference_values(item_spec, accepted, boundary)
    assert len(ref) > 20
    empty = list(empty_values(item_spec).values())
    for q, task in enumerate(stage_b):
        restored = RepartitionedTask(q, task.store, [item_spec], TIMING, codec, 2)
        restored.load(task.store.load())
        for t in (task, restored):
            vs = t.views[item_spec.name]
            assert vs.t_pub == boundary
            items = sorted({e["item_id"] for e in accepted if e["item_id"] is not None})
            mine = [i for i in items if i in vs.entities or (i in ref and zlib.crc32(i.encode()) % 2 == q)]
            for item, row in zip(mine, t.values(item_spec.name, mine, boundary), strict=True):
                want = list(ref[item].values()) if item in ref else empty
                for a, b in zip(row, want, strict=True):
                    assert a == pytest.approx(b, nan_ok=True), (item, row, want)
    assert sum(r.headers[0][0] == MARKER_HEADER for log in topic.logs for r in log) > 0
