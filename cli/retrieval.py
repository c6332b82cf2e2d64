"""``headwater retrieval train``: the two-tower model from the ranker's point-in-time training set.

Registered in ``cli/main.py`` with ``main.add_command(retrieval)``. torch is imported inside
the command so ``headwater --help`` stays fast.
"""

from __future__ import annotations

from pathlib import Path

import click

from headwater.cli.errors import HeadwaterGroup
from headwater.cli.options import models_out_option, training_set_option


@click.group(cls=HeadwaterGroup)
def retrieval() -> None:
    """Retrieve from the whole catalog: the two-tower model and its item index."""


@retrieval.command()
@training_set_option("Parquet training set from `headwater training-set` (as `headwater model train`).")
@models_out_option("two_tower-<version>.pt; latest.json gets a two_tower entry")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the training run.")
@click.option("--epochs", type=click.IntRange(min=1), default=20, show_default=True)
@click.option(
    "--threads", type=click.IntRange(min=1), default=None, help="torch CPU threads [default: torch's]."
)
@click.option(
    "--device", type=click.Choice(["cpu", "cuda"]), default=None, help="Default: cuda when present."
)
def train(
    training_set: Path, out_dir: Path, seed: int, epochs: int, threads: int | None, device: str | None
) -> None:
    """Train the two-tower model on the clicks; print holdout recall@10/100 against popularity."""
    from headwater.ranking.tower_artifact import save_towers
    from headwater.ranking.towers import TowerOptions, train_two_tower
    from headwater.ranking.trainset import read_parquet

    ts = read_parquet(training_set)
    report = train_two_tower(ts, TowerOptions(seed=seed, epochs=epochs, threads=threads, device=device))
    artifact = save_towers(out_dir, report, ts)
    h, rows = report.metrics["holdout"], report.metrics["rows"]
    click.echo(
        f"{rows['train_clicks']} training clicks, {h.get('clicks', 0)} holdout clicks over a catalog of"
        f" {h.get('catalog', 0)} items; {report.metrics['seconds']} s on {report.metrics['device']}"
    )
    for k in (10, 100):
        if f"two_tower_recall@{k}" in h:
            click.echo(
                f"recall@{k}: two-tower {h[f'two_tower_recall@{k}']:.4f},"
                f" popularity {h[f'popularity_recall@{k}']:.4f}"
            )
    click.echo(f"wrote {artifact.path} (model_version {artifact.version})")
