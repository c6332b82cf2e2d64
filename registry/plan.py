"""``headwater plan``: what ``apply`` would change, against the snapshot of the last apply.

``apply`` writes ``<state>/applied.json`` (the plan form of every view, and the registry hash);
``plan`` compares the checked repo with it: views added, removed, changed (a new view version:
its state restarts) and metadata-only (same version: description, owner, cost, SLA or tags edited,
state and online values kept), with the fields and features that changed and the cost and SLA
deltas.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from headwater.registry.compiled import CheckResult
from headwater.registry.config import state_dir
from headwater.registry.durations import format_seconds
from headwater.registry.plans import plan_sources, plan_views

SNAPSHOT_FILE = "applied.json"
SNAPSHOT_VERSION = 1
_COMPARED = ("tier", "entity", "source", "owner", "description", "tags", "compute_cost")


def default_state_dir(repo: Path | None = None) -> Path:
    """Return the state folder as every command resolves it (:func:`headwater.registry.config.state_dir`).

    ``$HEADWATER_STATE_DIR``, else ``state_dir`` of the repo's headwater.yaml, else ``.headwater/``
    in the current folder. ``repo`` (the features folder) no longer decides it; the parameter stays
    for the callers that still pass one.
    """
    del repo
    return state_dir()


@dataclass
class ViewChange:
    """One view in the plan, with its cost and SLA before and after.

    ``kind`` is ``added``, ``removed``, ``changed`` (its version changes: the tiers restart its
    state) or ``metadata`` (same version: nothing is recomputed).
    """

    name: str
    kind: str
    tier: str
    version_before: str | None = None
    version_after: str | None = None
    changes: list[str] = field(default_factory=list)
    cost_before: float = 0.0
    cost_after: float = 0.0
    sla_before: float | None = None
    sla_after: float | None = None
    backfill: str | None = None
    """How a new or changed view gets full windows before it serves (None: nothing to backfill)."""

    @property
    def cost_delta(self) -> float:
        """Charged CPU-h/day after minus before."""
        return self.cost_after - self.cost_before

    def to_json(self) -> dict[str, Any]:
        """JSON-ready form (``headwater plan --format json``)."""
        return {**self.__dict__, "cost_delta": round(self.cost_delta, 4)}


def snapshot(result: CheckResult, reg_hash: str) -> dict[str, Any]:
    """Build the snapshot ``apply`` stores: every view's plan form, and each source's schema versions."""
    return {
        "schema_version": SNAPSHOT_VERSION,
        "registry_hash": reg_hash,
        "applied_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "views": {v.name: v.model_dump() for v in plan_views(result)},
        "sources": source_summaries(result),
    }


def source_summaries(result: CheckResult) -> dict[str, dict[str, Any]]:
    """Return what ``plan`` compares of each source: its topic and its schema fingerprints, oldest first."""
    return {
        s.name: {"topic": s.topic, "schemas": [sch.fingerprint for sch in s.schemas]}
        for s in plan_sources(result)
    }


def diff_sources(old: dict[str, dict[str, Any]], new: dict[str, dict[str, Any]]) -> list[str]:
    """Say which sources were added, removed, re-pointed or given a new schema version."""
    out = []
    for name in sorted(set(old) | set(new)):
        before, after = old.get(name), new.get(name)
        if before is None:
            out.append(f"+ source {name} (topic {after['topic']})" if after else "")
        elif after is None:
            out.append(f"- source {name} (topic {before['topic']})")
        else:
            if before["topic"] != after["topic"]:
                out.append(f"~ source {name}: topic {before['topic']} -> {after['topic']}")
            if before["schemas"] != after["schemas"]:
                added = [f for f in after["schemas"] if f not in before["schemas"]]
                dropped = [f for f in before["schemas"] if f not in after["schemas"]]
                what = ", ".join([*(f"+ schema {f}" for f in added), *(f"- schema {f}" for f in dropped)])
                out.append(
                    f"~ source {name}: {what or 'schema order changed'}; the views that read only"
                    " unchanged fields keep their versions"
                )
    return [line for line in out if line]


def read_snapshot(state_dir: Path) -> dict[str, Any] | None:
    """Read the last applied snapshot, or None when nothing was applied yet."""
    path = state_dir / SNAPSHOT_FILE
    if not path.is_file():
        return None
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return data


def _charged(view: dict[str, Any]) -> float:
    return max(float(view["compute_cost"]), float(view["estimated_cost"]))


def diff_views(old: dict[str, dict[str, Any]], new: dict[str, dict[str, Any]]) -> list[ViewChange]:
    """List the views added, removed and changed from ``old`` to ``new`` (plan-form dicts by name)."""
    out = []
    for name in sorted(set(old) | set(new)):
        before, after = old.get(name), new.get(name)
        if before is None and after is not None:
            out.append(
                ViewChange(
                    name,
                    "added",
                    after["tier"],
                    version_after=after["version"],
                    cost_after=_charged(after),
                    sla_after=after["freshness_sla_s"],
                    backfill=backfill_plan(after),
                )
            )
        elif after is None and before is not None:
            out.append(
                ViewChange(
                    name,
                    "removed",
                    before["tier"],
                    version_before=before.get("version"),
                    cost_before=_charged(before),
                    sla_before=before["freshness_sla_s"],
                )
            )
        elif before is not None and after is not None:
            changes = _view_changes(before, after)
            if changes:
                restarts = before.get("version") != after["version"]
                out.append(
                    ViewChange(
                        name,
                        "changed" if restarts else "metadata",
                        after["tier"],
                        before.get("version"),
                        after["version"],
                        changes,
                        _charged(before),
                        _charged(after),
                        before["freshness_sla_s"],
                        after["freshness_sla_s"],
                        backfill_plan(after) if restarts else None,
                    )
                )
    return out


def backfill_plan(view: dict[str, Any]) -> str:
    """Say how a new (or new version of a) view gets full windows before it serves."""
    longest = max((float(f["window_s"]) for f in view["features"]), default=0.0)
    span = format_seconds(longest)
    source = view["source"]
    if view["tier"] == "offline":
        return f"computed from bronze/{source} by the next `run offline` (each day's {span} window)"
    if view["tier"] == "nearline":
        return (
            f"replayed from the retained Kafka history of source {source} over its longest window ({span})"
            " plus the allowed lateness when `run nearline` restarts, then continued live; served"
            " after the replay"
        )
    return (
        f"replayed by the realtime job itself when `run realtime` restarts from its checkpoint: the"
        f" source {source} is read again from its longest window ({span}) plus the lateness margins"
        " before the checkpoint's Kafka offsets into this view only, then continued live from those"
        " offsets (the other views keep their state); full windows at once"
    )


def _view_changes(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    changes = [
        f"{key}: {_show(before[key])} -> {_show(after[key])}"
        for key in _COMPARED
        if before[key] != after[key]
    ]
    if before.get("late", "drop") != after.get("late", "drop"):  # snapshots before ``late`` lack it
        changes.append(f"late: {before.get('late', 'drop')} -> {after.get('late', 'drop')}")
    if before["freshness_sla_s"] != after["freshness_sla_s"]:
        changes.append(f"freshness_sla: {before['freshness_sla']} -> {after['freshness_sla']}")
    old_f = {f["name"]: f for f in before["features"]}
    new_f = {f["name"]: f for f in after["features"]}
    changes += [f"+ feature {n}" for n in sorted(set(new_f) - set(old_f))]
    changes += [f"- feature {n}" for n in sorted(set(old_f) - set(new_f))]
    for name in sorted(set(old_f) & set(new_f)):
        fields = [k for k in new_f[name] if k != "window" and old_f[name].get(k) != new_f[name][k]]
        if fields:
            what = ", ".join(_feature_field_change(k, old_f[name].get(k), new_f[name][k]) for k in fields)
            changes.append(f"~ feature {name}: {what}")
    return changes


def _show(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else repr(value)


def _feature_field_change(key: str, before: Any, after: Any) -> str:
    if key in ("window_s", "slide_s"):
        return f"{key[:-2]} {format_seconds(before)} -> {format_seconds(after)}"
    if isinstance(before, dict) or isinstance(after, dict):
        return f"{key} {(before or {}).get('text')!r} -> {(after or {}).get('text')!r}"
    return f"{key} {before!r} -> {after!r}"


def format_plan(
    changes: list[ViewChange], applied_hash: str | None, new_hash: str, sources: list[str] | None = None
) -> str:
    """Render the text shown by ``headwater plan`` (``sources``: :func:`diff_sources` lines)."""
    head = f"Plan: registry {applied_hash or '(nothing applied yet)'} -> {new_hash}"
    lines = [head, *(f"  {line}" for line in sources or ())]
    if not changes:
        if applied_hash == new_hash:
            return head + "\nNo changes: the applied registry matches the repo."
        lines.append("No view changes: every view keeps its version, its state and its online values.")
        return "\n".join(lines)
    marks = {"added": "+", "removed": "-", "changed": "!", "metadata": "~"}
    for c in changes:
        sla = _sla_text(c)
        lines.append(
            f"  {marks[c.kind]} {c.name} [{c.tier}] cost {c.cost_before:.2f} -> {c.cost_after:.2f} "
            f"({c.cost_delta:+.2f} CPU-h/day){sla}"
        )
        lines.append(f"      {_consequence(c)}")
        if c.backfill:
            lines.append(f"      backfill: {c.backfill}")
        lines.extend(f"      {line}" for line in c.changes)
    counts = {k: sum(1 for c in changes if c.kind == k) for k in marks}
    total = sum(c.cost_delta for c in changes)
    lines.append(
        f"{counts['added']} to add, {counts['changed']} to change (state restarts), "
        f"{counts['metadata']} metadata only, {counts['removed']} to remove; "
        f"charged cost {total:+.2f} CPU-h/day."
    )
    return "\n".join(lines)


def _consequence(c: ViewChange) -> str:
    """Say what applying the change does to the view's state and online values."""
    if c.kind == "metadata":
        return f"metadata only: version {c.version_after} kept, state and online values kept"
    if c.kind == "removed":
        return f"removed: version {c.version_before}'s state is dropped; its online keys expire"
    fresh = "new" if c.kind == "added" else f"{c.version_before} -> {c.version_after}, restarts"
    return f"version {fresh}: its state starts anew; the other views keep theirs"


def _sla_text(c: ViewChange) -> str:
    if c.sla_before == c.sla_after or c.sla_before is None or c.sla_after is None:
        value = c.sla_after if c.sla_after is not None else c.sla_before
        return f", sla {format_seconds(value)}" if value is not None else ""
    return f", sla {format_seconds(c.sla_before)} -> {format_seconds(c.sla_after)}"
