"""Scorers built from saved artifacts: the DCN on a device and the numpy linear fallback.

The service (:mod:`headwater.serving.runtime`) and the offline skew check
(:mod:`headwater.ranking.skew_pit`) build their scorers here, so both score with the same network.
"""

from __future__ import annotations

import numpy as np

from headwater.ranking.artifact import Artifact, ArtifactError
from headwater.ranking.model import DCNRanker, LinearRanker, NeuralScorer


def neural_from_artifact(artifact: Artifact, device: str) -> NeuralScorer:
    """Build a scorer on ``device`` from a ``dcn`` artifact.

    Raises:
        ArtifactError: the metadata does not describe a network the weights fit.
    """
    hyper = artifact.metadata.get("hyperparameters", {})
    try:
        model = DCNRanker(
            len(artifact.metadata["user_features"]),
            len(artifact.metadata["item_features"]),
            int(hyper.get("embed_dim", 16)),
            int(hyper.get("cross_layers", 3)),
            tuple(int(x) for x in hyper.get("deep", (256, 128))),
        )
        model.load_state_dict(artifact.state)
    except (KeyError, TypeError, ValueError, RuntimeError) as exc:
        msg = f"model artifact {artifact.path}: weights do not fit the network in its metadata ({exc})"
        raise ArtifactError(msg) from exc
    return NeuralScorer(model, device)


def linear_from_artifact(artifact: Artifact) -> LinearRanker:
    """Build the numpy linear ranker from a ``linear`` artifact.

    Raises:
        ArtifactError: a weight is missing or its shape does not fit the slots in the metadata.
    """
    try:
        ranker = LinearRanker({k: v.numpy().astype(np.float32) for k, v in artifact.state.items()})
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        msg = f"model artifact {artifact.path}: not a linear model's weights ({type(exc).__name__}: {exc})"
        raise ArtifactError(msg) from exc
    dims = (len(artifact.metadata["user_features"]), len(artifact.metadata["item_features"]))
    if (ranker.user_dim, ranker.item_dim) != dims or ranker.w_cross.shape != dims:
        msg = (
            f"model artifact {artifact.path}: weights of shape {ranker.w_cross.shape} do not fit {dims} slots"
        )
        raise ArtifactError(msg)
    return ranker
