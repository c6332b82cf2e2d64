"""The simulated world behind the generator: a catalog, users with tastes, slates and a click model.

Everything here is drawn from one ``random.Random`` seeded by the generator's seed, so a seed
fixes the catalog and the users; the stream of events on top of them is in ``generator.py``.

- Items have a category, a price (log-normal around a per-category level), a quality and a
  popularity that follows a Zipf law over a random permutation of the catalog.
- Users have category preferences drawn from a Dirichlet law (a low concentration means a
  user likes few categories), an activity level and a main device. Preferences drift: a
  session may move part of the user's taste to another category.
- A slate mixes popular items and items from the user's preferred categories, ranked by a
  noisy relevance. The click probability is ``base_ctr * position_bias(position) *
  affinity(user, category) * quality(item)``, so a ranker has something to learn.
"""

from __future__ import annotations

import bisect
import itertools
import math
import random
from dataclasses import dataclass

from headwater.pipelines.events.schema import DEVICES, Device

CATEGORY_WORDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("sports", ("football", "tennis", "running", "cycling", "ski")),
    ("music", ("jazz", "vinyl", "guitar", "concert", "headphones")),
    ("cooking", ("pasta", "knife", "vegan", "baking", "spices")),
    ("travel", ("backpack", "hotel", "japan", "beach", "camping")),
    ("tech", ("laptop", "phone", "keyboard", "monitor", "drone")),
    ("fashion", ("sneakers", "jacket", "dress", "watch", "bag")),
    ("books", ("novel", "poetry", "history", "comics", "sci-fi")),
    ("gaming", ("console", "rpg", "controller", "indie", "strategy")),
    ("home", ("sofa", "lamp", "plants", "rug", "kitchen")),
    ("beauty", ("skincare", "perfume", "makeup", "hair", "nails")),
    ("garden", ("seeds", "tools", "roses", "compost", "hose")),
    ("pets", ("dog", "cat", "aquarium", "leash", "toys")),
    ("kids", ("lego", "puzzle", "stroller", "crayons", "plush")),
    ("auto", ("tyres", "dashcam", "oil", "seat", "charger")),
    ("art", ("canvas", "brushes", "prints", "clay", "sketch")),
    ("health", ("vitamins", "yoga", "protein", "tracker", "sleep")),
)
MAX_CATEGORIES = len(CATEGORY_WORDS)
DEVICE_WEIGHTS = (0.45, 0.40, 0.15)


@dataclass(frozen=True)
class Catalog:
    """Items ``i000000..`` with category index, price, quality and Zipf popularity."""

    item_ids: tuple[str, ...]
    category: tuple[int, ...]
    price: tuple[float, ...]
    quality: tuple[float, ...]
    popularity_rank: tuple[int, ...]
    """Rank 1 = most popular."""
    cum_weights: tuple[float, ...]
    """Cumulative Zipf weights over all items, for bisect sampling."""
    by_category: tuple[tuple[tuple[int, ...], tuple[float, ...]], ...]
    """Per category: (item indexes, cumulative Zipf weights)."""
    category_names: tuple[str, ...]

    def sample(self, rng: random.Random) -> int:
        """Draw an item index by global popularity."""
        weights = self.cum_weights
        return bisect.bisect_right(weights, rng.random() * weights[-1])

    def sample_in(self, rng: random.Random, category: int) -> int:
        """Draw an item index of ``category`` by popularity within it."""
        items, weights = self.by_category[category]
        return items[bisect.bisect_right(weights, rng.random() * weights[-1])]


def build_catalog(rng: random.Random, items: int, categories: int, zipf_s: float) -> Catalog:
    """Draw a catalog of ``items`` items over the first ``categories`` categories."""
    names = tuple(name for name, _ in CATEGORY_WORDS[:categories])
    level = [math.exp(rng.uniform(math.log(5), math.log(300))) for _ in range(categories)]
    ranks = list(range(1, items + 1))
    rng.shuffle(ranks)
    cats = [rng.randrange(categories) for _ in range(items)]
    weights = [rank**-zipf_s for rank in ranks]
    by_category: list[tuple[tuple[int, ...], tuple[float, ...]]] = []
    for c in range(categories):
        members = tuple(i for i in range(items) if cats[i] == c) or (c % items,)
        by_category.append((members, tuple(itertools.accumulate(weights[i] for i in members))))
    return Catalog(
        item_ids=tuple(f"i{i:06d}" for i in range(items)),
        category=tuple(cats),
        price=tuple(round(level[c] * math.exp(rng.gauss(0.0, 0.5)), 2) for c in cats),
        quality=tuple(math.exp(rng.gauss(0.0, 0.3)) for _ in range(items)),
        popularity_rank=tuple(ranks),
        cum_weights=tuple(itertools.accumulate(weights)),
        by_category=tuple(by_category),
        category_names=names,
    )


class Users:
    """Users ``u000000..`` with drifting category preferences, activity and a main device."""

    def __init__(self, rng: random.Random, users: int, categories: int, concentration: float) -> None:
        """Draw ``users`` users; preferences ~ Dirichlet(``concentration``) over ``categories``."""
        self.user_ids = tuple(f"u{u:06d}" for u in range(users))
        self.preferences: list[list[float]] = [
            _dirichlet(rng, categories, concentration) for _ in range(users)
        ]
        self._cum_preferences = [list(itertools.accumulate(p)) for p in self.preferences]
        self.cum_activity = tuple(itertools.accumulate(math.exp(rng.gauss(0.0, 1.0)) for _ in range(users)))
        self.device: tuple[Device, ...] = tuple(rng.choices(DEVICES, DEVICE_WEIGHTS, k=users))
        self.categories = categories

    def sample(self, rng: random.Random) -> int:
        """Draw a user index by activity (active users start more sessions)."""
        weights = self.cum_activity
        return bisect.bisect_right(weights, rng.random() * weights[-1])

    def preferred_category(self, rng: random.Random, user: int) -> int:
        """Draw a category from the user's current preferences."""
        weights = self._cum_preferences[user]
        return min(bisect.bisect_right(weights, rng.random() * weights[-1]), self.categories - 1)

    def affinity(self, user: int, category: int) -> float:
        """Preference relative to indifference: 1.0 = uniform taste, up to ``categories``."""
        return self.preferences[user][category] * self.categories

    def drift(self, rng: random.Random, user: int, step: float) -> None:
        """Move a share ``step`` of the user's taste to one random category."""
        target = rng.randrange(self.categories)
        prefs = self.preferences[user]
        for c in range(self.categories):
            prefs[c] *= 1.0 - step
        prefs[target] += step
        self._cum_preferences[user] = list(itertools.accumulate(prefs))


def _dirichlet(rng: random.Random, k: int, alpha: float) -> list[float]:
    draws = [rng.gammavariate(alpha, 1.0) + 1e-9 for _ in range(k)]
    total = sum(draws)
    return [d / total for d in draws]


def affinity_factor(affinity: float) -> float:
    """Click multiplier for a user-category affinity: 0.2 when indifferent to ~2.0 for a favourite."""
    return 0.2 + 1.8 * affinity / (1.0 + affinity)


def position_bias(position: int, decay: float) -> float:
    """Return the examination probability of slot ``position`` (1 = top): ``position ** -decay``."""
    return math.pow(position, -decay)


def build_slate(
    rng: random.Random, catalog: Catalog, users: Users, user: int, size: int, category: int | None
) -> list[int]:
    """Item indexes for one slate, best first.

    With ``category`` (a search), every item comes from it; otherwise half the slots are drawn
    from the user's preferred categories and half by global popularity. Items are ordered by
    a noisy relevance (affinity x quality), as an imperfect production ranker would.
    """
    chosen: dict[int, float] = {}
    for _ in range(size * 20):
        if len(chosen) == size:
            break
        if category is not None:
            item = catalog.sample_in(rng, category)
        elif rng.random() < 0.5:
            item = catalog.sample_in(rng, users.preferred_category(rng, user))
        else:
            item = catalog.sample(rng)
        if item not in chosen:
            relevance = affinity_factor(users.affinity(user, catalog.category[item])) * catalog.quality[item]
            chosen[item] = relevance * math.exp(rng.gauss(0.0, 0.5))
    return sorted(chosen, key=chosen.__getitem__, reverse=True)


def query_for(rng: random.Random, category: int) -> str:
    """Search text for a category: one or two of its words."""
    words = CATEGORY_WORDS[category][1]
    if rng.random() < 0.5:
        return rng.choice(words)
    return f"{rng.choice(words)} {rng.choice(words)}"
