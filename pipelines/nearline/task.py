"""The work of one source partition: fold a poll batch into window state and say what to write.

A :class:`PartitionTask` owns the in-memory mirror of one :class:`PartitionStore`. For each
poll batch, :meth:`PartitionTask.process` decodes and filters the records (dead letters for
malformed, late and future-dated ones), drops duplicate event ids, folds the events into the
pane records of every view, advances the watermark and each view's published boundary, expires
dead panes, and returns the store changes and the (view, entities) to publish. Nothing leaves
the process here: the runner persists and publishes (see :mod:`headwater.pipelines.nearline.runner`).

The task is generic over the source: its codec (built from the plan's source) decodes and
validates; the event-time rules are the source's (:meth:`SourceTiming.of`). The window code reads
an event's time in UTC ms as ``event_time`` and its identity as ``event_id``, so each accepted
event gets both from the source's own fields (its event-time field in whatever unit, its event-id
field; a source without one gets the record's coordinates, and is not de-duplicated).

Time from the future does not move the watermark past the wall clock: an accepted event ahead of
the clock (up to the source's ``max_future``) is folded, but the partition's max event time only
advances to the batch's clock, so the events after it are not judged late against a time that has
not come yet (issue 16, item 1).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from headwater.pipelines.events.codec import DeadLetter, DecodeError, EventCodec, Reason, dead_letter
from headwater.pipelines.events.timing import SourceTiming, counted_time
from headwater.pipelines.nearline.state import (
    DEDUP_BUCKET_MS,
    META_KEY,
    OUTBOX_KEY,
    Loaded,
    PartitionStore,
    dedup_key,
    dumps,
    pane_key,
)
from headwater.pipelines.nearline.versions import Restored, sort_state
from headwater.pipelines.windows import PaneAggregator, Panes, ViewSpec

EVENT_TIME = "event_time"
"""Where the window code (:mod:`headwater.pipelines.windows`) reads an event's time, in UTC ms."""
EVENT_ID = "event_id"
"""Where the window code reads an event's identity (``last`` breaks ties on it; dedup keys on it)."""


@dataclass
class BatchOutput:
    """The result of one batch: store changes, dead letters, what to publish, counters."""

    changes: dict[bytes, bytes | None] = field(default_factory=dict)
    dead: list[DeadLetter] = field(default_factory=list)
    publish: dict[str, tuple[int, list[str]]] = field(default_factory=dict)
    """view -> (boundary B, entity ids)."""
    outbox: dict[str, dict[str, Any]] = field(default_factory=dict)
    """The compact form of ``publish`` kept in the store (see :meth:`PartitionTask.restored_publish`)."""
    events: int = 0
    duplicates: int = 0
    expired_panes: int = 0
    next_offset: int | None = None
    forward: list[tuple[str, Any, dict[str, Any], int]] = field(default_factory=list)
    """(join key, its value, event, source offset) per accepted event to repartition by that key."""
    watermark: int | None = None
    """This partition's watermark after the batch (sent downstream with forwarded events)."""


class ViewState:
    """One view's state in one partition: entity -> panes, and pane start -> entities (index)."""

    def __init__(self, spec: ViewSpec) -> None:
        self.spec = spec
        self.agg = PaneAggregator(spec)
        self.entities: dict[str, Panes] = {}
        self.index: dict[int, set[str]] = {}
        self.t_pub = 0
        self.tick = spec.tick_ms


class PartitionTask:
    """Window state of one partition for a set of views keyed like the source topic."""

    def __init__(
        self,
        partition: int,
        store: PartitionStore,
        views: Sequence[ViewSpec],
        timing: SourceTiming,
        codec: EventCodec,
        refresh_all: bool = True,
        forward_keys: Sequence[str] = (),
    ) -> None:
        """Own ``store``; with ``refresh_all`` every live entity is re-published at each new boundary.

        ``refresh_all=False`` re-publishes only entities whose value changed (fewer writes, but an
        unchanged entity's stored event time stays at the boundary it last changed at).
        ``forward_keys``: join keys of views computed downstream of a repartition; each accepted,
        first-seen event with such a field is returned in :attr:`BatchOutput.forward`.
        """
        self.partition = partition
        self.forward_keys = tuple(forward_keys)
        self.refresh_all = refresh_all
        self.store = store
        self.timing = timing
        self.codec = codec
        self.views = {v.name: ViewState(v) for v in views}
        self.filters: dict[str, Any] = {}
        """Every distinct filter of every view (key -> predicate), evaluated once per event."""
        for vs in self.views.values():
            self.filters.update(vs.agg.filters)
        self.seen: dict[str, int] = {}
        self.buckets: dict[int, dict[bytes, list[str]]] = {}
        self.max_t: int | None = None
        self.next_offset: int | None = None
        self.pending_outbox: dict[str, Any] = {}
        self.restored = Restored()
        """What :meth:`load` kept, dropped and left to backfill (see :mod:`.versions`)."""
        self.short: dict[str, int] = {}
        """View -> the boundary from which its windows are full (its backfill found less history)."""
        self.backfill_report: dict[str, Any] | None = None
        """What the last backfill of this partition replayed (``backfill.py``), for the stats."""
        self.fold_s = dict.fromkeys(self.views, 0.0)
        """Per view, the seconds spent in its folds since ``fold_since`` (``headwater costs``)."""
        self.fold_since = time.time()
        src = codec.source
        self.dedup = src.event_id is not None
        """Whether events are de-duplicated by the source's event-id field."""
        id_field = src.field(src.event_id) if src.event_id else None
        self._id_field = src.event_id
        self._copy_id = src.event_id is not None and not (
            src.event_id == EVENT_ID and id_field is not None and id_field.kind == "string"
        )
        """False when the id is already a string under ``event_id`` (the codec refuses a null one)."""
        self._set_time = not (src.event_time == EVENT_TIME and src.event_time_unit == "ms")
        """False when the event time is already UTC ms under ``event_time``."""

    # -- restore -------------------------------------------------------------------------------
    def load(self, loaded: Loaded) -> None:
        """Rebuild the in-memory state from a store scan; the outbox becomes pending publishes.

        Only the state of a view whose stored version is the plan's is loaded; the state of a view
        of another version (or written before versions, or removed from the plan) is dropped:
        :attr:`restored` lists it with the store changes that delete it, and the views of the plan
        left without state while the partition has a committed offset (to backfill).
        """
        meta = loaded.meta
        self.next_offset = meta.get("offset")
        self.max_t = meta.get("max_t")
        plan = {name: vs.spec.version for name, vs in self.views.items()}
        self.restored = sort_state(meta, loaded, plan, set(self.forward_keys))
        kept = set(self.restored.kept)
        for name in self.restored.kept:
            vs = self.views[name]
            vs.t_pub = int(meta.get("t_pub", {}).get(name, 0))
            for entity, pane, rec in loaded.panes.get(name, []):
                vs.entities.setdefault(entity, {})[pane] = vs.agg.load(rec)
                vs.index.setdefault(pane, set()).add(entity)
        self.short = {v: int(b) for v, b in meta.get("short", {}).items() if v in kept}
        for bucket, keys in loaded.dedup.items():
            for key, ids in keys.items():
                self.seen.update(ids)
                self.buckets.setdefault(bucket, {})[key] = list(ids)
        self.pending_outbox = {v: o for v, o in loaded.outbox.items() if v in kept}

    # -- backfill (see versions.py) ------------------------------------------------------------
    def helper(self, views: Sequence[str], forward_keys: Sequence[str] = ()) -> PartitionTask:
        """Return an empty task of this partition for ``views`` only, to fold a replay into.

        It has its own de-duplication set and watermark (this task's have already seen the
        replayed events); ``forward_keys``: join keys whose events it returns to forward.
        """
        return PartitionTask(
            self.partition,
            self.store,
            [self.views[v].spec for v in views],
            self.timing,
            self.codec,
            self.refresh_all,
            forward_keys,
        )

    def finish_helper(self, helper: PartitionTask, now_ms: int) -> None:
        """Bring ``helper`` (replayed up to this task's offset) to this task's watermark and boundaries."""
        if self.max_t is not None and (helper.max_t is None or helper.max_t < self.max_t):
            helper.max_t = self.max_t
        helper.process([], now_ms)  # moves each view's boundary to the watermark and expires

    def adopt(self, helper: PartitionTask, short: dict[str, int]) -> dict[bytes, bytes | None]:
        """Take ``helper``'s views (backfilled up to this task's offset); return their store changes.

        Every pane of the adopted views is written, and each is in the outbox as live (its values
        are published at its boundary before the task reads on). ``short``: view -> the boundary
        from which its windows are full, for views whose backfill found less history than that.
        """
        changes: dict[bytes, bytes | None] = {}
        for name, vs in helper.views.items():
            self.views[name] = vs
            for entity, panes in vs.entities.items():
                for start, rec in panes.items():
                    changes[pane_key(name, entity, start)] = dumps(vs.agg.dump(rec))
            self.pending_outbox[name] = {"live": True, "entities": []}
        self.short.update(short)
        changes[OUTBOX_KEY] = dumps(self.pending_outbox)
        return changes

    def meta_change(self) -> dict[bytes, bytes | None]:
        """Return the meta record as a store change (committed after a restore that changed state)."""
        return {META_KEY: dumps(self._meta())}

    def restored_publish(self) -> dict[str, tuple[int, list[str]]]:
        """Return what the outbox of the last committed batch said to publish (re-run after a crash).

        An outbox entry is ``{"live": bool, "entities": [...]}``: the listed entities, plus, when
        ``live``, every entity with a pane before the view's boundary (a refresh of all of them).
        """
        out: dict[str, tuple[int, list[str]]] = {}
        for name, box in self.pending_outbox.items():
            vs = self.views[name]
            if isinstance(box, list):  # written before the compact form
                box = {"entities": box}
            todo = set(box.get("entities", []))
            if box.get("live"):
                todo |= _live(vs, vs.t_pub)
            if todo:
                out[name] = (vs.t_pub, sorted(todo))
        return out

    # -- one batch -----------------------------------------------------------------------------
    def process(self, records: Sequence[Any], now_ms: int) -> BatchOutput:
        """Fold ``records`` (kafka-python ConsumerRecords of this partition, in offset order).

        Each distinct filter of all views is evaluated once per event; each changed (view,
        entity, pane) record gives one store change per batch, however many events it took.
        """
        out = BatchOutput()
        all_records, records = records, self._pre(records)
        forward = self.forward_keys
        dirty: set[tuple[str, str, int]] = set()
        late_touch: dict[str, set[str]] = {name: set() for name in self.views}
        new_ids: dict[int, dict[str, int]] = {}
        seen = self.seen
        dedup = self.dedup
        filters = tuple(self.filters.items())
        views = [
            (name, vs.spec.join_key, vs.entities, vs.index, vs.agg.fold, vs.t_pub, late_touch[name])
            for name, vs in self.views.items()
        ]
        # a view's own folds, timed in wall seconds: perf_counter costs ~0 us a fold (thread_time,
        # a system call, cost 2 us a record for two views); a preempted fold counts its wait too
        clock = time.perf_counter
        spent = dict.fromkeys(self.views, 0.0)
        for rec in records:
            event = self._accept(rec, now_ms, out)
            if event is None:
                continue
            off = rec.offset
            if dedup:
                eid = event[EVENT_ID]
                first = seen.get(eid)
                if first is not None and first != off:
                    out.duplicates += 1
                    continue
                if first is None:
                    seen[eid] = off
                    bucket = new_ids.get(event[EVENT_TIME] // DEDUP_BUCKET_MS)
                    if bucket is None:
                        bucket = new_ids[event[EVENT_TIME] // DEDUP_BUCKET_MS] = {}
                    bucket[eid] = off
            out.events += 1
            if forward:
                for fk in forward:
                    if (fv := event.get(fk)) is not None:
                        out.forward.append((fk, fv, event, off))
            hits = {key: pred(event) for key, pred in filters}
            for name, join_key, entities, index, fold, t_pub, touched in views:
                key = event.get(join_key)
                if key is None:
                    continue
                t0 = clock()
                entity = key if isinstance(key, str) else str(key)
                panes = entities.get(entity)
                if panes is None:
                    panes = entities[entity] = {}
                for start in fold(panes, event, off, hits):
                    dirty.add((name, entity, start))
                    ents = index.get(start)
                    if ents is None:
                        ents = index[start] = set()
                    ents.add(entity)
                    if start < t_pub:
                        touched.add(entity)
                if not panes:
                    del entities[entity]
                spent[name] += clock() - t0
        for name, s in spent.items():
            self.fold_s[name] = self.fold_s.get(name, 0.0) + s
        if all_records:
            self.next_offset = all_records[-1].offset + 1
        self._dedup_changes(new_ids, all_records[0].offset if all_records else 0, out)
        self._advance(dirty, late_touch, out)
        self._pane_changes(dirty, out)
        out.changes[OUTBOX_KEY] = dumps(out.outbox)
        out.changes[META_KEY] = dumps(self._meta())
        out.next_offset = self.next_offset
        out.watermark = self._watermark()
        return out

    def _pre(self, records: Sequence[Any]) -> Sequence[Any]:
        """Return the records to fold (a subclass drops control records here)."""
        return records

    def _meta(self) -> dict[str, Any]:
        """Return the meta record committed with every batch (``load`` reads it back)."""
        self.short = {v: b for v, b in self.short.items() if v in self.views and self.views[v].t_pub < b}
        return {
            "offset": self.next_offset,
            "max_t": self.max_t,
            "t_pub": {n: vs.t_pub for n, vs in self.views.items()},
            "versions": {n: vs.spec.version for n, vs in self.views.items()},
            "fold_s": {n: round(s, 4) for n, s in self.fold_s.items()},
            "fold_since": round(self.fold_since, 3),
            "forward": sorted(self.forward_keys),
            **({"short": dict(self.short)} if self.short else {}),
        }

    def watermark(self) -> int | None:
        """Return the event time before which this partition expects no more events (None: none seen)."""
        return self._watermark()

    def _watermark(self) -> int | None:
        """Event time before which this partition expects no more events (None: none seen yet)."""
        return None if self.max_t is None else self.max_t - self.timing.max_out_of_orderness_ms

    def _pane_changes(self, dirty: set[tuple[str, str, int]], out: BatchOutput) -> None:
        changes = out.changes
        for name, entity, start in dirty:
            vs = self.views[name]
            panes = vs.entities.get(entity)
            rec = panes.get(start) if panes is not None else None
            changes[pane_key(name, entity, start)] = dumps(vs.agg.dump(rec)) if rec is not None else None

    def _accept(self, rec: Any, now_ms: int, out: BatchOutput) -> dict[str, Any] | None:
        decoded = self.codec.decode(rec.value, rec.headers)
        if isinstance(decoded, DecodeError):
            out.dead.append(dead_letter(rec, decoded.reason, decoded.detail, now_ms))
            return None
        event = decoded.event  # a fresh dict from the Avro reader: no copy
        t, timing = decoded.event_time_ms, self.timing
        if timing.is_future(t, now_ms):
            detail = (
                f"{self.codec.source.event_time} {t} ms is more than {timing.max_future_ms} ms ahead of the "
                f"clock ({now_ms}; max_future of source {self.codec.source.name!r})"
            )
            out.dead.append(dead_letter(rec, Reason.FUTURE_DATED, detail, now_ms))
            return None
        max_t = self.max_t
        if max_t is not None:
            horizon = timing.horizon(max_t)
            if t < horizon:
                detail = (
                    f"{self.codec.source.event_time} {t} ms is {horizon - t} ms before watermark - allowed "
                    f"lateness ({horizon}; source {self.codec.source.name!r})"
                )
                out.dead.append(dead_letter(rec, Reason.LATE, detail, now_ms))
                return None
        seen_t = counted_time(t, now_ms)  # the future does not move the watermark (module docstring)
        if max_t is None or seen_t > max_t:
            self.max_t = seen_t
        if self._set_time:
            event[EVENT_TIME] = t
        if self._copy_id:
            ident = event.get(self._id_field) if self._id_field else None
            event[EVENT_ID] = f"{rec.partition}:{rec.offset}" if ident is None else str(ident)
        elif not self.dedup:
            event[EVENT_ID] = f"{rec.partition}:{rec.offset}"  # only breaks ties of `last`
        return event

    def _dedup_changes(self, new_ids: dict[int, dict[str, int]], first_offset: int, out: BatchOutput) -> None:
        for bucket, ids in new_ids.items():
            key = dedup_key(bucket, first_offset)
            known = self.buckets.setdefault(bucket, {})
            merged = {**{i: self.seen[i] for i in known.get(key, [])}, **ids}
            known[key] = list(merged)
            out.changes[key] = dumps(merged)  # the whole batch's ids of the bucket
        if self.max_t is None:
            return
        horizon = self.timing.horizon(self.max_t)
        for bucket in [b for b in self.buckets if (b + 1) * DEDUP_BUCKET_MS <= horizon]:
            for key, id_list in self.buckets.pop(bucket).items():
                for i in id_list:
                    self.seen.pop(i, None)
                out.changes[key] = None

    def _advance(self, dirty: set[tuple[str, str, int]], late: dict[str, set[str]], out: BatchOutput) -> None:
        """Move each view's boundary to the watermark; collect the entities to publish; expire."""
        wm = self._watermark()
        if wm is None:
            return
        for name, vs in self.views.items():
            target = wm // vs.tick * vs.tick
            listed = late[name]
            live: set[str] = set()
            if target > vs.t_pub:
                if self.refresh_all:
                    live = _live(vs, target)
                else:
                    listed |= _changed_entities(vs, vs.t_pub, target)
                vs.t_pub = target
                expired, emptied = self._expire(vs, dirty)
                out.expired_panes += expired
                listed |= emptied  # gone from the state: listed, so a restart still writes their empty value
            if listed or live:
                out.publish[name] = (vs.t_pub, sorted(listed | live))
                out.outbox[name] = {"live": bool(live), "entities": sorted(listed)}

    def _expire(self, vs: ViewState, dirty: set[tuple[str, str, int]]) -> tuple[int, set[str]]:
        """Drop panes no boundary from ``t_pub`` on needs; return (panes dropped, entities left empty).

        A record at pane start ``s`` can hold a partial of a feature only when that feature's slide
        divides ``s`` (an event goes to its pane start of each slide), so it is needed while one
        such feature's window from ``t_pub`` on still reaches it. A short window's records (on its
        slide's grid alone) go when that window leaves them, not with the view's longest window; a
        start that is also on a longer window's grid lives as long as that window.
        """
        oldest: dict[int, int] = {}  # slide -> the oldest start a feature of that slide still needs
        for f in vs.spec.features:
            start = f.window_start(vs.t_pub)
            oldest[f.slide_ms] = min(start, oldest.get(f.slide_ms, start))
        cutoff, last = min(oldest.values()), max(oldest.values())

        def dead(s: int) -> bool:
            return s < cutoff or (s < last and all(s < o for slide, o in oldest.items() if s % slide == 0))

        count = 0
        emptied: set[str] = set()
        for start in [s for s in vs.index if dead(s)]:
            for entity in vs.index.pop(start):
                panes = vs.entities.get(entity)
                if panes is not None and panes.pop(start, None) is not None:
                    count += 1
                    dirty.add((vs.spec.name, entity, start))
                    if not panes:
                        del vs.entities[entity]
                        emptied.add(entity)
        return count, emptied

    # -- read ----------------------------------------------------------------------------------
    def values(self, view: str, entities: Sequence[str], as_of_ms: int) -> list[list[Any]]:
        """Return the values of ``entities`` as of ``as_of_ms`` (empty panes give empty values)."""
        vs = self.views[view]
        return [vs.agg.values(vs.entities.get(e, {}), as_of_ms) for e in entities]

    def stats(self) -> dict[str, Any]:
        """Return counts of the in-memory state (entities, panes, dedup ids) for logs and benchmarks."""
        return {
            "partition": self.partition,
            "entities": {n: len(vs.entities) for n, vs in self.views.items()},
            "panes": {n: sum(len(p) for p in vs.entities.values()) for n, vs in self.views.items()},
            "dedup_ids": len(self.seen),
            "offset": self.next_offset,
            "max_t": self.max_t,
            "t_pub": {n: vs.t_pub for n, vs in self.views.items()},
            "versions": {n: vs.spec.version for n, vs in self.views.items()},
            "short_history": dict(self.short),
            "restored": {
                "kept": self.restored.kept,
                "dropped": self.restored.dropped,
                "backfill": self.backfill_report,
            },
        }


def _live(vs: ViewState, boundary: int) -> set[str]:
    """Entities with a pane before ``boundary``: those whose value as of it may be non-empty."""
    out: set[str] = set()
    for start, ents in vs.index.items():
        if start < boundary:
            out |= ents
    return out


def _changed_entities(vs: ViewState, old: int, new: int) -> set[str]:
    """Entities with a pane entering or leaving some feature's window when B moves from old to new."""
    if old == 0:
        return _live(vs, new)
    lo: list[tuple[int, int]] = []
    for f in vs.spec.features:  # panes entering [B - W, B), then panes leaving it
        b_old, b_new = f.boundary(old), f.boundary(new)
        if b_new > b_old:
            lo += [(b_old, b_new), (b_old - f.window_ms, b_new - f.window_ms)]
    out: set[str] = set()
    for start, ents in vs.index.items():
        if any(a <= start < b for a, b in lo):
            out |= ents
    return out
