"""Idle source partitions leave the repartitioned watermark (like Flink's withIdleness); the idle timer."""

from __future__ import annotations

from pathlib import Path

from headwater.pipelines.events.codec import EventCodec
from headwater.pipelines.events.testing import Record as Rec
from headwater.pipelines.events.timing import SourceTiming
from headwater.pipelines.nearline.repartition import (
    IdleSources,
    RepartitionedTask,
    forwarded_record,
    idle_headers,
    marker_headers,
)
from headwater.pipelines.nearline.state import PartitionStore
from headwater.pipelines.windows import ViewSpec, compile_view
from headwater.pipelines.windows.testing import plan_feature, plan_view

MIN = 60_000
T0 = 1_767_225_600_000
TIMING = SourceTiming(5_000, 60_000, 300_000)


class Log:
    """One partition of the repartition topic, in memory."""

    def __init__(self) -> None:
        self.recs: list[Rec] = []

    def marker(self, p: int, wm: int) -> Rec:
        return self._add(b"", marker_headers(p, wm))

    def idle(self, p: int, wm: int | None) -> Rec:
        return self._add(b"", idle_headers(p, wm))

    def event(self, p: int, src_offset: int, item: str, t: int) -> Rec:
        event = {"event_id": f"e{p}-{src_offset}", "item_id": item, "event_time": t, "event_type": "click"}
        payload, headers = forwarded_record(event, p, src_offset)
        return self._add(payload, headers)

    def _add(self, value: bytes, headers: list[tuple[str, bytes]]) -> Rec:
        rec = Rec(len(self.recs), value, headers, topic="by-item")
        self.recs.append(rec)
        return rec


def _spec() -> ViewSpec:
    view = plan_view("items", [plan_feature("clicks_10m", "count", 10, 1)])
    return compile_view(view.model_copy(update={"entity": "item", "join_key": "item_id"}))


def _task(tmp: Path, upstream: int = 3) -> RepartitionedTask:
    return RepartitionedTask(0, PartitionStore(tmp, 0), [_spec()], TIMING, EventCodec(), upstream)


def test_idle_source_leaves_the_minimum_until_its_next_marker(tmp_path: Path) -> None:
    task, log = _task(tmp_path), Log()
    name = _spec().name
    batch = [log.event(0, 0, "i1", T0 + 30_000), log.marker(0, T0 + 5 * MIN), log.marker(1, T0 + 7 * MIN)]
    task.process(batch, T0)
    assert task.watermark() is None  # source partition 2 has said nothing yet
    assert task.views[name].t_pub == 0
    out = task.process([log.idle(2, None)], T0)
    assert task.watermark() == T0 + 5 * MIN  # 2 is idle: min over 0 and 1
    assert out.publish[name] == (T0 + 5 * MIN, ["i1"])
    assert task.values(name, ["i1"], T0 + 5 * MIN) == [[1]]
    task.process([log.idle(0, T0 + 6 * MIN)], T0)  # 0 idle too, with a later watermark
    assert task.watermark() == T0 + 7 * MIN
    assert task.views[name].t_pub == T0 + 7 * MIN
    task.process([log.marker(2, T0 + 2 * MIN)], T0)  # 2 is back, far behind: the minimum again
    assert task.watermark() == T0 + 2 * MIN
    assert task.views[name].t_pub == T0 + 7 * MIN  # a boundary never moves back
    # 2's late event is folded and its entity re-published at the current boundary
    out = task.process([log.event(2, 0, "i2", T0 + 6 * MIN + 1)], T0)
    assert out.publish[name] == (T0 + 7 * MIN, ["i2"])
    assert task.values(name, ["i2"], T0 + 7 * MIN) == [[1]]


def test_all_sources_idle_hold_the_minimum_and_idleness_survives_a_restore(tmp_path: Path) -> None:
    task, log = _task(tmp_path, upstream=2), Log()
    out = task.process([log.idle(0, T0 + 3 * MIN), log.idle(1, T0 + 9 * MIN)], T0)
    assert task.watermark() == T0 + 3 * MIN
    task.store.commit(out.changes, 0)
    task.store.close()
    restored = _task(tmp_path, upstream=2)
    restored.load(restored.store.load())
    assert restored.idle == {0, 1}
    assert restored.wm_src == {0: T0 + 3 * MIN, 1: T0 + 9 * MIN}
    restored.process([log.marker(1, T0 + 10 * MIN)], T0)  # 1 active again, 0 still idle
    assert restored.watermark() == T0 + 10 * MIN
    assert restored.stats()["idle_sources"] == [0]
    restored.store.close()


def test_idle_timer_announces_caught_up_partitions_once() -> None:
    timer = IdleSources(10.0)
    timer.active(0, 100.0)
    timer.active(1, 100.0)
    timer.active(2, 105.0)
    caught_up = {0: True, 1: False, 2: True}.__getitem__
    assert timer.due(109.9, caught_up) == []
    assert timer.due(110.0, caught_up) == [0]  # 1 is behind its high watermark: not idle
    assert timer.due(200.0, caught_up) == [2]  # 0 was announced already
    timer.active(0, 201.0)  # records again: announced again after the next timeout
    assert timer.due(211.0, caught_up) == [0]
    timer.forget(2)
    timer.active(2, 0.0)
    assert IdleSources(None).due(1e9, caught_up) == []
    assert IdleSources(0).due(1e9, caught_up) == []
    assert idle_headers(3, None) == [("hw-idle", b"3:")]  # a partition that never had an event
    assert idle_headers(3, 42) == [("hw-idle", b"3:42")]
