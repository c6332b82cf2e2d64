"""Diversity by category and editorial pins, on examples and on drawn lists (hypothesis)."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headwater.serving.funnel.config import FunnelConfig
from headwater.serving.funnel.rules import apply_rules, diversify, pin


def test_diversity_caps_each_category_and_keeps_the_order() -> None:
    ordered = ["a1", "a2", "a3", "b1", "a4", "c1", "b2"]
    cats = ["a", "a", "a", "b", "a", "c", "b"]
    items, skipped, relaxed = diversify(ordered, cats, 4, 2)
    assert items == ["a1", "a2", "b1", "c1"]
    assert (skipped, relaxed) == (2, 0)


def test_diversity_fills_from_passed_over_items_when_too_few_are_left() -> None:
    items, skipped, relaxed = diversify(["a1", "a2", "a3", "b1"], ["a", "a", "a", "b"], 4, 1)
    assert items == ["a1", "b1", "a2", "a3"]
    assert (skipped, relaxed) == (2, 2)


def test_items_without_a_category_are_never_capped() -> None:
    items, skipped, _ = diversify(["x", "y", "z"], [None, None, None], 3, 1)
    assert items == ["x", "y", "z"]
    assert skipped == 0


def test_pins_go_to_their_positions_moved_or_inserted() -> None:
    items, placed = pin(["a", "b", "c", "d", "e"], {"d": 1, "p": 3}, 5)
    assert items == ["d", "a", "p", "b", "c"]
    assert placed == 2


def test_a_pin_beyond_k_is_not_shown() -> None:
    items, placed = pin(["a", "b", "c"], {"p": 7}, 3)
    assert items == ["a", "b", "c"]
    assert placed == 0


def test_rules_apply_diversity_to_the_others_and_exempt_pins() -> None:
    ordered = ["a1", "a2", "a3", "b1", "b2"]
    cats = ["a", "a", "a", "b", "b"]
    out = apply_rules(ordered, cats, 4, 1, {"a3": 2})
    assert out.items == ["a1", "a3", "b1", "a2"]
    assert out.pinned == 1


def test_pins_config_refuses_two_pins_at_one_position() -> None:
    with pytest.raises(ValueError, match="both pinned at position 1"):
        FunnelConfig(pins={"x": 1, "y": 1})


@settings(max_examples=200, deadline=None)
@given(
    n=st.integers(0, 40),
    cats=st.lists(st.sampled_from(["a", "b", "c", None]), min_size=40, max_size=40),
    k=st.integers(1, 20),
    cap=st.one_of(st.none(), st.integers(1, 4)),
    pins=st.dictionaries(st.sampled_from([f"i{j}" for j in range(50)]), st.integers(1, 25), max_size=4),
)
def test_rules_hold_for_any_list(
    n: int, cats: list[str | None], k: int, cap: int | None, pins: dict[str, int]
) -> None:
    pins = {item: pos for pos, item in {p: i for i, p in pins.items()}.items()}  # one pin per position
    ordered = [f"i{j}" for j in range(n)]
    out = apply_rules(ordered, cats[:n], k, cap, pins)
    assert len(out.items) == len(set(out.items))  # no item twice
    others = [i for i in ordered if i not in pins]
    assert len(out.items) <= k
    assert len(out.items) >= min(k, len(others))  # never shorter than the candidates allow
    for item, pos in pins.items():
        if pos <= len(out.items):
            assert out.items[pos - 1] == item
    category = dict(zip(ordered, cats[:n], strict=True))
    if cap is not None and out_relaxed_free(out.items, pins, category, cap, ordered, k):
        counts = Counter(category[i] for i in out.items if i not in pins and category.get(i) is not None)
        assert max(counts.values(), default=0) <= cap


def out_relaxed_free(
    items: list[str],
    pins: dict[str, int],
    category: dict[str, str | None],
    cap: int,
    ordered: list[str],
    k: int,
) -> bool:
    """True when the non-pinned candidates can fill k within the cap (no relaxation needed)."""
    counts: Counter[str | None] = Counter()
    fill = 0
    for item in ordered:
        if item in pins:
            continue
        c = category[item]
        if c is None or counts[c] < cap:
            counts[c] += 1
            fill += 1
    return fill >= k


def test_too_few_candidates_to_reach_a_pin_end_the_answer_before_it() -> None:
    # one organic candidate, pins at 3, 4 and 5: position 2 has nothing to show, so the pins after
    # it are left out instead of moving up to 2 and 3 (hypothesis found the old answer i0, i1, i2)
    out = apply_rules(["i0"], ["a"], 5, None, {"i1": 3, "i2": 4, "i3": 5})
    assert out.items == ["i0"]
    assert out.pinned == 0
    assert apply_rules(["i0", "i9"], ["a", "b"], 5, None, {"i1": 3}).items == ["i0", "i9", "i1"]
