"""Rows of numpy slabs handed out to item ids: the one allocator of the item cache and the item mirror.

Both keep per-item data in preallocated numpy arrays (one row per item) and a dict from item id to
row, so a look-up of 500 candidates is a few C-level passes. :class:`SlotMap` holds that id <-> row
bookkeeping and the free rows; the owner grows its own slabs (:meth:`SlotMap.add_rows` tells it how
many rows exist) and decides what to evict. Not thread-safe: each owner calls it under its own rules
(the cache on the event loop, the mirror under its lock).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import repeat

import numpy as np
import numpy.typing as npt


class SlotMap:
    """Item id -> row, each row's id (None: free), and the free rows (reused last-freed first)."""

    def __init__(self) -> None:
        self.row: dict[str, int] = {}
        self.ids: list[str | None] = []
        self.free: list[int] = []

    def __len__(self) -> int:
        return len(self.row)

    @property
    def capacity(self) -> int:
        """Rows that exist (held and free)."""
        return len(self.ids)

    def find(self, ids: Sequence[str]) -> npt.NDArray[np.intp]:
        """Return each id's row, -1 where it holds none."""
        return np.fromiter(map(self.row.get, ids, repeat(-1)), dtype=np.intp, count=len(ids))

    def add_rows(self, count: int) -> None:
        """Record ``count`` new free rows after the existing ones (the owner grew its slabs by as many)."""
        size = len(self.ids)
        self.ids.extend([None] * count)
        self.free.extend(range(size + count - 1, size - 1, -1))  # the lowest row is taken first

    def take(self, new_ids: Sequence[str]) -> npt.NDArray[np.intp]:
        """Give each of ``new_ids`` (held by none) a free row; the owner made sure enough are free."""
        if len(new_ids) > len(self.free):
            msg = f"slot map: {len(new_ids)} rows wanted, {len(self.free)} free; grow or evict first"
            raise ValueError(msg)
        taken = self.free[-len(new_ids) :] if new_ids else []
        del self.free[len(self.free) - len(new_ids) :]
        for slot, item_id in zip(taken, new_ids, strict=True):
            self.ids[slot] = item_id
        self.row.update(zip(new_ids, taken, strict=True))
        return np.asarray(taken, dtype=np.intp)

    def forget(self, item_id: str) -> int | None:
        """Free ``item_id``'s row; return it (None when the id held none)."""
        slot = self.row.pop(item_id, None)
        if slot is not None:
            self.ids[slot] = None
            self.free.append(slot)
        return slot

    def release(self, slots: Iterable[int]) -> None:
        """Free these rows, whoever holds them (eviction)."""
        for slot in slots:
            item_id = self.ids[slot]
            if item_id is not None and self.row.get(item_id) == slot:
                del self.row[item_id]
            self.ids[slot] = None
            self.free.append(slot)

    def load(self, ids: Sequence[str | None]) -> None:
        """Replace everything with rows held as ``ids`` says (None: free), e.g. from a snapshot.

        Raises:
            ValueError: an id holds two rows.
        """
        row = {item_id: k for k, item_id in enumerate(ids) if item_id is not None}
        if len(row) != sum(1 for i in ids if i is not None):
            msg = "slot map: an id holds two rows"
            raise ValueError(msg)
        self.row = row
        self.ids = list(ids)
        self.free = [k for k in range(len(ids) - 1, -1, -1) if ids[k] is None]  # the lowest taken first

    def clear(self) -> None:
        """Forget every id and every row (the owner drops its slabs too)."""
        self.row.clear()
        self.ids = []
        self.free = []


def ids_to_arrays(ids: Sequence[str | None]) -> dict[str, npt.NDArray[np.generic]]:
    """Return a row -> id list (None: free) as numpy arrays without objects: ``ids`` and ``held``."""
    return {
        "ids": np.asarray([i if i is not None else "" for i in ids], dtype=np.str_),
        "held": np.fromiter((i is not None for i in ids), dtype=bool, count=len(ids)),
    }


def ids_from_arrays(arrays: dict[str, npt.NDArray[np.generic]], what: str) -> list[str | None]:
    """Return what :func:`ids_to_arrays` made back as a list.

    Raises:
        ValueError: arrays of another shape or type (``what`` names the snapshot's part).
    """
    ids, held = arrays["ids"], arrays["held"]
    if ids.ndim != 1 or ids.dtype.kind != "U" or held.shape != ids.shape or held.dtype != np.bool_:
        msg = f"{what} snapshot: a malformed id map (ids {ids.dtype}{ids.shape}, held {held.shape})"
        raise ValueError(msg)
    names: list[str] = ids.tolist()
    return [n if h else None for n, h in zip(names, held.tolist(), strict=True)]


__all__ = ["SlotMap", "ids_from_arrays", "ids_to_arrays"]
