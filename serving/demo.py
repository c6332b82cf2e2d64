"""Demo features for the ranking service: the generator's world, counted, written to the store.

Until the realtime and nearline tiers write ``user_profile``, ``item_stats`` and
``item_popularity``, this fills them from the same counters the training set uses
(:class:`headwater.serving.trainset.FeatureState`), so a demo request ranks real-looking rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

from headwater.serving.config import ServingConfig, ViewSpec
from headwater.serving.store import now_ms
from headwater.serving.trainset import FeatureState, generated_events


class FeatureWriter(Protocol):
    """Anything that writes vectors of one view (the Redis reader/writer or the in-memory store)."""

    def write(
        self, spec: ViewSpec, ids: Sequence[str], values: npt.NDArray[np.float32], event_ms: int
    ) -> None:
        """Write one vector per id."""
        ...


@dataclass(frozen=True)
class DemoRows:
    """Vectors of the three demo views."""

    user_ids: list[str]
    users: npt.NDArray[np.float32]
    item_ids: list[str]
    items: npt.NDArray[np.float32]
    popularity: npt.NDArray[np.float32]


def demo_rows(events: int = 200_000, seed: int = 7, users: int = 2_000, items: int = 2_000) -> DemoRows:
    """Count ``events`` generator events into the users' and items' final feature vectors."""
    state = FeatureState()
    for event in generated_events(events, seed, users, items):
        state.apply(event)
    user_ids = sorted(state.users)
    item_ids = sorted(state.items)
    return DemoRows(
        user_ids,
        np.stack([state.user_vector(u) for u in user_ids]),
        item_ids,
        np.stack([state.item_vector(i) for i in item_ids]),
        np.asarray([[state.items[i][1]] for i in item_ids], dtype=np.float32),
    )


def write_demo(writer: FeatureWriter, config: ServingConfig, rows: DemoRows, chunk: int = 5_000) -> int:
    """Write the rows into the config's user, item and popularity views; returns rows written."""
    event_ms = now_ms()
    written = 0
    for spec, ids, values in (
        (config.user_view, rows.user_ids, rows.users),
        (config.item_view, rows.item_ids, rows.items),
        (config.popularity_view, rows.item_ids, rows.popularity),
    ):
        for start in range(0, len(ids), chunk):
            writer.write(spec, ids[start : start + chunk], values[start : start + chunk], event_ms)
        written += len(ids)
    return written
