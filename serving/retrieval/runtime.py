"""Everything the funnel's retrieval stage holds, loaded in one call and refreshed in the background.

:func:`load_retrieval` loads the two-tower artifact, binds it to the applied registry (the same
slot check as the ranker's, :func:`headwater.serving.artifact.check_binding`: same slots in any
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

from redis.exceptions import RedisError

from headwater.pipelines.store import OnlineStore, StoreError
from headwater.serving.artifact import check_binding
from headwater.serving.item_mirror import ItemMirror
from headwater.serving.registry import BoundRegistry
from headwater.serving.retrieval.artifact import TowerArtifact, load_towers
from headwater.serving.retrieval.index import ItemIndex
from headwater.serving.retrieval.refresh import IndexRefresher, RefreshReport, StoreItemSource
from headwater.serving.retrieval.retriever import TwoTowerRetriever
from headwater.serving.store import now_ms

log = logging.getLogger(__name__)
BUILD_ATTEMPTS = 3
"""Tries of the first refresh at start-up; a retry re-reads only what the failed one had not embedded."""


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
                self.refresh_if_changed(every, look_log)

        self._thread = threading.Thread(target=loop, name="headwater-retrieval-refresh", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop the refresh thread (a refresh in progress finishes first)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None


def load_retrieval(
    model_path: Path,
    registry: BoundRegistry,
    store: OnlineStore,
    batch: int = 2000,
    threads: int = 0,
    mirror_sla_share: float | None = None,
) -> RetrievalRuntime:
    """Load the two-tower artifact (file or models folder), bind it, build its index from ``store``.

    ``mirror_sla_share``: also keep the item views' rows in memory for the ranker, each view served
    from there while the mirror's age is within this share of its freshness SLA (None: no mirror;
    :mod:`headwater.serving.item_mirror`).

    Raises:
        ArtifactError: no artifact, a modified one, or one trained on other slots than the registry's.
    """
    artifact = load_towers(model_path)
    binding = check_binding(artifact.metadata, registry)
    if binding.warning:
        log.warning("%s", binding.warning)
    model = artifact.model
    index = ItemIndex(model.embed_dim, threads=threads)
    mirror = None if mirror_sla_share is None else ItemMirror(registry.item, mirror_sla_share)
    source = StoreItemSource(store, registry.item, batch)
    refresher = IndexRefresher(source, model, index, artifact.version, binding.item_columns, mirror)
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
        "retrieval index %s: %d items embedded in %.1f s", refresher.version, first.catalog, first.seconds
    )
    retriever = TwoTowerRetriever(model, index, binding.user_columns)
    return RetrievalRuntime(artifact, index, refresher, retriever, first)
