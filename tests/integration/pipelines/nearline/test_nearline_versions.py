"""Registry changes keep nearline serving (issue 14): state per view version, backfill of new views.

Each test runs the worker (a real process, real Kafka and Redis) on a first plan, then restarts it
on a second plan over the same store folder, group and changelog, and checks what was kept, what
was dropped, and that every view equals the reference (``harness.py``) right after the switch.
The plans carry real view versions (:func:`headwater.registry.plans.view_version`), so a
description edit keeps them and a window edit changes one.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from rocksdict import Options, Rdict

from headwater.pipelines.nearline.state import decode_pane_key
from headwater.pipelines.settings import Settings
from headwater.pipelines.store import OnlineStore
from headwater.pipelines.windows import compile_view, view_layout
from headwater.registry.plans import SCHEMA_VERSION, PlanView, TierPlan, view_version

_spec = importlib.util.spec_from_file_location("nl_harness_versions", Path(__file__).with_name("harness.py"))
assert _spec is not None
assert _spec.loader is not None
h = importlib.util.module_from_spec(_spec)
sys.modules["nl_harness_versions"] = h
_spec.loader.exec_module(h)


@pytest.fixture
def env(settings: Settings, kafka_bootstrap: str, redis_url: str, tmp_path: Path) -> Iterator[h.Env]:
    e = h.Env(settings=settings, tmp=tmp_path)
    e.create()
    yield e
    e.cleanup()


def versioned(env: h.Env, view: PlanView) -> PlanView:
    """``view`` with its real version (what the registry computes from what defines its values)."""
    source = h.example_source("events", env.settings.events_topic)
    version = view_version(view.entity, view.join_key, view.tier, view.features, source)
    return view.model_copy(update={"version": version})


def write(env: h.Env, views: list[PlanView]) -> TierPlan:
    """Write a nearline plan of ``views`` where apply would; the registry hash covers everything."""
    views = [versioned(env, v) for v in views]
    digest = hashlib.sha256(str([v.model_dump() for v in views]).encode()).hexdigest()
    plan = TierPlan(
        schema_version=SCHEMA_VERSION,
        tier="nearline",
        registry_hash=f"sha256:{digest}",
        generated_at="2026-01-01T00:00:00+00:00",
        tier_spec={},
        entities={"user": "user_id"},
        sources=[h.example_source("events", env.settings.events_topic)],
        views=views,
    )
    return h._write(env.tmp, plan)


def run(env: h.Env) -> dict[str, Any]:
    """Run one worker until idle; return its stats (the restored state per partition, counters)."""
    # No worker is killed here: a long session lets restores and backfills of 8 tasks finish inside
    # the rebalance callback, which blocks heartbeats (the harness's 6 s is for fast takeovers).
    assert env.start(6, 2000, 1, "--session-timeout-ms", "30000").wait(timeout=90) == 0
    return json.loads((env.store_dir / "stats-0.json").read_text())


def restored(stats: dict[str, Any]) -> list[dict[str, Any]]:
    return [t["restored"] for t in stats["tasks"]]


def snapshot(env: h.Env, view: PlanView) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every online value of ``view`` for the users of the topic: (found, event times, values)."""
    spec = compile_view(view)
    users = sorted({e["user_id"] for evs in h.expected(env.settings).accepted.values() for e in evs})
    store = OnlineStore.from_url(env.settings.redis_url, namespace=env.namespace)
    try:
        got = store.read_batch(view_layout(spec), users)
    finally:
        store.close()
    assert got.found.sum() > 50
    return np.asarray(got.found), np.asarray(got.event_time_ms), np.asarray(got.values)


def assert_same(before: tuple[np.ndarray, ...], after: tuple[np.ndarray, ...]) -> None:
    for a, b in zip(before, after, strict=True):
        np.testing.assert_array_equal(a, b)


def check(env: h.Env, views: list[PlanView]) -> int:
    """Assert ``views`` equal the reference over every event of the topic; return rows checked."""
    return h.compare_views(env, [compile_view(versioned(env, v)) for v in views], h.expected(env.settings))


def pane_views(env: h.Env) -> dict[str, int]:
    """View -> pane records in the local stores (every partition), read after the worker exited."""
    out: dict[str, int] = {}
    for db in sorted((env.store_dir / "events").glob("p*/db")):
        store = Rdict(str(db), options=Options(raw_mode=True))
        try:
            for key, _ in store.items():
                if key[:1] == b"p":
                    view = decode_pane_key(key)[0]
                    out[view] = out.get(view, 0) + 1
        finally:
            store.close()
    return out


def changelog_views(env: h.Env) -> tuple[dict[str, int], dict[str, int]]:
    """(live pane records per view, deleted ones per view) of the changelog, last record per key."""
    last: dict[bytes, bytes | None] = {}
    for rec in h.read_topic(env.settings, f"{env.group}-events-changelog"):
        last[rec.key] = rec.value
    live: dict[str, int] = {}
    gone: dict[str, int] = {}
    for key, value in last.items():
        if key[:1] == b"p":
            view = decode_pane_key(key)[0]
            counts = live if value is not None else gone
            counts[view] = counts.get(view, 0) + 1
    return live, gone


def test_description_edit_keeps_every_value_and_all_state(env: h.Env) -> None:
    activity, taste = h.nearline_views()
    old = write(env, [activity, taste])
    h.produce(env.settings, 4_000, seed=41)
    first = run(env)
    before = {v.name: snapshot(env, v) for v in (activity, taste)}
    panes = pane_views(env)
    edited = [
        v.model_copy(update={"description": "edited", "owner": "someone else"}) for v in (activity, taste)
    ]
    plan = write(env, edited)
    assert plan.registry_hash != old.registry_hash  # before issue 14, the worker refused to start here
    assert [v.version for v in plan.views] == [v.version for v in old.views]
    second = run(env)
    for r in restored(second):  # every partition loaded both views as they were: nothing dropped or replayed
        assert sorted(r["kept"]) == ["nl_activity", "nl_taste"]
        assert r["dropped"] == {}
        assert r["backfill"] is None
    assert second["counters"]["events"] == 0
    assert "backfill_records" not in second["counters"]
    assert {t["partition"]: t["panes"] for t in second["tasks"]} == {
        t["partition"]: t["panes"] for t in first["tasks"]
    }
    assert pane_views(env) == panes
    for v in (activity, taste):
        assert_same(before[v.name], snapshot(env, v))
    # the kept state goes on: more events, and both views still equal the reference over all of them
    h.produce(env.settings, 1_500, seed=42, start_ms=_after(env))
    run(env)
    assert check(env, [activity, taste]) > 40


def test_added_view_is_backfilled_and_old_values_unchanged(env: h.Env) -> None:
    activity, taste = h.nearline_views()
    write(env, [activity])
    h.produce(env.settings, 4_000, seed=43)
    first = run(env)
    before = snapshot(env, activity)
    write(env, [activity, taste])
    second = run(env)
    assert second["counters"]["events"] == 0  # nothing new on the topic: only the backfill read it
    assert second["counters"]["backfill_records"] == sum(
        first["counters"][k] for k in ("events", "dead", "duplicates")
    )
    for r in restored(second):
        assert r["kept"] == ["nl_activity"]
        assert r["dropped"] == {}
        assert r["backfill"]["views"] == ["nl_taste"]
        assert r["backfill"]["complete"] is True
    assert_same(before, snapshot(env, activity))
    assert check(env, [taste]) > 40  # right after the backfill, before any new event
    h.produce(env.settings, 1_500, seed=44, start_ms=_after(env))
    run(env)
    assert check(env, [activity, taste]) > 40


def test_window_change_restarts_only_that_view(env: h.Env) -> None:
    activity, taste = h.nearline_views()
    write(env, [activity, taste])
    h.produce(env.settings, 4_000, seed=45)
    first = run(env)
    before = snapshot(env, activity)
    wider = taste.model_copy(
        update={
            "features": [f.model_copy(update={"window": "90m", "window_s": 5400}) for f in taste.features]
        }
    )
    assert versioned(env, wider).version != versioned(env, taste).version
    write(env, [activity, wider])
    second = run(env)
    for r in restored(second):
        assert r["kept"] == ["nl_activity"]
        assert list(r["dropped"]) == ["nl_taste"]
        assert r["dropped"]["nl_taste"].startswith("version ")
        assert r["backfill"]["views"] == ["nl_taste"]
    panes = {t["partition"]: t["panes"]["nl_activity"] for t in second["tasks"]}
    assert panes == {t["partition"]: t["panes"]["nl_activity"] for t in first["tasks"]}
    assert_same(before, snapshot(env, activity))
    assert check(env, [wider]) > 40


def test_removed_view_state_and_changelog_entries_are_gone(env: h.Env) -> None:
    activity, taste = h.nearline_views()
    write(env, [activity, taste])
    h.produce(env.settings, 4_000, seed=47)
    run(env)
    before = snapshot(env, activity)
    live, _ = changelog_views(env)
    assert live["nl_taste"] > 50
    kept_panes = pane_views(env)["nl_activity"]
    write(env, [activity])
    second = run(env)
    for r in restored(second):
        assert r["kept"] == ["nl_activity"]
        assert r["dropped"] == {"nl_taste": "removed from the plan"}
        assert r["backfill"]["views"] == []
        assert r["backfill"]["records"] == 0
    assert pane_views(env) == {"nl_activity": kept_panes}
    live_after, gone = changelog_views(env)
    assert "nl_taste" not in live_after
    assert gone["nl_taste"] == live["nl_taste"]
    assert live_after["nl_activity"] == live["nl_activity"]
    assert_same(before, snapshot(env, activity))
    # the removed view's online keys are left to expire by their TTL (twice its longest window)
    store = OnlineStore.from_url(env.settings.redis_url, namespace=env.namespace)
    try:
        keys = list(store.client.scan_iter(match=f"{env.namespace}:{{nl_taste}}:*", count=1000))
        assert keys
        ttl_ms = store.client.pttl(keys[0])
        assert 0 < ttl_ms <= 2 * 60 * 60_000
    finally:
        store.close()
    # a restore from the changelog alone agrees: a new store folder rebuilt from it has no nl_taste pane
    for db in (env.store_dir / "events").glob("p*"):
        for sub in ("db", "checkpoint"):
            _rmtree(db / sub)
    third = run(env)
    for r in restored(third):
        assert r["kept"] == ["nl_activity"]
        assert r["dropped"] == {}
    assert pane_views(env) == {"nl_activity": kept_panes}
    assert_same(before, snapshot(env, activity))


def _after(env: h.Env) -> int:
    """An event time just after every event of the topic (the next batch continues the stream)."""
    last = max(e["event_time"] for evs in h.expected(env.settings).accepted.values() for e in evs)
    return int(last) + 1_000


def _rmtree(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)


def test_repartitioned_view_added_then_changed(env: h.Env) -> None:
    """A view keyed by item (behind a repartition) added to a running plan: stage A forwards the
    history by the new key once, stage B computes it from the start; then a window change of that
    view restarts only its stage-B state, backfilled from the repartition topic."""
    activity = h.nearline_views()[0]
    item = h.item_views()[0]
    write(env, [activity])
    h.produce(env.settings, 3_000, seed=48)
    run(env)
    before = snapshot(env, activity)
    write(env, [activity, item])
    second = run(env)
    stage_a = [t["restored"] for t in second["tasks"] if "wm_src" not in t]
    stage_b = [t["restored"] for t in second["tasks"] if "wm_src" in t]
    assert len(stage_a) == len(stage_b) == env.partitions
    for r in stage_a:
        assert r["kept"] == ["nl_activity"]
        assert (r["backfill"]["views"], r["backfill"]["reforward"]) == ([], ["item_id"])
    for r in stage_b:  # a new topic: every stage-B task starts with its stream, nothing to backfill
        assert (r["kept"], r["backfill"]) == (["nl_item"], None)
    assert_same(before, snapshot(env, activity))
    assert h.compare_items(env, h.expected(env.settings)) > 40
    wider = item.model_copy(
        update={"features": [f.model_copy(update={"window": "60m", "window_s": 3600}) for f in item.features]}
    )
    write(env, [activity, wider])
    third = run(env)
    for t in third["tasks"]:
        r = t["restored"]
        if "wm_src" in t:
            assert list(r["dropped"]) == ["nl_item"]
            assert r["backfill"]["views"] == ["nl_item"]
            assert r["backfill"]["records"] > 0
        else:
            assert (r["kept"], r["dropped"], r["backfill"]) == (["nl_activity"], {}, None)
    assert_same(before, snapshot(env, activity))
    assert check(env, [wider]) > 40
