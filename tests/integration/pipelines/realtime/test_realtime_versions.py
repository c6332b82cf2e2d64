"""Registry edits keep the realtime job's state (issue 14): one job, restarted on three edited plans.

A real mini-cluster, Kafka and Redis. The job runs the behaviour events' realtime views rt_all and
rt_clicks (one window operator: user, 1 s slide) and rt_items (item, 5 s slide). Each phase sends its
events, ends them with an event of u1 one second before a clock event, waits until u1's rt_all value
of that boundary is written (so the operator has read every event of the phase) and for a checkpoint
after that, then kills the job (SIGKILL to its process group) and restarts it from the checkpoint on
the next plan:

(a) rt_items' and rt_all's description and owner edited (a new registry hash, no new view version):
    every value equals the reference over every event so far, at the event time of its last change;
(b) rt_clicks' window changed (15 s -> 10 s): rt_all, in the same operator, and rt_items equal the
    reference over every event; rt_clicks is written under its new version with the reference over the
    events after the restart only (it started empty);
(c) rt_clicks and rt_items removed (rt_items' whole operator is gone: unclaimed state, dropped): the job
    restores and rt_all equals the reference over every event; the removed views get no write.

Every restart uses ``--from-latest`` while its phase's events were sent with the job down: the Kafka
source starts at the latest offset unless its checkpointed offsets restore, so the values prove that
they did across plans that change its columns (uid ``hw-kafka-<source>``).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import redis

from headwater.pipelines.realtime.testing import ALL_KINDS_VIEW, CLICKS_VIEW, ITEM_VIEW, edit_metadata
from headwater.registry.plans import TierPlan, read_plan
from headwater.registry.testing import ScratchRepo

from .conftest import ROOT, T0, Feed, JobProcess, Names, event, expected_vectors, read_store, wait_for

USERS = ["u1", "u2"]
ITEMS = ["i0", "i1", "i2"]


def apply(base: Path, name: str, views: dict[str, str]) -> tuple[TierPlan, Path]:
    """``headwater apply`` a scratch repo with ``views``; return its realtime plan and state folder."""
    repo = ScratchRepo(base / name / "features", template=ROOT / "features")
    for file, text in views.items():
        repo.write(file, text)
    state = base / name / "state"
    cmd = [str(Path(sys.executable).parent / "headwater"), "apply", str(repo.root), "--state-dir", str(state)]
    done = subprocess.run([*cmd, "--no-feast"], capture_output=True, text=True, cwd=ROOT, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    return read_plan(state, "realtime"), state


def phase_a() -> list[dict[str, Any]]:
    return [
        event(1, "u1", "impression", 500, position=1, category="c1"),
        event(2, "u1", "click", 1500, position=1, category="c1"),
        event(3, "u2", "impression", 4500, position=3, category="c3"),
        event(4, "u1", "purchase", 11_000, price=7.5, category="c2"),
        event(5, "u1", "click", 12_500, position=2, category="c2"),
        event(6, "u2", "click", 13_000, position=3, category="c3"),
        event(7, "u1", "dwell", 14_000, dwell_ms=2000),
        event(8, "u1", "impression", 16_000, position=4, category="c1"),
        event(9, "u2", "purchase", 18_000, price=3.0, category="c3"),
        event(10, "u1", "click", 19_000, position=4, category="c1"),
        event(100, "zz", "impression", 20_000),  # the clock: u1's boundary 20 s is published
    ]


def phase_b() -> list[dict[str, Any]]:
    return [
        event(7, "u1", "dwell", 14_000, dwell_ms=2000),  # a duplicate of phase a: counts once
        event(11, "u1", "click", 21_000, position=1, category="c2"),
        event(12, "u1", "dwell", 22_000, dwell_ms=4000),
        event(13, "u2", "impression", 23_000, position=2, category="c1"),
        event(14, "u1", "impression", 24_500, position=5, category="c2"),
        event(15, "u2", "click", 26_000, position=2, category="c1"),
        event(16, "u1", "click", 27_500, position=5, category="c2"),
        event(17, "u1", "purchase", 29_000, price=12.0, category="c2"),
        event(101, "zz", "impression", 30_000),
    ]


def phase_c() -> list[dict[str, Any]]:
    return [
        event(18, "u2", "click", 30_500, position=1, category="c3"),
        event(19, "u1", "purchase", 31_000, price=4.0, category="c1"),
        event(20, "u2", "purchase", 32_500, price=6.5, category="c3"),
        event(25, "u2", "click", 33_000, position=1, category="c2"),  # i1 changes (a value's TTL is 40 s)
        event(21, "u1", "click", 34_000, position=3, category="c1"),
        event(102, "zz", "impression", 35_000),
    ]


def phase_d() -> list[dict[str, Any]]:
    return [
        event(22, "u2", "dwell", 36_000, dwell_ms=1500),
        event(23, "u1", "impression", 37_500, position=2, category="c2"),
        event(24, "u1", "click", 39_000, position=2, category="c2"),
        event(103, "zz", "impression", 40_000),
    ]


def checkpoints(folder: Path) -> list[tuple[int, str, float]]:
    """Complete checkpoints of the job folder: (N of chk-N, job id, mtime of _metadata)."""
    out = []
    for meta in folder.glob("*/chk-*/_metadata"):
        out.append(
            (int(meta.parent.name.removeprefix("chk-")), meta.parent.parent.name, meta.stat().st_mtime)
        )
    return out


def unique(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return list({e["event_id"]: e for e in events}.values())


class Run:
    """The job across its restarts: one checkpoint folder, one log, one topic."""

    def __init__(self, names: Names, feed: Feed, redis_url: str, tmp: Path) -> None:
        self.names, self.feed, self.redis_url = names, feed, redis_url
        self.chk = tmp / "checkpoints"
        self.log = tmp / "job.log"
        self.job: JobProcess | None = None
        self.jobs_before: set[str] = set()
        self.newest = -1

    def phase(self, plan: TierPlan, state: Path, events: list[dict[str, Any]], end_ms: int) -> None:
        """Send ``events`` (the job down), (re)start it on ``plan``, wait for ``end_ms`` and a checkpoint."""
        self.feed.send(*events)
        extra = ("--from-latest",) if self.job is not None else ()
        started = time.monotonic()
        self.job = JobProcess(state, self.names, self.chk, self.log, extra=extra)
        wait_for(
            lambda: self.u1_at(plan, end_ms), 240, f"u1's rt_all at T0+{(end_ms - T0) / 1000:g} s", self.log
        )
        seen = time.time()
        # a figure for the report, not an assertion: (re)start to the phase's last value written
        print(f"{plan.registry_hash[7:19]}: started -> u1 at T0+{(end_ms - T0) / 1000:g} s written in "
              f"{time.monotonic() - started:.1f} s (load {os.getloadavg()[0]:.1f})")  # fmt: skip
        wait_for(
            lambda: any(t > seen for _, _, t in checkpoints(self.chk)), 60, "a checkpoint after it", self.log
        )
        self.job.kill()
        found = checkpoints(self.chk)
        mine = [n for n, j, _ in found if j not in self.jobs_before]
        # Flink numbers a restored job's checkpoints after the one it loaded: proof the state was loaded
        assert min(mine) > self.newest, (mine, self.newest)
        self.newest = max(mine)
        self.jobs_before = {j for _, j, _ in found}

    def u1_at(self, plan: TierPlan, b_ms: int) -> bool:
        _, res = read_store(self.redis_url, self.names.namespace, plan, "rt_all", ["u1"])
        return bool(res.found[0]) and int(res.event_time_ms[0]) >= b_ms

    def check(self, plan: TierPlan, view: str, ids: list[str], events: list[Any], b_ms: int) -> Any:
        """``view``'s stored values of ``ids`` equal the reference over ``events`` at ``b_ms``."""
        spec_version = next(v.version for v in plan.views if v.name == view)
        _, res = read_store(self.redis_url, self.names.namespace, plan, view, ids)
        assert res.found.all(), (view, res.found)
        assert res.versions == [spec_version] * len(ids), (view, res.versions, spec_version)
        client = redis.Redis.from_url(self.redis_url)
        try:
            ref, want = expected_vectors(plan, view, unique(events), ids, client, self.names.namespace, b_ms)
        finally:
            client.close()
        np.testing.assert_allclose(res.values, want, rtol=1e-6, equal_nan=True, err_msg=view)
        return ref


def test_registry_edits_keep_the_state_of_unchanged_views(
    names: Names, kafka_bootstrap: str, redis_url: str, tmp_path: Path
) -> None:
    base = {"rt_all.yaml": ALL_KINDS_VIEW, "rt_items.yaml": ITEM_VIEW, "rt_clicks.yaml": CLICKS_VIEW}
    plan_a, state_a = apply(tmp_path, "a", base)
    edited = {**base, "rt_items.yaml": edit_metadata(ITEM_VIEW), "rt_all.yaml": edit_metadata(ALL_KINDS_VIEW)}
    plan_b, state_b = apply(tmp_path, "b", edited)
    window = {**edited, "rt_clicks.yaml": CLICKS_VIEW.replace("window: 15s}", "window: 10s}", 1)}
    plan_c, state_c = apply(tmp_path, "c", window)
    plan_d, state_d = apply(tmp_path, "d", {"rt_all.yaml": edit_metadata(ALL_KINDS_VIEW)})
    versions = [{v.name: v.version for v in p.views} for p in (plan_a, plan_b, plan_c, plan_d)]
    assert plan_a.registry_hash != plan_b.registry_hash
    assert versions[0] == versions[1]
    assert {n for n, v in versions[2].items() if versions[1][n] != v} == {"rt_clicks"}

    feed = Feed(kafka_bootstrap, names.topic)
    run = Run(names, feed, redis_url, tmp_path)
    sent: list[dict[str, Any]] = []
    try:
        run.phase(plan_a, state_a, phase_a(), T0 + 20_000)
        sent += phase_a()

        # (a) description and owner edits: every window goes on
        run.phase(plan_b, state_b, phase_b(), T0 + 30_000)
        sent += phase_b()
        b = T0 + 30_000
        ref = run.check(plan_b, "rt_all", USERS, sent, b)
        assert ref["u1"]["price_sum_20s"] == 19.5  # 7.5 before the restart + 12.0 after
        assert ref["u1"]["dwell_avg_20s"] == 3000.0  # the duplicate of phase a counted once
        assert run.check(plan_b, "rt_clicks", USERS, sent, b)["u1"]["clicks_15s"] == 3.0  # 19, 21, 27.5 s
        run.check(plan_b, "rt_items", ITEMS, sent, b)

        # (b) rt_clicks' window changes: it alone starts empty
        run.phase(plan_c, state_c, phase_c(), T0 + 35_000)
        sent += phase_c()
        b = T0 + 35_000
        assert run.check(plan_c, "rt_all", USERS, sent, b)["u1"]["price_sum_20s"] == 16.0  # 29 s, 31 s
        run.check(plan_c, "rt_items", ITEMS, sent, b)
        clicks = run.check(plan_c, "rt_clicks", USERS, phase_c(), b)
        assert clicks["u1"] == {"clicks_15s": 1.0, "spend_15s": 4.0}  # 27.5 s and 29 s are not in it

        # (c) rt_clicks and rt_items removed: the item operator's state is unclaimed and dropped
        before = read_store(redis_url, names.namespace, plan_c, "rt_items", ITEMS)[1]
        run.phase(plan_d, state_d, phase_d(), T0 + 40_000)
        sent += phase_d()
        run.check(plan_d, "rt_all", USERS, sent, T0 + 40_000)
        after = read_store(redis_url, names.namespace, plan_c, "rt_items", ITEMS)[1]
        # no write since the removal (a value may have expired meanwhile: its TTL is 2 x its window)
        found = after.found & before.found
        assert (after.event_time_ms[found] == before.event_time_ms[found]).all(), (before, after)
    finally:
        if run.job is not None:
            run.job.kill()
        feed.close()

    text = run.log.read_text(errors="replace")
    restored = re.findall(r"restoring from checkpoint (\S+)", text)
    assert len(restored) == 3, text[-3000:]
    assert "Exception" not in text.split("restoring from checkpoint", 1)[1], text[-3000:]
