"""Backfill of new and changed realtime views at restore: Flink replays their history, then goes on live.

A realtime job restarted on a new plan restores every kept view's state from the checkpoint
(:mod:`.job`); a new or changed view has none. Instead of starting it empty (partial values for one
window), the job backfills it, exactly, in the same run:

1. **The switch.** The restored checkpoint's own Kafka offsets, per partition of the source: ``B[p]``,
   the first offset the restored source would read (``CheckpointOffsets`` reads the source reader's
   split state in ``_metadata``; the state the restored source starts from, so exact by construction;
   the consumer group's committed offsets are not: they are committed after the checkpoint
   completes, and a kill in between leaves them behind).
2. **The start.** ``T0`` = the newest event time of the last records before the switch minus
   the backfilled views' longest window and slide, the source's out-of-orderness, allowed lateness and
   max_future (the nearline backfill's margin); ``S[p]`` = the first offset with a timestamp at or
   after ``T0`` (``offsets_for_times``), at least the earliest retained one, at most ``B[p]``.
3. **The replay.** The source's Kafka scan gets a new uid (``hw-kafka-<source>-b<n>``), so its
   checkpointed position is not restored (``ignore-unclaimed-state`` drops it) and it starts at
   ``S`` (``scan.startup.specific-offsets``); the program carries the seed (``B``, the backfilled
   views' ``name@version``, the partition and offset columns). In the JVM operator
   (``ViewOperator``), a row read before ``B[p]`` is folded into the backfilled views' features only,
   with the replay's own de-duplication (the restored slices already hold the ids the live run saw,
   and a replayed id joins them, so a later live duplicate is still found for every view); a group
   without a backfilled view skips it; a rejected row is not dead-lettered again. Rows from ``B[p]``
   on are the live stream, for every view. The aggregation is the operator's own (``Aggregator``),
   the very code of the live run, so the windows have the same semantics; no third implementation.
4. **Exactness.** Each kept view sees every event once (its state up to ``B``, the stream from
   ``B``), each backfilled view every event of its windows once (the replay up to ``B``, the stream
   from ``B``): at the switch its values equal an uninterrupted run's. An event a window still needs
   has a record timestamp at or after ``T0`` (a producer stamps records when sending; an event may be up
   to max_future ahead, and the lateness margins cover the rest), so it lies at or after ``S``.
   Replayed events older than a window are dropped by the operator as they would be live.
   Limits: a producer that stamps records earlier than their event times breaks the margin; the
   late/not-late verdict of a replayed event follows the replay's own greatest event time per
   partition (``LateCheck``, kept apart from the live one and tagged with the rewound scan's uid, so a
   restart mid-replay goes on with it), which starts empty at ``S``: an event the live run found late
   within the first allowed lateness after ``S`` can be folded into the backfilled views.
5. The restored state of kept views continues untouched; the backfilled views' values are written as
   the replay folds events (their last write is the value at the switch). The next start uses the
   new scan uid (``scans.json`` in the job's checkpoint folder), so its offsets restore again.
6. **A restart during the replay** (a crash, a kill) restores a checkpoint taken before the switch:
   the job goes on with the same seed (``seeds.json``: switch, views), its scan restored mid-replay
   (no rewind, even with ``--no-backfill``, or the kept views would count the rest again); a view new
   in that restart's plan starts empty (restart again after the switch to backfill it). Limit: the
   replay's de-duplication set is in memory, so a duplicate (same event id) of an event replayed
   before that checkpoint, replayed after it, counts twice in the backfilled views.

No backfill (the view starts empty, as before) when the checkpoint has no ``views.json`` (a legacy
folder), when the source has no restored offsets (a new source: it starts from ``scan.startup.mode``,
reading its history itself when that is earliest), or with ``--no-backfill``. When the earliest
retained record is after ``T0`` (retention, or a topic younger than the window), the view is
backfilled from what is left and serves partial windows until a full window has passed: logged, and
in the state report (``short``).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from kafka import TopicPartition

from headwater.pipelines import kafka as kafka_clients
from headwater.pipelines.events.codec import DecodedEvent, EventCodec
from headwater.pipelines.realtime.program import RealtimeProgram
from headwater.pipelines.realtime.sql import RAW, JobOptions
from headwater.registry.plans import PlanSource, TierPlan

log = logging.getLogger(__name__)

SEEDS_FILE = "seeds.json"
"""Per job folder: ``{source: seed}`` of the backfills the job ran, so a restart from a checkpoint
taken during one goes on with it (:func:`plan_backfill`)."""
SCANS_FILE = "scans.json"
"""Per job folder: ``{source: scan uid}`` of the job, so the next start restores the same scan."""
VIEWS_FILE = "views.json"


def default_scan_uid(source: str) -> str:
    """Return the uid of a source's Kafka scan that has never been rewound."""
    return f"hw-kafka-{source}"


def next_scan_uid(source: str, previous: str) -> str:
    """Return a scan uid unlike ``previous`` (``hw-kafka-<source>-b<n+1>``): its state is not restored."""
    m = re.fullmatch(re.escape(default_scan_uid(source)) + r"-b(\d+)", previous)
    return f"{default_scan_uid(source)}-b{int(m.group(1)) + 1 if m else 1}"


def scan_uids(checkpoint: Path | None) -> dict[str, str]:
    """Return ``{source: scan uid}`` of the job that wrote ``checkpoint`` (empty: none recorded)."""
    if checkpoint is None:
        return {}
    path = checkpoint.parent / SCANS_FILE
    if not path.is_file():
        return {}
    data: dict[str, str] = json.loads(path.read_text(encoding="utf-8"))
    return data


def parse_offsets(text: str) -> dict[str, dict[int, int]]:
    """Parse ``CheckpointOffsets.read`` lines (uid, operator id, topic, partition, offset) by topic."""
    out: dict[str, dict[int, int]] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        _uid, _op, topic, partition, offset = line.split("\t")
        out.setdefault(topic, {})[int(partition)] = int(offset)
    return out


def checkpoint_offsets(checkpoint: Path) -> dict[str, dict[int, int]]:
    """Return the Kafka offsets ``checkpoint`` restores, by topic and partition (through the gateway JVM)."""
    from pyflink.java_gateway import get_gateway

    reader = get_gateway().jvm.dev.headwater.flink.realtime.CheckpointOffsets
    return parse_offsets(str(reader.read(str(checkpoint))))


@dataclass(frozen=True)
class SourceBackfill:
    """The backfill of one source's new and changed views (module docstring)."""

    source: str
    topic: str
    views: tuple[str, ...]
    """``name@version`` of the views replayed."""
    boundary: dict[int, int]
    """Per partition, the switch: the first offset the restored checkpoint had not read."""
    start: dict[int, int]
    """Per partition, the first replayed offset."""
    from_ms: int | None
    """``T0``: the record timestamp the replay had to reach back to (None: no record before the switch)."""
    short: bool
    """The retained history does not reach back to ``T0``: partial windows until a full one passes."""
    scan_uid: str
    resumed: bool = False
    """A replay the restored checkpoint was taken in the middle of: it goes on from there (same switch,
    same scan, no rewind), so the kept views still skip what they already hold."""

    @property
    def records(self) -> int:
        """Records replayed (before the switch, over the partitions)."""
        return sum(self.boundary[p] - self.start[p] for p in self.boundary)

    def line(self) -> str:
        """One line for ``headwater run realtime``."""
        names = ", ".join(v.split("@")[0] for v in self.views) or "(no view left)"
        if self.resumed:
            return (
                f"backfill {self.source}: {names} goes on from the checkpoint taken during it, up to offsets "
                f"{_ranges(self.start, self.boundary)}, then live"
            )
        text = (
            f"backfill {self.source}: {names} replayed from Kafka ({self.records} records, offsets "
            f"{_ranges(self.start, self.boundary)}), then live from the checkpoint's offsets"
        )
        if self.short:
            text += "; the retained history is shorter than their windows: partial until one window passes"
        return text


def _ranges(start: Mapping[int, int], end: Mapping[int, int]) -> str:
    return ", ".join(f"p{p} {start[p]}-{end[p]}" for p in sorted(end))


@dataclass(frozen=True)
class Backfill:
    """What a start does per source: the scan uid it runs, and the backfill where there is one."""

    scan_uids: dict[str, str]
    sources: dict[str, SourceBackfill]

    def start_offsets(self) -> dict[str, dict[int, int]]:
        """Per backfilled source, where its rewound scan starts."""
        return {name: b.start for name, b in self.sources.items() if not b.resumed}

    def apply(self, programs: Sequence[RealtimeProgram]) -> list[RealtimeProgram]:
        """Return the programs with their scan uid and, for a backfilled source, its seed."""
        out = []
        for program in programs:
            data = program.data
            data["scan_uid"] = self.scan_uids.get(program.source, default_scan_uid(program.source))
            b = self.sources.get(program.source)
            if b is not None:
                routed = len(program.columns) + 2 + len(RAW)  # cols, reason, detail, raw: sql._routed_view
                data["seed"] = {
                    "topic": b.topic,
                    "partition_column": routed,
                    "offset_column": routed + 1,
                    "boundary": {str(p): o for p, o in b.boundary.items()},
                    "views": list(b.views),
                    "from_ms": b.from_ms,
                    "short": b.short,
                    "line": b.line(),
                }
            out.append(replace(program, text=json.dumps(data, separators=(",", ":"))))
        return out

    def lines(self) -> list[str]:
        """Human lines, one per backfilled source."""
        return [b.line() for _, b in sorted(self.sources.items())]


def plan_backfill(
    checkpoint: Path | None,
    plan: TierPlan,
    sources: Sequence[str],
    options: JobOptions,
    offsets: Callable[[Path], dict[str, dict[int, int]]] = checkpoint_offsets,
    enabled: bool = True,
) -> Backfill:
    """Decide each source's scan uid and backfill for a start that restores ``checkpoint`` (None: none).

    ``offsets`` reads the checkpoint's Kafka offsets (the JVM reader; tests pass another); ``enabled``
    False: no backfill, every scan restores where the checkpoint left it.
    """
    uids = scan_uids(checkpoint)
    scans = {name: uids.get(name, default_scan_uid(name)) for name in sources}
    if checkpoint is None:
        return Backfill(scans, {})
    restored: dict[str, dict[int, int]] | None = None
    out: dict[str, SourceBackfill] = {}
    seeds_path = checkpoint.parent / SEEDS_FILE
    pending = json.loads(seeds_path.read_text(encoding="utf-8")) if seeds_path.is_file() else {}
    for name, seed in pending.items():
        if name not in sources:
            continue
        restored = offsets(checkpoint) if restored is None else restored
        at = restored.get(seed["topic"], {})
        switch = {int(p): int(o) for p, o in seed["boundary"].items()}
        if all(at.get(p, -1) >= b for p, b in switch.items()):
            continue  # the checkpoint is past the switch: that backfill is over
        # checkpointed mid-replay (a crash, a kill): go on with the same switch, whatever --no-backfill says,
        # or the kept views would count the rest of the replay again
        ids = {f"{v.name}@{v.version}" for v in plan.views if v.source == name}
        out[name] = SourceBackfill(
            source=name,
            topic=seed["topic"],
            views=tuple(v for v in seed["views"] if v in ids),
            boundary=switch,
            start={p: min(max(at.get(p, b), 0), b) for p, b in switch.items()},
            from_ms=seed.get("from_ms"),
            short=bool(seed.get("short")),
            scan_uid=scans[name],
            resumed=True,
        )
        log.warning("%s", out[name].line())
    views_path = checkpoint.parent / VIEWS_FILE
    if not enabled or not views_path.is_file():
        return Backfill(scans, out)
    before: dict[str, str] = json.loads(views_path.read_text(encoding="utf-8"))
    by_name = {s.name: s for s in plan.sources}
    for name in sources:
        seeded = tuple(
            f"{v.name}@{v.version}"
            for v in plan.views
            if v.source == name and before.get(v.name) != v.version
        )
        if not seeded:
            continue
        if name in out:
            log.warning(
                "source %s: the restored checkpoint was taken during a backfill, which goes on: %s start "
                "empty; restart once it is over to backfill them",
                name,
                ", ".join(seeded),
            )
            continue
        if restored is None:
            restored = offsets(checkpoint)
        src = by_name[name]
        topic = options.topic(src)
        boundary = restored.get(topic)
        if not boundary:
            log.info("source %s: no offsets of %s in %s: it starts from its startup mode; %s not backfilled",
                     name, topic, checkpoint, ", ".join(seeded))  # fmt: skip
            continue
        if any(o < 0 for o in boundary.values()):
            log.warning("source %s: the checkpoint holds a split not read yet (%s): %s start empty",
                        name, boundary, ", ".join(seeded))  # fmt: skip
            continue
        window_ms = max(
            round((f.window_s + f.slide_s) * 1000) for v in plan.views if f"{v.name}@{v.version}" in seeded
            for f in v.features
        )  # fmt: skip
        start, from_ms, short = replay_range(options.kafka_bootstrap, topic, boundary, src, window_ms)
        out[name] = SourceBackfill(
            source=name,
            topic=topic,
            views=seeded,
            boundary=dict(boundary),
            start=start,
            from_ms=from_ms,
            short=short,
            scan_uid=next_scan_uid(name, scans[name]),
        )
        scans[name] = out[name].scan_uid
        log.info("%s", out[name].line())
    return Backfill(scans, out)


def margin_ms(src: PlanSource, window_ms: int) -> int:
    """How far before the newest record's timestamp the replay starts (module docstring, step 2)."""
    return window_ms + src.max_out_of_orderness_ms + src.allowed_lateness_ms + src.max_future_ms


LOOK_BACK = 256
"""Records read back from the switch, per partition, for the newest event time before it."""


def replay_range(
    bootstrap: str, topic: str, boundary: Mapping[int, int], src: PlanSource, window_ms: int
) -> tuple[dict[int, int], int | None, bool]:
    """Return per partition the first offset to replay, ``T0`` and whether the history is short.

    The clock at the switch is estimated by the newest event time of the last records before it
    (a lower bound of the operator's clock, so ``T0`` errs early: more replay, never less).
    """
    codec = EventCodec(src)
    consumer = kafka_clients.consumer(bootstrap, enable_auto_commit=False)
    try:
        tps = {p: TopicPartition(topic, p) for p in boundary}
        first = consumer.beginning_offsets(list(tps.values()))
        newest: int | None = None
        for p, tp in tps.items():
            if boundary[p] <= first[tp]:
                continue
            consumer.assign([tp])
            consumer.seek(tp, max(first[tp], boundary[p] - LOOK_BACK))
            while consumer.position(tp) < boundary[p]:
                records = consumer.poll(timeout_ms=10_000).get(tp, [])
                if not records:
                    break
                for r in records:
                    if r.offset >= boundary[p]:
                        break
                    got = codec.decode(r.value, r.headers)
                    if isinstance(got, DecodedEvent):
                        newest = got.event_time_ms if newest is None else max(newest, got.event_time_ms)
        if newest is None:
            return dict(boundary), None, False
        t0 = newest - margin_ms(src, window_ms)
        found = consumer.offsets_for_times({tp: max(t0, 0) for tp in tps.values()})
        start: dict[int, int] = {}
        short = False
        for p, tp in tps.items():
            at = found.get(tp)
            s = boundary[p] if at is None else max(at.offset, first[tp])
            s = min(s, boundary[p])
            if s == first[tp] and first[tp] > 0:
                short = True  # the records before T0 are deleted (or the first kept one is after T0)
            start[p] = s
        return start, t0, short
    finally:
        consumer.close()
