"""Load the models for serving: artifacts, binding checks, device and torch threads.

A model that cannot be loaded or that was trained on other features than the views the
service reads is not used (logged as an error); the service still starts and answers from
the next step of the fallback chain, so a bad deploy degrades instead of failing.
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch

from headwater.ranking.accel import plan_for
from headwater.ranking.artifact import (
    Artifact,
    ArtifactError,
    Binding,
    check_binding,
    check_metadata,
    linear_sibling,
    load_artifact,
    resolve_model_path,
)
from headwater.ranking.features import BoundRegistry
from headwater.ranking.model import LinearRanker, NeuralScorer, pick_device
from headwater.ranking.scorers import linear_from_artifact, neural_from_artifact
from headwater.serving.engine import Models

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoadedModels:
    """The scorers and their versions; either may be None."""

    neural: NeuralScorer | None
    neural_artifact: Artifact | None
    linear: LinearRanker | None
    linear_artifact: Artifact | None
    device: str
    binding: Binding = field(default_factory=lambda: Binding(None, None))
    """How the models' inputs map onto the registry's vectors (both models share it)."""

    def models(self) -> Models:
        """Return the engine's view of them."""
        return Models(
            neural_version=self.neural_artifact.version
            if self.neural is not None and self.neural_artifact
            else None,
            linear=self.linear,
            linear_version=self.linear_artifact.version if self.linear_artifact else None,
        )


def configure_torch_threads(requested: int | None) -> int:
    """Intra-op threads: ``requested``, else one fewer than the cores (the event loop needs one), 1..4."""
    threads = requested or max(1, min(4, (os.cpu_count() or 2) - 1))
    torch.set_num_threads(threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        logger.debug("torch inter-op threads were already set")
    return threads


def configure_switch_interval(interval_ms: float | None) -> float:
    """Set the interpreter's thread switch interval (None keeps it); returns it in milliseconds."""
    if interval_ms is not None:
        sys.setswitchinterval(interval_ms / 1000.0)
    return sys.getswitchinterval() * 1000.0


def load_models(model_path: Path | None, registry: BoundRegistry, device: str | None = None) -> LoadedModels:
    """Load the DCN and its linear sibling from ``model_path`` (file or training directory).

    A model whose slots do not match the applied registry is refused (logged with the reason);
    the service then answers from the next step of the fallback chain. Start-up never fails on a
    model: a broken ``latest.json``, a corrupt file or incomplete metadata leaves the linear model
    (found through the neural model's metadata, else through ``latest.json``) or popularity.
    """
    dev = pick_device(device)
    if model_path is None:
        logger.warning("no model given: answering from popularity and the editorial list")
        return LoadedModels(None, None, None, None, dev)
    neural = neural_art = linear = linear_art = None
    binding = Binding(None, None)
    try:
        neural_art = load_artifact(resolve_model_path(model_path))
        check_metadata(neural_art)
        binding = check_binding(neural_art.metadata, registry)
        neural = neural_from_artifact(neural_art, dev)
    except ArtifactError as exc:
        logger.error("neural model not used: %s", exc)
    except Exception:  # a bad deploy must degrade, whatever the file holds
        logger.exception("neural model not used: unexpected error loading %s", model_path)
        neural = None
    if binding.warning:
        logger.warning("%s", binding.warning)
    sibling = linear_sibling(neural_art) if neural_art is not None else _latest_linear(model_path)
    if sibling is not None:
        try:
            linear_art = load_artifact(sibling)
            check_metadata(linear_art)
            linear_binding = check_binding(linear_art.metadata, registry)
            linear = linear_from_artifact(linear_art)
            if neural is None:
                binding = linear_binding
        except ArtifactError as exc:
            logger.error("linear fallback model not used: %s", exc)
            linear_art = linear = None
        except Exception:  # as above: degrade to popularity rather than fail to start
            logger.exception("linear fallback model not used: unexpected error loading %s", sibling)
            linear_art = linear = None
    if neural is None and linear is None:
        binding = Binding(None, None)
    if neural is not None:
        logger.info("models on %s", plan_for(dev, neural.runtime).describe())
    return LoadedModels(neural, neural_art if neural is not None else None, linear, linear_art, dev, binding)


def _latest_linear(model_path: Path) -> Path | None:
    """Return the linear artifact ``latest.json`` names (used when the neural one could not be read)."""
    if not model_path.is_dir():
        return None
    try:
        return resolve_model_path(model_path, "linear")
    except ArtifactError as exc:
        logger.error("linear fallback model not used: %s", exc)
        return None
