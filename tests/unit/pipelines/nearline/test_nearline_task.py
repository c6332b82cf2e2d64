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


def test_a_short_windows_records_expire_with_it_and_the_values_stay_exact(tmp_path: Path) -> None:
    # 40 min of events: nl_activity's 10-min features (1-min slide) drop their records after 10 min,
    # its 30-min features (5-min slide) keep theirs (starts on the 5-min grid) for 30 min
    codec = EventCodec()
    gen = EventGenerator(GeneratorConfig(seed=5, rate=2.0, users=30, late_share=0.0), codec)
    events = [dict(em.event) for em in gen.take(6000) if em.event is not None]
    recs = [Rec(i, codec.encode(e), codec.headers()) for i, e in enumerate(events)]
    specs = [compile_view(v) for v in h.nearline_views()]
    timing = SourceTiming.of(h.BEHAVIOUR)
    now = max(e["event_time"] for e in events)
    task = PartitionTask(0, PartitionStore(tmp_path, 0), specs, timing, codec)
    expired = 0
    for s in range(0, len(recs), 500):
        out = task.process(recs[s : s + 500], now_ms=now)
        task.store.commit(out.changes, s)
        expired += out.expired_panes
    restored = PartitionTask(0, task.store, specs, timing, codec)
    restored.load(task.store.load())
    accepted, _ = split_late(events, 5_000, 60_000)
    minute = 60_000
    for spec in specs:
        vs = task.views[spec.name]
        t_pub = vs.t_pub
        assert t_pub - min(e["event_time"] for e in accepted) > 35 * minute
        starts = {s for panes in vs.entities.values() for s in panes}
        # what each start may hold: the features whose slide divides it; kept while one still needs it
        for s in starts:
            need = [f for f in spec.features if s % f.slide_ms == 0 and s >= f.window_start(t_pub)]
            assert need, (spec.name, s)
        assert {s for panes in restored.views[spec.name].entities.values() for s in panes} == starts
        if spec.name == "nl_activity":
            short = [s for s in starts if s % (5 * minute) and s < t_pub - 10 * minute]
            long = [s for s in starts if s % (5 * minute) == 0 and s < t_pub - 10 * minute]
            assert short == []  # the view's longest window (30 min) would have kept them
            assert len(long) > 0
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
    assert expired > 0
    task.store.close()
