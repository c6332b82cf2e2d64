"""``headwater funnel train-reranker``: the sequence re-ranker of ``/v1/recommend``.

Registered in ``registry/cli.py`` with ``main.add_command(funnel)``. torch is imported inside the
command so ``headwater --help`` stays fast.
"""

from __future__ import annotations

from pathlib import Path

import click

from headwater.registry.options import models_out_option, training_set_option


@click.group()
def funnel() -> None:
    """Train the recommendation funnel's re-ranker (/v1/recommend)."""


@funnel.command("train-reranker")
@training_set_option("Parquet training set from `headwater training-set` (the ranker's).")
@models_out_option("reranker-<version>.pt; latest.json gets a reranker entry (the DCN is read from there)")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the training run.")
@click.option("--epochs", type=click.IntRange(min=1), default=3, show_default=True)
@click.option("--max-clicks", type=click.IntRange(1, 200), default=20, show_default=True)
@click.option("--threads", type=click.IntRange(min=1), default=None, help="torch CPU threads.")
def train_reranker(
    training_set: Path, out_dir: Path, seed: int, epochs: int, max_clicks: int, threads: int | None
) -> None:
    """Train the attention re-ranker over recent clicks on top of the DCN in the models folder.

    Prints holdout AUC and NDCG@10 of the DCN alone and of the DCN + re-ranker.
    """
    import torch

    from headwater.serving.artifact import ArtifactError, load_artifact, resolve_model_path
    from headwater.serving.funnel.reranker import RerankOptions, save_reranker, train_reranker
    from headwater.serving.runtime import neural_from_artifact
    from headwater.serving.trainset import TrainingFileError, read_parquet

    try:
        ts = read_parquet(training_set)
        dcn = load_artifact(resolve_model_path(out_dir))
    except (TrainingFileError, ArtifactError) as exc:
        raise click.ClickException(str(exc)) from exc
    meta = dcn.metadata
    if (list(ts.user_features), list(ts.item_features)) != (meta["user_features"], meta["item_features"]):
        msg = (
            f"{training_set}: its user/item slots are not the ranker {dcn.version}'s"
            f" ({dcn.path}); train both on the same training set"
        )
        raise click.ClickException(msg)
    model = neural_from_artifact(dcn, "cpu").model
    with torch.inference_mode():
        logits = model(torch.from_numpy(ts.user), torch.from_numpy(ts.item), torch.arange(len(ts)))
        base = torch.sigmoid(logits).numpy()
    opts = RerankOptions(seed=seed, epochs=epochs, max_clicks=max_clicks, threads=threads)
    try:
        reranker, metrics = train_reranker(ts, base, opts)
    except TrainingFileError as exc:
        raise click.ClickException(str(exc)) from exc
    saved = save_reranker(out_dir, reranker, ts, metrics, max_clicks)
    click.echo(
        f"{metrics['rows']['train']} training rows, {metrics['rows']['holdout']} holdout rows"
        f" ({metrics['rows_with_clicks']} with earlier clicks); {metrics['seconds']} s"
    )
    click.echo(f"{'model':<14}{'AUC':>8}{'NDCG@10':>10}")
    for name, values in metrics["holdout"].items():
        click.echo(f"{name:<14}{values['auc']:>8.4f}{values['ndcg@10']:>10.4f}")
    click.echo(f"wrote reranker-{saved.version}.pt in {out_dir} (reranker {saved.version})")
