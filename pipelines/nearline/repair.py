"""The nearline tier's reconciliation pass: a value the online store lost is written again (issue 33).

Redis can lose a value the worker wrote: a kill -9 or a host crash with ``appendfsync everysec``
(up to a second of writes), a failover to a replica that was behind, an eviction. The commit protocol
(``runner.py``) writes an entity's value when its window boundary moves and keeps the outbox only
until the next batch, so without this pass a lost value stays missing, or older, until the entity's
next write.

**What a pass checks.** Every view of every task the worker owns, every *live* entity of the task's
state: one with a pane before the view's boundary B, exactly the entities step 3 of the commit
protocol writes at B (with ``--refresh-unchanged``, the default). The state is the task's mirror of
its partition's RocksDB store (``task.py``, ``state.py``: the same panes, loaded at restore and kept
equal at every commit), so nothing is read from disk. For each entity the value at B is computed as
step 3 does (:meth:`PartitionTask.values`, :func:`to_vectors` through the dictionary) and compared
with the stored row (one ``MGET`` per view and step):

- **ok**: the same payload and version at B (with ``--changed-only``, also at an earlier event time:
  that mode writes a value only when it changes);
- **newer**: the stored event time is after B: never touched (a newer owner is ahead);
- **missing**: no value (or a value of another layout);
- **stale**: a different payload or version at or before B, or (refreshing every boundary) an
  older event time with the same payload.

Missing and stale rows go through the SAME fenced write as the commit protocol
(:meth:`OnlineStore.write_batch` with the task's fence, ``write.lua``): a value whose event time
turned newer in between is kept (status stale, not counted as repaired), and a fence that a newer
epoch holds refuses the whole write (:class:`FencedError`: the task lost its partition; the runner
stops the worker as after a fenced publish). Entity ids are passed as they are: the store's keys
and the task's state hold any bytes (``keycodec.py``, ``store.keys``).

**Pacing.** A pass starts every ``interval_s`` (``nearline.repair.interval_s`` in headwater.yaml,
default 120 s, 0: off). It snapshots the entity ids of each (task, view) and walks them in steps of
at most ``max_keys`` keys (``nearline.repair.max_keys``, default 2,000), one step between two polls
of the worker's loop: a step is one read and at most one write per view touched, so a pass never
holds the worker longer than a step however large the state, and a pass over every owned key ends
within the interval unless the state holds more than ``max_keys`` x the loop's iterations per
interval. A task revoked during the pass is skipped; one assigned during it waits for the next pass.

**Not repaired here.** An entity whose state emptied: its last write was the empty value at the
boundary it emptied at and nothing is left to compute it from (a lost empty value reads as missing,
which serving treats as empty). The realtime tier (Flink) has no repair pass.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from headwater.pipelines.freshness.repairs import RepairCounts
from headwater.pipelines.nearline.task import ViewState
from headwater.pipelines.store import ViewLayout
from headwater.pipelines.store.store import ReadResult, WriteResult
from headwater.pipelines.windows import to_vectors
from headwater.pipelines.windows.vector import IdLookup

__all__ = ["OnlineRows", "RepairStore", "RepairTarget", "Repairer", "StepResult", "compare", "repair_rows"]


class OnlineRows(Protocol):
    """The online store calls a pass makes (:class:`headwater.pipelines.store.OnlineStore` has them)."""

    def read_batch(self, layout: ViewLayout, entity_ids: Sequence[str]) -> ReadResult:
        """Read the rows of ``entity_ids`` in one round trip."""
        ...

    def write_batch(
        self,
        layout: ViewLayout,
        entity_ids: Sequence[str],
        values: npt.ArrayLike,
        event_time_ms: npt.ArrayLike,
        write_time_ms: int | None = None,
        fence: tuple[str, int] | None = None,
    ) -> WriteResult:
        """Write rows, keeping newer event times, refused under a newer fence epoch."""
        ...


class RepairTarget(Protocol):
    """What a pass reads of a task (:class:`headwater.pipelines.nearline.task.PartitionTask` has it)."""

    views: dict[str, ViewState]
    refresh_all: bool

    def values(self, view: str, entities: Sequence[str], as_of_ms: int) -> list[list[Any]]:
        """Return the values of ``entities`` in ``view`` as of ``as_of_ms``."""
        ...


@dataclass(frozen=True)
class RepairStore:
    """Where a pass reads and writes: the store, each view's layout, the dictionary, each task's fence.

    ``fence(task key, view)`` returns the (owner, epoch) the commit protocol writes that view with.
    """

    store: OnlineRows
    layouts: Mapping[str, ViewLayout]
    ids: IdLookup
    fence: Callable[[Hashable, str], tuple[str, int]]


@dataclass(frozen=True)
class StepResult:
    """What one step checked (view -> counts) and, when it ended a pass, that pass's totals."""

    counts: dict[str, RepairCounts]
    finished: dict[str, RepairCounts] | None = None
    pass_s: float = 0.0
    """Seconds from the pass's start to its end (when ``finished``)."""


@dataclass
class _Walk:
    """One (task, view) of a pass: its entity ids when the pass started, and how far it got."""

    task: Hashable
    view: str
    entities: list[str]
    pos: int = 0


@dataclass
class Repairer:
    """Starts a pass every ``interval_s`` (0: never) and walks it ``max_keys`` keys per :meth:`step`."""

    interval_s: float
    max_keys: int
    clock: Callable[[], float] = time.monotonic
    walks: deque[_Walk] = field(default_factory=deque)
    totals: dict[str, RepairCounts] = field(default_factory=dict)
    started_at: float = 0.0
    next_at: float | None = None

    def __post_init__(self) -> None:
        if self.max_keys < 1:
            msg = f"nearline repair: max_keys must be >= 1; got {self.max_keys}"
            raise ValueError(msg)
        if self.next_at is None:  # the first pass one interval after the worker started
            self.next_at = self.clock() + self.interval_s

    @property
    def running(self) -> bool:
        """Whether a pass is under way."""
        return bool(self.walks)

    def start(self, tasks: Mapping[Any, RepairTarget]) -> None:
        """Start a pass over every (task, view) of ``tasks`` now (the next one is an interval later)."""
        now = self.clock()
        self.walks = deque(
            _Walk(key, name, list(vs.entities))
            for key, task in tasks.items()
            for name, vs in task.views.items()
        )
        self.totals = {}
        self.started_at = now
        self.next_at = now + self.interval_s

    def step(self, tasks: Mapping[Any, RepairTarget], online: RepairStore) -> StepResult | None:
        """Check (and repair) up to ``max_keys`` keys of the pass under way, starting one when due.

        Returns None when no pass is under way nor due.

        Raises:
            FencedError: a newer epoch holds a task's fence (nothing of that write was written).
            StoreError: the store could not be read or written; the keys of that (task, view) chunk
                are checked again at the next step.
        """
        if not self.walks:
            if self.interval_s <= 0 or self.next_at is None or self.clock() < self.next_at:
                return None
            self.start(tasks)
        budget = self.max_keys
        counts: dict[str, RepairCounts] = {}
        while self.walks and budget > 0:
            walk = self.walks[0]
            task = tasks.get(walk.task)
            if task is None or walk.view not in task.views:  # revoked (or the view left) meanwhile
                self.walks.popleft()
                continue
            chunk = walk.entities[walk.pos : walk.pos + budget]
            found = repair_rows(task, walk.view, chunk, online, online.fence(walk.task, walk.view))
            walk.pos += len(chunk)  # only once the chunk was checked: a failure retries it
            budget -= len(chunk)
            if walk.pos >= len(walk.entities):
                self.walks.popleft()
            counts[walk.view] = counts.get(walk.view, RepairCounts()) + found
        for view, c in counts.items():
            self.totals[view] = self.totals.get(view, RepairCounts()) + c
        if self.walks:
            return StepResult(counts)
        finished, self.totals = self.totals, {}
        return StepResult(counts, finished, self.clock() - self.started_at)


def repair_rows(
    task: RepairTarget,
    view: str,
    entities: Sequence[str],
    online: RepairStore,
    fence: tuple[str, int],
) -> RepairCounts:
    """Compare the live ones of ``entities`` with the store at the view's boundary; rewrite what differs.

    Raises:
        FencedError: ``fence`` is older than the fence in Redis; nothing was written.
    """
    vs = task.views[view]
    boundary = vs.t_pub
    if boundary <= 0:  # nothing published yet (the commit protocol writes nothing either)
        return RepairCounts()
    live = [e for e in entities if _is_live(vs, e, boundary)]
    if not live:
        return RepairCounts()
    layout = online.layouts[view]
    got = online.store.read_batch(layout, live)
    want = to_vectors(vs.spec, task.values(view, live, boundary), online.ids)
    missing, stale = compare(got, want, boundary, task.refresh_all)
    fix = missing | stale
    repaired = 0
    if fix.any():
        rows = [e for e, bad in zip(live, fix.tolist(), strict=True) if bad]
        res = online.store.write_batch(layout, rows, want[fix], boundary, fence=fence)
        repaired = res.written
    return RepairCounts(len(live), int(missing.sum()), int(stale.sum()), repaired)


def compare(
    got: ReadResult, want: npt.NDArray[np.float32], boundary: int, refresh_all: bool
) -> tuple[npt.NDArray[np.bool_], npt.NDArray[np.bool_]]:
    """Return (missing, stale) per row of ``got`` against the state's rows ``want`` at ``boundary``.

    A stored event time after ``boundary`` is neither (a newer value is never rewritten); see the
    module docstring for the rules.
    """
    found = got.found
    et = got.event_time_ms
    newer = found & (et > boundary)
    same = np.all((got.values == want) | (np.isnan(got.values) & np.isnan(want)), axis=1)
    version = got.layout.version
    other = np.array([v is not None and v != version for v in got.versions], dtype=bool)
    older = (et < boundary) if refresh_all else np.zeros(len(et), dtype=bool)
    stale = found & ~newer & (~same | other | older)
    return ~found, stale


def _is_live(vs: ViewState, entity: str, boundary: int) -> bool:
    """Whether ``entity`` has a pane before ``boundary`` (its value there is what was written)."""
    panes = vs.entities.get(entity)
    return panes is not None and any(start < boundary for start in panes)
