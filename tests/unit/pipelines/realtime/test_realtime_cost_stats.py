"""The realtime operators' per-view timed work (infra/maven/flink-udfs ``ViewCpuStats``), issue 17.

Runs ``dev.headwater.flink.realtime.ViewCpuStatsCheck`` (a ``java`` process, no Flink runtime) with the
example registry's realtime program of the behaviour events: its ``user_id`` group has
``user_dwell_realtime`` (3 features) and ``user_session_realtime`` (6 features). Given timings (not
measured ones) must be split exactly by the views' feature operations; measured ones (events folded
by the real ``Aggregator``) must add up to the total and favour the view with more features; the file
each subtask writes is what ``headwater costs`` reads (:func:`headwater.cli.costs.reported_cost`).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from headwater.cli.costs import REALTIME_REPORTED_HOW, reported_cost
from headwater.pipelines.realtime.program import RealtimeProgram, StoreTarget, compile_program
from headwater.pipelines.realtime.sql import check_plan
from headwater.registry.plans import TierPlan, read_plan

from .jvm_check import run_driver

CHECK = "dev.headwater.flink.realtime.ViewCpuStatsCheck"
ROOT = Path(__file__).resolve().parents[4]
T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z
DWELL, SESSION = "user_dwell_realtime", "user_session_realtime"


@pytest.fixture(scope="module")
def plan(tmp_path_factory: pytest.TempPathFactory) -> TierPlan:
    state = tmp_path_factory.mktemp("cpu_plan") / "state"
    exe = str(Path(sys.executable).parent / "headwater")
    cmd = [exe, "apply", str(ROOT / "features"), "--state-dir", str(state), "--no-feast"]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    return read_plan(state, "realtime")


def program_of(plan: TierPlan, reported: Path) -> RealtimeProgram:
    events = next(s for s in check_plan(plan) if s.name == "events")
    return compile_program(plan, events, StoreTarget("redis://127.0.0.1:6379/0"), reported_dir=reported)


def user_group(program: RealtimeProgram) -> tuple[int, dict[str, Any]]:
    groups = program.data["groups"]
    index = next(i for i, g in enumerate(groups) if g["id"].startswith("user_id@"))
    return index, groups[index]


def by_group(out: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {doc["group"]: doc for doc in out}


def test_given_timings_are_split_by_the_views_feature_operations(plan: TierPlan, tmp_path: Path) -> None:
    program = program_of(plan, tmp_path / "realtime" / "reported")
    g, group = user_group(program)
    assert [(v["name"], len(v["features"])) for v in group["views"]] == [(DWELL, 3), (SESSION, 6)]
    lines = [
        # every feature passes: 3 of 9 operations are dwell's, 6 session's
        {"added": {"group": g, "ns": 9_000, "hits": [True] * 9}},
        # one feature of each view: half each
        {"added": {"group": g, "ns": 4_000, "hits": [False, False, True, True] + [False] * 5}},
        # no feature kept it (every filter was tested): by feature counts, 1:2
        {"added": {"group": g, "ns": 900, "hits": [False] * 9}},
        # two fires: by feature counts
        {"fired": {"group": g, "ns": 1_800, "count": 2}},
    ]
    doc = by_group(run_driver(CHECK, lines, header=program.text))[group["id"]]
    task = doc["tasks"][0]
    assert task["fold_s"][DWELL] == pytest.approx((3_000 + 2_000 + 300 + 600) / 1e9)
    assert task["fold_s"][SESSION] == pytest.approx((6_000 + 2_000 + 600 + 1_200) / 1e9)
    assert sum(task["fold_s"].values()) == pytest.approx(doc["total_s"]) == pytest.approx(15_700 / 1e9)
    assert (task["add_s"], task["fire_s"]) == (pytest.approx(13_900 / 1e9), pytest.approx(1_800 / 1e9))
    assert (task["events"], task["fires"], task["hits"]) == (3, 2, {DWELL: 2, SESSION: 2})
    assert (doc["source"], doc["subtask"]) == ("events", 0)

    # the file the subtask wrote, one per group, is what `headwater costs` reads
    files = sorted(p.name for p in (tmp_path / "realtime" / "reported").iterdir())
    assert files == [f"stats-events-{i}-0.json" for i in range(len(program.data["groups"]))]
    written = json.loads((tmp_path / "realtime" / "reported" / f"stats-events-{g}-0.json").read_text())
    assert written["tasks"][0]["fold_s"] == task["fold_s"]
    got = reported_cost(DWELL, tmp_path / "realtime", how=REALTIME_REPORTED_HOW)
    assert got is not None
    assert (got["fold_s"], got["tasks"], got["events"]) == (0.0, 1, 3)  # 5.9 us: 0.000 s at 3 decimals
    assert got["us_per_event"] == pytest.approx(5.9 / 3, abs=1e-3)


def test_measured_folds_add_up_and_the_view_with_more_features_gets_more(
    plan: TierPlan, tmp_path: Path
) -> None:
    program = program_of(plan, tmp_path / "reported")
    _, group = user_group(program)
    columns = program.data["columns"]
    rows = []
    for i in range(3_000):
        values = {
            "hw_event_id": f"e{i}",
            "hw_time_ms": T0 + i * 137,
            "user_id": f"u{i % 50}",
            "item_id": f"i{i % 40}",
            "category": f"c{i % 7}",
            "dwell_ms": 1_000 + i % 900,
        }
        # every filter passes: each event is split 3:6 between dwell's and session's features
        rows.append([values.get(c, True) for c in columns])
    out = run_driver(CHECK, [*rows, {"clock": T0 + 3_000 * 137 + 3_600_000}], header=program.text)
    docs = by_group(out)
    assert set(docs) == {grp["id"] for grp in program.data["groups"]}
    for doc in docs.values():
        task = doc["tasks"][0]
        assert task["events"] == 3_000
        assert all(s > 0 for s in task["fold_s"].values())
        assert sum(task["fold_s"].values()) == pytest.approx(doc["total_s"])
        assert task["add_s"] + task["fire_s"] == pytest.approx(doc["total_s"])
    user = docs[group["id"]]["tasks"][0]
    assert user["fires"] == 50  # the clock an hour past the last event: every user fired once more
    assert user["fold_s"][SESSION] == pytest.approx(2 * user["fold_s"][DWELL])
    assert user["hits"] == {DWELL: 3_000, SESSION: 3_000}


def test_random_timings_split_as_the_python_rule_says(plan: TierPlan, tmp_path: Path) -> None:
    """Many random events and fires in one driver run: each view's seconds as computed here, sum = total."""
    import random

    program = program_of(plan, tmp_path / "reported")
    g, group = user_group(program)
    sizes = [len(v["features"]) for v in group["views"]]
    rng = random.Random(17)
    want = [0.0] * len(sizes)
    lines: list[Any] = []
    for _ in range(500):
        ns = rng.randrange(0, 5_000_000)
        if rng.random() < 0.2:
            lines.append({"fired": {"group": g, "ns": ns, "count": rng.randrange(1, 9)}})
            shares = [n / sum(sizes) for n in sizes]
        else:
            hits = [rng.random() < 0.3 for _ in range(sum(sizes))]
            lines.append({"added": {"group": g, "ns": ns, "hits": hits}})
            mine, start = [], 0
            for n in sizes:
                mine.append(sum(hits[start : start + n]))
                start += n
            shares = [m / sum(mine) for m in mine] if any(mine) else [n / sum(sizes) for n in sizes]
        want = [w + ns * s for w, s in zip(want, shares, strict=True)]
    doc = by_group(run_driver(CHECK, lines, header=program.text))[group["id"]]
    fold = doc["tasks"][0]["fold_s"]
    got = [fold[v["name"]] for v in group["views"]]
    assert got == pytest.approx([w / 1e9 for w in want], rel=1e-9)
    assert sum(got) == pytest.approx(doc["total_s"], rel=1e-9)
