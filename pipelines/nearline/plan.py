"""What the nearline tier runs, read from the applied plan: views, event-time rules, layouts, topics."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from headwater.pipelines.nearline.task import SourceTiming
from headwater.pipelines.store import ViewLayout
from headwater.pipelines.topics import ensure_topics
from headwater.pipelines.windows import ViewSpec, compile_view, view_layout
from headwater.registry.plans import TierPlan, read_plan
from kafka import KafkaConsumer

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
    skipped: tuple[str, ...]
    timing: SourceTiming
    layouts: dict[str, ViewLayout]

    @classmethod
    def from_plan(cls, plan: TierPlan) -> NearlinePlan:
        """Compile ``plan``; views keyed by another field than the topic key are skipped (see report)."""
        views, skipped = [], []
        for pv in plan.views:
            spec = compile_view(pv)
            if spec.join_key == PARTITION_KEY:
                views.append(spec)
            else:
                skipped.append(pv.name)
                log.warning(
                    "view %s (%s) is keyed by %s but events are partitioned by %s: a repartition stage is "
                    "not built yet, so the nearline tier does not compute it",
                    pv.name,
                    pv.defined_at,
                    spec.join_key,
                    PARTITION_KEY,
                )
        if not views:
            msg = f"the applied nearline plan ({plan.registry_hash}) has no view keyed by {PARTITION_KEY}"
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
        layouts = {v.name: view_layout(v, plan.registry_hash) for v in views}
        return cls(plan.registry_hash, tuple(views), tuple(skipped), timing, layouts)

    @classmethod
    def load(cls, config: NearlineConfig) -> NearlinePlan:
        """Read the applied plan and make sure the changelog topic exists (compacted, like events)."""
        plan = cls.from_plan(read_plan(config.plan_dir, "nearline"))
        ensure_changelog(config)
        return plan


def ensure_changelog(config: NearlineConfig) -> None:
    """Create ``<group>-changelog`` with the events topic's partition count and cleanup.policy=compact."""
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
    ensure_topics(s, {config.changelog_topic: configs}, partitions=len(parts))
