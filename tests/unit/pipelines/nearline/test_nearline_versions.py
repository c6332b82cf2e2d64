"""State per view version without Kafka: what a restore keeps, drops and backfills, and that a
backfill from the middle of the stream (the start chosen by record timestamp) folds exactly what a
view that ran from the start holds."""

from __future__ import annotations

import importlib.util
import sys
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from headwater.pipelines.events.codec import EventCodec
from headwater.pipelines.events.generator import EventGenerator, GeneratorConfig
from headwater.pipelines.events.testing import Record as Rec
from headwater.pipelines.events.timing import SourceTiming
from headwater.pipelines.nearline.backfill import replay_start_ms
from headwater.pipelines.nearline.state import Loaded, PartitionStore, pane_key
from headwater.pipelines.nearline.task import PartitionTask
from headwater.pipelines.nearline.versions import sort_state
from headwater.pipelines.windows import compile_view
from headwater.pipelines.windows.testing import plan_feature, plan_view

_path = Path(__file__).parents[3] / "integration/pipelines/nearline/harness.py"
_spec = importlib.util.spec_from_file_location("nl_harness_unit_versions", _path)
assert _spec is not None
assert _spec.loader is not None
h = importlib.util.module_from_spec(_spec)
sys.modules["nl_harness_unit_versions"] = h
_spec.loader.exec_module(h)

ACTIVITY = compile_view(h.nearline_views()[0])
SHORT = compile_view(
    plan_view(
        "nl_short",
        [
            plan_feature("clicks_5m", "count", 5, 1, flt="event_type = 'click'"),
            plan_feature("last_query_5m", "last", 5, 1, "query", "event_type = 'search'"),
            plan_feature("categories_10m", "distinct_count", 10, 2, "category"),
            plan_feature("top_categories_10m", "top_k", 10, 2, "category", k=3),
            plan_feature("price_avg_10m", "avg", 10, 1, "price"),
        ],
    )
)
"""The view added mid-stream: windows short enough for the replay to start inside the stream."""
TIMING = SourceTiming.of(h.BEHAVIOUR)


def _loaded(panes: dict[str, int]) -> Loaded:
    return Loaded(panes={v: [(f"u{i}", i * 60_000, [1]) for i in range(n)] for v, n in panes.items()})


def test_same_versions_keep_everything() -> None:
    meta = {"offset": 10, "versions": {"a": "v1", "b": "v2"}, "forward": ["item_id"]}
    r = sort_state(meta, _loaded({"a": 3, "b": 2}), {"a": "v1", "b": "v2"}, {"item_id"})
    assert (r.kept, r.dropped, r.backfill, r.reforward, r.changes, r.changed) == (
        ["a", "b"],
        {},
        [],
        [],
        {},
        False,
    )


def test_changed_new_and_removed_views() -> None:
    meta = {"offset": 10, "versions": {"a": "v1", "b": "v2", "gone": "v9"}, "forward": []}
    r = sort_state(
        meta, _loaded({"a": 2, "b": 2, "gone": 3}), {"a": "v1", "b": "v3", "new": "v4"}, {"item_id"}
    )
    assert r.kept == ["a"]
    assert r.backfill == ["b", "new"]
    assert r.dropped == {"b": "version v2 -> v3", "gone": "removed from the plan"}
    assert r.reforward == ["item_id"]  # a join key the partition never forwarded by
    assert r.changes == {
        **{pane_key("b", f"u{i}", i * 60_000): None for i in range(2)},
        **{pane_key("gone", f"u{i}", i * 60_000): None for i in range(3)},
    }
    assert r.changed


def test_a_store_written_before_versions_is_rebuilt() -> None:
    meta = {"offset": 10, "registry": "sha256:old", "t_pub": {"a": 60_000}}
    r = sort_state(meta, _loaded({"a": 2}), {"a": "v1"}, {"item_id"})
    assert (r.kept, r.backfill, r.reforward, r.unversioned) == ([], ["a"], ["item_id"], True)
    assert r.dropped == {"a": "state written before view versions"}
    assert len(r.changes) == 2


def test_a_partition_without_committed_offset_starts_every_view_with_the_stream() -> None:
    r = sort_state({}, Loaded(), {"a": "v1", "b": "v2"}, {"item_id"})
    assert (r.kept, r.backfill, r.reforward, r.changed) == (["a", "b"], [], [], False)


def _stream(seed: int, n: int, delays: list[int]) -> tuple[list[Rec], list[int], int]:
    """Generator records (late, out of order, duplicates, malformed) and their record timestamps.

    A record's timestamp is its emission time plus a delay: never before its event time.
    """
    codec = EventCodec()
    gen = EventGenerator(GeneratorConfig(seed=seed, rate=1.0, users=25), codec)
    recs, stamps, last = [], [], 0
    for i, em in enumerate(gen.take(n)):
        if em.event is not None:
            recs.append(Rec(i, codec.encode(em.event), codec.headers()))
            last = max(last, em.event["event_time"])
        else:
            assert em.malformed is not None
            recs.append(Rec(i, em.malformed.value, list(em.malformed.headers)))
        stamps.append(em.sim_time_ms + delays[i % len(delays)])
    return recs, stamps, last


def _panes(task: PartitionTask, view: str) -> dict[str, dict[int, Any]]:
    vs = task.views[view]
    return {e: {p: vs.agg.dump(r) for p, r in panes.items()} for e, panes in vs.entities.items()}


def _run(task: PartitionTask, recs: list[Rec], now: int, commit: bool = True) -> None:
    for s in range(0, len(recs), 150):
        out = task.process(recs[s : s + 150], now)
        if commit:
            task.store.commit(out.changes, s)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 10_000),
    cut=st.floats(0.6, 0.95),
    delays=st.lists(st.integers(0, 20_000), min_size=1, max_size=5),
)
def test_backfill_from_mid_stream_equals_the_view_run_from_the_start(
    seed: int, cut: float, delays: list[int]
) -> None:
    """Old plan [activity] up to offset C; new plan [activity, short]: short is replayed from the
    first record stamped at or after T0 (what ``offsets_for_times`` returns) to C, then both go on.
    Every pane of both views, right after the switch and at the end, equals a task that ran
    [activity, short] from the first record."""
    recs, stamps, last = _stream(seed, 3_000, delays)  # ~40 min of events, T0 ~18 min before the cut
    now = last + 1  # the clock: no event is ahead of it
    c = int(len(recs) * cut)
    codec = EventCodec()
    with tempfile.TemporaryDirectory() as tmp:
        full = PartitionTask(0, PartitionStore(Path(tmp) / "full", 0), [ACTIVITY, SHORT], TIMING, codec)
        _run(full, recs[:c], now, commit=False)
        old = PartitionTask(0, PartitionStore(Path(tmp) / "s", 0), [ACTIVITY], TIMING, codec)
        _run(old, recs[:c], now)
        old.store.close()
        new = PartitionTask(0, PartitionStore(Path(tmp) / "s", 0), [ACTIVITY, SHORT], TIMING, codec)
        new.load(new.store.load())
        assert (new.restored.kept, new.restored.backfill) == (["nl_activity"], ["nl_short"])
        t0 = replay_start_ms(new, ["nl_short"], 0)
        assert t0 is not None
        start = next((i for i, t in enumerate(stamps[:c]) if t >= t0), c)
        assert start > 0  # the replay starts inside the stream
        helper = new.helper(["nl_short"])
        _run(helper, recs[start:c], now, commit=False)
        new.finish_helper(helper, now)
        new.adopt(helper, {})
        for view in ("nl_activity", "nl_short"):  # right after the switch
            assert new.views[view].t_pub == full.views[view].t_pub
            assert _panes(new, view) == _panes(full, view), view
        _run(full, recs[c:], now, commit=False)
        _run(new, recs[c:], now)
        for view in ("nl_activity", "nl_short"):
            assert new.views[view].t_pub == full.views[view].t_pub
            assert _panes(new, view) == _panes(full, view), view
        new.store.close()
        full.store.close()


def test_short_history_is_kept_in_the_meta_until_the_windows_are_full(tmp_path: Path) -> None:
    recs, _, last = _stream(9, 600, [0])
    task = PartitionTask(0, PartitionStore(tmp_path, 0), [ACTIVITY, SHORT], TIMING, EventCodec())
    _run(task, recs[:300], last + 1)
    full_at = task.views["nl_short"].t_pub + 4 * SHORT.tick_ms
    task.adopt(task.helper(["nl_short"]), {"nl_short": full_at})
    assert task.meta_change()  # written with the switch
    assert task._meta()["short"] == {"nl_short": full_at}
    assert task.stats()["short_history"] == {"nl_short": full_at}
    _run(task, recs[300:], last + 1)
    assert task.views["nl_short"].t_pub >= full_at
    assert "short" not in task._meta()
    assert task.stats()["short_history"] == {}
