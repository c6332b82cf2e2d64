"""The JVM operator's state across a plan change (issue 14): kept views go on exactly, changed ones restart.

``AggregateCheck`` with a ``{"restart": PROGRAM}`` line takes every entity's state through what a
checkpoint and a restore into a job compiled from another plan do (``KeyStateSerializer`` bytes, its
versioned snapshot written and read back, the compatibility the new serializer's snapshot resolves,
the restore serializer, groups matched by id, then ``Aggregator.adopt``), and goes on with the new
program's rows. Events are split in arrival order at the restart, as a job restored from a checkpoint
reads on from its offsets.

- a view whose version is unchanged ends with the reference values over every event (as if nothing
  had restarted), whatever else changed in its group;
- a changed or new view ends with the reference over the events after the restart only (its state
  starts empty; an event already seen before the restart is still a duplicate);
- a removed view writes nothing after the restart.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from headwater.pipelines.realtime.program import RealtimeProgram, StoreTarget, compile_program
from headwater.pipelines.realtime.sql import check_plan
from headwater.pipelines.realtime.testing import ALL_KINDS_VIEW, CLICKS_VIEW, ITEM_VIEW, edit_metadata
from headwater.pipelines.windows import compile_view, empty_values, reference_values, to_vectors
from headwater.registry.plans import TierPlan, build_plans, registry_hash
from headwater.registry.testing import ScratchRepo

from .jvm_check import run_driver
from .test_java_aggregation import (
    AGGREGATE_CHECK,
    T0,
    Ids,
    expected,
    java_vector,
    random_stream,
    rows,
    stored,
)

ROOT = Path(__file__).resolve().parents[4]
END = T0 + 61_000
CUT = 450
"""Restart after 450 of 500 events over a minute (about 54 s in): the windows at END hold events from
both sides of the restart, so a view that lost its panes cannot match (:func:`sensitive` checks it)."""


def build(tmp: Path, views: dict[str, str]) -> TierPlan:
    """The realtime plan of a scratch repo with ``views`` (file name -> YAML), built in process."""
    repo = ScratchRepo(tmp, template=ROOT / "features")
    for name, text in views.items():
        repo.write(name, text)
    result = repo.check()
    assert not result.diagnostics.errors, [d.message for d in result.diagnostics.errors]
    return build_plans(result, registry_hash(result))["realtime"]


BASE = {"rt_all.yaml": ALL_KINDS_VIEW, "rt_items.yaml": ITEM_VIEW, "rt_clicks.yaml": CLICKS_VIEW}


@pytest.fixture(scope="module")
def plans(tmp_path_factory: pytest.TempPathFactory) -> dict[str, TierPlan]:
    base = tmp_path_factory.mktemp("versions")
    variants = {
        "base": BASE,
        # metadata only: rt_items' description and owner, rt_all's too
        "metadata": {
            **BASE,
            "rt_items.yaml": edit_metadata(ITEM_VIEW),
            "rt_all.yaml": edit_metadata(ALL_KINDS_VIEW),
        },
        # one view of the user group changes a window: only it restarts
        "window": {**BASE, "rt_clicks.yaml": CLICKS_VIEW.replace("window: 15s}", "window: 10s}", 1)},
        # the item group is gone, rt_clicks leaves the user group
        "removed": {"rt_all.yaml": ALL_KINDS_VIEW},
    }
    return {name: build(base / name, views) for name, views in variants.items()}


def program_of(plan: TierPlan) -> RealtimeProgram:
    events = next(s for s in check_plan(plan) if s.name == "events")
    return compile_program(plan, events, StoreTarget("redis://127.0.0.1:6379/0"))


def run_restart(
    before: RealtimeProgram, after: RealtimeProgram, first: list[dict[str, Any]], second: list[dict[str, Any]]
) -> tuple[list[dict[str, Any]], dict[str, int], list[dict[str, Any]]]:
    """Run ``first`` with ``before``, restart into ``after``, run ``second``; clock to END.

    Returns the updates before the restart, the entities restored per group, the updates after it.
    """
    lines: list[Any] = [*rows(before, first), {"restart": after.text}, *rows(after, second), {"clock": END}]
    out = run_driver(AGGREGATE_CHECK, lines, header=before.text)[:-1]
    at = next(i for i, o in enumerate(out) if "restored" in o)
    return out[:at], out[at]["restored"], out[at + 1 :]


def unique(events: list[dict[str, Any]], seen: set[str]) -> list[dict[str, Any]]:
    """The events whose id was not seen before (the operator's duplicates count once, in the first run)."""
    out = {}
    for e in events:
        if e["event_id"] not in seen:
            out.setdefault(e["event_id"], e)
    return list(out.values())


def check_kept(
    plan: TierPlan, program: RealtimeProgram, view: str, updates: list[dict[str, Any]], events: list[Any]
) -> int:
    """``view``'s last written values (the store's newest) equal the reference over ``events``."""
    got = stored(updates)
    ids = Ids()
    slide = round(next(v for v in plan.views if v.name == view).features[0].slide_s * 1000)
    b = END // slide * slide
    n = 0
    for entity, (vec, changed) in expected(plan, view, events, b, ids).items():
        u = got.get((view, entity))
        if u is None:
            assert np.isnan(vec).sum() + (vec == 0).sum() == len(vec), (view, entity)
            continue
        np.testing.assert_allclose(
            java_vector(program, u, ids), vec, rtol=1e-6, equal_nan=True, err_msg=f"{view} {entity}"
        )
        assert changed <= u["event_time"] <= b, (view, entity)
        n += 1
    return n


def sensitive(plan: TierPlan, view: str, events: list[Any], fresh: list[Any]) -> None:
    """The reference over ``events`` differs from the one over ``fresh`` only: the check can fail."""
    spec = compile_view(next(v for v in plan.views if v.name == view))
    slide = round(next(v for v in plan.views if v.name == view).features[0].slide_s * 1000)
    b = END // slide * slide
    full, part = reference_values(spec, events, b), reference_values(spec, fresh, b)
    assert full != part, f"{view}: the events before the restart do not reach END's windows"


def check_restarted(
    plan: TierPlan, program: RealtimeProgram, view: str, after: list[dict[str, Any]], events: list[Any]
) -> int:
    """``view``'s values written after the restart equal the reference over ``events`` (the new ones) only."""
    got = stored(after)
    definition = next(v for v in plan.views if v.name == view)
    spec = compile_view(definition)
    slide = round(definition.features[0].slide_s * 1000)
    b = END // slide * slide
    ids = Ids()
    entities = sorted(e for (v, e) in got if v == view)
    ref = reference_values(spec, events, b)
    empty = empty_values(spec)
    want = to_vectors(spec, [[ref.get(x, empty)[f.name] for f in spec.features] for x in entities], ids.ids)
    for entity, vec in zip(entities, want, strict=True):
        np.testing.assert_allclose(
            java_vector(program, got[(view, entity)], ids), vec, rtol=1e-6, equal_nan=True,
            err_msg=f"{view} {entity} (restarted empty)",
        )  # fmt: skip
    return len(entities)


def test_a_metadata_edit_keeps_every_window(plans: dict[str, TierPlan]) -> None:
    before, after = program_of(plans["base"]), program_of(plans["metadata"])
    assert plans["base"].registry_hash != plans["metadata"].registry_hash
    assert {v.name: v.version for v in plans["base"].views} == {
        v.name: v.version for v in plans["metadata"].views
    }
    events = random_stream(5, 500, 3_000)
    first, second = events[:CUT], events[CUT:]
    pre, restored, post = run_restart(before, after, first, second)
    assert restored == {"user_id@1000": 4, "item_id@5000": 5}
    fresh = unique(second, {e["event_id"] for e in first})
    for view in ("rt_all", "rt_clicks", "rt_items"):
        sensitive(plans["metadata"], view, events, fresh)
        assert check_kept(plans["metadata"], after, view, pre + post, events) > 0, view


def test_a_changed_window_restarts_only_its_view(plans: dict[str, TierPlan]) -> None:
    before, after = program_of(plans["base"]), program_of(plans["window"])
    versions = {v.name: v.version for v in plans["window"].views}
    old = {v.name: v.version for v in plans["base"].views}
    assert [n for n in versions if versions[n] != old[n]] == ["rt_clicks"]
    events = random_stream(6, 500, 3_000)
    first, second = events[:CUT], events[CUT:]
    pre, restored, post = run_restart(before, after, first, second)
    assert restored == {"user_id@1000": 4, "item_id@5000": 5}
    # rt_all shares the user group with the changed view: its panes are kept, its values exact
    fresh = unique(second, {e["event_id"] for e in first})
    for view in ("rt_all", "rt_items"):
        sensitive(plans["window"], view, events, fresh)
        assert check_kept(plans["window"], after, view, pre + post, events) > 0, view
    sensitive(plans["window"], "rt_clicks", events, fresh)  # so its restart shows
    assert check_restarted(plans["window"], after, "rt_clicks", post, fresh) == 4


def test_a_removed_view_and_group_are_dropped_and_the_others_exact(plans: dict[str, TierPlan]) -> None:
    before, after = program_of(plans["base"]), program_of(plans["removed"])
    events = random_stream(7, 500, 3_000)
    first, second = events[:CUT], events[CUT:]
    pre, restored, post = run_restart(before, after, first, second)
    assert restored == {"user_id@1000": 4}  # the item group is state no operator claims: dropped
    assert {u["view"] for u in post if "view" in u} == {"rt_all"}
    sensitive(plans["removed"], "rt_all", events, unique(second, {e["event_id"] for e in first}))
    assert check_kept(plans["removed"], after, "rt_all", pre + post, events) == 4


def test_a_new_view_starts_empty_beside_kept_ones(plans: dict[str, TierPlan]) -> None:
    """The reverse of a removal: rt_clicks and rt_items are new to a job that ran rt_all only."""
    before, after = program_of(plans["removed"]), program_of(plans["base"])
    events = random_stream(8, 500, 3_000)
    first, second = events[:CUT], events[CUT:]
    pre, restored, post = run_restart(before, after, first, second)
    assert restored == {"user_id@1000": 4, "item_id@5000": 0}
    fresh = unique(second, {e["event_id"] for e in first})
    sensitive(plans["base"], "rt_all", events, fresh)
    assert check_kept(plans["base"], after, "rt_all", pre + post, events) == 4
    assert check_restarted(plans["base"], after, "rt_clicks", post, fresh) == 4
    assert check_kept(plans["base"], after, "rt_items", post, fresh) > 0  # a new group: a clean start


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 10_000), cut=st.integers(0, 160), change=st.sampled_from(["metadata", "window"]))
def test_any_restart_point_keeps_unchanged_views_exact(
    plans: dict[str, TierPlan], seed: int, cut: int, change: str
) -> None:
    """Wherever the stream is cut (even before any event), rt_all and rt_items end exact.

    The minute is 150 events here and the cut anywhere in them, so at END some cuts leave pre-restart
    events in the windows and some do not; the fixed cuts above make sure of both sides."""
    before, after = program_of(plans["base"]), program_of(plans[change])
    events = random_stream(seed, 150, 4_000)
    pre, _, post = run_restart(before, after, events[:cut], events[cut:])
    for view in ("rt_all", "rt_items"):
        check_kept(plans[change], after, view, pre + post, events)


def test_a_start_on_a_new_plan_says_what_it_keeps(plans: dict[str, TierPlan], tmp_path: Path) -> None:
    """``headwater run realtime`` reads the views the checkpoint's job recorded and names each view's fate."""
    from headwater.pipelines.realtime.job import RunOptions, record_views, state_report

    run = RunOptions(redis_url="redis://127.0.0.1:6379/0", checkpoint_dir=tmp_path / "chk")
    written = record_views(run, "0" * 32, plans["window"], ["events"])
    chk = written.parent / "chk-7"
    assert state_report(tmp_path / "elsewhere" / "chk-1", plans["base"], ["events"]) is None
    report = state_report(chk, plans["base"], ["events"])
    assert report is not None
    assert report.kept == ("rt_all", "rt_items")
    assert report.restarted == ("rt_clicks",)  # 10 s back to 15 s: another version
    assert report.new == ()
    assert report.warm_after_s == {"rt_clicks": 15.0}
    base_job = record_views(run, "1" * 32, plans["base"], ["events"]).parent
    report = state_report(base_job / "chk-3", plans["removed"], ["events"])
    assert report is not None
    assert (report.kept, report.dropped) == (("rt_all",), ("rt_clicks", "rt_items"))
    assert report.lines() == [
        "state kept (windows go on): rt_all",
        "state dropped (removed): rt_clicks, rt_items; their online keys expire",
    ]
