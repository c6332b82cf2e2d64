"""``headwater apply``: push a checked repo to Feast and write the tier plans and the snapshot.

Steps (in this order, so a failure leaves the previous apply intact for the pipelines):
    1. Refuse when ``check`` found errors, or when a source would drop a schema version that the
       applied plan lists (events written with it may still be in the topic).
    2. Hash the checked definitions (the registry hash stamped everywhere).
    3. Apply entities, sources and views to the Feast registry (deleting views no longer defined).
    4. Write one plan per tier, each atomically (temp file + rename).
    5. Write the snapshot that ``headwater plan`` diffs against, last.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from headwater.registry.compiled import CheckResult
from headwater.registry.errors import HeadwaterError
from headwater.registry.feast_compile import apply_to_feast
from headwater.registry.plan import SNAPSHOT_FILE, snapshot
from headwater.registry.plans import PlanSource, build_plans, plan_path, registry_hash


class ApplyError(HeadwaterError, RuntimeError):
    """``apply`` was asked to apply a repo that does not pass ``check``."""


@dataclass
class ApplyOutcome:
    """What ``apply`` wrote."""

    registry_hash: str
    state_dir: Path
    plan_paths: dict[str, Path] = field(default_factory=dict)
    deleted_views: list[str] = field(default_factory=list)
    views: int = 0


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temp file and a rename (readers never see half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def dropped_schema_versions(state_dir: Path, sources: list[PlanSource]) -> list[str]:
    """List the schema versions of the applied plan that ``sources`` no longer list, as sentences."""
    applied = plan_path(state_dir, "offline")
    if not applied.is_file():
        return []
    try:
        old = json.loads(applied.read_text(encoding="utf-8")).get("sources", [])
    except (OSError, ValueError):
        return []
    new = {s.name: {v.fingerprint for v in s.schemas} for s in sources}
    out = []
    for src in old:
        kept = new.get(src.get("name"))
        if kept is None:  # a removed source: its events are no longer read
            continue
        for version in src.get("schemas", []):
            if version.get("fingerprint") not in kept:
                out.append(f"source {src['name']!r} would drop schema version {version.get('fingerprint')}")
    return out


def apply_repo(
    result: CheckResult,
    state_dir: Path,
    kafka_bootstrap: str,
    online_store: Mapping[str, object] | None = None,
) -> ApplyOutcome:
    """Apply a checked repo (see the module docstring for the steps).

    ``online_store`` is the Feast repo's ``online_store:`` block; without one, Feast is skipped
    (the tier plans and the snapshot are written all the same).

    Raises:
        ApplyError: when ``result`` has errors.
    """
    # Step 1
    if not result.ok:
        msg = f"{len(result.diagnostics.errors)} error(s) found by check; fix them before apply"
        raise ApplyError(msg)
    dropped = dropped_schema_versions(state_dir, build_plans(result, "")["offline"].sources)
    if dropped:
        msg = "; ".join(dropped) + (
            ": keep each old .avsc file and list it under the source's `previous_schemas` in sources.yaml"
        )
        raise ApplyError(msg)
    # Step 2
    reg_hash = registry_hash(result)
    outcome = ApplyOutcome(registry_hash=reg_hash, state_dir=state_dir, views=len(result.views))
    # Step 3
    if online_store is not None:
        outcome.deleted_views = apply_to_feast(result, state_dir, online_store, kafka_bootstrap, reg_hash)
    # Step 4
    for tier, plan in build_plans(result, reg_hash).items():
        path = plan_path(state_dir, tier)
        write_atomic(path, plan.model_dump_json(indent=2) + "\n")
        outcome.plan_paths[tier] = path
    # Step 5
    write_atomic(state_dir / SNAPSHOT_FILE, json.dumps(snapshot(result, reg_hash), indent=2) + "\n")
    return outcome
