"""Backfill of new and changed views before they serve: replay the partition's history into them.

After a restore (``versions.py``), a view of the plan without state of its version on a partition
that already has a committed offset ``C`` is computed from the partition's retained history before
the partition reads on:

1. **Start.** ``S`` = the first offset whose record timestamp is at or after ``T0`` =
   watermark - (the view's longest window + slide) - the source's out-of-orderness, allowed
   lateness and max_future (``offsets_for_times``), or the earliest retained offset.
2. **Replay** ``[S, C)`` into a helper task (``PartitionTask.helper``) that holds only the views
   to backfill, with its own de-duplication set and watermark: the partition's own have already
   seen these events. Its dead letters are not sent again (the live run sent them) and it writes
   nothing to Redis.
3. **Switch.** The helper is brought to the partition's watermark (boundaries, expiry), its views
   replace the empty ones, and their panes, the drop's tombstones (``versions.py``) and the meta
   record (with the new versions) are committed by the commit protocol's steps 1 to 3 (changelog
   first, then RocksDB). The live stream then continues for every view from ``C``: no gap, and
   no event counted twice. The backfilled views are published at their boundary right after.

Exactness: an event a value still needs has ``event_time >= T0 + margins``; a record timestamp is
at or after its event time (the producer stamps it when sending; an event up to max_future ahead
of the clock is covered by the margin), so every such event, and every duplicate of it, lies at or
after ``S``, and events before ``S`` cannot make it late (their event times are below ``T0``). So
the helper accepts, de-duplicates and folds exactly what the live run did for the windows that
still count. A producer that stamps records earlier than their event times breaks this.

A crash during the replay commits nothing: the restart finds the same state and replays again.

Stage A also forwards the history again for a join key it never forwarded by (a view behind a
repartition with a new key: its stage B starts empty on a new topic and reads it from the start),
followed by one watermark marker; stage B skips what it already had by source offset.

**Short history.** When the earliest retained record is after ``T0`` (retention, or a topic younger
than the window), the view serves partial windows until a full window has passed: logged, counted
(``short_history_views``), and kept per view in the meta record and the worker's stats
(``short_history``: the boundary from which its windows are full).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kafka import TopicPartition

from headwater.pipelines import kafka as kafka_clients
from headwater.pipelines.nearline.repartition import marker_headers
from headwater.pipelines.nearline.restore import check_crcs
from headwater.pipelines.nearline.task import BatchOutput, PartitionTask
from headwater.pipelines.store import epoch_ms

if TYPE_CHECKING:
    from headwater.pipelines.nearline.runner import NearlineWorker

log = logging.getLogger("headwater.nearline")


@dataclass
class BackfillReport:
    """What one partition's backfill replayed (kept in the task's stats)."""

    views: list[str]
    reforward: list[str]
    start_offset: int
    end_offset: int
    records: int = 0
    seconds: float = 0.0
    needed_from_ms: int | None = None
    """``T0``: the record timestamp the replay had to reach back to (None: the whole partition)."""
    first_ms: int | None = None
    """Timestamp of the first replayed record."""
    complete: bool = True
    """The retained history reaches back to ``T0`` (or to the partition's first record ever)."""
    short: dict[str, int] = field(default_factory=dict)
    """View -> the boundary from which its windows are full (only when not ``complete``)."""

    def as_dict(self) -> dict[str, Any]:
        """Return a JSON-able form (stats)."""
        return dict(self.__dict__)


def replay_start_ms(task: PartitionTask, views: list[str], window_ms: int) -> int | None:
    """Return ``T0`` (module docstring), or None to replay from the earliest retained offset.

    ``window_ms``: the longest window + slide of the views behind a new forward key (0: none).
    """
    wm = task.watermark()
    if wm is None:
        return None
    longest = max(
        [window_ms, *(f.window_ms + f.slide_ms for v in views for f in task.views[v].spec.features)]
    )
    t = task.timing
    return wm - longest - t.max_out_of_orderness_ms - t.allowed_lateness_ms - t.max_future_ms


def backfill(worker: NearlineWorker, tp: TopicPartition, task: PartitionTask) -> BackfillReport | None:
    """Replay ``tp`` into the views ``task.restored`` left to backfill, then commit the switch.

    Also forwards the history by each join key of ``task.restored.reforward``. Commits the drop of
    stale state even when nothing is to replay, and the migration of records found under old-format
    keys (``state.py``: one tombstone and one new key each, on the changelog too, once). Returns None
    when the restore changed nothing.
    """
    restored = task.restored
    migration = task.store.migration
    if not restored.changed and not migration:
        return None
    if migration:
        log.info(
            "%s partition %d: %d records rewritten from old-format (\\x1f-separated) keys",
            tp.topic,
            tp.partition,
            len(migration) // 2,
        )
    for view, why in restored.dropped.items():
        log.info("%s partition %d: state of view %s dropped (%s)", tp.topic, tp.partition, view, why)
        if why == "removed from the plan":
            log.info(
                "view %s is no longer in the plan: its online keys are left to expire by their TTL "
                "(twice its longest window)",
                view,
            )
    end = task.next_offset if task.next_offset is not None else 0
    report = BackfillReport(list(restored.backfill), list(restored.reforward), end, end)
    changes = {**migration, **restored.changes}  # a dropped view's tombstones win over its migration
    if restored.backfill or restored.reforward:
        started = time.monotonic()
        helper = task.helper(restored.backfill, restored.reforward)
        sp = worker.sources.get(tp.topic)
        behind = [v for k in restored.reforward for v in sp.repartitioned.get(k, ())] if sp else []
        window_ms = max((f.window_ms + f.slide_ms for v in behind for f in v.features), default=0)
        forwarded = _replay(worker, tp, task, helper, report, window_ms)
        task.finish_helper(helper, epoch_ms())
        if not report.complete and report.first_ms is not None:
            for view in restored.backfill:
                spec = task.views[view].spec
                full = report.first_ms + max(f.window_ms + f.slide_ms for f in spec.features)
                report.short[view] = -(-full // spec.tick_ms) * spec.tick_ms
        changes.update(task.adopt(helper, report.short))
        if restored.reforward and (wm := task.watermark()) is not None:
            forwarded += worker._markers(tp, marker_headers(tp.partition, wm))
        report.seconds = time.monotonic() - started
        _count(worker, tp, report)
    out = BatchOutput(changes={**changes, **task.meta_change()})
    pos = worker._transact({tp: out})  # the forwarded history, the panes and the meta: one transaction
    task.store.commit(out.changes, pos[tp])
    task.store.migration = {}
    task.backfill_report = report.as_dict()
    if report.views or report.reforward:
        worker.write_stats()  # the status shows the backfill (and a short history) at once
    return report


def _replay(
    worker: NearlineWorker,
    tp: TopicPartition,
    task: PartitionTask,
    helper: PartitionTask,
    report: BackfillReport,
    reforward_window_ms: int,
) -> list[Any]:
    """Fold ``[S, committed offset)`` of ``tp`` into ``helper``; return the forwarded records' futures."""
    end = report.end_offset
    t0 = replay_start_ms(task, report.views, reforward_window_ms)
    report.needed_from_ms = t0
    consumer = kafka_clients.consumer(
        worker.config.settings.kafka_bootstrap,
        enable_auto_commit=False,
        max_partition_fetch_bytes=8 * 1024 * 1024,
        fetch_max_bytes=32 * 1024 * 1024,
        check_crcs=check_crcs(worker.config.check_crcs),
        isolation_level="read_committed",  # a repartition topic is written in transactions
    )
    forwarded: list[Any] = []
    try:
        consumer.assign([tp])
        first = consumer.beginning_offsets([tp])[tp]
        start = first
        if t0 is not None and t0 > 0:
            found = consumer.offsets_for_times({tp: t0}).get(tp)
            start = end if found is None else max(found.offset, first)
        start = min(start, end)
        report.start_offset = start
        report.complete = first == 0 or start > first
        consumer.seek(tp, start)
        while consumer.position(tp) < end:
            records = [r for r in consumer.poll(timeout_ms=1000).get(tp, []) if r.offset < end]
            if not records:
                continue
            if report.first_ms is None:
                report.first_ms = records[0].timestamp
            out = helper.process(records, epoch_ms())
            report.records += len(records)
            if out.forward:
                out.watermark = None  # one marker at the end, with the partition's own watermark
                forwarded += worker._forward(tp, out)
    finally:
        consumer.close()
    return forwarded


def _count(worker: NearlineWorker, tp: TopicPartition, report: BackfillReport) -> None:
    c = worker.counters
    c["backfill_records"] = c.get("backfill_records", 0) + report.records
    c["backfill_s"] = c.get("backfill_s", 0.0) + report.seconds
    c["backfilled_views"] = c.get("backfilled_views", 0) + len(report.views)
    if report.short:
        c["short_history_views"] = c.get("short_history_views", 0) + len(report.short)
        log.warning(
            "%s partition %d: retained history starts at %s ms, after the %s ms the windows need: views %s "
            "serve partial windows until the boundaries %s",
            tp.topic,
            tp.partition,
            report.first_ms,
            report.needed_from_ms,
            sorted(report.short),
            report.short,
        )
    log.info(
        "%s partition %d: backfilled views %s%s from offset %d to %d: %d records in %.2f s",
        tp.topic,
        tp.partition,
        report.views,
        f" (forwarded again by {report.reforward})" if report.reforward else "",
        report.start_offset,
        report.end_offset,
        report.records,
        report.seconds,
    )
