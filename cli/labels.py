"""``headwater labels``: ranker labels derived from the landed events (see :mod:`.labels`)."""

from __future__ import annotations

import json
from datetime import date
from pathlib import Path

import click

from headwater.cli.errors import HeadwaterCommand
from headwater.cli.offline import LAKE, MASTER, STATE, tier_plan


def day_range(day: str | None, first: str | None, last: str | None) -> tuple[date | None, date | None]:
    """Return the UTC day range of --date or --from/--to (inclusive; None is open)."""
    if day and (first or last):
        msg = "give --date or --from/--to, not both"
        raise click.UsageError(msg)
    try:
        if day:
            return date.fromisoformat(day), date.fromisoformat(day)
        lo = date.fromisoformat(first) if first else None
        hi = date.fromisoformat(last) if last else None
    except ValueError as exc:
        raise click.BadParameter(f"{exc} (dates are YYYY-MM-DD)") from exc
    if lo and hi and hi < lo:
        msg = f"--to {hi} is before --from {lo}; give FROM <= TO"
        raise click.BadParameter(msg)
    return lo, hi


@click.command("labels", cls=HeadwaterCommand)
@click.option("--date", "day", default=None, help="Label the impressions of this UTC day (YYYY-MM-DD).")
@click.option("--from", "first", default=None, help="First UTC day (inclusive; default: the first landed).")
@click.option("--to", "last", default=None, help="Last UTC day (inclusive; default: the last landed).")
@click.option("--horizon", "horizon_s", type=click.IntRange(min=1), default=1_800, show_default=True,
              help="Seconds after an impression within which a click makes it positive.")  # fmt: skip
@click.option(
    "--out", type=click.Path(path_type=Path, dir_okay=False), required=True, help="Parquet file to write."
)
@click.option("--source", "source_name", default=None,
              help="The behaviour source to label (default: the plan's one source with user_id, item_id, "
                   "session_id, event_type and position).")  # fmt: skip
@LAKE
@STATE
@MASTER
def labels(
    day: str | None, first: str | None, last: str | None, horizon_s: int, out: Path, source_name: str | None,
    lake: Path | None, state_dir: Path | None, master: str | None,
) -> None:  # fmt: skip
    """Label each landed impression 1 if the user clicked its item in the session soon after, else 0.

    Writes what `headwater training-set --labels` reads: group (slate = session page), user_id,
    item_id, event_time (ms), label, session_id, position.
    """
    from headwater.pipelines.offline.job import read_bronze
    from headwater.pipelines.offline.labels import derive_labels, labels_source, write_labels
    from headwater.pipelines.offline.lake import lake_root
    from headwater.pipelines.offline.session import offline_session

    lo, hi = day_range(day, first, last)
    root = lake_root(lake)
    source = labels_source(tier_plan(state_dir, "offline").sources, source_name)
    spark = offline_session("headwater-labels", master)
    frame = derive_labels(read_bronze(spark, root, source), source, lo, hi, horizon_s)
    result = write_labels(frame, out, root / "_staging")
    click.echo(json.dumps({"out": str(result.path), "rows": result.rows, "positives": result.positives,
                           "horizon_s": horizon_s, "from": str(lo) if lo else None,
                           "to": str(hi) if hi else None}))  # fmt: skip
