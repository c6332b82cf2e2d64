"""A source's event-time rules, one definition for every tier that reads its topic.

Each record is judged in its partition's offset order, after decoding and the field rules:

- ``future_dated``: its event time is more than ``max_future_ms`` ahead of the reading tier's clock;
- ``late``: its event time is before the partition's *horizon*: the greatest event time of the
  partition's accepted records, each counted at most at the wall clock when it was read, minus the
  source's ``max_out_of_orderness_ms`` and ``allowed_lateness_ms``. Only an accepted record moves
  that greatest time, and an accepted record from the near future moves it only up to the clock, so
  one event minutes ahead cannot make the normal events after it late (issue 16).

The nearline tier applies it per record (``pipelines/nearline/task.py``), the landing per column
(``pipelines/offline/landing_batch.py`` ``late_mask``), and the realtime tier in the JVM
(``LateCheck``), whose tests compare it with :func:`late_verdicts`. The limits come from the plan's
source, where the registry resolved them (:mod:`headwater.registry.sources` holds the defaults).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from headwater.registry.plans import PlanSource


@dataclass(frozen=True)
class SourceTiming:
    """Event-time limits of one source, in ms (from the plan's source: :meth:`of`)."""

    max_out_of_orderness_ms: int
    """The watermark trails the partition's greatest event time by this much."""
    allowed_lateness_ms: int
    """An event older than the watermark minus this is a dead letter (``late``)."""
    max_future_ms: int
    """An event this far ahead of the wall clock is a dead letter (``future_dated``)."""

    @classmethod
    def of(cls, source: PlanSource) -> SourceTiming:
        """Return the timing the plan resolved for ``source``."""
        return cls(source.max_out_of_orderness_ms, source.allowed_lateness_ms, source.max_future_ms)

    @property
    def slack_ms(self) -> int:
        """How far behind the partition's greatest event time a record may be and still count."""
        return self.max_out_of_orderness_ms + self.allowed_lateness_ms

    def horizon(self, greatest_ms: int) -> int:
        """Return the horizon of a partition whose greatest accepted event time is ``greatest_ms``."""
        return greatest_ms - self.max_out_of_orderness_ms - self.allowed_lateness_ms

    def is_future(self, event_ms: int, now_ms: int) -> bool:
        """Whether an event at ``event_ms`` is ``future_dated`` for a tier whose clock reads ``now_ms``."""
        return event_ms > now_ms + self.max_future_ms


def counted_time(event_ms: int, now_ms: int) -> int:
    """Return what an accepted event adds to its partition's greatest event time: at most the clock."""
    return event_ms if event_ms <= now_ms else now_ms


def late_verdicts(
    records: Iterable[tuple[int, int, int]], timing: SourceTiming, greatest: dict[int, int] | None = None
) -> list[bool]:
    """Return the ``late`` verdict of each record, one at a time, as this module's rule defines it.

    ``records``: records that passed decoding, the field rules and the future check, as (partition,
    event time ms, clock ms when read), in the order each partition's records are read (offset order;
    partitions may interleave). ``greatest``: each partition's greatest counted event time, the state a
    tier keeps between batches; updated in place (a new one when None). This is the rule's plain
    statement; the tiers apply it their own faster ways, and tests compare them with it.
    """
    if greatest is None:
        greatest = {}
    verdicts = []
    for partition, event_ms, now_ms in records:
        known = greatest.get(partition)
        late = known is not None and event_ms < timing.horizon(known)
        verdicts.append(late)
        if not late:
            counted = counted_time(event_ms, now_ms)
            if known is None or counted > known:
                greatest[partition] = counted
    return verdicts
