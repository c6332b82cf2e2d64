"""What the nearline tier runs, read from the applied plan: views, event-time rules, layouts, topics."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kafka import KafkaConsumer

from headwater.pipelines.nearline.repartition import repartition_changelog, repartition_topic
from headwater.pipelines.nearline.task import SourceTiming
from headwater.pipelines.store import ViewLayout
from headwater.pipelines.topics import ensure_topics
from headwater.pipelines.windows import ViewSpec, compile_view, view_layout
from headwater.registry.plans import TierPlan, read_plan

if TYPE_CHECKING:
    from headwater.pipelines.nearline.runner import NearlineConfig

log = logging.getLogger("headwater.nearline")
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

    @classmethod
    def load(cls, config: NearlineConfig) -> NearlinePlan:
        """Read the applied plan and make sure the changelog topic exists (compacted, like events)."""
        plan = cls.from_plan(read_plan(config.plan_dir, "nearline"))
        ensure_changelog(config, tuple(plan.repartitioned))
        return plan


def ensure_changelog(config: NearlineConfig, keys: tuple[str, ...] = ()) -> None:
    """Create the changelog (compacted) and, per repartition key, its topic and changelog.

    Every topic gets the events topic's partition count.
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
    for key in keys:  # stage A -> stage B topic (kept a day: a stage B down longer loses events)
        topics[repartition_topic(config.group_id, key)] = {"retention.ms": str(86_400_000)}
        topics[repartition_changelog(config.group_id, key)] = configs
    ensure_topics(s, topics, partitions=len(parts))
