"""Backfill of new and changed realtime views (pipelines/realtime/backfill.py) without Flink.

The JVM half: ``AggregateCheck`` restarts into a program with a seed and replays the rows before the
cut as ``{"replay": ROW}`` lines (what the rewound scan reads before the checkpoint's offsets), then
the rows after it: every view, kept or backfilled, ends with the reference over every event, as if
nothing had restarted. The Python half: scan uids, the seed in the program, the startup offsets in
the SQL, the offsets read from a checkpoint's lines, the state report.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from headwater.pipelines.realtime.backfill import (
    Backfill,
    SourceBackfill,
    default_scan_uid,
    next_scan_uid,
    parse_offsets,
    plan_backfill,
    scan_uids,
)
from headwater.pipelines.realtime.program import RealtimeProgram
from headwater.pipelines.realtime.sql import JobOptions, compile_job
from headwater.registry.plans import TierPlan

from .jvm_check import run_driver
from .test_java_aggregation import AGGREGATE_CHECK, random_stream, rows
from .test_java_versions import CUT, END, check_kept, program_of, sensitive, unique
from .test_java_versions import plans as plans


def seeded(program: RealtimeProgram, views: list[str], plan: TierPlan) -> RealtimeProgram:
    """``program`` with a seed that backfills ``views`` (names)."""
    ids = tuple(f"{v.name}@{v.version}" for v in plan.views if v.name in views)
    b = SourceBackfill("events", "t", ids, {0: 100}, {0: 10}, 0, False, "hw-kafka-events-b1")
    return Backfill({"events": b.scan_uid}, {"events": b}).apply([program])[0]


def run_backfill(
    before: RealtimeProgram, after: RealtimeProgram, first: list[dict[str, Any]], second: list[dict[str, Any]]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Run ``first`` with ``before``; restart into ``after``, replay ``first``, run ``second``; to END."""
    replay = [{"replay": r} for r in rows(after, first)]
    lines: list[Any] = [*rows(before, first), {"restart": after.text}, *replay, *rows(after, second)]
    lines.append({"clock": END})
    out = run_driver(AGGREGATE_CHECK, lines, header=before.text)[:-1]
    at = next(i for i, o in enumerate(out) if "restored" in o)
    return out[:at], out[at + 1 :]


def test_new_views_are_backfilled_exactly_beside_a_kept_one(plans: dict[str, TierPlan]) -> None:
    """rt_clicks joins rt_all's group (restored entities), rt_items is a new group: all exact at END."""
    plan = plans["base"]
    before, after = program_of(plans["removed"]), seeded(program_of(plan), ["rt_clicks", "rt_items"], plan)
    events = random_stream(8, 500, 3_000)
    first, second = events[:CUT], events[CUT:]
    pre, post = run_backfill(before, after, first, second)
    fresh = unique(second, {e["event_id"] for e in first})
    for view in ("rt_all", "rt_clicks", "rt_items"):
        sensitive(plan, view, events, fresh)  # the events before the cut matter at END
    assert check_kept(plan, after, "rt_all", pre + post, events) == 4
    assert check_kept(plan, after, "rt_clicks", post, events) == 4
    assert check_kept(plan, after, "rt_items", post, events) > 0


def test_a_changed_view_is_backfilled_and_its_group_mate_kept(plans: dict[str, TierPlan]) -> None:
    plan = plans["window"]
    before, after = program_of(plans["base"]), seeded(program_of(plan), ["rt_clicks"], plan)
    events = random_stream(6, 500, 3_000)
    first, second = events[:CUT], events[CUT:]
    pre, post = run_backfill(before, after, first, second)
    for view in ("rt_all", "rt_items"):
        assert check_kept(plan, after, view, pre + post, events) > 0, view
    # the replay skips rt_items' group (nothing to backfill there): no write from the replay
    assert check_kept(plan, after, "rt_clicks", post, events) == 4


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 10_000), cut=st.integers(0, 160))
def test_any_switch_point_backfills_exactly(plans: dict[str, TierPlan], seed: int, cut: int) -> None:
    """Wherever the switch falls (even before any event), every view ends with the reference."""
    plan = plans["base"]
    before, after = program_of(plans["removed"]), seeded(program_of(plan), ["rt_clicks", "rt_items"], plan)
    events = random_stream(seed, 150, 4_000)
    pre, post = run_backfill(before, after, events[:cut], events[cut:])
    check_kept(plan, after, "rt_all", pre + post, events)
    for view in ("rt_clicks", "rt_items"):
        check_kept(plan, after, view, post, events)


def test_scan_uids_move_on_at_each_backfill_and_are_read_back(tmp_path: Path) -> None:
    assert default_scan_uid("events") == "hw-kafka-events"
    assert next_scan_uid("events", "hw-kafka-events") == "hw-kafka-events-b1"
    assert next_scan_uid("events", "hw-kafka-events-b1") == "hw-kafka-events-b2"
    assert next_scan_uid("events", "hw-kafka-other-b4") == "hw-kafka-events-b1"
    job = tmp_path / "job"
    job.mkdir()
    assert scan_uids(job / "chk-1") == {}
    (job / "scans.json").write_text('{"events": "hw-kafka-events-b3"}')
    assert scan_uids(job / "chk-1") == {"events": "hw-kafka-events-b3"}


def test_checkpoint_offset_lines_parse_by_topic() -> None:
    text = "\top1\tt.a\t1\t30\n\top1\tt.a\t0\t12\nuid\top2\tt.b\t0\t-2\n"
    assert parse_offsets(text) == {"t.a": {0: 12, 1: 30}, "t.b": {0: -2}}


def test_the_seed_reaches_the_program_and_the_rewind_the_sql(plans: dict[str, TierPlan]) -> None:
    plan = plans["base"]
    program = seeded(program_of(plan), ["rt_clicks"], plan)
    data = program.data
    assert data["scan_uid"] == "hw-kafka-events-b1"
    # the routed rows: the program's columns, reason, detail, key, value, headers, partition, offset
    assert (data["seed"]["partition_column"], data["seed"]["offset_column"]) == (
        len(program.columns) + 5,
        len(program.columns) + 6,
    )
    assert data["seed"]["boundary"] == {"0": 100}
    assert [v.split("@")[0] for v in data["seed"]["views"]] == ["rt_clicks"]
    options = JobOptions("k:9092", "dlq", start_offsets={"events": {1: 7, 0: 10}})
    ddl = compile_job(plan, options, [program]).ddl[1]
    assert "'scan.startup.mode' = 'specific-offsets'" in ddl
    assert "'scan.startup.specific-offsets' = 'partition:0,offset:10;partition:1,offset:7'" in ddl
    plain = compile_job(plan, JobOptions("k:9092", "dlq"), [program_of(plan)]).ddl[1]
    assert "'scan.startup.mode' = 'group-offsets'" in plain


def test_no_backfill_without_recorded_views_or_when_disabled(
    plans: dict[str, TierPlan], tmp_path: Path
) -> None:
    from headwater.pipelines.realtime.job import RunOptions, record_views

    options = JobOptions("127.0.0.1:1", "dlq")

    def never(_: Path) -> dict[str, dict[int, int]]:
        raise AssertionError("offsets read without a backfill")

    legacy = tmp_path / "legacy" / "chk-1"
    assert plan_backfill(legacy, plans["base"], ["events"], options, never) == Backfill(
        {"events": "hw-kafka-events"}, {}
    )
    run = RunOptions(redis_url="redis://127.0.0.1:6379/0", checkpoint_dir=tmp_path / "chk")
    job = record_views(run, "0" * 32, plans["removed"], ["events"]).parent
    (job / "scans.json").write_text('{"events": "hw-kafka-events-b2"}')
    off = plan_backfill(job / "chk-3", plans["base"], ["events"], options, never, enabled=False)
    assert off == Backfill({"events": "hw-kafka-events-b2"}, {})  # the scan restores where it was
    same = plan_backfill(job / "chk-3", plans["removed"], ["events"], options, never)
    assert same == Backfill({"events": "hw-kafka-events-b2"}, {})  # nothing new: nothing to replay
    # a new view, but the checkpoint holds no offsets of the topic (a new source): no backfill
    assert plan_backfill(job / "chk-3", plans["base"], ["events"], options, lambda _: {}).sources == {}


def test_the_state_report_names_the_backfilled_views(plans: dict[str, TierPlan], tmp_path: Path) -> None:
    from headwater.pipelines.realtime.job import RunOptions, record_views, state_report

    run = RunOptions(redis_url="redis://127.0.0.1:6379/0", checkpoint_dir=tmp_path / "chk")
    plan = plans["base"]
    job = record_views(run, "0" * 32, plans["removed"], ["events"]).parent
    program = seeded(program_of(plan), ["rt_clicks", "rt_items"], plan)
    report = state_report(job / "chk-2", plan, ["events"], [program])
    assert report is not None
    assert report.new == ("rt_clicks", "rt_items")
    assert report.lines() == [
        "state kept (windows go on): rt_all",
        "state backfilled (new): rt_clicks: full windows at once",
        "state backfilled (new): rt_items: full windows at once",
        "backfill events: rt_clicks, rt_items replayed from Kafka (90 records, offsets p0 10-100), then live"
        " from the checkpoint's offsets",
    ]
    record_views(run, "1" * 32, plan, ["events"], [program])
    assert json.loads((tmp_path / "chk" / ("1" * 32) / "scans.json").read_text()) == {
        "events": "hw-kafka-events-b1"
    }


def test_a_restart_during_the_replay_goes_on_with_the_same_switch(
    plans: dict[str, TierPlan], tmp_path: Path
) -> None:
    """A checkpoint taken before the switch: same seed, same scan, no rewind (even with backfill off)."""
    from headwater.pipelines.realtime.job import RunOptions, record_views

    plan = plans["base"]
    run = RunOptions(redis_url="redis://127.0.0.1:6379/0", checkpoint_dir=tmp_path / "chk")
    program = seeded(program_of(plan), ["rt_clicks"], plan)
    job = record_views(run, "0" * 32, plan, ["events"], [program]).parent
    options = JobOptions("127.0.0.1:1", "dlq")
    for enabled in (True, False):
        mid = plan_backfill(
            job / "chk-4", plan, ["events"], options, lambda _: {"t": {0: 40}}, enabled=enabled
        )
        b = mid.sources["events"]
        assert (b.resumed, b.boundary, b.start, b.scan_uid) == (True, {0: 100}, {0: 40}, "hw-kafka-events-b1")
        assert mid.start_offsets() == {}  # the scan restores its position
        assert mid.apply([program_of(plan)])[0].data["seed"]["boundary"] == {"0": 100}
    past = plan_backfill(job / "chk-9", plan, ["events"], options, lambda _: {"t": {0: 100}})
    assert past == Backfill({"events": "hw-kafka-events-b1"}, {})  # over: a plain restore
