"""A realtime view added between two runs serves full windows at once (issue 14, backfill).

A real mini-cluster, Kafka and Redis; the phases of test_realtime_versions.py (events sent with the
job down, then a restart with ``--from-latest``, wait for u1's value at the phase's end and a
checkpoint, SIGKILL):

1. plan A: rt_all only (user, 1 s slide).
2. plan B adds rt_clicks (15 s windows, in rt_all's operator: restored entities, shared slices and
   event ids) and rt_items (item, 5 s slide: an operator of its own, no restored state). Right after
   the restart every view equals the reference over every event sent so far: rt_clicks' and rt_items'
   windows hold events from before the restart (u1's clicks_15s at 30 s counts the click at 19 s of
   phase A), and rt_all, replayed past, is not double counted (its price sum and the duplicate
   event 7 of phase B).

The next start restores the rewound scan (``hw-kafka-events-b1``, recorded in scans.json) and
backfills nothing: test_realtime_versions.py's last restart (after its rt_clicks backfill) checks
that every value is still exact then; two phases here keep this test inside CI's budget.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from headwater.pipelines.realtime.testing import ALL_KINDS_VIEW, CLICKS_VIEW, ITEM_VIEW

from .conftest import T0, Feed, Names, Run, apply, checkpoints
from .test_realtime_versions import ITEMS, USERS, phase_a, phase_b


def test_added_view_is_backfilled_at_the_restart(
    names: Names, kafka_bootstrap: str, redis_url: str, tmp_path: Path
) -> None:
    plan_a, state_a = apply(tmp_path, "a", {"rt_all.yaml": ALL_KINDS_VIEW})
    added = {"rt_all.yaml": ALL_KINDS_VIEW, "rt_clicks.yaml": CLICKS_VIEW, "rt_items.yaml": ITEM_VIEW}
    plan_b, state_b = apply(tmp_path, "b", added)
    assert next(v.version for v in plan_a.views) == next(
        v.version for v in plan_b.views if v.name == "rt_all"
    )

    feed = Feed(kafka_bootstrap, names.topic)
    run = Run(names, feed, redis_url, tmp_path)
    sent: list[dict[str, Any]] = []
    try:
        run.phase(plan_a, state_a, phase_a(), T0 + 20_000)
        sent += phase_a()

        run.phase(plan_b, state_b, phase_b(), T0 + 30_000)
        sent += phase_b()
        b = T0 + 30_000
        ref = run.check(plan_b, "rt_all", USERS, sent, b)
        assert ref["u1"]["price_sum_20s"] == 19.5  # 7.5 before the restart + 12.0 after: once each
        assert ref["u1"]["dwell_avg_20s"] == 3000.0  # phase B's duplicate of event 7 counted once
        clicks = run.check(plan_b, "rt_clicks", USERS, sent, b)
        # [15 s, 30 s): the click at 19 s is from before the view existed
        assert clicks["u1"] == {"clicks_15s": 3.0, "spend_15s": 12.0}
        assert clicks["u2"] == {"clicks_15s": 1.0, "spend_15s": 3.0}  # 26 s; the purchase at 18 s
        run.check(plan_b, "rt_items", ITEMS, sent, b)

    finally:
        if run.job is not None:
            run.job.kill()
        feed.close()

    text = run.log.read_text(errors="replace")
    assert len(re.findall(r"restoring from checkpoint (\S+)", text)) == 1, text[-3000:]
    # logged by the backfill and echoed by `run realtime`: one backfill, of phase A's records
    backfills = set(re.findall(r"backfill events: (.*) replayed from Kafka \((\d+) records", text))
    assert backfills == {("rt_clicks, rt_items", str(len(phase_a())))}, text[-3000:]
    assert text.count("state backfilled (new): rt_clicks: full windows at once") == 1, text[-3000:]
    assert "state kept (windows go on): rt_all\n" in text, text[-3000:]
    scans = {
        json.loads((f.parent / "scans.json").read_text())["events"] for f in run.chk.glob("*/views.json")
    }
    assert scans == {"hw-kafka-events", "hw-kafka-events-b1"}
    assert len({j for _, j, _ in checkpoints(run.chk)}) == 2
