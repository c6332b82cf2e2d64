"""Views keyed by another field than their source's key: a repartition through Kafka.

A source's topic is keyed by its ``key`` field (``events`` by ``user_id``, ``payments`` by
``account_id``), so the events of one value of any other field (an item, a merchant) are spread
over every partition; a source without a key spreads every field's values. The task of each
source partition (stage A) forwards them to the internal topic ``<group>-<source>-by-<field>``
and a :class:`RepartitionedTask` per partition of that topic (stage B) computes the views keyed
by the field, with the same window code and commit protocol. One such pair of topics exists per
(source, join key) of the plan's views.

Stage A, in step 1 of the commit protocol (with the changelog, before the RocksDB commit):

- each accepted, first-seen event with the field set: key = the field's value, value = the event
  as JSON (with ``event_time`` in UTC ms and ``event_id`` set, see ``task.py``), header ``hw-src``
  = ``<source partition>:<source offset>``;
- then a watermark marker to every partition of the topic: header ``hw-wm`` =
  ``<source partition>:<watermark>`` (no key, no value).

Stage B differs from the source partition task in three ways:

1. **Exactly once across stage-A crashes.** A crash of stage A after step 1 re-forwards the
   batch when it is replayed. Stage B keeps, per source partition, the next source offset it
   expects (``src_hw``, committed in its meta record) and skips a record below it.
2. **Watermark = minimum over the active source partitions** of the last marker from each; until
   every active source partition has sent one, no boundary is published. A source partition that
   stage A found idle (caught up, no record for the idle timeout) sends an idle marker, header
   ``hw-idle`` = ``<source partition>:<watermark or empty>``, and leaves the minimum until its next
   watermark marker (Flink's ``withIdleness``). Its events that arrive after the boundary moved
   on are folded as in 3. When every source partition is idle the watermark holds at the minimum
   of all of them (nothing moves the boundary without an active source).
3. **Nothing is late here**: stage A applied the lateness rule; an event behind stage B's
   boundary is folded and its entity re-published at that boundary, as an allowed late event is.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import orjson

from headwater.pipelines.events.codec import EventCodec, Reason, dead_letter
from headwater.pipelines.events.timing import SourceTiming
from headwater.pipelines.nearline.state import PartitionStore
from headwater.pipelines.nearline.task import EVENT_TIME, BatchOutput, PartitionTask
from headwater.pipelines.windows import ViewSpec

SOURCE_HEADER = "hw-src"
MARKER_HEADER = "hw-wm"
IDLE_HEADER = "hw-idle"


def repartition_topic(group: str, source: str, field: str) -> str:
    """Return the internal topic that holds the events of ``source`` keyed by ``field``."""
    return f"{group}-{source}-by-{field}"


def repartition_changelog(group: str, source: str, field: str) -> str:
    """Return the changelog topic of the stage-B stores of ``source`` keyed by ``field``."""
    return f"{group}-{source}-by-{field}-changelog"


def forwarded_record(event: dict[str, Any], source_partition: int, offset: int) -> tuple[bytes, list[Any]]:
    """Return (value, headers) of one forwarded event."""
    return orjson.dumps(event), [(SOURCE_HEADER, f"{source_partition}:{offset}".encode())]


def marker_headers(source_partition: int, watermark: int) -> list[tuple[str, bytes]]:
    """Return the headers of a watermark marker."""
    return [(MARKER_HEADER, f"{source_partition}:{watermark}".encode())]


def idle_headers(source_partition: int, watermark: int | None) -> list[tuple[str, bytes]]:
    """Return the headers of an idle marker (the source partition's watermark, when it has one)."""
    wm = "" if watermark is None else str(watermark)
    return [(IDLE_HEADER, f"{source_partition}:{wm}".encode())]


class IdleSources:
    """Stage A's idle timer: which source partitions to announce idle, once each time they go idle.

    A partition is idle when it is caught up (``caught_up(p)``: its position is the partition's
    high watermark) and no record of it arrived for ``timeout_s``; a record makes it active again.
    """

    def __init__(self, timeout_s: float | None) -> None:
        """``timeout_s`` None or <= 0: never announce a partition idle."""
        self.timeout_s = timeout_s if timeout_s is not None and timeout_s > 0 else None
        self.active_at: dict[int, float] = {}
        self.announced: set[int] = set()

    def active(self, partition: int, now: float) -> None:
        """Record that ``partition`` was assigned or had records at ``now`` (monotonic seconds)."""
        self.active_at[partition] = now
        self.announced.discard(partition)

    def forget(self, partition: int) -> None:
        """Stop timing a revoked partition."""
        self.active_at.pop(partition, None)
        self.announced.discard(partition)

    def due(self, now: float, caught_up: Callable[[int], bool]) -> list[int]:
        """Return the partitions to announce idle now (each once until it is active again)."""
        if self.timeout_s is None:
            return []
        out = [
            p
            for p, at in sorted(self.active_at.items())
            if p not in self.announced and now - at >= self.timeout_s and caught_up(p)
        ]
        self.announced.update(out)
        return out


class RepartitionedTask(PartitionTask):
    """Stage B: the views keyed by one field, over one partition of its repartition topic."""

    def __init__(
        self,
        partition: int,
        store: PartitionStore,
        views: Sequence[ViewSpec],
        timing: SourceTiming,
        codec: EventCodec,
        upstream_partitions: int,
        refresh_all: bool = True,
    ) -> None:
        """Own ``store``; ``timing`` and ``codec`` are the source's.

        They set how long event ids are kept and whether there are any; ``upstream_partitions`` is
        the source topic's partition count (the watermark waits for a marker from each).
        """
        super().__init__(partition, store, views, timing, codec, refresh_all)
        self.upstream_partitions = upstream_partitions
        self.wm_src: dict[int, int] = {}
        self.src_hw: dict[int, int] = {}
        self.idle: set[int] = set()
        """Source partitions announced idle (left out of the watermark until their next marker)."""

    def load(self, loaded: Any) -> None:
        """Rebuild the state, then the per-source watermarks and offsets of the meta record."""
        super().load(loaded)
        self.wm_src = {int(p): int(w) for p, w in loaded.meta.get("wm_src", {}).items()}
        self.src_hw = {int(p): int(o) for p, o in loaded.meta.get("src_hw", {}).items()}
        self.idle = {int(p) for p in loaded.meta.get("idle", [])}

    def helper(self, views: Sequence[str], forward_keys: Sequence[str] = ()) -> RepartitionedTask:
        """Return an empty stage-B task of this partition for ``views`` only (see the base class)."""
        return RepartitionedTask(
            self.partition,
            self.store,
            [self.views[v].spec for v in views],
            self.timing,
            self.codec,
            self.upstream_partitions,
            self.refresh_all,
        )

    def finish_helper(self, helper: PartitionTask, now_ms: int) -> None:
        """Give ``helper`` this task's per-source watermarks, then its boundaries (see the base class)."""
        if isinstance(helper, RepartitionedTask):
            helper.wm_src = dict(self.wm_src)
            helper.idle = set(self.idle)
        super().finish_helper(helper, now_ms)

    def _pre(self, records: Sequence[Any]) -> Sequence[Any]:
        kept = []
        for rec in records:
            name, raw = rec.headers[0] if rec.headers else ("", b"")
            src, _, num = raw.decode("ascii", "replace").partition(":")
            if name == MARKER_HEADER:
                p, wm = int(src), int(num)
                if wm > self.wm_src.get(p, wm - 1):
                    self.wm_src[p] = wm
                self.idle.discard(p)
            elif name == IDLE_HEADER:
                p = int(src)
                self.idle.add(p)
                if num and int(num) > self.wm_src.get(p, int(num) - 1):
                    self.wm_src[p] = int(num)
            elif name == SOURCE_HEADER:
                p, offset = int(src), int(num)
                if offset >= self.src_hw.get(p, 0):  # below: a re-forward after a stage-A crash
                    self.src_hw[p] = offset + 1
                    kept.append(rec)
            else:
                kept.append(rec)  # not ours: _accept sends it to the dead-letter topic
        return kept

    def _accept(self, rec: Any, now_ms: int, out: BatchOutput) -> dict[str, Any] | None:
        if not rec.headers or rec.headers[0][0] != SOURCE_HEADER:
            detail = f"a record on {rec.topic} without a {SOURCE_HEADER} header (not written by nearline)"
            out.dead.append(dead_letter(rec, Reason.INVALID_HEADER, detail, now_ms))
            return None
        try:
            event: dict[str, Any] = orjson.loads(rec.value)
        except orjson.JSONDecodeError as exc:
            out.dead.append(dead_letter(rec, Reason.CORRUPT_PAYLOAD, f"not a forwarded event: {exc}", now_ms))
            return None
        t = event[EVENT_TIME]
        seen_t = t if t <= now_ms else now_ms  # as in stage A: the future does not expire dedup ids
        if self.max_t is None or seen_t > self.max_t:
            self.max_t = seen_t
        return event

    def _watermark(self) -> int | None:
        active = [p for p in range(self.upstream_partitions) if p not in self.idle]
        if not active:
            return min(self.wm_src.values()) if self.wm_src else None
        if any(p not in self.wm_src for p in active):
            return None
        return min(self.wm_src[p] for p in active)

    def _meta(self) -> dict[str, Any]:
        return {
            **super()._meta(),
            "wm_src": {str(p): w for p, w in self.wm_src.items()},
            "src_hw": {str(p): o for p, o in self.src_hw.items()},
            "idle": sorted(self.idle),
        }

    def stats(self) -> dict[str, Any]:
        """Return the base counts plus the per-source watermarks and the idle source partitions."""
        return {**super().stats(), "wm_src": dict(self.wm_src), "idle_sources": sorted(self.idle)}
