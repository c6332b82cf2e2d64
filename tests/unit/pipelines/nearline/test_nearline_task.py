"""PartitionTask without Kafka: values at the published boundary equal the reference; late/bad to DLQ."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest

from headwater.pipelines.events.codec import EventCodec
from headwater.pipelines.events.generator import EventGenerator, GeneratorConfig
from headwater.pipelines.events.testing import Record as Rec
from headwater.pipelines.events.timing import SourceTiming
from headwater.pipelines.nearline.state import PartitionStore
from headwater.pipelines.nearline.task import PartitionTask
from headwater.pipelines.windows import compile_view, empty_values, reference_values, split_late

_path = Path(__file__).parents[3] / "integration/pipelines/nearline/harness.py"
_spec = importlib.util.spec_from_file_location("nl_harness_unit", _path)
assert _spec is not None
assert _spec.loader is not None
h = importlib.util.module_from_spec(_spec)
sys.modules["nl_harness_unit"] = h
_spec.loader.exec_module(h)


def test_task_matches_reference_and_restores_from_its_store(tmp_path: Path) -> None:
    codec = EventCodec()
    gen = EventGenerator(GeneratorConfig(seed=3, rate=20.0, users=40), codec)
    recs, events = [], []
    for i, em in enumerate(gen.take(4000)):
        if em.event is not None:
            recs.append(Rec(i, codec.encode(em.event), codec.headers()))
            events.append(dict(em.event))
        else:
            assert em.malformed is not None
            recs.append(Rec(i, em.malformed.value, list(em.malformed.headers)))
    specs = [compile_view(v) for v in h.nearline_views()]
    timing = SourceTiming.of(h.BEHAVIOUR)
    assert (timing.max_out_of_orderness_ms, timing.allowed_lateness_ms) == (5_000, 60_000)
    now = max(e["event_time"] for e in events)  # the clock: no event is ahead of it
    task = PartitionTask(0, PartitionStore(tmp_path, 0), specs, timing, codec)
    dead: list[Any] = []
    for s in range(0, len(recs), 700):
        out = task.process(recs[s : s + 700], now_ms=now)
        task.store.commit(out.changes, s)
        dead += out.dead
    accepted, late = split_late(events, 5_000, 60_000)
    assert sum(d.reason == "late" for d in dead) == len(late) > 0
    assert sum(d.reason != "late" for d in dead) == len(recs) - len(events) > 0
    restored = PartitionTask(0, task.store, specs, timing, codec)
    restored.load(task.store.load())
    for spec in specs:
        t_pub = task.views[spec.name].t_pub
        assert t_pub == (max(e["event_time"] for e in accepted) - 5_000) // spec.tick_ms * spec.tick_ms
        ref = reference_values(spec, accepted, t_pub)
        users = sorted({e["user_id"] for e in accepted})
        for t in (task, restored):
            got = t.values(spec.name, users, t_pub)
            for u, row in zip(users, got, strict=True):
                want = list(ref[u].values()) if u in ref else list(empty_values(spec).values())
                for a, b in zip(row, want, strict=True):
                    if isinstance(b, float) and b != b:
                        assert a != a
                    elif isinstance(b, tuple):
                        assert [v for v, _ in a] == [v for v, _ in b]
                    else:
                        assert a == pytest.approx(b)
    task.store.close()
