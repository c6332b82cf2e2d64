"""One landing batch in columns: raw Kafka records decoded, classified and turned into Arrow once.

Per record only what must be per record runs in Python: the codec's decode (header check, the
fastavro read, field validation), with the codec of the records' own source. Everything after it is
columnar: the Arrow table (the source's bronze columns, :mod:`.source_columns`) is built in one call
from the decoded events, and the event-time rules (future-dated, late) are numpy arithmetic over the
event times in ms, per partition, in offset order.

Rules, as the streaming tiers apply them (:mod:`headwater.pipelines.events.timing`), with the source's limits:

- future-dated: ``event time > now + max_future_ms`` -> dead letter ``future_dated``, not landed,
  and it does not move the watermark (one such event would make every later one look late);
- late: ``event time < watermark - allowed_lateness`` where the watermark is the partition's max
  event time seen before this event minus ``max_out_of_orderness`` -> dead letter ``late``, and
  landed flagged ``late = true`` (the feature jobs skip it);
- time from the future does not move the watermark past the landing clock: an accepted event ahead
  of ``now`` (up to ``max_future_ms``) is landed, but it counts as ``now`` in the partition's max
  event time, as in the realtime and nearline tiers (else one event 4 min ahead would make the
  normal events after it late: issue 16).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from headwater.pipelines.events.codec import DecodedEvent, EventCodec, Reason
from headwater.pipelines.events.timing import SourceTiming
from headwater.pipelines.offline.source_columns import META_COLUMNS, event_schema

if TYPE_CHECKING:
    from kafka.consumer.fetcher import ConsumerRecord


@dataclass
class Rejected:
    """A record to dead-letter: the record, the reason and a detail for people."""

    record: ConsumerRecord
    reason: str
    detail: str


@dataclass
class DecodedChunk:
    """Decoded records of one poll: the good events as Arrow rows, the rejected ones, the positions."""

    table: pa.Table
    rejected: list[Rejected] = field(default_factory=list)
    next_offsets: dict[int, int] = field(default_factory=dict)


def decode_records(
    codec: EventCodec,
    records: Sequence[ConsumerRecord],
    rules: SourceTiming,
    max_event_ms: dict[int, int],
    now_ms: int,
) -> DecodedChunk:
    """Decode ``records`` (offset order per partition) into bronze rows; update ``max_event_ms``.

    Steps: 1. decode each record, keeping the good events and the malformed ones; 2. build the
    Arrow columns once; 3. drop the future-dated rows; 4. flag the late rows against the
    per-partition watermark, advancing ``max_event_ms`` in place.
    """
    # Step 1
    events: list[Any] = []
    kept: list[ConsumerRecord] = []
    produce_ts: list[int | None] = []
    event_times: list[int] = []
    rejected: list[Rejected] = []
    next_offsets: dict[int, int] = {}
    decode = codec.decode
    for record in records:
        next_offsets[record.partition] = record.offset + 1
        decoded = decode(record.value, record.headers)
        if isinstance(decoded, DecodedEvent):
            events.append(decoded.event)
            kept.append(record)
            produce_ts.append(decoded.produce_ts_ms)
            event_times.append(decoded.event_time_ms)
        else:
            rejected.append(Rejected(record, str(decoded.reason), decoded.detail))
    # Step 2
    table = _bronze_table(event_schema(codec.source), events, kept, produce_ts)
    # Step 3
    name = codec.source.event_time
    times = np.asarray(event_times, dtype=np.int64)
    future = times > now_ms + rules.max_future_ms  # SourceTiming.is_future, over the column
    for i in np.flatnonzero(future):
        ahead = (int(times[i]) - now_ms) / 1000
        detail = (f"{name} {int(times[i])} ms is {ahead:.1f} s ahead of the landing clock "
                  f"(at most {rules.max_future_ms / 1000:g} s allowed)")  # fmt: skip
        rejected.append(Rejected(kept[i], str(Reason.FUTURE_DATED), detail))
    if future.any():
        keep = ~future
        table = table.filter(pa.array(keep))
        kept = [r for r, k in zip(kept, keep, strict=True) if k]
        times = times[keep]
    # Step 4
    partitions = table.column("kafka_partition").to_numpy()
    late = late_mask(times, partitions, rules, max_event_ms, now_ms)
    for i in np.flatnonzero(late):
        detail = (
            f"{name} {int(times[i])} ms is behind the partition watermark by more than the allowed lateness"
        )
        rejected.append(Rejected(kept[i], str(Reason.LATE), detail))
    table = table.set_column(table.schema.get_field_index("late"), "late", pa.array(late, pa.bool_()))
    return DecodedChunk(table, rejected, next_offsets)


def late_mask(
    times: np.ndarray[Any, Any],
    partitions: np.ndarray[Any, Any],
    rules: SourceTiming,
    max_event_ms: dict[int, int],
    now_ms: int,
) -> np.ndarray[Any, Any]:
    """Which events are late; ``max_event_ms`` (per partition) advances to the max time seen.

    The max counts each event at ``min(event time, now_ms)``: the future is accepted but not
    trusted, so the watermark never passes the landing clock (module docstring).
    """
    late = np.zeros(len(times), dtype=bool)
    slack = rules.slack_ms
    for part in np.unique(partitions):
        idx = np.flatnonzero(partitions == part)
        ts = times[idx]
        start = max_event_ms.get(int(part))
        if start is not None and start > now_ms:  # a checkpoint from before this rule or a faster clock
            start = now_ms
        running = np.maximum.accumulate(np.minimum(ts, now_ms))
        before = np.empty_like(ts)
        before[0] = start if start is not None else np.iinfo(np.int64).min + slack
        before[1:] = running[:-1]
        if start is not None:
            np.maximum(before, start, out=before)
        late[idx] = ts < before - slack
        top = int(running[-1])
        max_event_ms[int(part)] = top if start is None else max(start, top)
    return late


def _bronze_table(
    schema: pa.Schema, events: list[Any], kept: list[ConsumerRecord], produce_ts: list[int | None]
) -> pa.Table:
    base = pa.Table.from_pylist(events, schema=schema)
    n = len(kept)
    extra = {
        "produce_ts_ms": pa.array(produce_ts, pa.int64()),
        "kafka_topic": pa.array([r.topic for r in kept], pa.string()),
        "kafka_partition": pa.array([r.partition for r in kept], pa.int32()),
        "kafka_offset": pa.array([r.offset for r in kept], pa.int64()),
        "late": pa.array(np.zeros(n, dtype=bool), pa.bool_()),
    }
    for name, column in extra.items():
        base = base.append_column(META_COLUMNS.field(name), column)
    return base
