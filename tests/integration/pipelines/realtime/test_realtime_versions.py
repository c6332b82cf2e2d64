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
    reference over every event; rt_clicks is written under its new version and, backfilled at the
    restart (pipelines/realtime/backfill.py), equals the reference over every event too (its window
    holds events from before the restart); rt_items' operator has no backfilled view and skips the
    replayed records;
(c) rt_clicks and rt_items removed (rt_items' whole operator is gone: unclaimed state, dropped): the job
    restores and rt_all equals the reference over every event; the removed views get no write.

Every restart uses ``--from-latest`` while its phase's events were sent with the job down: the Kafka
source starts at the latest offset unless its checkpointed offsets restore (or a backfill rewinds it
to before them), so the values prove that they did across plans that change its columns (uid
``hw-kafka-<source>``, then the rewound scan's ``hw-kafka-<source>-b1`` from scans.json).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from headwater.pipelines.realtime.testing import ALL_KINDS_VIEW, CLICKS_VIEW, ITEM_VIEW, edit_metadata

from .conftest import T0, Feed, Names, Run, apply, event, read_store

USERS = ["u1", "u2"]
ITEMS = ["i0", "i1", "i2"]


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
        clicks = run.check(plan_c, "rt_clicks", USERS, sent, b)
        # backfilled: 27.5 s and 29 s (before the restart) are in its window [25 s, 35 s), with 31 s and 34 s
        assert clicks["u1"] == {"clicks_15s": 2.0, "spend_15s": 16.0}

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
