"""What the nearline tier runs, read from the applied plan: per source, its views, rules and topics.

Everything comes from the plan's sources (:class:`~headwater.registry.plans.PlanSource`): the topic,
the field the topic is keyed by, the event-time rules, the event-id field. Per source, a view whose
entity join key is the source's ``key`` is computed by the tasks of the source's partitions (stage
A); any other join key (or every view of a source without a key) is computed behind a repartition
by that key (stage B, ``repartition.py``). Internal topics are named after the consumer group and
the source, so the sources of one group never share a topic:

- ``<group>-<source>-changelog``: stage A's state, partition = source partition;
- ``<group>-<source>-by-<field>``: the source's events keyed by ``field``;
- ``<group>-<source>-by-<field>-changelog``: stage B's state.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kafka.admin import ConfigResource, ConfigResourceType

from headwater.pipelines import kafka as kafka_clients
from headwater.pipelines.events.timing import SourceTiming
from headwater.pipelines.nearline.repartition import repartition_changelog, repartition_topic
from headwater.pipelines.nearline.task import EVENT_ID, EVENT_TIME
from headwater.pipelines.settings import Settings
from headwater.pipelines.store import ViewLayout
from headwater.pipelines.topics import ensure_topics
from headwater.pipelines.windows import ViewSpec, compile_view, view_layout
from headwater.registry.errors import HeadwaterError
from headwater.registry.plans import PlanSource, TierPlan, read_plan

if TYPE_CHECKING:
    from headwater.pipelines.nearline.runner import NearlineConfig

log = logging.getLogger("headwater.nearline")
DAY_MS = 86_400_000
OUTAGE_BUDGET_MS = DAY_MS
"""How long stage B (the repartitioned views) may be down or behind without losing forwarded events."""


class NearlinePlanError(HeadwaterError, ValueError):
    """The applied nearline plan cannot run (no views, an unknown --source, a missing topic)."""


def changelog_topic(group: str, source: str) -> str:
    """Return the compacted changelog topic of the stage-A stores of ``source`` in ``group``."""
    return f"{group}-{source}-changelog"


@dataclass(frozen=True)
class SourcePlan:
    """One source of the plan and the nearline views over it."""

    source: PlanSource
    timing: SourceTiming
    views: tuple[ViewSpec, ...]
    """Views keyed by the source's ``key``, computed by the source's partition tasks."""
    repartitioned: dict[str, tuple[ViewSpec, ...]] = dataclasses.field(default_factory=dict)
    """Join key -> views keyed by it, computed behind a repartition (see ``repartition.py``)."""

    @property
    def name(self) -> str:
        """The source's name."""
        return self.source.name

    @property
    def topic(self) -> str:
        """The source's topic."""
        return self.source.topic

    def all_views(self) -> list[ViewSpec]:
        """Every view over the source, stage A's first."""
        return [*self.views, *(v for vs in self.repartitioned.values() for v in vs)]

    def repartition_retention_ms(self) -> int:
        """Return the retention a repartition topic needs: longest window + lateness + outage budget.

        Stage B restores its state from its own changelog, so in normal operation the topic only
        has to hold what stage B has not consumed yet (``OUTAGE_BUDGET_MS``, a day). To rebuild a
        stage B whose local state AND changelog were lost (a new ``--group`` reading an old stage
        A, a deleted changelog topic), it must also hold every event a value still depends on:
        the longest window of the repartitioned views plus the allowed lateness (events that
        late are still folded).
        """
        longest = max((v.longest_window_ms for vs in self.repartitioned.values() for v in vs), default=0)
        return longest + self.timing.allowed_lateness_ms + OUTAGE_BUDGET_MS


def source_plan(source: PlanSource, views: Sequence[ViewSpec]) -> SourcePlan:
    """Split ``views`` (all over ``source``) into stage A's and the repartitioned ones.

    Raises:
        NearlinePlanError: a field of the source has a name the window code reserves with another
            meaning (see :func:`reserved_name_clash`).
    """
    clash = reserved_name_clash(source)
    if clash is not None:
        raise NearlinePlanError(clash)
    own: list[ViewSpec] = []
    others: dict[str, list[ViewSpec]] = {}
    for spec in views:
        if source.key is not None and spec.join_key == source.key:
            own.append(spec)
        else:
            others.setdefault(spec.join_key, []).append(spec)
            log.info(
                "view %s is keyed by %s, source %s by %s: computed behind a repartition",
                spec.name,
                spec.join_key,
                source.name,
                source.key,
            )
    return SourcePlan(
        source, SourceTiming.of(source), tuple(own), {k: tuple(vs) for k, vs in sorted(others.items())}
    )


def reserved_name_clash(source: PlanSource) -> str | None:
    """Return why ``source`` cannot run in nearline because of a field name, or None.

    The window code reads an event's time (UTC ms) as ``event_time`` and its identity as
    ``event_id``; the nearline task sets both from the source's own fields. A source field of one
    of those names with another meaning would be overwritten, so it is refused here.
    """
    time_field = source.field(EVENT_TIME)
    if time_field is not None and (source.event_time != EVENT_TIME or source.event_time_unit != "ms"):
        return (
            f"source {source.name!r}: field {EVENT_TIME!r} is not the source's event time in ms (event_time: "
            f"{source.event_time}, unit {source.event_time_unit}); the nearline window code reserves that "
            "name for the event time in ms: rename the field in the schema"
        )
    if source.field(EVENT_ID) is not None and source.event_id != EVENT_ID:
        return (
            f"source {source.name!r}: field {EVENT_ID!r} is not the source's event_id ({source.event_id}); "
            "the nearline window code reserves that name for the event id: declare it as `event_id` in "
            "sources.yaml or rename the field in the schema"
        )
    return None


@dataclass(frozen=True)
class NearlinePlan:
    """The compiled nearline views per source and their online layouts."""

    registry_hash: str
    sources: tuple[SourcePlan, ...]
    layouts: dict[str, ViewLayout]

    @classmethod
    def from_plan(cls, plan: TierPlan, only: Sequence[str] = ()) -> NearlinePlan:
        """Compile ``plan``: every source with a nearline view (``only``: just the sources named).

        Raises:
            NearlinePlanError: the plan has no view (over the chosen sources), a view reads a source
                the plan does not carry, ``only`` names a source without nearline views, or a
                source's field names clash with the window code's (:func:`reserved_name_clash`).
        """
        by_source: dict[str, list[ViewSpec]] = {}
        for pv in plan.views:
            by_source.setdefault(pv.source, []).append(compile_view(pv))
        carried = {s.name: s for s in plan.sources}
        missing = sorted(set(by_source) - set(carried))
        if missing:
            msg = (
                f"the nearline plan ({plan.registry_hash}) has views over {missing} but no such source; "
                "re-run `headwater apply`"
            )
            raise NearlinePlanError(msg)
        unknown = sorted(set(only) - set(by_source))
        if unknown:
            msg = (
                f"--source {', '.join(unknown)}: no nearline view reads it; sources with nearline views: "
                f"{sorted(by_source) or 'none'}"
            )
            raise NearlinePlanError(msg)
        names = sorted(n for n in by_source if not only or n in only)
        if not names:
            msg = f"the applied nearline plan ({plan.registry_hash}) has no view"
            raise NearlinePlanError(msg)
        sources = tuple(source_plan(carried[n], by_source[n]) for n in names)
        topics = [s.topic for s in sources]
        if len(set(topics)) != len(topics):
            msg = f"two nearline sources read one topic ({topics}); give each source its own topic"
            raise NearlinePlanError(msg)
        layouts = {v.name: view_layout(v) for s in sources for v in s.all_views()}
        return cls(plan.registry_hash, sources, layouts)

    def source(self, name: str) -> SourcePlan:
        """Return the plan of source ``name``.

        Raises:
            KeyError: no nearline view reads ``name``.
        """
        found = next((s for s in self.sources if s.name == name), None)
        if found is None:
            msg = f"no nearline view reads source {name!r}; sources: {[s.name for s in self.sources]}"
            raise KeyError(msg)
        return found

    @classmethod
    def load(cls, config: NearlineConfig) -> NearlinePlan:
        """Read the applied plan and make sure every internal topic exists (see :func:`ensure_changelog`)."""
        plan = cls.from_plan(read_plan(config.plan_dir, "nearline"), config.sources)
        for sp in plan.sources:
            ensure_changelog(config, sp)
        return plan


def ensure_changelog(config: NearlineConfig, sp: SourcePlan) -> None:
    """Create the source's changelog (compacted) and, per repartition key, its topic and changelog.

    Every topic gets the source topic's partition count. A repartition topic keeps its records
    :meth:`SourcePlan.repartition_retention_ms`; an existing one with a shorter retention is
    raised to it (a longer one is left as the operator set it).

    Raises:
        NearlinePlanError: the source's topic does not exist.
    """
    s = config.settings
    consumer = kafka_clients.consumer(s.kafka_bootstrap)
    try:
        parts = consumer.partitions_for_topic(sp.topic)
    finally:
        consumer.close()
    if not parts:
        msg = (
            f"topic {sp.topic!r} of source {sp.name!r} (features/sources.yaml) does not exist at "
            f"{s.kafka_bootstrap}; create it (`headwater topics create`, or your own tooling) before the tier"
        )
        raise NearlinePlanError(msg)
    configs = {"cleanup.policy": "compact", "min.compaction.lag.ms": "60000", "segment.ms": "600000"}
    retention_ms = sp.repartition_retention_ms()
    topics = {changelog_topic(config.group_id, sp.name): configs}
    for key in sp.repartitioned:
        topics[repartition_topic(config.group_id, sp.name, key)] = {"retention.ms": str(retention_ms)}
        topics[repartition_changelog(config.group_id, sp.name, key)] = configs
    created = ensure_topics(s, topics, partitions=len(parts))
    old = [repartition_topic(config.group_id, sp.name, k) for k in sp.repartitioned]
    raise_retention(s, [t for t in old if t not in created], retention_ms)


def raise_retention(settings: Settings, topics: list[str], retention_ms: int) -> None:
    """Set ``retention.ms`` of each topic to ``retention_ms`` where it is shorter (or unset)."""
    if not topics:
        return
    admin = kafka_clients.admin(settings.kafka_bootstrap, client_id="headwater-admin")
    try:
        found = admin.describe_configs(
            [ConfigResource(ConfigResourceType.TOPIC, t, {"retention.ms": None}) for t in topics]
        ).get("topic", {})
        short = [t for t in topics if _retention(found.get(t, {})) < retention_ms]
        if short:
            admin.alter_configs(
                [
                    ConfigResource(ConfigResourceType.TOPIC, t, {"retention.ms": str(retention_ms)})
                    for t in short
                ]
            )
            log.info(
                "retention.ms of %s raised to %d (longest window + lateness + a day)", short, retention_ms
            )
    finally:
        admin.close()


def _retention(configs: dict[str, Any]) -> int:
    value = int(configs.get("retention.ms", {}).get("value", -1))
    return 2**62 if value < 0 else value  # -1: kept forever
