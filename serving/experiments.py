"""Experiments: each user is assigned to one arm by a stable hash; the arm picks the scorer.

An experiment is declared in the serving config (``experiment:``). An arm is a model version
(``model``: an artifact file or a training directory) and/or funnel settings (``start_at``:
``linear`` skips the DCN, ``popularity`` skips both models), with a weight::

    experiment:
      name: ranker-v2
      arms:
        - {name: control, weight: 50}                                 # the service's own model
        - {name: treatment, weight: 50, model: models/dcn-v2.pt}
        - {name: no-model, weight: 5, start_at: popularity}

Assignment: ``u = int(sha256(salt + NUL + user_id)[:8]) / 2**64`` (NUL: the zero byte), a
uniform number in ``[0, 1)``; the arm is the first whose cumulative share of the weights is above
``u``. The salt is the experiment's name unless set, so a new experiment reshuffles users and one user keeps
their arm across requests, restarts and replicas (any language can compute it). The arm's label,
``<experiment>/<arm>``, is returned in the answer, written on the impressions and on the
feedback events (the ``events`` schema's nullable ``arm``), and labels the business metrics.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, model_validator

from headwater.registry.errors import HeadwaterError

if TYPE_CHECKING:
    from headwater.pipelines.events.schema import BehaviorEvent
    from headwater.ranking.features import BoundRegistry
    from headwater.serving.engine import Models, RankingEngine
    from headwater.serving.runtime import LoadedModels

logger = logging.getLogger(__name__)
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,47}$"
StartAt = Literal["neural", "linear", "popularity"]
EXPERIMENT_REASON = "experiment"
"""The ``fallback_reason`` of an answer whose arm starts the chain below the DCN."""


class ArmConfig(BaseModel):
    """One arm: a share of the users, the model that scores them and where the chain starts."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=NAME_PATTERN)
    weight: float = Field(gt=0.0, allow_inf_nan=False)
    """Relative share of the users (weights need not add up to 1 or 100)."""
    model: Path | None = None
    """Artifact file or training directory of this arm's model (relative: to the working folder);
    None: the service's model."""
    start_at: StartAt = "neural"
    """First step of the fallback chain: ``linear`` skips the DCN, ``popularity`` both models."""


class ExperimentConfig(BaseModel):
    """An experiment: its arms and the salt of the assignment hash."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=NAME_PATTERN)
    arms: tuple[ArmConfig, ...] = Field(min_length=2, max_length=16)
    salt: str | None = None
    """Salt of the assignment hash; default: the experiment's name."""

    @model_validator(mode="after")
    def _unique_arms(self) -> ExperimentConfig:
        names = [a.name for a in self.arms]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            msg = f"arms: names must be unique within experiment {self.name!r}; repeated: {', '.join(twice)}"
            raise ValueError(msg)
        return self

    def shares(self) -> dict[str, float]:
        """Return each arm's expected share of the users (its weight over the sum of weights)."""
        total = sum(a.weight for a in self.arms)
        return {a.name: a.weight / total for a in self.arms}

    def label(self, arm: str) -> str:
        """Return the arm's label carried by answers, events and metrics: ``<experiment>/<arm>``."""
        return f"{self.name}/{arm}"


def unit_hash(salt: str, user_id: str) -> float:
    """Return the user's position in ``[0, 1)`` for ``salt``: the first 8 bytes of a SHA-256, big endian."""
    digest = hashlib.sha256(f"{salt}\0{user_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


class Assigner:
    """Maps a user id to an arm of one experiment (pure: no state beyond the config)."""

    def __init__(self, experiment: ExperimentConfig) -> None:
        """Precompute the cumulative shares of ``experiment``'s arms."""
        self.experiment = experiment
        self._salt = experiment.salt if experiment.salt is not None else experiment.name
        bounds: list[float] = []
        total = 0.0
        for share in experiment.shares().values():
            total += share
            bounds.append(total)
        bounds[-1] = 1.0  # rounding must not leave a sliver of [0, 1) without an arm
        self._bounds = bounds
        self._names = [a.name for a in experiment.arms]

    def arm(self, user_id: str) -> str:
        """Return the name of ``user_id``'s arm."""
        u = unit_hash(self._salt, user_id)
        for name, bound in zip(self._names, self._bounds, strict=True):
            if u < bound:
                return name
        return self._names[-1]

    def label(self, user_id: str) -> str:
        """Return ``<experiment>/<arm>`` for ``user_id``."""
        return self.experiment.label(self.arm(user_id))


@dataclass(frozen=True)
class Routed:
    """The engine that answers a user and the arm label the answer and its events carry."""

    engine: RankingEngine
    arm: str | None


EngineFactory = Callable[["LoadedModels", "Models"], "tuple[RankingEngine, Stoppable | None]"]
"""Builds an arm's engine from its models; returns it and what to stop with the app (its batcher)."""


class Stoppable(Protocol):
    """What an arm's engine owns that must stop with the app (its micro-batcher)."""

    async def stop(self) -> None:
        """Stop it."""
        ...


class ArmEngines:
    """One ranking engine per arm; picks each request's engine by the user's arm.

    An arm with neither a model nor a ``start_at`` shares the service's engine (and batcher); the
    others get their own, built at start (the app's lifespan) with ``make_engine``.
    """

    def __init__(
        self,
        experiment: ExperimentConfig | None,
        default_loaded: LoadedModels,
        arm_loaded: Mapping[str, LoadedModels],
        make_engine: EngineFactory,
    ) -> None:
        """Route by ``experiment`` (None: every request to the service's engine)."""
        self.experiment = experiment
        self.assigner = Assigner(experiment) if experiment is not None else None
        self._default_loaded = default_loaded
        self._arm_loaded = dict(arm_loaded)
        self._make = make_engine
        self._engines: dict[str, RankingEngine] = {}
        self._owned: list[Stoppable] = []

    async def start(self) -> None:
        """Build the arms' engines (the service's engine exists by then)."""
        if self.experiment is None:
            return
        for arm in self.experiment.arms:
            if arm.model is None and arm.start_at == "neural":
                continue
            loaded = self._arm_loaded.get(arm.name, self._default_loaded)
            engine, owned = self._make(loaded, arm_models(arm, loaded))
            self._engines[arm.name] = engine
            if owned is not None:
                self._owned.append(owned)

    async def stop(self) -> None:
        """Stop what the arms' engines own."""
        for owned in self._owned:
            await owned.stop()
        self._owned.clear()

    def route(self, user_id: str, default: RankingEngine) -> Routed:
        """Return the engine and the arm label for ``user_id`` (``default``: the service's engine)."""
        if self.assigner is None:
            return Routed(default, None)
        name = self.assigner.arm(user_id)
        return Routed(self._engines.get(name, default), self.assigner.experiment.label(name))

    def arm_of(self, user_id: str) -> str | None:
        """Return ``user_id``'s arm label (None without an experiment): what feedback events carry."""
        return self.assigner.label(user_id) if self.assigner is not None else None


def with_arm(events: list[BehaviorEvent], arm: str | None) -> list[BehaviorEvent]:
    """Write ``arm`` on each event (in place, and return them); None leaves them outside experiments."""
    if arm is not None:
        for event in events:
            event["arm"] = arm
    return events


def arm_models(arm: ArmConfig, loaded: LoadedModels) -> Models:
    """Return what scores for ``arm``: ``loaded``'s models, less the steps before ``start_at``."""
    from headwater.serving.engine import Models

    full = loaded.models()
    if arm.start_at == "neural":
        return full
    if arm.start_at == "linear":
        return Models(None, full.linear, full.linear_version, absent_reason=EXPERIMENT_REASON)
    return Models(absent_reason=EXPERIMENT_REASON)


class ExperimentModelError(HeadwaterError, ValueError):
    """An arm's model cannot be used: the experiment would not compare what it says."""


def load_arm_models(
    experiment: ExperimentConfig | None, registry: BoundRegistry, device: str | None
) -> dict[str, LoadedModels]:
    """Load the model of every arm that names one.

    Raises:
        ExperimentModelError: an arm's model loads neither its DCN nor its linear model (the
            service refuses to start rather than serve that arm from another model).
    """
    from headwater.serving.runtime import load_models

    out: dict[str, LoadedModels] = {}
    if experiment is None:
        return out
    for arm in experiment.arms:
        if arm.model is None:
            continue
        if not arm.model.exists():
            msg = (
                f"experiment {experiment.name!r}, arm {arm.name!r}: model {arm.model} does not exist"
                " (an artifact file or a training directory; relative paths start at the working folder)"
            )
            raise ExperimentModelError(msg)
        loaded = load_models(arm.model, registry, device)
        models = loaded.models()
        wanted = models.neural_version if arm.start_at == "neural" else models.linear_version
        if wanted is None:
            step = "DCN" if arm.start_at == "neural" else "linear model"
            msg = (
                f"experiment {experiment.name!r}, arm {arm.name!r}: the {step} of {arm.model} cannot be"
                " used (see the log above); fix the artifact or drop the arm"
            )
            raise ExperimentModelError(msg)
        logger.info(
            "experiment %s arm %s: model %s (linear %s)",
            experiment.name,
            arm.name,
            models.neural_version,
            models.linear_version,
        )
        out[arm.name] = loaded
    return out
