"""Two-tower artifacts: the ranker's file layout and content-hash versions, a format of their own.

A file is ``{"format": "headwater.retrieval/1", "metadata_json", "state"}`` (strings and tensors
only, loaded with ``torch.load(weights_only=True)``, never unpickling code), named
``two_tower-<version>.pt``; the version is :func:`headwater.ranking.artifact.content_hash` of the
metadata and tensors, so the same data and seed give the same version and a modified file is
refused. ``latest.json`` in the folder gets a ``two_tower`` entry beside the ranker's (merged, not
overwritten). The format differs from the ranker's so that neither loader accepts the other's file.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from headwater.ranking.artifact import (
    ArtifactError,
    point_latest,
    read_verified,
    resolve_model_path,
    write_versioned,
)
from headwater.ranking.towers import TowerReport, TwoTowerModel
from headwater.ranking.trainset import TrainingSet

FORMAT = "headwater.retrieval/1"
KIND = "two_tower"


@dataclass(frozen=True)
class TowerArtifact:
    """A loaded two-tower artifact: its file, metadata and model (on the CPU, in eval mode)."""

    path: Path
    metadata: dict[str, Any]
    model: TwoTowerModel

    @property
    def version(self) -> str:
        """The content hash."""
        return str(self.metadata["model_version"])


def save_towers(out_dir: Path, report: TowerReport, ts: TrainingSet) -> TowerArtifact:
    """Write ``two_tower-<version>.pt`` and point ``latest.json``'s ``two_tower`` entry at it."""
    model = report.model
    state = {k: v.detach().to("cpu").contiguous().clone() for k, v in model.state_dict().items()}
    meta: dict[str, Any] = {
        "kind": KIND,
        "registry_version": ts.registry_version,
        "user_features": list(ts.user_features),
        "item_features": list(ts.item_features),
        "hyperparameters": {"embed_dim": model.embed_dim, "hidden": list(model.hidden)},
        "training": {k: v for k, v in report.metrics.items() if k not in ("created_at", "seconds")},
        "created_at": report.metrics.get("created_at", ""),
    }
    path = write_versioned(out_dir, KIND, FORMAT, meta, state)
    point_latest(out_dir, KIND, path)
    return TowerArtifact(path, meta, model.eval())


def load_towers(path: Path) -> TowerArtifact:
    """Load ``path`` (a file, or a folder whose ``latest.json`` names a ``two_tower`` file).

    Raises:
        ArtifactError: missing, unreadable, of another format, modified (hash mismatch), or
            its tensors do not fit the hyper-parameters it names.
    """
    path = resolve_model_path(path, KIND, "headwater retrieval train")
    meta, state = read_verified(
        path, FORMAT, "two-tower artifact", "train it with `headwater retrieval train`"
    )
    try:
        hyper = meta["hyperparameters"]
        model = TwoTowerModel(
            len(meta["user_features"]), len(meta["item_features"]), int(hyper["embed_dim"]), hyper["hidden"]
        )
    except (KeyError, TypeError, ValueError) as exc:
        msg = f"two-tower artifact {path}: incomplete metadata ({type(exc).__name__}: {exc}); retrain it"
        raise ArtifactError(msg) from exc
    try:
        model.load_state_dict(state)
    except RuntimeError as exc:
        msg = f"two-tower artifact {path}: tensors do not fit the model its metadata describes: {exc}"
        raise ArtifactError(msg) from exc
    return TowerArtifact(path, meta, model.eval())
