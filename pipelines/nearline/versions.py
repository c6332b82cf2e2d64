"""Which stored window state a partition keeps when the plan changed: state per view version.

The meta record of a partition's store says which version of each view its state was built from
(``versions``, :func:`headwater.registry.plans.view_version`: only what defines the view's values)
and which join keys its events were forwarded by (``forward``, stage A). On restore, per view:

- **kept**: the stored version is the plan's (an edit of a description, owner, cost or SLA, or of
  another view): its panes, boundary and outbox are loaded as they are;
- **dropped**: a view of another version, a view removed from the plan, or any view of a store
  written before versions existed: its pane records are deleted (with changelog tombstones, so a
  restore from the changelog agrees);
- **to backfill**: a view of the plan without state of its version while the partition already has
  a committed offset (new, changed, or unversioned): the worker replays the partition's retained
  history into that view alone before it reads on (``backfill.py``). On a partition without a
  committed offset every view starts with the stream: nothing to backfill.

A removed view's online keys are not deleted: they expire by their TTL (twice the view's longest
window, ``view_layout``), and the worker logs that. Deleting them would need a scan of the whole
namespace per partition; nothing reads a view that is not in the plan.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from headwater.pipelines.nearline.state import Loaded, pane_key


@dataclass
class Restored:
    """What a partition's restore kept, dropped and left to backfill."""

    kept: list[str] = field(default_factory=list)
    """Views whose stored state is of the plan's version (loaded as it is)."""
    dropped: dict[str, str] = field(default_factory=dict)
    """View -> why its stored state was deleted."""
    backfill: list[str] = field(default_factory=list)
    """Views of the plan to replay the partition's history into before the partition reads on."""
    reforward: list[str] = field(default_factory=list)
    """Join keys (stage A) whose events were never forwarded: the history is forwarded again."""
    changes: dict[bytes, bytes | None] = field(default_factory=dict)
    """Store changes of the drop (None: delete), committed with the meta record."""
    unversioned: bool = False
    """The store was written before view versions (its meta record has no ``versions``)."""

    @property
    def changed(self) -> bool:
        """Whether the restore changed what the store holds (a commit is due before reading on)."""
        return bool(self.dropped or self.backfill or self.reforward or self.unversioned)


def sort_state(
    meta: Mapping[str, Any], loaded: Loaded, plan: Mapping[str, str], forward_keys: set[str]
) -> Restored:
    """Sort the stored state by the plan's view versions (``plan``: view -> version).

    ``forward_keys``: the join keys the partition forwards events by now (empty in stage B).
    """
    out = Restored()
    stored: Mapping[str, str] | None = meta.get("versions")
    has_offset = meta.get("offset") is not None
    out.unversioned = has_offset and stored is None
    for name, version in plan.items():
        if not has_offset or (stored is not None and stored.get(name) == version):
            out.kept.append(name)
            continue
        out.backfill.append(name)
        if stored is None:
            out.dropped[name] = "state written before view versions"
        elif name in stored:
            out.dropped[name] = f"version {stored[name]} -> {version}"
    for name in sorted({*loaded.panes, *(stored or {})} - set(plan)):
        out.dropped[name] = "removed from the plan"
    for name in out.dropped:
        for entity, pane, _ in loaded.panes.get(name, []):
            out.changes[pane_key(name, entity, pane)] = None
    if has_offset:
        before = meta.get("forward")
        out.reforward = sorted(forward_keys if before is None else forward_keys - set(before))
    return out


def short_history(stats_root: Path, view: str) -> int | None:
    """Return the boundary (epoch ms) from which ``view``'s windows are full, or None when they are.

    Read from the workers' stats files under ``stats_root`` (``<state>/nearline``, every group):
    a view backfilled from a Kafka retention shorter than its longest window is listed there, per
    partition, until its published boundary reaches that point. The latest partition decides.
    """
    latest: int | None = None
    for path in sorted(stats_root.glob("*/stats-*.json")):
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):  # a worker rewriting its file right now: the next call reads it
            continue
        for task in doc.get("tasks", []) if isinstance(doc, dict) else []:
            boundary = (task.get("short_history") or {}).get(view) if isinstance(task, dict) else None
            if isinstance(boundary, int) and (latest is None or boundary > latest):
                latest = boundary
    return latest
