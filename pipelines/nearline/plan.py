"""What the nearline tier runs, read from the applied plan: views, event-time rules, layouts, topics."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kafka import KafkaAdminClient, KafkaConsumer
from kafka.admin import ConfigResource, ConfigResourceType

from headwater.pipelines.nearline.repartition import repartition_changelog, repartition_topic
from headwater.pipelines.nearline.task import SourceTiming
from headwater.pipelines.settings import Settings
from headwater.pipelines.store import ViewLayout
from headwater.pipelines.topics import ensure_topics
from headwater.pipelines.windows import ViewSpec, compile_view, view_layout
from headwater.registry.plans import TierPlan, read_plan

if TYPE_CHECKING:
    from headwater.pipelines.nearline.runner import NearlineConfig

log = logging.getLogger("headwater.nearline")
DAY_MS = 86_400_000
OUTAGE_BUDGET_MS = DAY_MS
"""How long stage B (the repartitioned views) may be down or behind without losing forwarded events."""
PARTITION_KEY = "user_id"
"""The field the ``events`` topic is keyed (partitioned) by."""


class NearlinePlanError(ValueError):
    """The applied nearline plan cannot run (no views, several sources)."""


@dataclass(frozen=True)
class NearlinePlan:
    """The compiled nearline views, their source timing and online layouts."""

    registry_hash: str
    views: tuple[ViewSpec, ...]
    """Views keyed by the topic's key, computed by the events tasks."""
    timing: SourceTiming
    layouts: dict[str, ViewLayout]
    repartitioned: dict[str, tuple[ViewSpec, ...]] = dataclasses.field(default_factory=dict)
    """Join key -> views keyed by it, computed behind a repartition (see ``repartition.py``)."""

    @classmethod
    def from_plan(cls, plan: TierPlan) -> NearlinePlan:
        """Compile ``plan``; views keyed by another field than the topic key go behind a repartition."""
        views: list[ViewSpec] = []
        others: dict[str, list[ViewSpec]] = {}
        for pv in plan.views:
            spec = compile_view(pv)
            if spec.join_key == PARTITION_KEY:
                views.append(spec)
            else:
                others.setdefault(spec.join_key, []).append(spec)
                log.info("view %s is keyed by %s: computed behind a repartition", pv.name, spec.join_key)
        if not views and not others:
            msg = f"the applied nearline plan ({plan.registry_hash}) has no view"
            raise NearlinePlanError(msg)
        sources = {pv.source for pv in plan.views}
        if len(sources) != 1:
            msg = f"the nearline tier reads one source; the plan uses {sorted(sources)}"
            raise NearlinePlanError(msg)
        src = next(s for s in plan.sources if s.name in sources)
        timing = SourceTiming(
            max_out_of_orderness_ms=round((src.max_out_of_orderness_s or 0) * 1000),
            allowed_lateness_ms=None
            if src.allowed_lateness_s is None
            else round(src.allowed_lateness_s * 1000),
        )
        every = views + [v for vs in others.values() for v in vs]
        layouts = {v.name: view_layout(v, plan.registry_hash) for v in every}
        repartitioned = {k: tuple(vs) for k, vs in others.items()}
        return cls(plan.registry_hash, tuple(views), timing, layouts, repartitioned)

    def repartition_retention_ms(self) -> int:
        """Return the retention a repartition topic needs: longest window + lateness + outage budget.

        Stage B restores its state from its own changelog, so in normal operation the topic only
        has to hold what stage B has not consumed yet (``OUTAGE_BUDGET_MS``, a day). To rebuild a
        stage B whose local state AND changelog were lost (a new ``--group`` reading an old stage
        A, a deleted changelog topic), it must also hold every event a value still depends on:
        the longest window of the repartitioned views plus the allowed lateness (events that
        late are still folded). A source without allowed lateness counts one more longest window.
        """
        longest = max((v.longest_window_ms for vs in self.repartitioned.values() for v in vs), default=0)
        late = self.timing.allowed_lateness_ms
        return longest + (longest if late is None else late) + OUTAGE_BUDGET_MS

    @classmethod
    def load(cls, config: NearlineConfig) -> NearlinePlan:
        """Read the applied plan and make sure the changelog topic exists (compacted, like events)."""
        plan = cls.from_plan(read_plan(config.plan_dir, "nearline"))
        ensure_changelog(config, tuple(plan.repartitioned), plan.repartition_retention_ms())
        return plan


def ensure_changelog(
    config: NearlineConfig, keys: tuple[str, ...] = (), retention_ms: int = 2 * DAY_MS
) -> None:
    """Create the changelog (compacted) and, per repartition key, its topic and changelog.

    Every topic gets the events topic's partition count. A repartition topic keeps its records
    ``retention_ms`` (:meth:`NearlinePlan.repartition_retention_ms`); an existing one with a
    shorter retention is raised to it (a longer one is left as the operator set it).
    """
    s = config.settings
    consumer = KafkaConsumer(bootstrap_servers=s.kafka_bootstrap)
    try:
        parts = consumer.partitions_for_topic(s.events_topic)
    finally:
        consumer.close()
    if not parts:
        msg = f"topic {s.events_topic!r} does not exist at {s.kafka_bootstrap}; run `headwater topics create`"
        raise NearlinePlanError(msg)
    configs = {"cleanup.policy": "compact", "min.compaction.lag.ms": "60000", "segment.ms": "600000"}
    topics = {config.changelog_topic: configs}
    for key in keys:
        topics[repartition_topic(config.group_id, key)] = {"retention.ms": str(retention_ms)}
        topics[repartition_changelog(config.group_id, key)] = configs
    created = ensure_topics(s, topics, partitions=len(parts))
    old = [repartition_topic(config.group_id, k) for k in keys]
    raise_retention(s, [t for t in old if t not in created], retention_ms)


def raise_retention(settings: Settings, topics: list[str], retention_ms: int) -> None:
    """Set ``retention.ms`` of each topic to ``retention_ms`` where it is shorter (or unset)."""
    if not topics:
        return
    admin = KafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap, client_id="headwater-admin")
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
