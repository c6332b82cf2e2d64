"""Landing's configuration, its checkpoint (stored in the Delta commit) and its counters."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from headwater.pipelines.events.codec import Reason
from headwater.pipelines.offline.lake import is_delta_table
from headwater.registry.errors import HeadwaterError
from headwater.registry.plans import PlanSource

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

MARKER = "headwater_landing"
CHUNK_RECORDS = 50_000
"""Records per poll: decoded into Arrow at once, then released."""


class LandingError(HeadwaterError, RuntimeError):
    """Landing cannot go on (broker, topic or table problem); the message says what to do."""


class SourceTopicMissingError(LandingError):
    """The source's topic does not exist yet: nothing was ever produced to it (or it was never created).

    :func:`~headwater.pipelines.offline.landing.land_sources` skips such a source with this message
    (:attr:`LandingStats.skipped`) and lands the others.
    """


class BrokerUnavailableError(LandingError):
    """No Kafka broker answered; the lander retries for ``kafka_patience_s`` before raising it."""


@dataclass(frozen=True)
class LandingConfig:
    """Where to read (the source's topic, from the plan), where to write, and how big a batch is.

    The event-time rules are the source's own (:class:`PlanSource`), never a default of the landing.
    """

    bootstrap: str
    source: PlanSource
    dlq_topic: str
    table: Path
    batch_records: int = 1_000_000
    max_batch_s: float = 60.0
    workers: int = 1
    """Reader processes (each consumes and decodes its share of the partitions); 1 reads in-process."""
    poll_timeout_ms: int = 500
    kafka_patience_s: float = 120.0
    """How long a run retries while Kafka is unreachable (from the first failure) before it fails."""

    @property
    def topic(self) -> str:
        """The source's topic."""
        return self.source.topic

    @property
    def app_id(self) -> str:
        """The Delta ``txnAppId`` of this landing stream."""
        return f"{MARKER}:{self.topic}"


@dataclass
class Checkpoint:
    """What the last landing commit recorded: next offset and max event time per partition."""

    seq: int = 0
    offsets: dict[int, int] = field(default_factory=dict)
    max_event_ms: dict[int, int] = field(default_factory=dict)

    def metadata(self, app_id: str) -> str:
        """Return the commit's ``userMetadata`` JSON."""
        return json.dumps(
            {MARKER: 1, "app": app_id, "seq": self.seq,
             "offsets": {str(p): o for p, o in sorted(self.offsets.items())},
             "max_event_ms": {str(p): t for p, t in sorted(self.max_event_ms.items())}},
            separators=(",", ":"),
        )  # fmt: skip

    @classmethod
    def parse(cls, text: str, app_id: str) -> Checkpoint | None:
        """Return the checkpoint in a commit's ``userMetadata``, or None when it is not one of ``app_id``."""
        try:
            data = json.loads(text)
        except json.JSONDecodeError:
            return None
        if not isinstance(data, dict) or data.get(MARKER) != 1 or data.get("app") != app_id:
            return None
        return cls(
            seq=int(data["seq"]),
            offsets={int(p): int(o) for p, o in data["offsets"].items()},
            max_event_ms={int(p): int(t) for p, t in data["max_event_ms"].items()},
        )


@dataclass
class LandingStats:
    """Counts of one run."""

    batches: int = 0
    records: int = 0
    landed: int = 0
    late: int = 0
    future: int = 0
    malformed: int = 0
    seconds: float = 0.0
    reasons: dict[str, int] = field(default_factory=dict)
    retries: int = 0
    """Runs started again after a Kafka failure (each resumes from the table's checkpoint)."""
    skipped: str | None = None
    """Why the source was not landed (its topic does not exist yet); None when it was."""

    def count_reasons(self) -> None:
        """Set ``late``, ``future`` and ``malformed`` from the dead-letter ``reasons``."""
        self.late = self.reasons.get(Reason.LATE, 0)
        self.future = self.reasons.get(Reason.FUTURE_DATED, 0)
        self.malformed = sum(
            n for r, n in self.reasons.items() if r not in (Reason.LATE, Reason.FUTURE_DATED)
        )

    @property
    def records_per_s(self) -> float:
        """Kafka records handled per second."""
        return self.records / self.seconds if self.seconds > 0 else 0.0


def read_checkpoint(spark: SparkSession, config: LandingConfig) -> Checkpoint:
    """Return the checkpoint of the latest landing commit in the bronze table (empty when none)."""
    if not is_delta_table(config.table):
        return Checkpoint()
    from delta.tables import DeltaTable

    history = DeltaTable.forPath(spark, str(config.table)).history()
    rows = (
        history.where(history.userMetadata.contains(f'"app":"{config.app_id}"'))
        .orderBy(history.version.desc())
        .select("userMetadata")
        .limit(1)
        .collect()
    )
    if not rows:
        return Checkpoint()
    found = Checkpoint.parse(rows[0]["userMetadata"], config.app_id)
    return found if found is not None else Checkpoint()
