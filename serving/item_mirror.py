"""The item views' rows of the whole catalog in memory, kept in step with the store by the index refresher.

The retrieval index already reads every item's vectors from the online store to embed them, and
re-reads an item whenever its write time changes (:mod:`headwater.serving.retrieval.refresh`). The
mirror keeps what that read returned, per item view: values, found, event time, and the key's write
time and absolute expiry (the header fields every tier stamps, offsets 16 and 24). A ranking request
then takes the rows of the views whose freshness allows it from memory instead of one ``MGET`` of
200-500 keys per view.

**When a view is served from memory.** The mirror is *confirmed* at a moment T when everything the
store held at T is in it: T is when the last successful refresh took its change-log position
(before its scan), or when the last change check found no item view written since. Its *age* is
now - T. A view is served from memory while that age is at most ``sla_share`` of the view's declared
freshness (``freshness_sla``): with the default share 0.1 and the refresher reading the change
feeds every 0.5 s (each read confirms the mirror), every item view down to a realtime one with a
10-second SLA (bound 1 s) is served from memory; without the feeds (only the 30-s look) the realtime
view would be read from the store per request. The age bounds the staleness the mirror adds: a
write after T reaches the mirror at the next refresh.

**Exact.** A row from memory equals the row a store read returns at the same moment, as long as no
item view was written since T (the test compares both): an item changed when any of its views'
write times differs from the one recorded, and a row whose key is gone from its view (expired,
deleted) is forgotten at the next refresh without a read (:meth:`ItemMirror.sync`). Until then a row
whose key expires within ``expiry_margin_ms`` (or has expired) is read from the store instead (expiry
writes nothing to the change log). Items the mirror
does not hold (added since the last refresh, or a caller's own candidates) are read from the store.
Deleting keys by hand, outside the store API, writes no change-log entry: the next full scan
(``index_full_scan_s``) finds it.

Rows live in per-view numpy slabs and a dict from item id to row; the refresher's thread writes
under a lock and a look-up copies the rows it needs under the same lock, so a request never sees a
half-applied batch.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from headwater.ranking.features import SideViews
from headwater.serving.slots import SlotMap, ids_from_arrays, ids_to_arrays
from headwater.serving.store import ViewRows, now_ms

DEFAULT_SLA_SHARE = 0.1
DEFAULT_EXPIRY_MARGIN_MS = 5_000


@dataclass(frozen=True)
class MirrorLookup:
    """Rows of the candidates for the views served from memory.

    ``rows[j]`` is view j's rows for every candidate, or None when view j is read from the store;
    ``known[i]`` is False where candidate i must be read from the store in every view (not in the
    mirror, or a row expiring soon); its rows in ``rows`` are then meaningless.
    """

    rows: tuple[ViewRows | None, ...]
    known: npt.NDArray[np.bool_]


class ItemMirror:
    """Every indexed item's rows of each item view, with write times and expiries (module docstring)."""

    def __init__(
        self,
        side: SideViews,
        sla_share: float = DEFAULT_SLA_SHARE,
        expiry_margin_ms: int = DEFAULT_EXPIRY_MARGIN_MS,
    ) -> None:
        self.side = side
        self.sla_share = sla_share
        self.expiry_margin_ms = expiry_margin_ms
        n_views = len(side.layouts)
        fresh = side.freshness_s if len(side.freshness_s) == n_views else (0.0,) * n_views
        self.bounds_s: tuple[float, ...] = tuple(sla_share * s for s in fresh)
        """Largest mirror age (s) at which each view is served from memory (0: always read)."""
        self._lock = threading.Lock()
        self._slots = SlotMap()
        self._values = [np.empty((0, lay.dim), dtype=np.float32) for lay in side.layouts]
        self._found = [np.zeros(0, dtype=bool) for _ in side.layouts]
        self._event = [np.zeros(0, dtype=np.int64) for _ in side.layouts]
        self._write = [np.zeros(0, dtype=np.int64) for _ in side.layouts]
        self._expire = [np.zeros(0, dtype=np.int64) for _ in side.layouts]
        self._grow(1024)
        self.confirmed_ms: int | None = None
        """Epoch ms at which the mirror last held everything the store held (None: never)."""
        self.version = 0
        """Bumped by every change of the rows."""
        self.served = 0
        """Candidates served from memory (in at least one view)."""
        self.read = 0
        """Candidates read from the store in every view (unknown, or expiring)."""

    def __len__(self) -> int:
        return len(self._slots)

    def age_s(self, at_ms: int | None = None) -> float:
        """Seconds since the mirror was last confirmed in step with the store (inf: never)."""
        if self.confirmed_ms is None:
            return float("inf")
        return max(0.0, ((now_ms() if at_ms is None else at_ms) - self.confirmed_ms) / 1000.0)

    def confirm(self, at_ms: int) -> None:
        """Record that everything the store held at ``at_ms`` is in the mirror."""
        with self._lock:
            if self.confirmed_ms is None or at_ms > self.confirmed_ms:
                self.confirmed_ms = at_ms

    def views_served(self, at_ms: int | None = None) -> tuple[bool, ...]:
        """Which item views are served from memory now: the mirror's age within each view's bound."""
        age = self.age_s(at_ms)
        return tuple(age <= bound for bound in self.bounds_s)

    def changed(self, ids: Sequence[str], write_ms: Sequence[npt.NDArray[np.int64]]) -> npt.NDArray[np.bool_]:
        """Return which of ``ids`` are not held with these per-view write times (0 = no key in that view)."""
        with self._lock:
            slots = self._slots.find(ids)
            out = slots < 0
            held = np.flatnonzero(~out)
            for j, times in enumerate(write_ms):
                mine = self._write[j][slots[held]]
                out[held] |= mine != np.asarray(times)[held]
        return out

    def sync(self, ids: Sequence[str], write_ms: Sequence[npt.NDArray[np.int64]]) -> npt.NDArray[np.bool_]:
        """Compare with the store's per-view write times (0 = no key); return which ``ids`` need a read.

        A held row whose key is gone from its view (expired, deleted: write time now 0) is forgotten
        here without a read (found False, as a store read would say); an id not held, or with a
        view written since, needs a read. A view's keys expiring (a TTL) thus costs no re-read of
        the catalog.
        """
        with self._lock:
            slots = self._slots.find(ids)
            need = slots < 0
            held = np.flatnonzero(~need)
            at = slots[held]
            for j, times in enumerate(write_ms):
                now = np.asarray(times)[held]
                differs = self._write[j][at] != now
                gone = at[differs & (now == 0)]
                if len(gone):
                    self._values[j][gone] = np.nan
                    self._found[j][gone] = False
                    self._event[j][gone] = 0
                    self._write[j][gone] = 0
                    self._expire[j][gone] = 0
                    self.version += 1
                need[held[differs & (now != 0)]] = True
        return need

    def put(
        self,
        ids: Sequence[str],
        rows: Sequence[ViewRows],
        write_ms: Sequence[npt.NDArray[np.int64]],
        expire_ms: Sequence[npt.NDArray[np.int64]],
    ) -> None:
        """Hold ``ids``' rows of every view (``rows[j]`` view j's), with each key's write time and expiry."""
        if not len(ids):
            return
        with self._lock:
            slots = self._slots.find(ids)
            new = np.flatnonzero(slots < 0)
            if len(new):
                slots[new] = self._allocate([ids[i] for i in new.tolist()])
            for j, got in enumerate(rows):
                self._values[j][slots] = got.values
                self._found[j][slots] = got.found
                self._event[j][slots] = got.event_time_ms
                self._write[j][slots] = write_ms[j]
                self._expire[j][slots] = expire_ms[j]
            self.version += 1

    def remove(self, ids: Sequence[str]) -> int:
        """Forget ``ids`` (gone from every view); returns how many were held."""
        gone = 0
        with self._lock:
            for item_id in ids:
                gone += self._slots.forget(item_id) is not None
            if gone:
                self.version += 1
        return gone

    def holds(self, item_id: str) -> bool:
        """Return whether the mirror holds ``item_id`` (it was in an item view at the last refresh)."""
        with self._lock:
            return item_id in self._slots.row

    def lookup(self, ids: Sequence[str], at_ms: int | None = None) -> MirrorLookup | None:
        """Return the candidates' rows of the views served from memory now; None when no view is."""
        now = now_ms() if at_ms is None else at_ms
        served = self.views_served(now)
        if not any(served):
            return None
        horizon = now + self.expiry_margin_ms
        with self._lock:
            slots = self._slots.find(ids)
            known = slots >= 0
            safe = np.where(known, slots, 0)
            out: list[ViewRows | None] = []
            for j, serve in enumerate(served):
                if not serve:
                    out.append(None)
                    continue
                expire = self._expire[j][safe]
                known &= (expire == 0) | (expire > horizon) | ~self._found[j][safe]
                out.append(ViewRows(self._values[j][safe], self._found[j][safe], self._event[j][safe]))
        n_known = int(np.count_nonzero(known))
        self.served += n_known
        self.read += len(ids) - n_known
        return MirrorLookup(tuple(out), known)

    def export(self) -> dict[str, npt.NDArray[np.generic]]:
        """Return the rows and their ids as arrays; :meth:`restore` takes them back.

        ``ids``, ``held``, then per view j ``values.j``, ``found.j``, ``event.j``, ``write.j``,
        ``expire.j``. Not the confirmation time: a restored mirror serves nothing until a refresh confirms it.
        """
        with self._lock:
            slots = self._slots
            out = ids_to_arrays(slots.ids)
            for j in range(len(self.side.layouts)):
                out[f"values.{j}"] = self._values[j].copy()
                out[f"found.{j}"] = self._found[j].copy()
                out[f"event.{j}"] = self._event[j].copy()
                out[f"write.{j}"] = self._write[j].copy()
                out[f"expire.{j}"] = self._expire[j].copy()
        return out

    def restore(self, arrays: dict[str, npt.NDArray[np.generic]]) -> None:
        """Hold what :meth:`export` returned (into an empty mirror of the same views); not confirmed.

        Raises:
            ValueError: arrays of other shapes or types than this mirror's views (named), an id twice.
        """
        slot_ids = ids_from_arrays(arrays, "item mirror")
        rows = len(slot_ids)
        if not rows:  # an exported mirror has rows (a look-up indexes row 0)
            msg = "item mirror snapshot: no rows"
            raise ValueError(msg)
        want = {
            "values": np.float32,
            "found": np.bool_,
            "event": np.int64,
            "write": np.int64,
            "expire": np.int64,
        }
        for j, lay in enumerate(self.side.layouts):
            for name, dtype in want.items():
                got = arrays[f"{name}.{j}"]
                shape = (rows, lay.dim) if name == "values" else (rows,)
                if got.shape != shape or got.dtype != dtype:
                    msg = (
                        f"item mirror snapshot: view {lay.view} {name} is {got.dtype}{got.shape},"
                        f" expected {np.dtype(dtype)}{shape}"
                    )
                    raise ValueError(msg)
        with self._lock:
            if len(self._slots):
                msg = "item mirror: restore into an empty mirror only"
                raise ValueError(msg)
            self._slots.load(slot_ids)  # raises on an id held twice, before anything changed
            for j in range(len(self.side.layouts)):
                self._values[j] = np.array(arrays[f"values.{j}"])
                self._found[j] = np.array(arrays[f"found.{j}"])
                self._event[j] = np.array(arrays[f"event.{j}"])
                self._write[j] = np.array(arrays[f"write.{j}"])
                self._expire[j] = np.array(arrays[f"expire.{j}"])
            self.confirmed_ms = None
            self.version += 1

    def _grow(self, grow: int) -> None:
        """Add ``grow`` free rows to every slab (an empty mirror has some: a look-up indexes row 0)."""
        for j, lay in enumerate(self.side.layouts):
            more = np.empty((grow, lay.dim), dtype=np.float32)
            self._values[j] = np.concatenate([self._values[j], more])
            self._found[j] = np.concatenate([self._found[j], np.zeros(grow, dtype=bool)])
            self._event[j] = np.concatenate([self._event[j], np.zeros(grow, dtype=np.int64)])
            self._write[j] = np.concatenate([self._write[j], np.zeros(grow, dtype=np.int64)])
            self._expire[j] = np.concatenate([self._expire[j], np.zeros(grow, dtype=np.int64)])
        self._slots.add_rows(grow)

    def _allocate(self, new_ids: list[str]) -> npt.NDArray[np.intp]:
        need = len(new_ids) - len(self._slots.free)
        if need > 0:
            self._grow(max(need, self._slots.capacity // 2, 1024))
        return self._slots.take(new_ids)


__all__ = ["DEFAULT_EXPIRY_MARGIN_MS", "DEFAULT_SLA_SHARE", "ItemMirror", "MirrorLookup"]
