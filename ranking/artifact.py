"""Versioned model artifacts: tensors plus JSON metadata, loadable with ``torch.load(weights_only=True)``.

An artifact file is a dict ``{"format", "metadata_json", "state"}`` with only strings and
tensors in it, so loading never unpickles code. The model version is a content hash: SHA-256
of the metadata (without ``model_version`` and ``created_at``) and of every tensor's name,
dtype, shape and bytes, 12 hex digits. Training the same data with the same seed gives the
same version; loading recomputes it and refuses a file whose content does not match.

Metadata binds the model to what it was trained on: ``registry_version`` and the slot lists
``user_features`` and ``item_features`` (the training set's ``user.<slot>``/``item.<slot>``
columns; see :func:`check_binding`).
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

import numpy as np
import numpy.typing as npt
import torch

from headwater.ranking.features import BoundRegistry
from headwater.registry.errors import HeadwaterError

FORMAT = "headwater.ranker/1"
KINDS = ("dcn", "linear")
LATEST = "latest.json"
_UNHASHED = ("model_version", "created_at")


class ArtifactError(HeadwaterError, ValueError):
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
    return Artifact(write_versioned(out_dir, kind, FORMAT, meta, cpu_state), meta, cpu_state)


def write_versioned(
    out_dir: Path, kind: str, fmt: str, meta: dict[str, Any], state: Mapping[str, torch.Tensor]
) -> Path:
    """Write ``<kind>-<version>.pt`` into ``out_dir`` atomically; sets ``meta["model_version"]``.

    Every model kind (ranker, two-tower, re-ranker) is saved this way: a content-hash version, the
    metadata as JSON beside plain tensors, so loading needs no pickle (``weights_only=True``).
    """
    meta["model_version"] = content_hash(meta, state)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{kind}-{meta['model_version']}.pt"
    tmp = path.with_suffix(".pt.tmp")
    torch.save({"format": fmt, "metadata_json": json.dumps(meta, sort_keys=True), "state": dict(state)}, tmp)
    tmp.replace(path)
    return path


def point_latest(out_dir: Path, kind: str, path: Path) -> None:
    """Make ``out_dir``'s ``latest.json`` name ``path`` for ``kind``, keeping the other kinds' entries."""
    pointer = out_dir / LATEST
    try:
        latest = json.loads(pointer.read_text(encoding="utf-8"))
    except (FileNotFoundError, ValueError):
        latest = {}
    latest = latest if isinstance(latest, dict) else {}
    latest[kind] = path.name
    tmp = pointer.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(latest, indent=2) + "\n", encoding="utf-8")
    tmp.replace(pointer)


def load_artifact(path: Path) -> Artifact:
    """Load an artifact with ``weights_only=True`` and verify its content hash."""
    meta, state = read_verified(path, FORMAT, "model artifact", "train one with `headwater model train`")
    return Artifact(path, meta, state)


def read_verified(
    path: Path, fmt: str, what: str, missing_hint: str
) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """Read a file written like :func:`save_artifact`: metadata and tensors, their hash checked.

    ``fmt`` is the format tag the file must carry (each kind of artifact has its own, so no loader
    takes another's file); ``what`` names the file in errors and ``missing_hint`` says what to run
    when it does not exist. Nothing is unpickled: ``torch.load(weights_only=True)``.

    Raises:
        ArtifactError: missing, unreadable, of another format, without metadata or tensors, or
            modified (its content hash differs from its ``model_version``).
    """
    try:
        raw = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError as exc:
        msg = f"{what} {path}: no such file; {missing_hint}"
        raise ArtifactError(msg) from exc
    except (OSError, RuntimeError, pickle.UnpicklingError, zipfile.BadZipFile, EOFError) as exc:
        msg = f"{what} {path}: cannot be loaded with weights_only=True ({exc}); retrain or re-copy it"
        raise ArtifactError(msg) from exc
    if not isinstance(raw, dict) or raw.get("format") != fmt:
        found = raw.get("format") if isinstance(raw, dict) else type(raw).__name__
        msg = f"{what} {path}: expected format {fmt!r}; found {found!r}"
        raise ArtifactError(msg)
    try:
        meta = json.loads(raw["metadata_json"])
    except (KeyError, TypeError, ValueError) as exc:
        msg = f"{what} {path}: no readable metadata_json ({type(exc).__name__}: {exc}); retrain it"
        raise ArtifactError(msg) from exc
    state = raw.get("state")
    if not isinstance(state, dict) or not all(isinstance(t, torch.Tensor) for t in state.values()):
        msg = f"{what} {path}: 'state' is not a dict of tensors; retrain it"
        raise ArtifactError(msg)
    if not isinstance(meta, dict):
        msg = f"{what} {path}: metadata is a {type(meta).__name__}, not a JSON object; retrain it"
        raise ArtifactError(msg)
    expected = content_hash(meta, state)
    if meta.get("model_version") != expected:
        msg = (
            f"{what} {path}: content hash is {expected} but the metadata says"
            f" {meta.get('model_version')!r}; the file was modified or is corrupt"
        )
        raise ArtifactError(msg)
    return meta, state


def check_metadata(artifact: Artifact) -> None:
    """Refuse metadata that lacks what serving reads (a hand-edited or truncated file).

    Raises:
        ArtifactError: ``kind``, ``user_features``/``item_features`` or ``hyperparameters`` is
            missing or of the wrong type.
    """
    path, meta = artifact.path, artifact.metadata
    problems = []
    if meta.get("kind") not in KINDS:
        problems.append(f"kind must be one of {KINDS}, found {meta.get('kind')!r}")
    for key in ("user_features", "item_features"):
        slots = meta.get(key)
        if not isinstance(slots, list) or not slots or not all(isinstance(s, str) for s in slots):
            problems.append(f"{key} must be a non-empty list of slot names, found {str(slots)[:60]}")
    hyper = meta.get("hyperparameters", {})
    if not isinstance(hyper, dict):
        problems.append(f"hyperparameters must be an object, found {type(hyper).__name__}")
    if problems:
        msg = f"model artifact {path}: metadata is incomplete: {'; '.join(problems)}; retrain it"
        raise ArtifactError(msg)


@dataclass(frozen=True)
class Binding:
    """How a model's inputs map onto the registry's vectors.

    ``user_columns``/``item_columns``: for each model input, its column in the registry's vector
    (None when the orders are the same). ``warning``: a registry-version difference worth logging.
    """

    user_columns: npt.NDArray[np.intp] | None
    item_columns: npt.NDArray[np.intp] | None
    warning: str | None = None
    changed_views: tuple[str, ...] = ()
    """Views whose applied version differs from the one the model was trained on: their features may
    mean something else now (reported in /health and /metrics; retrain)."""


def check_binding(metadata: Mapping[str, Any], registry: BoundRegistry) -> Binding:
    """Bind a model to the applied registry; raise :class:`ArtifactError` unless the slots match.

    The slots (names) must be the same set on each side; an other order is mapped. A different
    registry version with the same slots is accepted with a warning: the version changes with any
    edit of the registry (owner, cost, another view), not only with a feature's meaning.
    """
    model, trained_on = metadata.get("model_version"), metadata.get("registry_version")
    columns: list[npt.NDArray[np.intp] | None] = []
    for side in ("user", "item"):
        trained = tuple(str(s) for s in metadata.get(f"{side}_features", ()))
        current = registry.side(side).slots
        pairs = registry.on_demand.names if side == "item" and registry.on_demand else ()
        if pairs and set(pairs) & set(trained):  # a ranker trained on on-demand features: they follow
            current = current + pairs  # the item slots, and the explicit columns tell fetch to add them
        elif trained == current:
            columns.append(None)
            continue
        missing = [f for f in trained if f not in current]
        extra = [f for f in current if f not in trained]
        if missing or extra or len(trained) != len(current):
            msg = (
                f"model {model} (registry {trained_on}) does not"
                f" match the applied registry {registry.registry_version}: {side} slots the model needs but"
                f" the registry lacks: {_few(missing)}; registry {side} slots the model was not trained on:"
                f" {_few(extra)}. Build a training set from the applied registry (`headwater training-set`)"
                " and retrain (`headwater model train --training-set FILE`)"
            )
            raise ArtifactError(msg)
        columns.append(np.asarray([current.index(f) for f in trained], dtype=np.intp))
    recorded = metadata.get("view_versions")
    trained_views: Mapping[str, Any] = recorded if isinstance(recorded, Mapping) else {}
    applied = registry.view_versions
    changed = tuple(sorted(v for v, ver in trained_views.items() if v in applied and applied[v] != ver))
    warning = None
    if changed:
        warning = (
            f"model {model} was trained on other versions of views {', '.join(changed)} than the applied"
            " ones: their features were redefined since (window, filter, field...), so the model scores"
            " values it never saw; the slots are the same, so it is used: build a training set"
            " (`headwater training-set`) and retrain"
        )
    elif not trained_views and trained_on != registry.registry_version:
        warning = (
            f"model {model} was trained on registry {trained_on} and records no view versions;"
            f" the applied registry is {registry.registry_version}; the slots are the same, so it is used:"
            " retrain if a feature's definition changed"
        )
    return Binding(columns[0], columns[1], warning, changed)


def _few(names: list[str], shown: int = 6) -> str:
    if not names:
        return "none"
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


def resolve_model_path(path: Path, kind: str = "dcn", train: str = "headwater model train") -> Path:
    """Return the ``kind`` artifact for ``path``: the file, or the one a directory's latest.json names.

    ``train`` is the command that writes that kind, for the error's hint.

    Raises:
        ArtifactError: ``latest.json`` is missing, unreadable, not JSON, or names no ``kind`` file.
    """
    if not path.is_dir():
        return path
    pointer = path / LATEST
    retrain = f"train with `{train} --out {path}`"
    try:
        latest = json.loads(pointer.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        msg = f"model directory {path}: no {LATEST}; {retrain}"
        raise ArtifactError(msg) from exc
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        msg = f"model directory {path}: {LATEST} cannot be read as JSON ({exc}); {retrain}"
        raise ArtifactError(msg) from exc
    name = latest.get(kind) if isinstance(latest, dict) else None
    if not isinstance(name, str) or not name or "/" in name or name in (".", ".."):
        msg = (
            f"model directory {path}: {LATEST} names no {kind} artifact (found {str(latest)[:80]}); {retrain}"
        )
        raise ArtifactError(msg)
    return path / name


def linear_sibling(artifact: Artifact) -> Path | None:
    """Return the linear fallback saved with a neural artifact (named in its metadata), if any."""
    name = artifact.metadata.get("linear_artifact")
    if not isinstance(name, str) or not name or "/" in name:
        return None
    return artifact.path.parent / name
