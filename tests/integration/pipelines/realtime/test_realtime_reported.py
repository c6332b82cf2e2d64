"""The realtime job reports each view's CPU (issue 17): Kafka -> job -> stats files -> ``headwater costs``.

Each operator subtask of the running job writes ``<state>/realtime/reported/stats-<source>-<group>-<subtask>
.json`` every 5 s (``ViewCpuStats``: its timed folds and fires split across its group's views); ``headwater
costs`` reads them as the realtime views' ``reported`` CPU. Only that figures exist, cover the events
sent and name exactly the views the job runs is asserted: no timing threshold.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from headwater.cli.costs import costs
from headwater.pipelines.realtime.program import StoreTarget, compile_program
from headwater.pipelines.realtime.sql import check_plan
from headwater.registry.plans import TierPlan

from .conftest import Feed, JobProcess, Names, event, wait_for

EVENTS = 300
KINDS = ("impression", "click", "purchase")


def generated() -> list[dict[str, Any]]:
    """Events every group of the behaviour source keys (a user and an item each), 100 ms apart."""
    out = []
    for i in range(EVENTS):
        kind = KINDS[i % len(KINDS)]
        extra: dict[str, Any] = {"position": 1 + i % 5, "category": f"c{i % 4}"}
        if kind == "purchase":
            extra["price"] = 1.0 + i % 9
        out.append(event(i, f"u{i % 20}", kind, i * 100, **extra))
    return out


def test_the_running_job_reports_each_views_cpu(
    plan: tuple[TierPlan, Path],
    names: Names,
    kafka_bootstrap: str,
    redis_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tier_plan, state = plan
    events = next(s for s in check_plan(tier_plan) if s.name == "events")
    groups = compile_program(tier_plan, events, StoreTarget(redis_url)).data["groups"]
    views = {v["name"] for g in groups for v in g["views"]}
    reported = state / "realtime" / "reported"
    files = [reported / f"stats-events-{i}-0.json" for i in range(len(groups))]  # parallelism 1

    def counted() -> bool:  # every group's subtask has written a file covering every event
        try:
            docs = [json.loads(f.read_text(encoding="utf-8")) for f in files]
        except (OSError, ValueError):
            return False
        return all(d["tasks"][0]["events"] == EVENTS for d in docs)

    feed = Feed(kafka_bootstrap, names.topic)
    log = tmp_path / "job.log"
    job = JobProcess(state, names, tmp_path / "checkpoints", log)
    try:
        feed.send(*generated())
        wait_for(counted, 300, f"stats files of {len(groups)} group(s) counting {EVENTS} events", log)
    finally:
        job.kill()
        feed.close()

    docs = [json.loads(f.read_text(encoding="utf-8")) for f in files]
    assert {d["group"] for d in docs} == {g["id"] for g in groups}
    assert {name for d in docs for name in d["tasks"][0]["fold_s"]} == views
    for d in docs:
        task = d["tasks"][0]
        assert task["fires"] > 0  # 30 s of event time: every entity's windows moved
        assert sum(task["fold_s"].values()) == pytest.approx(task["add_s"] + task["fire_s"], rel=1e-6)

    monkeypatch.setenv("HEADWATER_STATE_DIR", str(state))
    out = CliRunner().invoke(costs, [str(state.parent / "features"), "--format", "json"])
    assert out.exit_code == 0, out.output
    report = json.loads(out.output)["views"]
    told_by_job = {n for n, r in report.items() if r["reported"] and "ViewOperator" in r["reported"]["how"]}
    assert told_by_job == views  # the events source's views; the payments view's job is not running
    for name in views:
        told = report[name]["reported"]
        assert told["events"] == EVENTS
        assert told["tasks"] == 1
        assert told["cpu_hours_per_day"] > 0
        assert told["us_per_event"] > 0
