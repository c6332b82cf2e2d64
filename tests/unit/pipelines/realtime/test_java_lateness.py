"""The realtime tier's ``late`` verdict (infra/maven/flink-udfs ``Lateness``) against the nearline rule.

Runs ``dev.headwater.flink.realtime.LatenessCheck`` (a ``java`` process, no Flink runtime) over records
in read order, with restores between them (every subtask's checkpointed entries restored into each new
subtask, as the job's union state is), and compares each verdict with
:func:`headwater.pipelines.events.timing.late_verdicts` (the rule every tier applies). Issue 16: the
verdict was Flink's ``CURRENT_WATERMARK``, periodic and not checkpointed, so an event far behind read
in the same burst as newer ones, or right after a restore, was not late.
"""

from __future__ import annotations

import random
from typing import Any

from headwater.pipelines.events.timing import SourceTiming, late_verdicts

from .jvm_check import run_driver

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z
NOW = T0 + 86_400_000
OOO, LATENESS = 5_000, 60_000
TIMING = SourceTiming(OOO, LATENESS, max_future_ms=300_000)  # max_future is not part of the late rule
CONFIG = {
    "source": "events",
    "event_time_field": "event_time",
    "out_of_orderness_ms": OOO,
    "allowed_lateness_ms": LATENESS,
    "replay_tag": None,
}


def run_check(lines: list[dict[str, Any]], **config: Any) -> list[str | None]:
    """Each record line's verdict from the JVM: None (accepted) or the late letter's detail."""
    out = run_driver("dev.headwater.flink.realtime.LatenessCheck", [{**CONFIG, **config}, *lines])
    return [o["late"] for o in out]


def rec(p: int, t_ms: int, s: int = 0, **kw: Any) -> dict[str, Any]:
    return {"s": s, "p": p, "t": T0 + t_ms, "now": NOW, **kw}


def test_an_event_far_behind_in_the_same_burst_is_late_and_its_letter_names_the_horizon() -> None:
    # test_realtime_job.py's script: e19, 64.5 s behind the newest event, read right after it
    newer = [rec(0, t) for t in (500, 1500, 2500, 19_500, 17_000)]
    got = run_check([*newer, rec(0, 10_000), rec(0, -50_000), rec(0, -45_500), rec(1, -50_000)])
    assert got[:6] == [None] * 6  # in order, 2.5 s out of order, 9.5 s behind: within the lateness
    assert got[7] is None  # exactly at the horizon (19.5 s - 5 s - 60 s): not before it
    assert got[8] is None  # another partition: its own horizon (none yet)
    horizon = T0 + 19_500 - OOO - LATENESS
    assert got[6] == (
        f"event_time {T0 - 50_000} ms is 4500 ms before the horizon {horizon} of partition 0 (its greatest"
        f" accepted event time {T0 + 19_500} - max out-of-orderness 5000 ms - allowed lateness 60000 ms;"
        " source 'events')"
    )


def test_a_restored_job_judges_with_the_greatest_time_it_checkpointed() -> None:
    before = [rec(0, 100_000), rec(1, 0)]
    # restored into two subtasks, partition 0 now read by subtask 1: union state, it knows the max
    after = [rec(0, 30_000, s=1), rec(0, 40_000, s=1), rec(1, 10_000, s=0)]
    got = run_check([*before, {"restart": {"subtasks": 2}}, *after])
    assert got == [None, None, got[2], None, None]
    assert got[2] is not None
    assert "partition 0" in got[2]


def test_a_future_event_moves_the_horizon_only_up_to_the_wall_clock() -> None:
    now = T0 + 1_000_000
    lines = [{"p": 0, "t": now + 240_000, "now": now}, {"p": 0, "t": now - 60_000, "now": now}]
    lines += [{"p": 0, "t": now - 66_000, "now": now}]
    assert [x is not None for x in run_check(lines)] == [False, False, True]


def test_a_backfill_replay_has_its_own_horizon_kept_across_a_restart_of_the_same_replay() -> None:
    lines = [
        rec(0, 500_000),  # live: the checkpoint's greatest time
        rec(0, 10_000, replay=True),  # replayed from the rewind: not late against the live time
        rec(0, 20_000, replay=True),
        {"restart": {"subtasks": 1, "replay_tag": "hw-kafka-events-b1"}},
        rec(0, -50_000, replay=True),  # the same replay restored: its greatest time came back
        {"restart": {"subtasks": 1, "replay_tag": "hw-kafka-events-b2"}},
        rec(0, -50_000, replay=True),  # a new backfill: its replay starts from nothing
        rec(0, 430_000),  # live time kept throughout: 500 s - 65 s
    ]
    got = run_check(lines, replay_tag="hw-kafka-events-b1")
    assert [x is not None for x in got] == [False, False, False, True, False, True]


def test_random_streams_with_restores_give_the_nearline_verdict_of_every_record() -> None:
    rnd = random.Random(16)
    lines: list[dict[str, Any]] = []
    subtasks = 2
    clock = {p: rnd.randrange(0, 600_000) for p in range(4)}  # partitions apart: a global watermark differs
    for _ in range(6_000):
        if rnd.random() < 0.01:
            subtasks = rnd.choice((1, 2, 3))
            lines.append({"restart": {"subtasks": subtasks}})
            continue
        p = rnd.randrange(4)
        clock[p] += rnd.randrange(0, 400)
        t = clock[p] - rnd.choice((0, 0, 0, rnd.randrange(0, 5_000), rnd.randrange(55_000, 80_000)))
        t += rnd.choice((0,) * 30 + (rnd.randrange(0, 300_000),))  # now and then one from the future
        now = T0 + clock[p] + rnd.randrange(0, 2_000)  # read soon after it was produced
        lines.append({"s": p % subtasks, "p": p, "t": T0 + t, "now": now})
    got = [x is not None for x in run_check(lines, subtasks=2)]
    want = late_verdicts([(x["p"], x["t"], x["now"]) for x in lines if "p" in x], TIMING)
    assert sum(want) > 50
    assert sum(not w for w in want) > 5_000
    assert got == want
