"""Everything the funnel's retrieval stage holds, loaded in one call and refreshed in the background.

:func:`load_retrieval` loads the two-tower artifact, binds it to the applied registry (the same
slot check as the ranker's, :func:`headwater.ranking.artifact.check_binding`: same slots in any
order, another order mapped), builds the item index from the online store (the first refresh)
and returns a :class:`RetrievalRuntime`; :meth:`RetrievalRuntime.start` looks every ``interval_s``
seconds on a daemon thread until :meth:`RetrievalRuntime.stop`, and refreshes when an item view
wrote a row since the last refresh (its freshness log moved, :meth:`IndexRefresher.changed`) or
``full_scan_s`` passed (expired keys write nothing; only a scan finds them gone). A refresh that
fails (the store is down) is logged and counted and the index keeps serving what it holds.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from redis.exceptions import RedisError

from headwater.pipelines.store import OnlineStore, StoreError
from headwater.ranking.artifact import check_binding
from headwater.ranking.features import BoundRegistry
from headwater.ranking.tower_artifact import TowerArtifact, load_towers
from headwater.serving.item_mirror import ItemMirror
from headwater.serving.retrieval.index import ItemIndex
from headwater.serving.retrieval.refresh import IndexRefresher, RefreshReport, StoreItemSource
from headwater.serving.retrieval.retriever import TwoTowerRetriever
from headwater.serving.retrieval.snapshot import (
    NoSnapshot,
    SnapshotError,
    SnapshotInfo,
    load_snapshot,
    save_snapshot,
    snapshot_key,
)
from headwater.serving.store import now_ms

log = logging.getLogger(__name__)
BUILD_ATTEMPTS = 3
"""Tries of the first refresh at start-up; a retry re-reads only what the failed one had not embedded."""


@dataclass
class SnapshotPlan:
    """Where the index is saved, what with, and how often (serving/retrieval/snapshot.py)."""

    folder: Path
    key: dict[str, Any]
    every_s: float
    """At most this often while the index changes (and at stop)."""
    restored: SnapshotInfo | None = None
    """The snapshot the index started from (None: built from the store)."""
    saved: SnapshotInfo | None = None
    """The last snapshot saved by this process."""
    failures: int = 0


@dataclass
class RetrievalRuntime:
    """The loaded model, its index, the refresher and the retriever; an optional refresh thread."""

    artifact: TowerArtifact
    index: ItemIndex
    refresher: IndexRefresher
    retriever: TwoTowerRetriever
    last: RefreshReport
    failures: int = 0
    skipped: int = 0
    """Looks that found no item view written since the last refresh (no scan)."""
    snapshot: SnapshotPlan | None = None
    _changes: int = field(default=0, repr=False)
    """Items added, updated or removed (and mirror changes) since the last snapshot."""
    _saved_mono: float = field(default=float("-inf"), repr=False)
    _mirror_version: int = field(default=-1, repr=False)
    _scanned_at: float = field(default_factory=time.monotonic, repr=False)
    _stop: threading.Event = field(default_factory=threading.Event, repr=False)
    _thread: threading.Thread | None = field(default=None, repr=False)

    @property
    def version(self) -> str:
        """The index version: ``<two-tower model version>.<refresh number>``."""
        return self.refresher.version

    @property
    def mirror(self) -> ItemMirror | None:
        """The item views' rows in memory, kept in step by the refresher (None: not kept)."""
        return self.refresher.mirror

    def refresh_if_changed(self, full_scan_s: float, look_log: bool = True) -> RefreshReport | None:
        """Refresh when an item view wrote a row since the last refresh or ``full_scan_s`` passed.

        Between full scans, a source with a change feed refreshes only the items it names
        (:meth:`IndexRefresher.refresh_fed`); without one, or when it cannot say, a write found in
        the freshness log makes a full refresh. Returns the report, or None when skipped (nothing
        written) or failed (logged, counted). ``look_log`` False: only the feed is read (a look
        between the freshness-log looks); when it cannot say, nothing happens until the next one.
        """
        if time.monotonic() - self._scanned_at < full_scan_s:
            try:  # the change feed first: only the items it names, no scan (None: it cannot say)
                fed = self.refresher.refresh_fed()
                if fed is not None:
                    if fed.added or fed.updated or fed.removed or fed.unchanged:
                        self.last = fed
                        return fed
                    self.skipped += 1
                    return None
            except (StoreError, RedisError, OSError) as exc:
                log.debug("change-feed refresh failed (%s); checking the freshness log", exc)
            if not look_log:
                return None
            try:
                began_ms = now_ms()
                if not self.refresher.changed():
                    self.skipped += 1
                    if self.refresher.mirror is not None:  # nothing written since: still in step
                        self.refresher.mirror.confirm(began_ms)
                    return None
            except (StoreError, RedisError, OSError) as exc:
                log.debug("freshness-log check failed (%s); refreshing", exc)
        return self.refresh_once()

    def save_snapshot(self, force: bool = False) -> SnapshotInfo | None:
        """Save a snapshot when the index changed since the last one and ``every_s`` passed (or ``force``).

        Call it from the refresh thread, or once it stopped (the index's only writer). A failure
        (the disk is full) is logged and counted; serving goes on. Returns what was saved, or None.
        """
        plan = self.snapshot
        if plan is None:
            return None
        mirror_version = self.mirror.version if self.mirror is not None else 0
        changed = self._changes > 0 or mirror_version != self._mirror_version
        if not changed or (not force and time.monotonic() - self._saved_mono < plan.every_s):
            return None
        try:
            plan.saved = save_snapshot(plan.folder, plan.key, self.index, self.refresher)
        except Exception as exc:  # the disk, memory, usearch: a snapshot never stops the refreshes
            plan.failures += 1
            log.warning(
                "retrieval index snapshot not saved to %s (%s: %s); serving goes on",
                plan.folder, type(exc).__name__, exc,
            )  # fmt: skip
            return None
        self._changes, self._mirror_version, self._saved_mono = 0, mirror_version, time.monotonic()
        log.info(
            "retrieval index %s saved to %s: %d items, %.0f MB in %.1f s", plan.saved.version, plan.folder,
            plan.saved.items, plan.saved.bytes / 1e6, plan.saved.seconds,
        )  # fmt: skip
        return plan.saved

    def note_saved(self, mirror_version: int) -> None:
        """Record that the snapshot on disk holds the index as it was at mirror version ``mirror_version``."""
        self._changes = 0
        self._mirror_version = mirror_version
        self._saved_mono = time.monotonic()

    def count(self, report: RefreshReport | None) -> RefreshReport | None:
        """Add a refresh's changes to those the next snapshot saves; returns ``report``."""
        if report is not None:
            self._changes += report.added + report.updated + report.removed
        return report

    def refresh_once(self) -> RefreshReport | None:
        """Refresh now; on a store failure log it, count it and keep the index as it is."""
        try:
            self._scanned_at = time.monotonic()
            self.last = self.refresher.refresh()
        except (StoreError, RedisError, OSError) as exc:  # the scan and header reads use redis-py directly
            self.failures += 1
            log.warning(
                "retrieval index refresh failed (%s: %s); serving index %s as it is",
                type(exc).__name__,
                exc,
                self.version,
            )
            return None
        return self.last

    def start(self, interval_s: float, full_scan_s: float | None = None, feed_s: float | None = None) -> None:
        """Every ``interval_s`` seconds on a daemon thread, :meth:`refresh_if_changed` (idempotent).

        ``full_scan_s`` (default ``interval_s``: a scan every time) bounds how long an expired item
        stays in the index; ``feed_s``: read the change feeds this often in between (None: not).
        """
        if self._thread is not None:
            return
        self._stop.clear()
        every = interval_s if full_scan_s is None else max(full_scan_s, interval_s)
        tick = interval_s if feed_s is None else min(feed_s, interval_s)

        def loop() -> None:
            looked = time.monotonic()
            while not self._stop.wait(tick):
                look_log = time.monotonic() - looked >= interval_s - 1e-3
                if look_log:
                    looked = time.monotonic()
                self.count(self.refresh_if_changed(every, look_log))
                self.save_snapshot()

        self._thread = threading.Thread(target=loop, name="headwater-retrieval-refresh", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop the refresh thread (a refresh in progress finishes first), then save a snapshot if due."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive():  # still refreshing: no snapshot of a half-applied batch
                log.warning(
                    "retrieval index refresh still running after %.0f s; no snapshot at stop", timeout_s
                )
                return
            self._thread = None
        self.save_snapshot(force=True)


def load_retrieval(
    model_path: Path,
    registry: BoundRegistry,
    store: OnlineStore,
    batch: int = 2000,
    threads: int = 0,
    mirror_sla_share: float | None = None,
    snapshot_dir: Path | None = None,
    snapshot_every_s: float = 600.0,
) -> RetrievalRuntime:
    """Load the two-tower artifact (file or models folder), bind it, build its index from ``store``.

    ``mirror_sla_share``: also keep the item views' rows in memory for the ranker, each view served
    from there while the mirror's age is within this share of its freshness SLA (None: no mirror;
    :mod:`headwater.serving.item_mirror`). ``snapshot_dir``: start from the snapshot there when it
    was made the same way (the first refresh then re-embeds only what changed since), and save one
    there at most every ``snapshot_every_s`` while the index changes and at stop
    (:mod:`headwater.serving.retrieval.snapshot`); None: always build from the store, never save.

    Raises:
        ArtifactError: no artifact, a modified one, or one trained on other slots than the registry's.
    """
    artifact = load_towers(model_path)
    binding = check_binding(artifact.metadata, registry)
    if binding.warning:
        log.warning("%s", binding.warning)
    model = artifact.model
    source = StoreItemSource(store, registry.item, batch)

    def empty() -> tuple[ItemIndex, IndexRefresher]:
        index = ItemIndex(model.embed_dim, threads=threads)
        mirror = None if mirror_sla_share is None else ItemMirror(registry.item, mirror_sla_share)
        return index, IndexRefresher(source, model, index, artifact.version, binding.item_columns, mirror)

    index, refresher = empty()
    plan = None
    restored_mirror = 0
    if snapshot_dir is not None:
        key = snapshot_key(
            artifact.version,
            binding.item_columns,
            registry.item,
            store.namespace,
            index,
            mirror_sla_share is not None,
        )
        plan = SnapshotPlan(snapshot_dir, key, snapshot_every_s)
        try:
            plan.restored = load_snapshot(snapshot_dir, key, index, refresher)
            restored_mirror = refresher.mirror.version if refresher.mirror is not None else 0
            log.info(
                "retrieval index %s loaded from %s: %d items in %.1f s (saved %.0f s ago); refreshing",
                plan.restored.version, snapshot_dir, plan.restored.items, plan.restored.seconds,
                (now_ms() - plan.restored.saved_at_ms) / 1000.0,
            )  # fmt: skip
        except NoSnapshot as exc:
            log.info("%s", exc)
        except SnapshotError as exc:
            log.warning("retrieval index snapshot not used: %s", exc)
            index, refresher = empty()  # a failed load may have filled part of them
    first = None
    for attempt in range(1, BUILD_ATTEMPTS + 1):
        try:
            first = refresher.refresh()
            break
        except (StoreError, RedisError, OSError) as exc:  # a slow store under load: go on where it stopped
            if attempt == BUILD_ATTEMPTS:
                raise
            log.warning(
                "retrieval index build, attempt %d of %d, failed (%s: %s); resuming (items embedded stay)",
                attempt, BUILD_ATTEMPTS, type(exc).__name__, exc,
            )  # fmt: skip
    assert first is not None  # the loop breaks with a report or raises
    log.info(
        "retrieval index %s: %d items, %d embedded (%d unchanged, %d removed) in %.1f s", refresher.version,
        first.catalog, first.added + first.updated, first.unchanged, first.removed, first.seconds,
    )  # fmt: skip
    retriever = TwoTowerRetriever(model, index, binding.user_columns)
    runtime = RetrievalRuntime(artifact, index, refresher, retriever, first, snapshot=plan)
    if plan is not None and plan.restored is not None:
        runtime.note_saved(restored_mirror)  # what was loaded is on disk already
    runtime.count(first)  # a build, or the changes since the snapshot: saved at the thread's first look
    return runtime
