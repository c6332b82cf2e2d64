"""``headwater events import``: a history file straight into a source's bronze table (see :mod:`.history`)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from headwater.cli.errors import HeadwaterCommand
from headwater.cli.offline import LAKE, MASTER, STATE


@click.command("import", cls=HeadwaterCommand)
@click.option(
    "--source", "source_name", required=True, help="The source of the applied plan the rows are events of."
)
@click.option("--from", "path", required=True, type=click.Path(path_type=Path, dir_okay=False),
              help="JSON Lines, CSV/TSV or Parquet file (gzip for the text ones).")  # fmt: skip
@click.option("--format", "fmt", type=click.Choice(["jsonl", "csv", "tsv", "parquet"]), default=None,
              help="The file's format (default: from its extension).")  # fmt: skip
@click.option("--reject-file", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="Where rejected rows go, one JSON object per line with its line and reason "
                   "(default: <lake>/_rejects/<source>-<sha256 prefix>.jsonl, written only when a row "
                   "is rejected).")  # fmt: skip
@click.option("--chunk-rows", type=click.IntRange(min=1), default=500_000, show_default=True,
              help="Input rows per Delta commit (a crash redoes at most one chunk).")  # fmt: skip
@LAKE
@STATE
@MASTER
def import_cmd(
    source_name: str, path: Path, fmt: str | None, reject_file: Path | None, chunk_rows: int,
    lake: Path | None,
    state_dir: Path | None, master: str | None,
) -> None:  # fmt: skip
    """Import a history of any age and order into the source's bronze table, exactly once.

    Each row is checked against the source's schema and rules (min_event_time included: set it in
    sources.yaml for old data); rejected rows go to the reject file with their line and reason.
    Re-importing the same file lands nothing twice. Then `headwater run offline --backfill` computes
    the offline views over it.
    """
    from headwater.pipelines.events.sources import applied_source
    from headwater.pipelines.offline.history import ImportResult, import_history
    from headwater.pipelines.offline.lake import lake_root
    from headwater.pipelines.offline.session import offline_session

    source = applied_source(source_name, state_dir)
    if not path.is_file():
        msg = f"{path}: no such file"
        raise click.ClickException(msg)

    def report(r: ImportResult, share: float | None) -> None:
        done = f"{share:.0%} " if share is not None else ""
        rate = r.rows / r.seconds if r.seconds else 0.0
        click.echo(f"{source.name}: {done}{r.rows:,} rows, {r.landed:,} landed, {r.duplicates:,} duplicates, "
                   f"{r.rejected:,} rejected ({rate:,.0f} rows/s)", err=True)  # fmt: skip

    spark = offline_session("headwater-import", master)
    result = import_history(spark, lake_root(lake), source, path, fmt=fmt, reject_file=reject_file,
                            chunk_rows=chunk_rows, progress=report)  # fmt: skip
    if result.skipped_chunks:
        click.echo(f"{result.skipped_chunks} of {result.chunks} chunk(s) of this file were imported before "
                   "(same sha256): not landed again", err=True)  # fmt: skip
    if result.rejected:
        click.echo(f"{result.rejected} row(s) rejected: see {result.reject_file}", err=True)
    click.echo(json.dumps(result.to_json()))
