"""Build the funnel's parts for ``headwater serve``: retrieval, re-ranker, recent-items memory.

Start-up never fails on the funnel: a missing or unbindable two-tower artifact, an index that
cannot be built (the store is down) or a re-ranker that does not fit the ranker leave that part
out (logged with the reason), and ``/v1/recommend`` answers through the stage's fallback.
"""

from __future__ import annotations

import logging
from pathlib import Path

from headwater.pipelines.store import OnlineStore
from headwater.ranking.artifact import ArtifactError
from headwater.ranking.features import BoundRegistry
from headwater.ranking.reranker import Reranker, load_reranker
from headwater.serving.funnel.config import FunnelConfig
from headwater.serving.funnel.recent import RedisRecentItems
from headwater.serving.funnel.stages import FunnelParts
from headwater.serving.runtime import LoadedModels

log = logging.getLogger(__name__)


def load_funnel_reranker(model_path: Path, loaded: LoadedModels) -> Reranker | None:
    """Return the re-ranker in ``model_path`` if it reads the ranker's item slots in order, else None.

    It scores the DCN's item rows as the engine assembled them, so its slots must be the DCN's.
    """
    try:
        reranker = load_reranker(model_path)
    except ArtifactError as exc:
        log.warning("re-ranker not used (the funnel keeps the DCN's order): %s", exc)
        return None
    ranker = loaded.neural_artifact
    slots = tuple(ranker.metadata.get("item_features", ())) if ranker is not None else ()
    if reranker.item_features != slots:
        log.error(
            "re-ranker %s not used: it reads %d item slots, the ranker %s reads %d (another order or set);"
            " retrain it with `headwater funnel train-reranker` on the ranker's training set",
            reranker.version, len(reranker.item_features), ranker.version if ranker else None, len(slots),
        )  # fmt: skip
        return None
    reranker.compile()  # ONNX Runtime on the CPU, as the ranker
    return reranker


def build_funnel(
    config: FunnelConfig,
    registry: BoundRegistry,
    store: OnlineStore,
    model_path: Path | None,
    loaded: LoadedModels,
    retrieval: bool = True,
    snapshot_dir: Path | None = None,
) -> FunnelParts:
    """Load what exists under ``model_path`` (a models folder) and the store's recent-items memory.

    ``snapshot_dir``: where the item index is saved and loaded from (None, or ``index_snapshot_s``
    None: always built from the store).
    """
    recent = RedisRecentItems(store.client, store.namespace, config)
    if model_path is None or not model_path.is_dir():
        log.warning("no models folder: /v1/recommend answers from popularity candidates, DCN order")
        return FunnelParts(recent)
    runtime = None
    if retrieval:
        from headwater.serving.retrieval.runtime import load_retrieval

        try:
            share = config.item_mirror_sla_share
            every = config.index_snapshot_s
            runtime = load_retrieval(
                model_path, registry, store, mirror_sla_share=share,
                snapshot_dir=snapshot_dir if every is not None else None, snapshot_every_s=every or 0.0,
            )  # fmt: skip
        except ArtifactError as exc:
            log.warning("retrieval not used (popularity candidates instead): %s", exc)
        except Exception as exc:  # the store is down at start-up: serve without the index
            log.error(
                "retrieval index could not be built (%s: %s); popularity candidates", type(exc).__name__, exc
            )
    reranker = load_funnel_reranker(model_path, loaded)
    retriever = runtime.retriever if runtime else None
    refresh = (config.index_refresh_s, config.index_full_scan_s, config.index_feed_s)
    return FunnelParts(recent, retriever, reranker, runtime, *refresh)
