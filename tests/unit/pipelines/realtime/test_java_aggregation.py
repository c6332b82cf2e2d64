"""The JVM window operator's arithmetic (infra/maven/flink-udfs ``Aggregator``) against the reference.

Runs ``dev.headwater.flink.realtime.AggregateCheck`` (a ``java`` process, no Flink runtime) over
event streams, in arrival order, with the program :mod:`headwater.pipelines.realtime.program`
compiles from a real plan; its hit columns are computed here from the plan's filters. For each
(view, entity) the last value written (newer event time wins, as in write.lua) must equal
:func:`headwater.pipelines.windows.reference_values` at the final boundary, and its event time must
be the boundary at which the reference value last changed.

Issue 16 (the chaos soak's realtime mismatches after restores with a backlog): with one partition read
behind another, and across a kill -9 and a restore, every value the store keeps (the newest event time
per key) must equal the reference at its own event time, as ``headwater consistency`` checks it.
"""

from __future__ import annotations

import math
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from headwater.pipelines.realtime.program import RealtimeProgram, StoreTarget, compile_program
from headwater.pipelines.realtime.sql import check_plan
from headwater.pipelines.realtime.testing import ALL_KINDS_VIEW, ITEM_VIEW
from headwater.pipelines.windows import compile_view, empty_values, reference_values, to_vectors
from headwater.registry.expr import from_json
from headwater.registry.expr_eval import compile_predicate
from headwater.registry.plans import TierPlan, read_plan
from headwater.registry.testing import ScratchRepo

from .jvm_check import run_driver

AGGREGATE_CHECK = "dev.headwater.flink.realtime.AggregateCheck"

ROOT = Path(__file__).resolve().parents[4]
T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z


@pytest.fixture(scope="module")
def plan(tmp_path_factory: pytest.TempPathFactory) -> TierPlan:
    base = tmp_path_factory.mktemp("agg_plan")
    repo = ScratchRepo(base / "features", template=ROOT / "features")
    repo.write("rt_all.yaml", ALL_KINDS_VIEW)
    repo.write("rt_items.yaml", ITEM_VIEW)
    payments = ROOT / "features/account_payments_realtime.yaml"  # the example view, as the soak runs it
    repo.write(payments.name, payments.read_text(encoding="utf-8"))
    exe = str(Path(sys.executable).parent / "headwater")
    cmd = [exe, "apply", str(repo.root), "--state-dir", str(base / "state"), "--no-feast"]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    return read_plan(base / "state", "realtime")


@pytest.fixture(scope="module")
def program(plan: TierPlan) -> RealtimeProgram:
    events = next(s for s in check_plan(plan) if s.name == "events")
    return compile_program(plan, events, StoreTarget("redis://127.0.0.1:6379/0"))


@pytest.fixture(scope="module")
def payments(plan: TierPlan) -> RealtimeProgram:
    """The example payments view's program (one group: account, 1 s slide; 1m and 5m windows, two filters)."""
    source = next(s for s in check_plan(plan) if s.name == "payments")
    return compile_program(plan, source, StoreTarget("redis://127.0.0.1:6379/0"))


HEAD = {"hw_event_id": "event_id", "hw_time_ms": "event_time"}
"""The program's id and time columns, as the behaviour events name them (a millisecond event time)."""


def rows(program: RealtimeProgram, events: list[dict[str, Any]]) -> list[list[Any]]:
    """The operator's input rows: the program's columns, hits evaluated from the plan's filters."""
    hits = [compile_predicate(from_json(w.ast)) for w in program.hit_filters]
    fields = [HEAD.get(c.name, c.name) for c in program.columns[: len(program.columns) - len(hits)]]
    return [[e.get(n) for n in fields] + [bool(h(e)) for h in hits] for e in events]


def run_check(program: RealtimeProgram, lines: list[Any]) -> tuple[list[dict[str, Any]], dict[str, int]]:
    out = run_driver(AGGREGATE_CHECK, lines, header=program.text)
    return out[:-1], out[-1]["outcomes"]


def stored(updates: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    """What the store keeps per (view, entity), as write.lua decides: the newest event time; an equal
    one is rewritten; a value that holds up to ``valid_to`` past a stored time is rewritten there."""
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for u in updates:
        key = (u["view"], u["entity"])
        held = out.get(key)
        if held is not None and u["event_time"] < held["event_time"] <= u["valid_to"]:
            u = {**u, "event_time": held["event_time"]}
        if held is None or u["event_time"] >= held["event_time"]:
            out[key] = u
    return out


class Ids:
    """A dictionary shared by both sides of the comparison: ids in order of first use."""

    def __init__(self) -> None:
        self.table: dict[tuple[str, str], int] = {}

    def ids(self, field: str, values: Any) -> list[int]:
        return [self.table.setdefault((field, str(v)), len(self.table) + 1) for v in values]


def java_vector(program: RealtimeProgram, u: dict[str, Any], ids: Ids) -> np.ndarray:
    view = next(v for g in program.data["groups"] for v in g["views"] if v["name"] == u["view"])
    slots = np.array([float(s) for s in u["slots"]], dtype=np.float32)
    offset = 0
    for f in view["features"]:
        width = 2 * f["k"] if f["agg"] == "top_k" else 1
        for i in range(width):
            text = u["dict"][offset + i]
            if f["dict_field"] and text is not None:
                slots[offset + i] = ids.ids(f["dict_field"], [text])[0]
        offset += width
    return slots


def expected(
    plan: TierPlan, view_name: str, events: list[dict[str, Any]], b_ms: int, ids: Ids
) -> dict[str, Any]:
    """Per entity: the reference vector at ``b_ms`` and the boundary where it last changed.

    The walk back stops at the entity's first boundary: the operator writes an entity's first value
    when the first slice of its group (any view with its join key and slide) enters, even unchanged.
    """
    view = next(v for v in plan.views if v.name == view_name)
    spec = compile_view(view)
    slide = round(view.features[0].slide_s * 1000)
    group = [compile_view(v) for v in plan.views
             if v.join_key == view.join_key and round(v.features[0].slide_s * 1000) == slide]  # fmt: skip
    first: dict[str, int] = {}
    for e in events:
        key = e.get(view.join_key)
        if key is not None and any(f.predicate(e) for g in group for f in g.features):
            first[str(key)] = min(first.get(str(key), e["event_time"]), e["event_time"])
    empty = empty_values(spec)

    def vectors(b: int) -> dict[str, np.ndarray]:
        ref = reference_values(spec, events, b)
        rows_ = [[ref.get(x, empty)[f.name] for f in spec.features] for x in sorted(first)]
        return dict(zip(sorted(first), to_vectors(spec, rows_, ids.ids), strict=True))

    history: dict[int, dict[str, np.ndarray]] = {}
    out = {}
    for entity in sorted(first):
        lowest = first[entity] // slide * slide + slide
        b = b_ms
        vec = history.setdefault(b, vectors(b))[entity]
        while b - slide >= lowest:
            before = history.setdefault(b - slide, vectors(b - slide))[entity]
            if not np.allclose(before, vec, rtol=1e-6, equal_nan=True):
                break
            b -= slide
        out[entity] = (vec, b)
    return out


def slot(program: RealtimeProgram, view: str, feature: str, i: int = 0) -> int:
    """Index of slot ``i`` of ``feature`` in ``view``'s vector."""
    offset = 0
    for f in next(v for g in program.data["groups"] for v in g["views"] if v["name"] == view)["features"]:
        if f["name"] == feature:
            return offset + i
        offset += 2 * f["k"] if f["agg"] == "top_k" else 1
    raise KeyError(feature)


def event(i: int, user: str, kind: str, t_ms: int, **fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "event_id": f"e{i}", "user_id": user, "item_id": None if kind == "search" else f"i{i % 3}",
        "event_type": kind, "event_time": T0 + t_ms, "session_id": f"s-{user}-{i % 2}", "category": None,
        "price": None, "dwell_ms": None, "query": "q" if kind == "search" else None, "position": None,
        "device": "web",
    }  # fmt: skip
    base.update(fields)
    return base


def random_stream(seed: int, n: int, disorder_ms: int) -> list[dict[str, Any]]:
    """``n`` events over about a minute, in arrival order: shuffled by up to ``disorder_ms``, some twice."""
    rnd = random.Random(seed)
    kinds = ["impression", "click", "dwell", "purchase", "search"]
    events = []
    for i in range(n):
        kind = rnd.choice(kinds)
        t = rnd.randrange(0, 60_000)
        item = None if kind == "search" else f"i{rnd.randrange(5)}"
        e = event(i, f"u{rnd.randrange(4)}", kind, t, item_id=item,
                  category=rnd.choice([None, "c1", "c2", "c3"]), position=rnd.choice([None, 1, 2, 3, 7]),
                  price=rnd.choice([None, 1.25, 9.5, 20.0]) if kind in ("purchase", "impression") else None,
                  dwell_ms=rnd.randrange(100, 5000) if kind == "dwell" else None)  # fmt: skip
        events.append(e)
    arrival = sorted(events, key=lambda e: e["event_time"] + rnd.randrange(0, disorder_ms + 1))
    for e in rnd.sample(arrival, n // 20):  # duplicates: the same event again, a little later
        arrival.insert(min(len(arrival), arrival.index(e) + rnd.randrange(1, 30)), dict(e))
    return arrival


def compare(plan: TierPlan, program: RealtimeProgram, events: list[dict[str, Any]], end_ms: int,
            exact_times: bool) -> int:  # fmt: skip
    """Run the check with the clock moved to ``end_ms`` at the end; return the number of values compared."""
    updates, _ = run_check(program, [*rows(program, events), {"clock": end_ms}])
    got = stored(updates)
    ids = Ids()
    n = 0
    for view in (v for v in plan.views if v.source == program.source):
        b = (end_ms // round(view.features[0].slide_s * 1000)) * round(view.features[0].slide_s * 1000)
        for entity, (vec, changed) in expected(plan, view.name, events, b, ids).items():
            u = got.get((view.name, entity))
            if u is None:  # no event of the entity was kept by any feature: nothing written
                assert np.isnan(vec).sum() + (vec == 0).sum() == len(vec), (view.name, entity)
                continue
            np.testing.assert_allclose(java_vector(program, u, ids), vec, rtol=1e-6, equal_nan=True,
                                       err_msg=f"{view.name} {entity}")  # fmt: skip
            if exact_times:
                assert u["event_time"] == changed, (view.name, entity, u["event_time"] - T0, changed - T0)
            else:  # a revision may date a value later than its last change, never earlier
                assert changed <= u["event_time"] <= b, (view.name, entity)
            n += 1
    return n


def test_in_order_stream_matches_the_reference_values_and_change_times(
    plan: TierPlan, program: RealtimeProgram
) -> None:
    events = sorted(random_stream(1, 400, 0), key=lambda e: e["event_time"])
    assert compare(plan, program, events, T0 + 63_500, exact_times=True) == 9  # 4 users, 5 items


@pytest.mark.parametrize("seed", [2, 3, 4])
def test_out_of_order_stream_with_duplicates_matches_the_reference(
    plan: TierPlan, program: RealtimeProgram, seed: int
) -> None:
    events = random_stream(seed, 500, 4_000)
    assert compare(plan, program, events, T0 + 61_000, exact_times=False) == 9


def test_values_close_to_empty_when_every_event_has_left_the_windows(
    plan: TierPlan, program: RealtimeProgram
) -> None:
    events = [
        event(1, "u1", "click", 500, position=2, category="c1"),
        event(2, "u1", "dwell", 700, dwell_ms=40),
    ]
    clocks = [{"clock": T0 + t} for t in (1_500, 11_500, 21_500, 40_000)]
    updates, _ = run_check(program, [*rows(program, events), *clocks])
    rt_all = [u for u in updates if u["view"] == "rt_all"]
    # first value at 1 s (its slice enters), then changes when the 10 s and 20 s windows drop it
    assert [u["event_time"] - T0 for u in rt_all] == [1_000, 11_000, 21_000]
    last = np.array([float(s) for s in rt_all[-1]["slots"]], dtype=np.float32)
    zero = ["clicks_10s", "dwell_count_20s", "price_sum_20s", "sessions_20s"]
    assert [last[slot(program, "rt_all", f)] for f in zero] == [0.0] * 4
    assert last[slot(program, "rt_all", "top_categories_20s", 2)] == 0.0  # the first share
    assert math.isnan(last[slot(program, "rt_all", "dwell_avg_20s")])  # the mean of nothing


def test_duplicates_count_once_and_outside_events_are_counted(
    plan: TierPlan, program: RealtimeProgram
) -> None:
    events = [
        event(1, "u1", "click", 30_000, position=1),
        event(1, "u1", "click", 30_000, position=1),  # the same event again
        event(3, "u1", "dwell", 55_000, dwell_ms=10),  # keeps u1's state alive at the clock (60 s)
        event(2, "u1", "click", 1_000, position=1),  # older than u1's longest window at the clock
    ]
    lines: list[Any] = [*rows(program, events[:2]), {"clock": T0 + 31_000}, *rows(program, events[2:3]),
                        {"clock": T0 + 60_000}, *rows(program, events[3:])]  # fmt: skip
    updates, outcomes = run_check(program, lines)
    assert outcomes["DUPLICATE"] == 2  # once per group: the user's and the item's
    assert outcomes["OUTSIDE"] == 1  # the user group (20 s windows at 60 s); its item is new, it counts
    first = next(u for u in updates if u["view"] == "rt_all")
    assert first["event_time"] == T0 + 31_000
    assert float(first["slots"][slot(program, "rt_all", "clicks_10s")]) == 1.0  # one click, not two


def test_last_breaks_time_ties_by_event_id_and_top_k_ties_by_value(
    plan: TierPlan, program: RealtimeProgram
) -> None:
    events = [
        event(1, "u1", "click", 2_000, item_id="iA", category="c2"),
        event(2, "u1", "click", 2_000, item_id="iB", category="c1"),  # same time, greater id: its item wins
    ]
    updates, _ = run_check(program, [*rows(program, events), {"clock": T0 + 3_000}])
    u = [x for x in updates if x["view"] == "rt_all"][-1]
    assert u["dict"][slot(program, "rt_all", "last_item_20s")] == "iB"
    assert (
        u["dict"][slot(program, "rt_all", "top_categories_20s", 0)] == "c1"
    )  # 1 each: the smaller value first
    assert u["dict"][slot(program, "rt_all", "top_categories_20s", 1)] == "c2"


# Issue 16: after a restore with a backlog, one partition's events arrive minutes behind another's, and
# so behind the operator's clock (the greatest event time of all). What the store keeps must still be
# offline's value at its own event time (bench/soak.py's consistency check, headwater consistency).


def inconsistent(
    plan: TierPlan, program: RealtimeProgram, events: list[dict[str, Any]], updates: list[dict[str, Any]]
) -> list[str]:
    """The stored values (the newest event time per key) that differ from the reference at their time."""
    ids = Ids()
    bad = []
    for (view_name, entity), u in sorted(stored(updates).items()):
        spec = compile_view(next(v for v in plan.views if v.name == view_name))
        ref = reference_values(spec, events, u["event_time"]).get(entity, empty_values(spec))
        want = to_vectors(spec, [[ref[f.name] for f in spec.features]], ids.ids)[0]
        got = java_vector(program, u, ids)
        differ = [i for i in range(len(want)) if not np.allclose(got[i], want[i], rtol=1e-6, equal_nan=True)]
        if differ:
            bad.append(f"{view_name} {entity} at {u['event_time'] - T0}: slots {differ} online "
                       f"{got[differ].tolist()} offline {want[differ].tolist()}")  # fmt: skip
    return bad


def partitioned_stream(seed: int, n: int, span_ms: int, users: int = 40) -> list[list[dict[str, Any]]]:
    """Two partitions' events (a user's events in partition ``user % 2``), each in read order: event
    time plus up to 2 s of disorder, far inside the allowed lateness (no event here is late)."""
    rnd = random.Random(seed)
    kinds = ["impression", "click", "dwell", "purchase", "search"]
    parts: list[list[tuple[int, dict[str, Any]]]] = [[], []]
    for i in range(n):
        kind = rnd.choice(kinds)
        u = rnd.randrange(users)
        e = event(i, f"u{u}", kind, rnd.randrange(0, span_ms),
                  item_id=None if kind == "search" else f"i{rnd.randrange(5)}",
                  category=rnd.choice([None, "c1", "c2", "c3"]), position=rnd.choice([None, 1, 2, 3, 7]),
                  price=rnd.choice([None, 1.25, 9.5, 20.0]) if kind in ("purchase", "impression") else None,
                  dwell_ms=rnd.randrange(100, 5000) if kind == "dwell" else None)  # fmt: skip
        parts[u % 2].append((e["event_time"] + rnd.randrange(0, 2_000), e))
    return [[e for _, e in sorted(p, key=lambda x: x[0])] for p in parts]


def behind(parts: list[list[dict[str, Any]]], lag_ms: int) -> list[dict[str, Any]]:
    """The partitions read together, partition 1 ``lag_ms`` behind partition 0 (a backlog read at last)."""
    keyed = [
        (e["event_time"] + (lag_ms if p else 0), p, i) for p, es in enumerate(parts) for i, e in enumerate(es)
    ]
    return [parts[p][i] for _, p, i in sorted(keyed)]


def test_a_late_event_a_short_window_has_dropped_dates_the_view_where_it_left(
    plan: TierPlan, program: RealtimeProgram
) -> None:
    same = {"item_id": "iA", "session_id": "sA"}
    events = [
        event(1, "u1", "click", 1_000, **same),  # rt_all changes at 2 s (in) and 12 s (out of clicks_10s)
        event(2, "u1", "purchase", 12_500, **same),  # in at 13 s: u1's boundary, no rt_all feature changes
        event(3, "u1", "click", 2_500, **same),  # behind: in the 20 s windows at 13 s, out of the 10 s one
    ]
    updates, _ = run_check(
        program, [*rows(program, events[:2]), {"clock": T0 + 15_000}, *rows(program, events[2:])]
    )
    last = [u for u in updates if u["view"] == "rt_all"][-1]
    # the value at 13 s, unchanged, dated 13 s: offline's clicks_10s at 12 s holds the late click (12 s, as
    # before, was where the value had last changed without it)
    assert last["event_time"] == T0 + 13_000
    assert float(last["slots"][slot(program, "rt_all", "clicks_10s")]) == 0.0
    assert inconsistent(plan, program, events, updates) == []


@pytest.mark.parametrize(("seed", "lag_ms"), [(1, 15_000), (2, 40_000), (3, 90_000)])
def test_a_partition_read_behind_another_leaves_every_stored_value_equal_to_offline_at_its_time(
    plan: TierPlan, program: RealtimeProgram, seed: int, lag_ms: int
) -> None:
    # a user whose every slice has left the windows at the clock (set by the partition ahead) got its
    # empty value, dated at its last boundary; its next event, from the partition behind, is older than
    # that: it must revise that value, not start afresh with values dated before it (the store keeps the
    # newer event time, so the empty value stayed: "online 0, offline has events" in the chaos soak)
    parts = partitioned_stream(seed, 400, 150_000)
    events = behind(parts, lag_ms)
    end = max(e["event_time"] for e in events)
    updates, outcomes = run_check(program, [*rows(program, events), {"clock": end + 3_000}])
    assert inconsistent(plan, program, events, updates) == [], outcomes


def with_watermarks(
    parts: list[list[dict[str, Any]]], order: list[dict[str, Any]], every: int = 25
) -> list[Any]:
    """``order``'s rows with the source's watermark every ``every`` rows: the slowest partition's
    greatest event time so far minus the out-of-orderness (5 s), once every partition has an event."""
    part = {id(e): p for p, es in enumerate(parts) for e in es}
    top: dict[int, int] = {}
    lines: list[Any] = []
    for n, e in enumerate(order, 1):
        lines.append(e)
        top[part[id(e)]] = max(top.get(part[id(e)], e["event_time"]), e["event_time"])
        if n % every == 0 and len(top) == len(parts):
            lines.append({"watermark": min(top.values()) - 5_000})
    return lines


@pytest.mark.parametrize("seed", [4, 5])
def test_a_kill_and_a_restore_with_a_backlog_leave_every_stored_value_equal_to_offline_at_its_time(
    plan: TierPlan, program: RealtimeProgram, seed: int
) -> None:
    parts = partitioned_stream(seed, 500, 240_000)
    live = behind(parts, 3_000)
    checkpoint, kill = len(live) * 2 // 5, len(live) * 7 // 10
    # the restored job reads from the checkpoint's offsets, partition 1 a minute behind partition 0
    read = {id(e) for e in live[:checkpoint]}
    replay = behind([[e for e in es if id(e) not in read] for es in parts], 60_000)
    lines = [
        *with_watermarks(parts, live[:checkpoint]),
        {"checkpoint": True},
        *with_watermarks(parts, live[checkpoint:kill]),
        {"kill": True},
        *with_watermarks(parts, replay),
    ]
    encoded = [x if isinstance(x, dict) and "event_id" not in x else rows(program, [x])[0] for x in lines]
    end = max(e["event_time"] for e in live)
    updates, outcomes = run_check(program, [*encoded, {"clock": end + 3_000}])
    assert inconsistent(plan, program, live, updates) == [], outcomes


def test_a_restored_job_that_reads_in_another_order_rewrites_what_the_killed_one_wrote(
    plan: TierPlan, program: RealtimeProgram
) -> None:
    e1 = event(1, "u1", "click", 1_000, item_id="iX")  # iX: 1 click in [5 s, 25 s)
    ahead = event(2, "u9", "click", 27_000, item_id="iZ")  # another partition's event moves the clock
    behind_ = event(3, "u2", "click", 21_000, item_id="iX")  # iX's click in [25 s, 45 s), read late
    lines = [*rows(program, [e1]), {"clock": T0 + 6_000}, {"checkpoint": True},
             *rows(program, [ahead]),  # the killed job: iX's click leaves at 25 s, 0 written at 25 s
             {"kill": True},
             *rows(program, [behind_, ahead])]  # the restored job reads the late click first  # fmt: skip
    updates, _ = run_check(program, lines)
    # the restored job crosses 25 s up to the killed job's clock: iX's value (1, unchanged since 5 s) is
    # emitted with the interval it holds over, [5 s, 25 s], and the store rewrites "0 at 25 s" with it
    assert inconsistent(plan, program, [e1, ahead, behind_], updates) == []
    ix = stored(updates)[("rt_items", "iX")]
    assert (ix["event_time"] - T0, ix["valid_to"] - T0) == (25_000, 25_000)


def spread_items(parts: list[list[dict[str, Any]]], seed: int, items: int = 60) -> list[list[dict[str, Any]]]:
    """The same partitions with each event's item drawn from ``items``: an item is quiet most of the
    time, so the last value a killed job wrote of it can stand (a busy item's next change replaces it)."""
    rnd = random.Random(seed)
    return [[{**e, "item_id": None if e["item_id"] is None else f"i{rnd.randrange(items)}"} for e in es]
            for es in parts]  # fmt: skip


def test_a_restored_job_that_reads_a_backlog_in_time_agrees_with_offline_where_the_killed_one_read_it_late(
    plan: TierPlan, program: RealtimeProgram
) -> None:
    # the killed job read partition 1 a minute behind partition 0, so it crossed items' boundaries before
    # their clicks from partition 1 and wrote those values without them; the restored job reads both
    # partitions together. Without the catch-up's intervals one item keeps the killed job's value
    parts = spread_items(partitioned_stream(4, 400, 180_000, users=4), 4)
    live = behind(parts, 60_000)
    checkpoint, kill = len(live) * 3 // 10, len(live) * 9 // 10
    read = {id(e) for e in live[:checkpoint]}
    replay = behind([[e for e in es if id(e) not in read] for es in parts], 0)
    lines = [
        *with_watermarks(parts, live[:checkpoint]),
        {"checkpoint": True},
        *with_watermarks(parts, live[checkpoint:kill]),
        {"kill": True},
        *with_watermarks(parts, replay),
    ]
    encoded = [x if isinstance(x, dict) and "event_id" not in x else rows(program, [x])[0] for x in lines]
    end = max(e["event_time"] for e in live)
    updates, outcomes = run_check(program, [*encoded, {"clock": end + 3_000}])
    assert inconsistent(plan, program, live, updates) == [], outcomes


def test_a_restored_job_that_reads_in_the_same_order_leaves_the_store_as_an_uninterrupted_run(
    plan: TierPlan, program: RealtimeProgram
) -> None:
    # the catch-up re-emits unchanged values with their intervals; replayed in the same order, each finds
    # the killed job's value at its own last change (write.lua: unchanged), so every key keeps the same
    # value at the same boundary as without the kill (test_realtime_kill_after_flush, in a real job)
    parts = partitioned_stream(6, 400, 120_000)
    live = behind(parts, 3_000)
    checkpoint, kill = len(live) * 2 // 5, len(live) * 7 // 10
    end = {"clock": max(e["event_time"] for e in live) + 3_000}
    once, _ = run_check(program, [*rows(program, live), end])
    lines = [*rows(program, live[:checkpoint]), {"checkpoint": True}, *rows(program, live[checkpoint:kill]),
             {"kill": True}, *rows(program, live[checkpoint:]), end]  # fmt: skip
    twice, _ = run_check(program, lines)
    assert len(twice) > len(once)  # the catch-up emitted values again
    want = {k: (u["event_time"], u["slots"]) for k, u in stored(once).items()}
    assert {k: (u["event_time"], u["slots"]) for k, u in stored(twice).items()} == want


# Issue 16, the 6-minute soak's 4 payments mismatches ("online empty, offline has payments", dated where
# an account's restored events left the 5m windows, after the third restore). The source's watermark is
# Flink's: a split that sent nothing for the idle timeout (5 s) is left out of it, so after a restore with
# a backlog it can run minutes ahead of a partition still to be read. An account whose slices had all
# left its windows was then dropped as a disposable tombstone, and its next payments, from that partition,
# started a fresh state whose values were dated before the empty value the store held (and kept).


def payment(i: int, account: str, t_ms: int, status: str, amount: float) -> dict[str, Any]:
    return {"event_id": f"p{i}", "account_id": account, "event_time": T0 + t_ms, "status": status,
            "amount": amount}  # fmt: skip


def idle_watermarks(
    parts: list[list[dict[str, Any]]], order: list[dict[str, Any]], idle_rows: int, every: int = 10
) -> list[Any]:
    """``order``'s rows with Flink's watermark every ``every`` rows: the slowest partition's greatest event
    time minus the out-of-orderness (2 s), leaving out a partition idle (no row in the last ``idle_rows``)."""
    part = {id(e): p for p, es in enumerate(parts) for e in es}
    top: dict[int, int] = {}
    last: dict[int, int] = {}
    lines: list[Any] = []
    for n, e in enumerate(order, 1):
        lines.append(e)
        p = part[id(e)]
        top[p], last[p] = max(top.get(p, e["event_time"]), e["event_time"]), n
        active = [t for q, t in top.items() if n - last[q] < idle_rows]
        if n % every == 0 and active:
            lines.append({"watermark": min(active) - 2_000})
    return lines


def encode(program: RealtimeProgram, lines: list[Any]) -> list[Any]:
    return [x if isinstance(x, dict) and "event_id" not in x else rows(program, [x])[0] for x in lines]


def test_an_account_dropped_while_its_partition_was_idle_gets_its_payments_at_the_stored_time(
    plan: TierPlan, payments: RealtimeProgram
) -> None:
    first = payment(1, "a1", 1_000, "captured", 10.0)  # a1's windows are empty from 302 s
    later = [payment(2, "a1", 100_000, "captured", 5.9), payment(3, "a1", 150_000, "authorized", 62.84)]
    ahead = [payment(10 + i, "a0", 5_000 * i, "declined", 1.0) for i in range(1, 69)]  # up to 340 s
    # partition 1 (a1) sends its first payment, then nothing while partition 0 runs to 340 s: idle, it
    # is left out of the watermark (338 s), which drops a1 (its empty value dated 302 s); then it resumes
    lines = [*rows(payments, [first]), *rows(payments, ahead), {"watermark": T0 + 338_000},
             *rows(payments, later)]  # fmt: skip
    updates, _ = run_check(payments, lines)
    events = [first, *ahead, *later]
    assert inconsistent(plan, payments, events, updates) == []
    a1 = stored(updates)[("account_payments_realtime", "a1")]
    assert a1["event_time"] == T0 + 302_000  # the stored time, where a1's first payment left: the two later
    got = [float(x) for x in a1["slots"]]  # payments hold there (attempts_1m, declines, captured, max)
    assert got == pytest.approx([0.0, 0.0, 5.9, 62.84])


def fetched(parts: list[list[dict[str, Any]]], lag_ms: int, batch: int) -> list[dict[str, Any]]:
    """``behind(parts, lag_ms)`` as a Kafka consumer hands it over: in fetches of about ``batch`` rows,
    partition 0's rows of a fetch first, so partition 1 is silent for half of each fetch."""
    order = behind(parts, lag_ms)
    first = {id(e) for e in parts[0]}
    out: list[dict[str, Any]] = []
    for at in range(0, len(order), batch):
        chunk = order[at : at + batch]
        out += [e for e in chunk if id(e) in first] + [e for e in chunk if id(e) not in first]
    return out


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_payments_read_behind_an_idle_partition_across_a_restore_agree_with_offline(
    plan: TierPlan, payments: RealtimeProgram, seed: int
) -> None:
    # the soak's shape: sparse accounts (a payment every few minutes), two partitions, a kill -9 and a
    # restore whose replay reads partition 1 three minutes behind partition 0 and in fetches (left out of
    # the watermark while silent), so accounts go empty, are dropped and then get older payments (seeds 1
    # and 2 mismatch without the valid-to up to the published boundary; 13 of seeds 1-20 did)
    rnd = random.Random(seed)
    statuses = ["captured", "declined", "authorized", "failed"]
    parts: list[list[dict[str, Any]]] = [[], []]
    for i in range(400):
        a = rnd.randrange(100)
        parts[a % 2].append(payment(i, f"a{a}", rnd.randrange(0, 600_000), rnd.choice(statuses),
                                    round(rnd.uniform(1, 100), 2)))  # fmt: skip
    parts = [sorted(p, key=lambda e: e["event_time"]) for p in parts]
    live = behind(parts, 0)
    checkpoint, kill = len(live) * 2 // 5, len(live) * 3 // 5
    read = {id(e) for e in live[:checkpoint]}
    replay = fetched([[e for e in es if id(e) not in read] for es in parts], 180_000, 40)
    lines = [
        *idle_watermarks(parts, live[:checkpoint], idle_rows=15),
        {"checkpoint": True},
        *idle_watermarks(parts, live[checkpoint:kill], idle_rows=15),
        {"kill": True},
        *idle_watermarks(parts, replay, idle_rows=15),
    ]
    end = max(e["event_time"] for e in live)
    updates, outcomes = run_check(payments, [*encode(payments, lines), {"clock": end + 3_000}])
    assert inconsistent(plan, payments, live, updates) == [], outcomes


def test_a_hot_key_finds_its_duplicates_past_the_scan_size(plan: TierPlan, program: RealtimeProgram) -> None:
    """3,000 events of one user in one slice and 300 of them again (issue 33: de-dup was a scan per event).

    Past 16 ids a slice answers from its hash index; every duplicate must still be found, in both
    groups (the user's and the item's), and the values must equal the reference.
    """
    rnd = random.Random(33)
    events = [
        event(i, "hot", "click", 30_000 + rnd.randrange(500), item_id="i1", position=1) for i in range(3_000)
    ]
    arrival = list(events)
    for e in rnd.sample(events, 300):
        arrival.insert(rnd.randrange(arrival.index(e) + 1, len(arrival) + 1), dict(e))
    _, outcomes = run_check(program, [*rows(program, arrival), {"clock": T0 + 31_000}])
    assert outcomes["DUPLICATE"] == 600
    assert compare(plan, program, arrival, T0 + 31_000, exact_times=False) >= 1  # the hot user's value
