"""``headwater funnel train-reranker``: the sequence re-ranker of ``/v1/recommend``.

Registered in ``cli/main.py`` with ``main.add_command(funnel)``. torch is imported inside the
command so ``headwater --help`` stays fast.
"""

from __future__ import annotations

from pathlib import Path

import click

from headwater.cli.errors import HeadwaterGroup
from headwater.cli.options import models_out_option, training_set_option


@click.group(cls=HeadwaterGroup)
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

    from headwater.ranking.artifact import load_artifact, resolve_model_path
    from headwater.ranking.reranker import RerankOptions, save_reranker, train_reranker
    from headwater.ranking.scorers import neural_from_artifact
    from headwater.ranking.trainset import read_parquet

    ts = read_parquet(training_set).for_ranker()  # the DCN's item rows: on-demand slots included
    dcn = load_artifact(resolve_model_path(out_dir))
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
    reranker, metrics = train_reranker(ts, base, opts)
    saved = save_reranker(out_dir, reranker, ts, metrics, max_clicks)
    click.echo(
        f"{metrics['rows']['train']} training rows, {metrics['rows']['holdout']} holdout rows"
        f" ({metrics['rows_with_clicks']} with earlier clicks); {metrics['seconds']} s"
    )
    click.echo(f"{'model':<14}{'AUC':>8}{'NDCG@10':>10}")
    for name, values in metrics["holdout"].items():
        click.echo(f"{name:<14}{values['auc']:>8.4f}{values['ndcg@10']:>10.4f}")
    click.echo(f"wrote reranker-{saved.version}.pt in {out_dir} (reranker {saved.version})")


@funnel.command("categories")
@click.option(
    "--csv", "csv_path", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
    help="item_id,category rows (a header line is skipped) [default: the event generator's catalog].",
)  # fmt: skip
@click.option("--seed", type=int, default=None, help="The generator's seed [default: its config's].")
@click.option("--items", type=click.IntRange(min=1), default=None, help="The generator's catalog size.")
@click.option("--redis-url", default=None, help="Default: HEADWATER_REDIS_URL or the local Redis.")
@click.option("--namespace", default=None, help="Key namespace of the online store (default: the store's).")
def categories(
    csv_path: Path | None, seed: int | None, items: int | None, redis_url: str | None, namespace: str | None
) -> None:
    """Load each item's category into Redis for the funnel's diversity rule.

    Without --csv, the categories of the event generator's catalog (same seed and size as
    `headwater events`): the items the demo's traffic is about.
    """
    import csv
    import random
    from dataclasses import replace

    from headwater.pipelines.events.generator import GeneratorConfig
    from headwater.pipelines.events.world import build_catalog
    from headwater.pipelines.settings import Settings
    from headwater.pipelines.store import OnlineStore
    from headwater.serving.funnel.recent import RedisRecentItems

    if csv_path is not None:
        with csv_path.open(encoding="utf-8", newline="") as f:
            rows = [r for r in csv.reader(f) if len(r) >= 2 and r[0] and r[1]]
        if rows and rows[0][0] == "item_id":
            rows = rows[1:]
        mapping = {r[0]: r[1] for r in rows}
        source = str(csv_path)
    else:
        cfg = GeneratorConfig()
        cfg = replace(
            cfg, seed=cfg.seed if seed is None else seed, items=cfg.items if items is None else items
        )
        catalog = build_catalog(random.Random(cfg.seed), cfg.items, cfg.categories, cfg.zipf_s)
        names = catalog.category_names
        mapping = {i: names[c] for i, c in zip(catalog.item_ids, catalog.category, strict=True)}
        source = f"the generator's catalog (seed {cfg.seed}, {cfg.items} items)"
    url = redis_url or Settings.from_env().redis_url
    store = OnlineStore.from_url(url, namespace) if namespace else OnlineStore.from_url(url)
    written = RedisRecentItems(store.client, store.namespace).put_categories(mapping)
    click.echo(f"{written} item categories from {source} -> {store.namespace}:funnel:category")
    store.close()
