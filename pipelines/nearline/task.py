"""The work of one source partition: fold a poll batch into window state and say what to write.

A :class:`PartitionTask` owns the in-memory mirror of one :class:`PartitionStore`. For each
poll batch, :meth:`PartitionTask.process` decodes and filters the records (dead letters for
malformed, late and future-dated ones), drops duplicate event ids, folds the events into the
pane records of every view, advances the watermark and each view's published boundary, expires
dead panes, and returns the store changes and the (view, entities) to publish. Nothing leaves
the process here: the runner persists and publishes (see :mod:`headwater.pipelines.nearline.runner`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from headwater.pipelines.events.codec import DeadLetter, DecodeError, EventCodec, Reason, dead_letter
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
from headwater.pipelines.windows import PaneAggregator, Panes, ViewSpec


@dataclass(frozen=True)
class SourceTiming:
    """Event-time handling of the source, in ms (from the plan's source)."""

    max_out_of_orderness_ms: int
    allowed_lateness_ms: int | None
    max_future_ms: int = 3_600_000
    """An event this far ahead of the wall clock is a dead letter (``future_dated``)."""


@dataclass
class BatchOutput:
    """The result of one batch: store changes, dead letters, what to publish, counters."""

    changes: dict[bytes, bytes | None] = field(default_factory=dict)
    dead: list[DeadLetter] = field(default_factory=list)
    publish: dict[str, tuple[int, list[str]]] = field(default_factory=dict)
    """view -> (boundary B, entity ids)."""
    events: int = 0
    duplicates: int = 0
    expired_panes: int = 0
    next_offset: int | None = None


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
        registry_hash: str,
        codec: EventCodec,
    ) -> None:
        self.partition = partition
        self.store = store
        self.timing = timing
        self.codec = codec
        self.registry_hash = registry_hash
        self.views = {v.name: ViewState(v) for v in views}
        self.seen: dict[str, int] = {}
        self.buckets: dict[int, dict[bytes, list[str]]] = {}
        self.max_t: int | None = None
        self.next_offset: int | None = None
        self.pending_outbox: dict[str, list[str]] = {}

    # -- restore -------------------------------------------------------------------------------
    def load(self, loaded: Loaded) -> None:
        """Rebuild the in-memory state from a store scan; the outbox becomes pending publishes."""
        meta = loaded.meta
        if meta and meta.get("registry") != self.registry_hash:
            msg = (
                f"nearline state of partition {self.partition} at {self.store.dir} was built from registry "
                f"{meta.get('registry')}, the applied plan is {self.registry_hash}; delete that folder and "
                "the changelog topic (or run with a new --group) to rebuild the state from the events"
            )
            raise RuntimeError(msg)
        self.next_offset = meta.get("offset")
        self.max_t = meta.get("max_t")
        for name, vs in self.views.items():
            vs.t_pub = int(meta.get("t_pub", {}).get(name, 0))
            for entity, pane, rec in loaded.panes.get(name, []):
                vs.entities.setdefault(entity, {})[pane] = vs.agg.load(rec)
                vs.index.setdefault(pane, set()).add(entity)
        for bucket, keys in loaded.dedup.items():
            for key, ids in keys.items():
                self.seen.update(ids)
                self.buckets.setdefault(bucket, {})[key] = list(ids)
        self.pending_outbox = {v: list(e) for v, e in loaded.outbox.items() if v in self.views}

    def restored_publish(self) -> dict[str, tuple[int, list[str]]]:
        """Return what the outbox of the last committed batch said to publish (re-run after a crash)."""
        return {v: (self.views[v].t_pub, e) for v, e in self.pending_outbox.items() if e}

    # -- one batch -----------------------------------------------------------------------------
    def process(self, records: Sequence[Any], now_ms: int) -> BatchOutput:
        """Fold ``records`` (kafka-python ConsumerRecords of this partition, in offset order)."""
        out = BatchOutput()
        dirty: set[tuple[str, str, int]] = set()
        late_touch: dict[str, set[str]] = {name: set() for name in self.views}
        new_ids: dict[int, dict[str, int]] = {}
        first_offset = records[0].offset if records else 0
        for rec in records:
            event = self._accept(rec, now_ms, out)
            if event is None:
                continue
            eid, off = event["event_id"], rec.offset
            first = self.seen.get(eid)
            if first is not None and first != off:
                out.duplicates += 1
                continue
            if first is None:
                self.seen[eid] = off
                new_ids.setdefault(event["event_time"] // DEDUP_BUCKET_MS, {})[eid] = off
            out.events += 1
            for name, vs in self.views.items():
                key = event.get(vs.spec.join_key)
                if key is None:
                    continue
                entity = str(key)
                panes = vs.entities.get(entity)
                if panes is None:
                    panes = vs.entities[entity] = {}
                for start in vs.agg.fold(panes, event, off):
                    dirty.add((name, entity, start))
                    vs.index.setdefault(start, set()).add(entity)
                    if start < vs.t_pub:
                        late_touch[name].add(entity)
                if not panes:
                    del vs.entities[entity]
        if records:
            self.next_offset = records[-1].offset + 1
        self._dedup_changes(new_ids, first_offset, out)
        self._advance(dirty, late_touch, out)
        for name, entity, start in dirty:
            panes = self.views[name].entities.get(entity)
            rec = panes.get(start) if panes is not None else None
            out.changes[pane_key(name, entity, start)] = (
                dumps(self.views[name].agg.dump(rec)) if rec is not None else None
            )
        outbox = {v: e for v, (_, e) in out.publish.items()}
        out.changes[OUTBOX_KEY] = dumps(outbox)
        out.changes[META_KEY] = dumps(
            {
                "offset": self.next_offset,
                "max_t": self.max_t,
                "registry": self.registry_hash,
                "t_pub": {n: vs.t_pub for n, vs in self.views.items()},
            }
        )
        out.next_offset = self.next_offset
        return out

    def _accept(self, rec: Any, now_ms: int, out: BatchOutput) -> dict[str, Any] | None:
        decoded = self.codec.decode(rec.value, rec.headers)
        if isinstance(decoded, DecodeError):
            out.dead.append(dead_letter(rec, decoded.reason, decoded.detail, now_ms))
            return None
        event: dict[str, Any] = dict(decoded.event)
        t, timing = event["event_time"], self.timing
        if t > now_ms + timing.max_future_ms:
            detail = f"event_time {t} is more than {timing.max_future_ms} ms ahead of the clock ({now_ms})"
            out.dead.append(dead_letter(rec, Reason.FUTURE_DATED, detail, now_ms))
            return None
        if self.max_t is not None and timing.allowed_lateness_ms is not None:
            horizon = self.max_t - timing.max_out_of_orderness_ms - timing.allowed_lateness_ms
            if t < horizon:
                detail = f"event_time {t} is {horizon - t} ms before watermark - allowed lateness ({horizon})"
                out.dead.append(dead_letter(rec, Reason.LATE, detail, now_ms))
                return None
        if self.max_t is None or t > self.max_t:
            self.max_t = t
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
        lateness = self.timing.allowed_lateness_ms
        if lateness is None:
            lateness = max(vs.spec.longest_window_ms for vs in self.views.values())
        horizon = self.max_t - self.timing.max_out_of_orderness_ms - lateness
        for bucket in [b for b in self.buckets if (b + 1) * DEDUP_BUCKET_MS <= horizon]:
            for key, id_list in self.buckets.pop(bucket).items():
                for i in id_list:
                    self.seen.pop(i, None)
                out.changes[key] = None

    def _advance(self, dirty: set[tuple[str, str, int]], late: dict[str, set[str]], out: BatchOutput) -> None:
        """Move each view's boundary to the watermark; collect entities whose value changed; expire."""
        if self.max_t is None:
            return
        wm = self.max_t - self.timing.max_out_of_orderness_ms
        for name, vs in self.views.items():
            target = wm // vs.tick * vs.tick
            todo = late[name]
            if target > vs.t_pub:
                todo |= self._changed_entities(vs, vs.t_pub, target)
                vs.t_pub = target
                out.expired_panes += self._expire(vs, dirty)
            if todo:
                out.publish[name] = (vs.t_pub, sorted(todo))

    def _changed_entities(self, vs: ViewState, old: int, new: int) -> set[str]:
        if old == 0:
            return {e for s, ents in vs.index.items() if s < new for e in ents}
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

    def _expire(self, vs: ViewState, dirty: set[tuple[str, str, int]]) -> int:
        cutoff = vs.agg.horizon(vs.t_pub)
        count = 0
        for start in [s for s in vs.index if s < cutoff]:
            for entity in vs.index.pop(start):
                panes = vs.entities.get(entity)
                if panes is not None and panes.pop(start, None) is not None:
                    count += 1
                    dirty.add((vs.spec.name, entity, start))
                    if not panes:
                        del vs.entities[entity]
        return count

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
        }


def parse_json(raw: bytes) -> Any:
    """Decode a JSON store value."""
    return json.loads(raw)
