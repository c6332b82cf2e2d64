"""The example behaviour events: their typed record and the source they are read with.

Tiers never import this module: they read any source from the applied plan
(:class:`~headwater.registry.plans.PlanSource`). It serves the demo's generator, the ranking
service's feedback loop and the tests, which all produce the example repo's ``events`` source
(``features/schemas/behavior_event.avsc``). On the wire ``event_time`` is an Avro ``long`` with
logical type ``timestamp-millis``; in Python it stays an ``int`` of UTC milliseconds.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime
from functools import lru_cache
from pathlib import Path
from typing import Literal, NotRequired, TypedDict, get_args

from headwater.registry.errors import HeadwaterError
from headwater.registry.plans import PlanSource

EXAMPLE_REPO_ENV = "HEADWATER_EXAMPLE_REPO"
"""Environment variable that points at another copy of the example feature repo."""
BEHAVIOR_SOURCE = "events"
"""The example repo's behaviour source."""


EventType = Literal["impression", "click", "like", "share", "purchase", "search", "dwell"]
Device = Literal["ios", "android", "web"]
EVENT_TYPES: tuple[EventType, ...] = get_args(EventType)
DEVICES: tuple[Device, ...] = get_args(Device)


class BehaviorEvent(TypedDict):
    """One behaviour event, exactly the Avro record (``event_time`` in UTC milliseconds)."""

    event_id: str
    user_id: str
    item_id: str | None
    event_type: EventType
    event_time: int
    session_id: str
    category: str | None
    price: float | None
    dwell_ms: int | None
    query: str | None
    position: int | None
    device: Device
    arm: NotRequired[str | None]
    """Experiment arm (schema version 2); an event without it is written with null."""


FIELD_NAMES: tuple[str, ...] = tuple(BehaviorEvent.__annotations__)


class ExampleRepoError(HeadwaterError, ValueError):
    """The example repo is missing, or its behaviour source does not check."""


def example_repo() -> Path:
    """Return the example feature repo: ``$HEADWATER_EXAMPLE_REPO``, else the shipped one."""
    env = os.environ.get(EXAMPLE_REPO_ENV)
    if env:
        return Path(env)
    from headwater.registry.resources import example_features

    return example_features()  # inside the wheel, or the checkout's features/ for a source install


def behavior_source(repo: Path | None = None) -> PlanSource:
    """Return the plan form of the example repo's behaviour source (checked once per process and folder).

    Raises:
        ExampleRepoError: the repo or its ``events`` source does not check.
    """
    return example_source(BEHAVIOR_SOURCE, repo)


def example_source(name: str, repo: Path | None = None) -> PlanSource:
    """Return the plan form of source ``name`` of the example repo (``events`` or ``payments``).

    Raises:
        ExampleRepoError: the repo or that source does not check.
    """
    return _example_source(name, (repo or example_repo()).resolve())


@lru_cache(maxsize=8)
def _example_source(name: str, repo: Path) -> PlanSource:
    from headwater.registry.load import load_repo
    from headwater.registry.plans import plan_source
    from headwater.registry.sources import check_sources

    loaded = load_repo(repo)
    compiled = check_sources(repo, loaded.sources, loaded.diagnostics)
    if name not in compiled:
        problems = "; ".join(d.message for d in loaded.diagnostics.errors) or "no such source"
        msg = f"example repo {repo}: source {name!r} does not check: {problems}"
        raise ExampleRepoError(msg)
    return plan_source(compiled[name])


def event_datetime(event: BehaviorEvent) -> datetime:
    """Return the event time as a timezone-aware UTC datetime."""
    return datetime.fromtimestamp(event["event_time"] / 1000, tz=UTC)
