"""The nearline repair pass without Redis: a real task's state against an in-memory store (issue 33).

:class:`MemoryRows` is an in-memory fake of the online store's row interface (``read_batch``,
``write_batch``) that keeps the packed records of ``codec.py`` and applies ``write.lua``'s rules: a
fence held by a greater epoch refuses the whole call, a newer stored event time is kept, the same
event time and payload is unchanged. A real :class:`PartitionTask` folds generated events whose
user ids are drawn by hypothesis (any Unicode, separators and glob characters among them); its
values are published as step 3 of the commit protocol does; then hypothesis deletes, ages, corrupts
or advances stored rows, and one pass must leave the store equal to the state, except the newer rows,
which it never touches.
"""

from __future__ import annotations

import importlib.util
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from headwater.pipelines.events.codec import EventCodec
from headwater.pipelines.events.generator import EventGenerator, GeneratorConfig
from headwater.pipelines.events.testing import Record
from headwater.pipelines.events.timing import SourceTiming
from headwater.pipelines.freshness.repairs import RepairCounts, parse_status
from headwater.pipelines.freshness.report import Report
from headwater.pipelines.freshness.text import render_text
from headwater.pipelines.nearline.repair import Repairer, RepairStore, StepResult, repair_rows
from headwater.pipelines.nearline.state import PartitionStore
from headwater.pipelines.nearline.task import PartitionTask
from headwater.pipelines.store import ViewLayout, codec
from headwater.pipelines.store.store import FencedError, ReadResult, WriteResult
from headwater.pipelines.windows import ViewSpec, compile_view, to_vectors, view_layout

_path = Path(__file__).parents[3] / "integration/pipelines/nearline/harness.py"
_spec = importlib.util.spec_from_file_location("nl_harness_repair", _path)
assert _spec is not None
assert _spec.loader is not None
h = importlib.util.module_from_spec(_spec)
sys.modules["nl_harness_repair"] = h
_spec.loader.exec_module(h)

SPECS: list[ViewSpec] = [compile_view(v) for v in h.nearline_views()]
LAYOUTS = {s.name: view_layout(s) for s in SPECS}
OWNER = "g-events-changelog.p0"
TIMING = SourceTiming.of(h.BEHAVIOUR)
_gen = EventGenerator(GeneratorConfig(seed=11, rate=2.0, users=40, late_share=0.0), EventCodec())
EVENTS = [dict(em.event) for em in _gen.take(900) if em.event is not None]


class MemoryRows:
    """The online store's rows in a dict, with ``write.lua``'s fence and event-time rules."""

    def __init__(self) -> None:
        self.rows: dict[tuple[str, str], bytes] = {}
        self.fences: dict[tuple[str, str], int] = {}
        self.reads: list[int] = []
        """Keys of each read_batch call (a pass reads in bounded batches)."""

    def read_batch(self, layout: ViewLayout, entity_ids: Sequence[str]) -> ReadResult:
        self.reads.append(len(entity_ids))
        raw = [self.rows.get((layout.view, e)) for e in entity_ids]
        u = codec.unpack(raw, layout.dim, layout.schema_hash)
        return ReadResult(
            layout, u.values, u.found, u.event_time_ms, u.write_time_ms, u.mismatch, u.version_raw
        )

    def write_batch(
        self,
        layout: ViewLayout,
        entity_ids: Sequence[str],
        values: npt.ArrayLike,
        event_time_ms: npt.ArrayLike,
        write_time_ms: int | None = None,
        fence: tuple[str, int] | None = None,
    ) -> WriteResult:
        if fence is not None:
            held = self.fences.get((layout.view, fence[0]))
            if held is not None and held > fence[1]:
                msg = f"HWFENCED held by epoch {held}; this writer has {fence[1]}"
                raise FencedError(msg)
            self.fences[(layout.view, fence[0])] = fence[1]
        n = len(entity_ids)
        vals = np.asarray(values, dtype=np.float32).reshape(n, layout.dim)
        times = np.broadcast_to(np.asarray(event_time_ms, dtype=np.int64), (n,))
        blob = codec.pack(vals, times, write_time_ms or 1, 0, layout.schema_hash, layout.version).tobytes()
        size = codec.record_size(layout.dim)
        status = []
        for i, e in enumerate(entity_ids):
            rec, old = blob[i * size : (i + 1) * size], self.rows.get((layout.view, e))
            code = 1
            if old is not None and old[:2] == b"HW":
                old_et, new_et = _event_time(old), _event_time(rec)
                if old_et > new_et:
                    code = 0
                elif old_et == new_et and old[32:] == rec[32:]:
                    code = 2
            if code == 1:
                self.rows[(layout.view, e)] = rec
            status.append(code)
        return WriteResult(np.array(status, dtype=np.int8))


def _event_time(rec: bytes) -> int:
    return int.from_bytes(rec[8:16], "little", signed=True)


class Ids:
    """An in-memory dictionary: a new id per new string of a field (as RedisDictionary assigns)."""

    def __init__(self) -> None:
        self.table: dict[str, dict[str, int]] = {}

    def __call__(self, field: str, values: Sequence[Any]) -> list[int]:
        t = self.table.setdefault(field, {})
        return [t.setdefault(str(v), len(t) + 1) for v in values]


def _task(root: Path, user_ids: Sequence[str], refresh_all: bool = True) -> PartitionTask:
    """A task that folded EVENTS with their users mapped onto ``user_ids``."""
    c = EventCodec()
    users = sorted({e["user_id"] for e in EVENTS})
    to_id = {u: user_ids[i % len(user_ids)] for i, u in enumerate(users)}
    recs = [
        Record(i, c.encode({**e, "user_id": to_id[e["user_id"]]}), c.headers()) for i, e in enumerate(EVENTS)
    ]
    task = PartitionTask(0, PartitionStore(root, 0), SPECS, TIMING, c, refresh_all=refresh_all)
    task.online = MemoryRows()  # type: ignore[attr-defined]
    task.ids = Ids()  # type: ignore[attr-defined]
    now = max(e["event_time"] for e in EVENTS)
    for s in range(0, len(recs), 300):
        out = task.process(recs[s : s + 300], now_ms=now)
        task.store.commit(out.changes, s)
        for view, (boundary, entities) in out.publish.items():  # step 3 of the commit protocol
            if entities and boundary > 0:
                vectors = to_vectors(task.views[view].spec, task.values(view, entities, boundary), task.ids)  # type: ignore[attr-defined]
                task.online.write_batch(LAYOUTS[view], entities, vectors, boundary, fence=(OWNER, 3))  # type: ignore[attr-defined]
    return task


def _online(task: PartitionTask, epoch: int = 3) -> RepairStore:
    return RepairStore(task.online, LAYOUTS, task.ids, lambda _tp, _view: (OWNER, epoch))  # type: ignore[attr-defined]


def _live(task: PartitionTask, view: str) -> list[str]:
    vs = task.views[view]
    return [e for e, panes in vs.entities.items() if any(s < vs.t_pub for s in panes)]


def _want(task: PartitionTask, view: str, entity: str) -> npt.NDArray[np.float32]:
    vs = task.views[view]
    return to_vectors(vs.spec, task.values(view, [entity], vs.t_pub), task.ids)[0]  # type: ignore[attr-defined]


def _full_pass(task: PartitionTask, online: RepairStore, max_keys: int = 10_000) -> StepResult:
    rep = Repairer(interval_s=0, max_keys=max_keys)
    rep.start({"tp": task})
    while True:
        step = rep.step({"tp": task}, online)
        assert step is not None
        if step.finished is not None:
            return step


def _put(rows: MemoryRows, layout: ViewLayout, entity: str, values: npt.NDArray[np.float32], t: int) -> None:
    """Store a row as it is, with no rule (what a lost write, a failover or a hand edit leaves)."""
    blob = codec.pack(values.reshape(1, -1), np.array([t]), 1, 0, layout.schema_hash, layout.version)
    rows.rows[(layout.view, entity)] = blob.tobytes()


ID = st.text(st.characters(exclude_categories=("Cs",)), min_size=1, max_size=12)
ACTIONS = ("keep", "delete", "older", "corrupt", "newer")


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    user_ids=st.lists(ID, min_size=3, max_size=30, unique=True),
    actions=st.lists(st.sampled_from(ACTIONS), min_size=1, max_size=60),
    max_keys=st.integers(1, 50),
)
def test_one_pass_makes_the_store_equal_the_state_and_never_touches_a_newer_row(
    user_ids: list[str], actions: list[str], max_keys: int
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        task = _task(Path(tmp), [*user_ids, "a\x1fb", "c\nd", "{x}*?:"])
        rows: MemoryRows = task.online  # type: ignore[attr-defined]
        done: dict[tuple[str, str], str] = {}
        expected = {"missing": 0, "stale": 0, "checked": 0}
        i = 0
        for view in LAYOUTS:
            layout, t_pub = LAYOUTS[view], task.views[view].t_pub
            live = _live(task, view)
            assert live, view
            expected["checked"] += len(live)
            for entity in live:
                action = actions[i % len(actions)]
                i += 1
                done[(view, entity)] = action
                want = _want(task, view, entity)
                other = np.where(np.isnan(want), 1.0, want + 1).astype(np.float32)
                if action == "delete":
                    del rows.rows[(view, entity)]
                    expected["missing"] += 1
                elif action == "older":
                    _put(rows, layout, entity, other, t_pub - task.views[view].tick)
                    expected["stale"] += 1
                elif action == "corrupt":
                    _put(rows, layout, entity, other, t_pub)
                    expected["stale"] += 1
                elif action == "newer":
                    _put(rows, layout, entity, other, t_pub + 1)
        newer = {k: rows.rows[k] for k, a in done.items() if a == "newer"}
        rows.reads.clear()
        step = _full_pass(task, _online(task), max_keys)
        assert step.finished is not None
        total = sum(step.finished.values(), RepairCounts())
        assert total == RepairCounts(
            expected["checked"],
            expected["missing"],
            expected["stale"],
            expected["missing"] + expected["stale"],
        )
        assert max(rows.reads) <= max_keys  # a step reads at most max_keys keys
        for (view, entity), action in done.items():
            if action == "newer":
                assert rows.rows[(view, entity)] == newer[(view, entity)]  # never overwritten
                continue
            got = rows.read_batch(LAYOUTS[view], [entity])
            assert got.found[0]
            assert got.event_time_ms[0] == task.views[view].t_pub
            np.testing.assert_array_equal(got.values[0], _want(task, view, entity))
        again = _full_pass(task, _online(task))  # a second pass finds nothing to do
        assert again.finished is not None
        assert sum(again.finished.values(), RepairCounts()).repaired == 0
        task.store.close()


def test_a_stale_epoch_never_writes(tmp_path: Path) -> None:
    task = _task(tmp_path, ["u1", "u2", "u3", "u4"])
    rows: MemoryRows = task.online  # type: ignore[attr-defined]
    view = SPECS[0].name
    gone = _live(task, view)[0]
    del rows.rows[(view, gone)]
    rows.fences[(view, OWNER)] = 9  # a newer owner claimed the fence
    before = dict(rows.rows)
    with pytest.raises(FencedError):
        repair_rows(task, view, _live(task, view), _online(task, epoch=3), (OWNER, 3))
    assert rows.rows == before
    assert rows.fences[(view, OWNER)] == 9
    counts = repair_rows(task, view, _live(task, view), _online(task, epoch=9), (OWNER, 9))
    assert (counts.missing, counts.repaired) == (1, 1)
    task.store.close()


def test_changed_only_keeps_an_older_time_with_the_same_value(tmp_path: Path) -> None:
    task = _task(tmp_path, ["u1", "u2", "u3"], refresh_all=False)
    rows: MemoryRows = task.online  # type: ignore[attr-defined]
    view = SPECS[0].name
    layout, t_pub = LAYOUTS[view], task.views[view].t_pub
    entity = _live(task, view)[0]
    _put(rows, layout, entity, _want(task, view, entity), t_pub - 60_000)  # unchanged since then
    counts = repair_rows(task, view, [entity], _online(task), (OWNER, 3))
    assert counts == RepairCounts(1, 0, 0, 0)
    task.store.close()


def test_passes_start_every_interval_and_step_within_max_keys(tmp_path: Path) -> None:
    task = _task(tmp_path, [f"u{i}" for i in range(25)])
    now = [100.0]
    rep = Repairer(interval_s=120, max_keys=7, clock=lambda: now[0])
    online = _online(task)
    assert rep.step({"tp": task}, online) is None  # the first pass: one interval after the start
    now[0] = 220.0
    steps = []
    while True:
        step = rep.step({"tp": task}, online)
        assert step is not None
        steps.append(step)
        assert sum(c.checked for c in step.counts.values()) <= 7
        if step.finished is not None:
            break
    live = sum(len(_live(task, v)) for v in LAYOUTS)
    assert sum(c.checked for c in step.finished.values()) == live
    assert len(steps) >= live // 7
    assert rep.step({"tp": task}, online) is None  # next pass at 340
    now[0] = 340.0
    assert rep.step({}, online) is not None  # the task was revoked: the pass ends at once
    assert not rep.running
    task.store.close()


def test_repair_status_parses_and_the_text_report_shows_it() -> None:
    status = parse_status(
        {b"checked": b"40", b"missing": b"3", b"stale": b"2", b"repaired": b"5", b"passes": b"4",
         b"last_pass_ms": b"1000", b"last_repaired": b"5", b"junk": b"x"}
    )  # fmt: skip
    assert status.counts == RepairCounts(40, 3, 2, 5)
    assert (status.passes, status.last_pass_ms, status.last_repaired) == (4, 1000, 5)
    from headwater.pipelines.freshness.report import FreshnessTarget, view_freshness

    v = view_freshness(FreshnessTarget("nl_activity", "nearline", 60.0), [], 61_000, 60_000)
    import dataclasses

    text = render_text(Report(61_000, 60.0, [dataclasses.replace(v, repair=status)]))
    assert (
        "repair nearline nl_activity: 5 repaired (3 missing, 2 stale) of 40 checked in 4 passes; "
        "last pass 1m00s ago repaired 5"
    ) in text
