"""The ranker's inputs as served: one user vector per slate (no slot leaking into a user counter), and
the quality sets' collaborative (neighbour) inputs, point-in-time and as hand-computed."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headwater.ranking.quality_sets import NEIGHBOUR_FEATURES, NEIGHBOUR_PRIOR, events_training_set
from headwater.ranking.train import TrainOptions, choose_linear_l2, train_and_save
from headwater.ranking.trainset import TrainingSet


def _set(user: np.ndarray, group: list[int], time_ms: list[int], position: list[int] | None) -> TrainingSet:
    n = len(group)
    return TrainingSet(
        ("impressions_5m",),
        ("quality",),
        "test",
        np.asarray(user, np.float32).reshape(n, 1),
        np.zeros((n, 1), np.float32),
        np.zeros(n, np.float32),
        np.asarray(group, np.int64),
        np.asarray(time_ms, np.int64),
        np.asarray([f"u{g}" for g in group]),
        np.asarray([f"i{j}" for j in range(n)]),
        position=None if position is None else np.asarray(position, np.int64),
    )


def test_user_inputs_at_slate_start_take_each_slates_earliest_row() -> None:
    # slate 7: rows out of order; its earliest row (time 100) holds 3.0. Slate 2: two rows at one
    # time, the lower slot first (5.0). Slate 9: one row.
    ts = _set(
        [4.0, 3.0, 6.0, 5.0, 9.0, 5.5], [7, 7, 2, 2, 9, 7], [105, 100, 50, 50, 1, 110], [2, 1, 2, 1, 1, 3]
    )
    out = ts.user_at_slate_start()
    assert out.user[:, 0].tolist() == [3.0, 3.0, 5.0, 5.0, 9.0, 3.0]
    assert out.item is ts.item  # the rest as it was
    assert out.label is ts.label
    # without positions: time, then row order
    assert _set([4.0, 3.0], [1, 1], [10, 10], None).user_at_slate_start().user[:, 0].tolist() == [4.0, 4.0]
    empty = _set(np.zeros(0), [], [], None)
    assert empty.user_at_slate_start() is empty


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 50), st.floats(-5, 5)), min_size=1, max_size=30))
def test_user_inputs_at_slate_start_are_one_value_per_slate(rows: list[tuple[int, int, float]]) -> None:
    ts = _set([r[2] for r in rows], [r[0] for r in rows], [r[1] for r in rows], None)
    out = ts.user_at_slate_start()
    for g in set(ts.group.tolist()):
        mine = np.flatnonzero(ts.group == g)
        earliest = mine[np.lexsort((mine, ts.event_time_ms[mine]))[0]]
        assert set(out.user[mine, 0].tolist()) == {float(ts.user[earliest, 0])}


def _leaky_set(slates: int = 300, size: int = 5, seed: int = 0) -> TrainingSet:
    """A user's 5-minute impressions counter as of each impression: it rises by one per slot, and the
    top slot gets the clicks (a pure position effect); the item input is noise."""
    rng = np.random.default_rng(seed)
    group = np.repeat(np.arange(slates), size)
    slot = np.tile(np.arange(1, size + 1), slates)
    base = rng.integers(0, 40, slates).repeat(size)
    label = ((slot == 1) & (rng.random(len(slot)) < 0.6)).astype(np.float32)
    ts = _set(base + slot - 1.0, group.tolist(), (group * 60_000 + slot).tolist(), slot.tolist())
    return TrainingSet(
        ts.user_features,
        ts.item_features,
        "test",
        ts.user,
        rng.normal(size=(len(slot), 1)).astype(np.float32),
        label,
        ts.group,
        ts.event_time_ms,
        ts.user_ids,
        ts.item_ids,
        position=ts.position,
    )


def test_a_user_counter_that_tracks_the_slot_no_longer_wins_the_single_feature_baseline(
    tmp_path: Path,
) -> None:
    ts = _leaky_set()
    small: dict[str, Any] = {"seed": 0, "epochs": 1, "deep": (8,), "embed_dim": 4, "device": "cpu"}
    leaky = train_and_save(ts, tmp_path / "leaky", TrainOptions(user_at_slate_start=False, **small))
    served = train_and_save(ts, tmp_path / "served", TrainOptions(**small))
    before, after = leaky.metrics["holdout"]["best_feature"], served.metrics["holdout"]["best_feature"]
    # as built, the counter orders every clicked slate perfectly (lower = earlier slot)
    assert before["name"] == "user.impressions_5m"
    assert before["ndcg@10"] == 1.0
    assert before["training_pick"]["name"] == "user.impressions_5m"
    # as served it is one value per slate (a tie: what chance earns); the noise item input wins
    assert after["name"] == "item.quality"
    assert after["ndcg@10"] < 0.8
    assert after["training_pick"]["name"] in {"item.quality", "user.impressions_5m"}


def _events() -> list[dict[str, Any]]:
    """u1 clicks a then b in one slate; u2 clicks a, not b; u3 clicks a, then a later slate shows b."""
    spec = [
        ("u1", "s1", 1, "a", True),
        ("u1", "s1", 2, "b", True),
        ("u2", "s2", 1, "a", True),
        ("u2", "s2", 2, "b", False),
        ("u3", "s3", 1, "a", True),
        ("u3", "s4", 1, "b", False),
    ]
    out: list[dict[str, Any]] = []
    for n, (user, session, position, item, click) in enumerate(spec):
        base = {
            "user_id": user,
            "item_id": item,
            "session_id": session,
            "position": position,
            "category": "c",
        }
        out.append({**base, "event_id": f"{n}i", "event_type": "impression", "event_time": 1_000 * n})
        if click:
            out.append({**base, "event_id": f"{n}c", "event_type": "click", "event_time": 1_000 * n + 1})
    return out


def test_neighbour_inputs_are_the_hand_computed_point_in_time_values() -> None:
    ts = events_training_set(_events(), name="neighbours")
    assert ts.item_ids.tolist() == ["a", "b", "a", "b", "a", "b"]
    ctr, lift, shown = (ts.pair[f].astype(np.float64) for f in NEIGHBOUR_FEATURES)
    k = NEIGHBOUR_PRIOR
    # u3's b (last row): u3 clicked a before this slate; b was shown to 2 users who clicked a (u1, u2)
    # and clicked by 1 (u1). So far 5 impressions and 4 clicks: rate (4 + 1) / (5 + 2); b's own
    # rate (1 + k rate) / (2 + k); the neighbours' (1 + k own) / (2 + k)
    rate = 5 / 7
    own = (1 + k * rate) / (2 + k)
    assert shown[5] == 2.0
    assert ctr[5] == pytest.approx((1 + k * own) / (2 + k), rel=1e-6)
    assert lift[5] == pytest.approx(ctr[5] / own, rel=1e-6)
    assert (ctr[5], lift[5]) == pytest.approx((209 / 343, 209 / 224), rel=1e-6)  # with k = 5
    # u1's b (row 1): u1 clicked a in this same slate, which does not count (the user's side is as
    # of the slate's start), so no neighbour: the item's own rate, 1 impression and 1 click so far
    assert shown[1] == 0.0
    assert ctr[1] == pytest.approx((0 + k * 2 / 3) / (0 + k), rel=1e-6)
    assert lift[1] == pytest.approx(1.0)
    # an item is no neighbour of itself: u3's a comes before u3 clicked anything
    assert shown[4] == 0.0
    # off: the set as before, with the category inputs alone
    plain = events_training_set(_events(), name="plain", collaborative=False)
    assert set(plain.pair) == set(ts.pair) - set(NEIGHBOUR_FEATURES)
    assert np.array_equal(plain.item, ts.item, equal_nan=True)


def test_neighbour_inputs_reject_a_catalog_too_large_for_dense_counts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import headwater.ranking.quality_sets as qs

    monkeypatch.setattr(qs, "NEIGHBOUR_MAX_ITEMS", 1)
    with pytest.raises(ValueError, match="collaborative=False"):
        events_training_set(_events(), name="big")


def _noisy_set(slates: int, noise: int, seed: int = 0) -> TrainingSet:
    """One item input carries the click odds; ``noise`` user inputs and their crosses carry none."""
    rng = np.random.default_rng(seed)
    n = slates * 5
    group = np.repeat(np.arange(slates), 5)
    signal = rng.normal(size=n)
    label = (rng.random(n) < 1.0 / (1.0 + np.exp(2.5 - 0.8 * signal))).astype(np.float32)
    user = rng.normal(size=(slates, noise)).repeat(5, axis=0)
    return TrainingSet(
        tuple(f"u{j}" for j in range(noise)),
        ("signal", "noise"),
        "test",
        user.astype(np.float32),
        np.column_stack([signal, rng.normal(size=n)]).astype(np.float32),
        label,
        group,
        group * 60_000,
        np.asarray([f"u{g}" for g in group]),
        np.asarray([f"i{j}" for j in range(n)]),
    )


def test_the_fallbacks_l2_is_chosen_on_the_latest_training_slates() -> None:
    small = _noisy_set(300, 40)
    chosen, figures = choose_linear_l2(small, TrainOptions())
    assert list(figures) == ["0.0001", "0.001", "0.01", "0.1"]
    # the penalty that validates best; 1,500 rows and 120 noise weights want more than 1e-4
    assert f"{chosen.linear_l2:g}" == max(figures, key=lambda k: figures[k])
    assert chosen.linear_l2 > 1e-4
    assert replace(chosen, linear_l2=1e-4) == TrainOptions()  # nothing else changed
    # one value, or no grid: as given
    assert choose_linear_l2(small, TrainOptions(linear_l2_grid=(1e-2,))) == (
        TrainOptions(linear_l2_grid=(1e-2,)),
        {},
    )
    assert choose_linear_l2(small, TrainOptions(linear_l2_grid=())) == (TrainOptions(linear_l2_grid=()), {})
    # no click among the validation rows: nothing to judge by
    quiet = replace(small, label=np.where(small.group >= 270, 0.0, small.label).astype(np.float32))
    assert choose_linear_l2(quiet, TrainOptions()) == (TrainOptions(), {})
