"""The small serving world several unit tests share: two user slots, four items, popularity.

Item feature ``x`` orders the items i2 > i0 > i1 > i3 (what a fake neural scorer reading it ranks),
``y`` orders them i1 > i3 > i0 > i2 (a linear model weighting it), popularity i1 > i2 > i0 > i3.
"""

from __future__ import annotations

import time

import numpy as np

from headwater.ranking.synthetic import small_registry
from headwater.serving.store import InMemoryFeatureStore

REGISTRY = small_registry({"u": ["a", "b"]}, {"i": ["x", "y"], "p": ["clicks"]}, "p.clicks")
ITEMS = ["i0", "i1", "i2", "i3"]


def four_item_store() -> InMemoryFeatureStore:
    """A store with user u1 (3 s old), the four items' features (1 s old) and their popularity (now)."""
    s = InMemoryFeatureStore()
    now = int(time.time() * 1000)
    user, item, popularity = REGISTRY.user.layouts[0], *REGISTRY.item.layouts
    s.write(user, ["u1"], np.array([[1.0, 2.0]], np.float32), now - 3000)
    s.write(item, ITEMS, np.array([[3, 1], [1, 4], [5, 0], [0, 2]], np.float32), now - 1000)
    s.write(popularity, ITEMS, np.array([[10], [30], [20], [0]], np.float32), now)
    return s
