"""Business rules over the ranked list: diversity by category, then editorial pins.

Both are pure functions of the ordered candidates, so they are tested without a service.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class RulesOutcome:
    """The final order and what the rules did to it."""

    items: list[str]
    skipped_for_diversity: int
    """Candidates passed over because their category was full in the top k."""
    relaxed: int
    """Items taken back despite a full category because too few others were left to fill k."""
    pinned: int
    """Pins placed (a pin already at its position counts too)."""


def diversify(
    ordered: Sequence[str], categories: Sequence[str | None], k: int, max_per_category: int | None
) -> tuple[list[str], int, int]:
    """Take ``k`` items in order, at most ``max_per_category`` of one category.

    An item without a category is never limited. When the limit leaves fewer than ``k`` items,
    the passed-over ones fill the rest in their order (counted as ``relaxed``) so an answer is
    never shorter than the candidates allow. Returns (items, skipped, relaxed).
    """
    if max_per_category is None:
        return list(ordered[:k]), 0, 0
    taken: list[str] = []
    passed: list[str] = []
    count: dict[str, int] = {}
    for item, category in zip(ordered, categories, strict=True):
        if len(taken) == k:
            break
        if category is not None:
            if count.get(category, 0) >= max_per_category:
                passed.append(item)
                continue
            count[category] = count.get(category, 0) + 1
        taken.append(item)
    relaxed = min(len(passed), k - len(taken))
    return taken + passed[:relaxed], len(passed), relaxed


def pin(items: Sequence[str], pins: Mapping[str, int], k: int) -> tuple[list[str], int]:
    """Place each pinned item at its 1-based position (within ``k``), the others keep their order.

    A pinned item is moved if it is already in the list, else inserted; the list is cut at ``k``.
    A pin beyond the answer's length is placed at the end only if that is its position, so a pin
    is never shown elsewhere than where the editors put it. Returns (items, pins placed).
    """
    wanted = {item: pos for item, pos in pins.items() if pos <= k}
    rest = [i for i in items if i not in wanted]
    length = min(k, len(rest) + len(wanted))
    out: list[str | None] = [None] * length
    for item, pos in wanted.items():
        if pos <= length:
            out[pos - 1] = item
    fill = iter(rest)
    for j in range(length):
        if out[j] is None:
            out[j] = next(fill, None)
    # too few candidates to reach a pin's position: the answer ends at the first hole, so the pins
    # after it are not shown rather than shown higher than the editors put them
    shown = out[: out.index(None)] if None in out else out
    return [i for i in shown if i is not None], sum(1 for i in shown if i in wanted)


def apply_rules(
    ordered: Sequence[str],
    categories: Sequence[str | None],
    k: int,
    max_per_category: int | None,
    pins: Mapping[str, int],
) -> RulesOutcome:
    """Diversity over the non-pinned candidates, then the pins at their positions."""
    keep = [j for j, item in enumerate(ordered) if item not in pins]
    items, skipped, relaxed = diversify(
        [ordered[j] for j in keep], [categories[j] for j in keep], k, max_per_category
    )
    final, placed = pin(items, pins, k)
    return RulesOutcome(final, skipped, relaxed, placed)
