"""``headwater online get``: read what the tiers wrote for some entities, as a person would check it.

Reads the applied plans to find the view's layout (slot names, version), then one round trip to
the store; prints each slot with the value's window boundary, write time and age.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import click

from headwater.cli.errors import HeadwaterGroup
from headwater.cli.options import STATE_HELP, resolved_state_dir
from headwater.pipelines.settings import Settings
from headwater.pipelines.store.layout import ViewLayout
from headwater.pipelines.store.store import OnlineStore, epoch_ms
from headwater.registry.tiers import TIER_NAMES


def applied_layout(state_dir: Path, view: str) -> ViewLayout:
    """Return the store layout of an applied view, from whichever tier plan holds it.

    Raises:
        click.UsageError: no plan was applied, or no plan has the view.
    """
    from headwater.pipelines.windows.spec import compile_view
    from headwater.pipelines.windows.vector import view_layout
    from headwater.registry.plans import read_plan

    known: list[str] = []
    for tier in TIER_NAMES:
        try:
            plan = read_plan(state_dir, tier)
        except FileNotFoundError as err:
            msg = f"no applied plan in {state_dir}: run `headwater apply` first"
            raise click.UsageError(msg) from err
        for candidate in plan.views:
            if candidate.name == view:
                return view_layout(compile_view(candidate))
            known.append(candidate.name)
    msg = f"view {view!r} is not in the applied plans; known views: {', '.join(sorted(known))}"
    raise click.UsageError(msg)


@click.group(cls=HeadwaterGroup)
def online() -> None:
    """Read the online store."""


@online.command("get")
@click.argument("view")
@click.argument("entity_ids", nargs=-1, required=True)
@click.option("--state-dir", type=click.Path(path_type=Path), default=None, callback=resolved_state_dir,
              help=f"Where `headwater apply` wrote the plans {STATE_HELP}.")  # fmt: skip
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
def get_command(view: str, entity_ids: tuple[str, ...], state_dir: Path, fmt: str) -> None:
    """Print the online values of VIEW for ENTITY_IDS (one round trip)."""
    layout = applied_layout(state_dir, view)
    store = OnlineStore.from_url(Settings.from_env().redis_url)
    try:
        result = store.read_batch(layout, list(entity_ids))
    finally:
        store.close()
    ages = result.ages_s(epoch_ms())
    rows: list[dict[str, Any]] = []
    for i, entity in enumerate(entity_ids):
        values = {
            slot: (None if math.isnan(v) else round(float(v), 6))
            for slot, v in zip(layout.features, result.values[i], strict=True)
        }
        rows.append(
            {
                "entity": entity,
                "found": bool(result.found[i]),
                "event_time_ms": int(result.event_time_ms[i]) if result.found[i] else None,
                "age_s": round(float(ages[i]), 3) if result.found[i] else None,
                "values": values if result.found[i] else None,
            }
        )
    if fmt == "json":
        click.echo(json.dumps({"view": view, "rows": rows}, indent=2))
        return
    for row in rows:
        if not row["found"]:
            click.echo(f"{view} / {row['entity']}: no online value")
            continue
        click.echo(f"{view} / {row['entity']}: age {row['age_s']:.1f} s")
        for slot, value in (row["values"] or {}).items():
            click.echo(f"  {slot:<32} {'-' if value is None else value}")
