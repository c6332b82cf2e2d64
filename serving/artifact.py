"""Versioned model artifacts: tensors plus JSON metadata, loadable with ``torch.load(weights_only=True)``.

An artifact file is a dict ``{"format", "metadata_json", "state"}`` with only strings and
tensors in it, so loading never unpickles code. The model version is a content hash: SHA-256
of the metadata (without ``model_version`` and ``created_at``) and of every tensor's name,
dtype, shape and bytes, 12 hex digits. Training the same data with the same seed gives the
same version; loading recomputes it and refuses a file whose content does not match.

Metadata binds the model to what it was trained on: ``registry_version``, ``user_view``,
``user_features``, ``item_view``, ``item_features`` (see :func:`check_binding`).
"""

from __future__ import annotations

import hashlib
import json
import pickle
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from headwater.serving.config import ViewSpec

FORMAT = "headwater.ranker/1"
KINDS = ("dcn", "linear")
LATEST = "latest.json"
_UNHASHED = ("model_version", "created_at")


class ArtifactError(ValueError):
    """A model artifact is missing, unreadable, corrupt or bound to other features."""


@dataclass(frozen=True)
class Artifact:
    """A loaded artifact: its file, metadata and tensors (on the CPU)."""

    path: Path
    metadata: dict[str, Any]
    state: dict[str, torch.Tensor]

    @property
    def version(self) -> str:
        """The content hash."""
        return str(self.metadata["model_version"])

    @property
    def kind(self) -> str:
        """``dcn`` or ``linear``."""
        return str(self.metadata["kind"])


def content_hash(metadata: Mapping[str, Any], state: Mapping[str, torch.Tensor]) -> str:
    """12 hex digits of SHA-256 over the hashed metadata and the tensors."""
    digest = hashlib.sha256()
    hashed = {k: v for k, v in metadata.items() if k not in _UNHASHED}
    digest.update(json.dumps(hashed, sort_keys=True, separators=(",", ":")).encode("utf-8"))
    for name in sorted(state):
        tensor = state[name].detach().to("cpu").contiguous()
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(tensor.numpy().tobytes())
    return digest.hexdigest()[:12]


def save_artifact(out_dir: Path, metadata: Mapping[str, Any], state: Mapping[str, torch.Tensor]) -> Artifact:
    """Write ``<kind>-<version>.pt`` into ``out_dir``; returns the artifact with its version set."""
    kind = metadata.get("kind")
    if kind not in KINDS:
        msg = f"artifact metadata: kind must be one of {KINDS}; got {kind!r}"
        raise ArtifactError(msg)
    cpu_state = {k: v.detach().to("cpu").contiguous().clone() for k, v in state.items()}
    meta = dict(metadata)
    meta["model_version"] = content_hash(meta, cpu_state)
    try:
        json.dumps(meta)
    except TypeError as exc:
        msg = f"artifact metadata must be JSON-serialisable: {exc}"
        raise ArtifactError(msg) from exc
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{kind}-{meta['model_version']}.pt"
    tmp = path.with_suffix(".pt.tmp")
    torch.save({"format": FORMAT, "metadata_json": json.dumps(meta, sort_keys=True), "state": cpu_state}, tmp)
    tmp.replace(path)
    return Artifact(path, meta, cpu_state)


def load_artifact(path: Path) -> Artifact:
    """Load an artifact with ``weights_only=True`` and verify its content hash."""
    try:
        raw = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError as exc:
        msg = f"model artifact {path}: no such file; train one with `headwater model train`"
        raise ArtifactError(msg) from exc
    except (OSError, RuntimeError, pickle.UnpicklingError, zipfile.BadZipFile, EOFError) as exc:
        msg = f"model artifact {path}: cannot be loaded with weights_only=True ({exc}); retrain or re-copy it"
        raise ArtifactError(msg) from exc
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        found = raw.get("format") if isinstance(raw, dict) else type(raw).__name__
        msg = f"model artifact {path}: expected format {FORMAT!r}; found {found!r}"
        raise ArtifactError(msg)
    meta = json.loads(raw["metadata_json"])
    state = raw["state"]
    expected = content_hash(meta, state)
    if meta.get("model_version") != expected:
        msg = (
            f"model artifact {path}: content hash is {expected} but the metadata says"
            f" {meta.get('model_version')!r}; the file was modified or is corrupt"
        )
        raise ArtifactError(msg)
    return Artifact(path, meta, state)


def check_binding(metadata: Mapping[str, Any], user_view: ViewSpec, item_view: ViewSpec) -> None:
    """Raise :class:`ArtifactError` unless the model was trained on exactly these views' features."""
    for side, spec in (("user", user_view), ("item", item_view)):
        trained = tuple(metadata.get(f"{side}_features", ()))
        if trained != spec.features:
            missing = [f for f in trained if f not in spec.features]
            extra = [f for f in spec.features if f not in trained]
            msg = (
                f"model {metadata.get('model_version')} was trained on {side} view"
                f" {metadata.get(f'{side}_view')!r} with {len(trained)} features, the service reads"
                f" {spec.view!r} with {len(spec.features)}: missing from the view {missing}, not in the"
                f" model {extra}{' (same names, other order)' if not missing and not extra else ''};"
                " retrain the model on the current registry version"
            )
            raise ArtifactError(msg)


def resolve_model_path(path: Path) -> Path:
    """Return the neural artifact for ``path``: the file, or the one a directory's latest.json names."""
    if not path.is_dir():
        return path
    pointer = path / LATEST
    try:
        latest = json.loads(pointer.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        msg = f"model directory {path}: no {LATEST}; train with `headwater model train --out {path}`"
        raise ArtifactError(msg) from exc
    return path / str(latest["dcn"])


def linear_sibling(artifact: Artifact) -> Path | None:
    """Return the linear fallback saved with a neural artifact (named in its metadata), if any."""
    name = artifact.metadata.get("linear_artifact")
    return artifact.path.parent / str(name) if name else None
