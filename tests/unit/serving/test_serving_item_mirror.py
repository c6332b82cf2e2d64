"""The item mirror on its own: per-view bounds from the declared freshness, rows equal to what was put,
per-view change detection, expiring rows handed back to the store, and a model check of put/remove."""

from __future__ import annotations

import dataclasses

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from headwater.ranking.synthetic import small_registry
from headwater.serving.item_mirror import ItemMirror
from headwater.serving.store import ViewRows

REGISTRY = small_registry({"u": ["a"]}, {"slow": ["x", "y"], "fast": ["z"]}, "slow.x")
SIDE = dataclasses.replace(REGISTRY.item, freshness_s=(86_400.0, 10.0))
NOW = 1_800_000_000_000


def rows_of(values: dict[str, tuple[float, float, float]], ids: list[str]) -> list[ViewRows]:
    """Each view's rows of ``ids`` (every row found, event time = 1000 + the first value)."""
    matrix = np.asarray([values[i] for i in ids], dtype=np.float32).reshape(len(ids), 3)
    found = np.ones(len(ids), dtype=bool)
    event = (1000 + matrix[:, 0]).astype(np.int64)
    return [ViewRows(matrix[:, :2].copy(), found, event), ViewRows(matrix[:, 2:].copy(), found.copy(), event)]


def put(
    mirror: ItemMirror, values: dict[str, tuple[float, float, float]], ids: list[str], expire: int = 0
) -> None:
    n = len(ids)
    writes = [np.full(n, 7, dtype=np.int64), np.full(n, 8, dtype=np.int64)]
    mirror.put(ids, rows_of(values, ids), writes, [np.full(n, expire, dtype=np.int64)] * 2)


def test_bounds_follow_each_views_freshness_and_the_age() -> None:
    mirror = ItemMirror(SIDE, sla_share=0.1)
    assert mirror.bounds_s == (8_640.0, 1.0)
    assert mirror.views_served(NOW) == (False, False)  # never confirmed
    assert mirror.lookup(["a"], NOW) is None
    mirror.confirm(NOW)
    assert mirror.views_served(NOW + 500) == (True, True)
    assert mirror.views_served(NOW + 2_000) == (True, False)  # the 10 s view is read from the store
    assert mirror.views_served(NOW + 8_641_000) == (False, False)
    mirror.confirm(NOW - 5)  # an older confirmation never moves it back
    assert mirror.confirmed_ms == NOW
    hand_built = ItemMirror(dataclasses.replace(SIDE, freshness_s=()))  # no declared freshness: never
    assert hand_built.bounds_s == (0.0, 0.0)


def test_rows_changes_and_expiry() -> None:
    mirror = ItemMirror(SIDE, sla_share=0.1, expiry_margin_ms=5_000)
    values = {f"i{k}": (float(k), -float(k), 0.5 * k) for k in range(3000)}  # grows past the first slab
    ids = list(values)
    put(mirror, values, ids)
    mirror.confirm(NOW)
    look = mirror.lookup(["i5", "nope", "i2999"], NOW + 2_000)
    assert look is not None
    assert look.known.tolist() == [True, False, True]
    assert look.rows[1] is None  # the fast view is past its bound
    slow = look.rows[0]
    assert slow is not None
    assert slow.values[[0, 2]].tolist() == [[5.0, -5.0], [2999.0, -2999.0]]
    assert slow.event_time_ms[[0, 2]].tolist() == [1005, 3999]
    # Per-view write times: a change in one view alone is a change; an unknown id is one.
    writes = [np.full(3, 7, dtype=np.int64), np.asarray([8, 0, 8], dtype=np.int64)]
    assert mirror.changed(["i1", "i2", "zz"], writes).tolist() == [False, True, True]
    # A row expiring within the margin is handed back to the store; one expiring later is not.
    put(mirror, values, ["i1"], expire=NOW + 4_000)
    put(mirror, values, ["i2"], expire=NOW + 60_000)
    look = mirror.lookup(["i1", "i2"], NOW)
    assert look is not None
    assert look.known.tolist() == [False, True]
    assert mirror.remove(["i1", "i1", "zz"]) == 1
    assert len(mirror) == 2999


def test_sync_forgets_rows_whose_key_is_gone_without_a_read() -> None:
    mirror = ItemMirror(SIDE, sla_share=1.0)
    values = {"a": (1.0, 2.0, 3.0), "b": (4.0, 5.0, 6.0)}
    put(mirror, values, ["a", "b"])  # write times 7 (slow view) and 8 (fast view)
    mirror.confirm(NOW)
    version = mirror.version
    # a: the fast view's key expired (0); b: the slow view written again (9); c: not held.
    need = mirror.sync(["a", "b", "c"], [np.asarray([7, 9, 0]), np.asarray([0, 8, 0])])
    assert need.tolist() == [False, True, True]
    assert mirror.version == version + 1
    look = mirror.lookup(["a"], NOW)
    assert look is not None
    fast = look.rows[1]
    assert fast is not None
    assert (bool(fast.found[0]), int(fast.event_time_ms[0])) == (False, 0)
    assert np.isnan(fast.values[0]).all()
    assert mirror.sync(["a"], [np.asarray([7]), np.asarray([0])]).tolist() == [False]  # nothing left to do


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(st.booleans(), st.lists(st.integers(0, 40), min_size=1, max_size=12, unique=True)),
        max_size=25,
    )
)
def test_puts_and_removes_agree_with_a_dict(steps: list[tuple[bool, list[int]]]) -> None:
    mirror = ItemMirror(SIDE, sla_share=1.0)
    mirror.confirm(NOW)
    model: dict[str, tuple[float, float, float]] = {}
    for n, (is_put, keys) in enumerate(steps):
        ids = [f"i{k}" for k in keys]
        if is_put:
            fresh = {i: (float(n), float(k), float(n * k)) for i, k in zip(ids, keys, strict=True)}
            put(mirror, fresh, ids)
            model.update(fresh)
        else:
            assert mirror.remove(ids) == sum(i in model for i in ids)
            for i in ids:
                model.pop(i, None)
    assert len(mirror) == len(model)
    asked = [f"i{k}" for k in range(41)]
    look = mirror.lookup(asked, NOW)
    assert look is not None
    assert look.known.tolist() == [i in model for i in asked]
    held = [j for j, i in enumerate(asked) if i in model]
    if held:
        want = rows_of(model, [asked[j] for j in held])
        for got, expected in zip(look.rows, want, strict=True):
            assert got is not None
            np.testing.assert_array_equal(got.values[held], expected.values)
            np.testing.assert_array_equal(got.event_time_ms[held], expected.event_time_ms)
