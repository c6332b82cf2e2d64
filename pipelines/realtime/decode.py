"""Decode Kafka records into the flat rows the Flink SQL job aggregates, in batches.

This is the only per-event Python of the realtime tier: the Flink job reads each record's raw
bytes and headers through the Kafka connector, hands them to a vectorised (pandas) UDF built on
:func:`decode_batch`, and does everything else (watermarks, filters, windows, aggregation) in
Flink's JVM operators. A record that does not decode keeps its place with a reason and a
detail, so the SQL job routes it to the dead-letter topic instead of failing.

Future-dated events (event time further ahead of this process's clock than ``max_future_ms``)
are rejected here too: one of them would push the watermark ahead and make every later event
look late.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from headwater.pipelines.events.codec import DecodeError, EventCodec, Reason

EVENT_COLUMNS: tuple[tuple[str, str], ...] = (
    ("event_id", "STRING"),
    ("user_id", "STRING"),
    ("item_id", "STRING"),
    ("event_type", "STRING"),
    ("event_time", "BIGINT"),
    ("session_id", "STRING"),
    ("category", "STRING"),
    ("price", "DOUBLE"),
    ("dwell_ms", "BIGINT"),
    ("query", "STRING"),
    ("position", "INT"),
    ("device", "STRING"),
)
"""The event's fields as Flink SQL columns, in Avro order."""

DECODED_COLUMNS: tuple[tuple[str, str], ...] = (
    ("reason", "STRING"),
    ("detail", "STRING"),
    *EVENT_COLUMNS,
)
"""What the decode UDF returns per record: a reason (NULL when the record is good), then the event."""

DEFAULT_MAX_FUTURE_MS = 5 * 60 * 1000


@dataclass(frozen=True)
class DecodedBatch:
    """Column-wise decode results of a batch of records (one list per :data:`DECODED_COLUMNS`)."""

    columns: dict[str, list[object]]

    def __len__(self) -> int:
        return len(self.columns["reason"])


def decode_batch(
    codec: EventCodec,
    values: Sequence[bytes | None],
    headers: Sequence[Mapping[str, bytes | None] | None],
    max_future_ms: int = DEFAULT_MAX_FUTURE_MS,
    now_ms: int | None = None,
) -> DecodedBatch:
    """Decode ``values`` with their ``headers``; bad records get a reason and a zero event time.

    The event time of a rejected record is 0 (1970): it never moves the watermark and never
    reaches a window, since the job sends every row with a reason to the dead-letter topic.
    """
    now = time.time_ns() // 1_000_000 if now_ms is None else now_ms
    cols: dict[str, list[object]] = {name: [] for name, _ in DECODED_COLUMNS}
    reasons, details = cols["reason"], cols["detail"]
    event_cols = [(name, cols[name]) for name, _ in EVENT_COLUMNS]
    for value, hdrs in zip(values, headers, strict=True):
        result = codec.decode(value, list(hdrs.items()) if hdrs is not None else None)
        if isinstance(result, DecodeError):
            _reject(cols, str(result.reason), result.detail)
            continue
        event = result.event
        if event["event_time"] > now + max_future_ms:
            ahead = (event["event_time"] - now) / 1000
            detail = (
                f"event_time {event['event_time']} is {ahead:.1f} s ahead of the realtime tier's clock "
                f"(at most {max_future_ms / 1000:g} s allowed)"
            )
            _reject(cols, str(Reason.FUTURE_DATED), detail)
            continue
        reasons.append(None)
        details.append(None)
        fields: Mapping[str, object] = event  # a TypedDict read by column name
        for name, col in event_cols:
            col.append(fields[name])
    return DecodedBatch(cols)


def _reject(cols: dict[str, list[object]], reason: str, detail: str) -> None:
    cols["reason"].append(reason)
    cols["detail"].append(detail)
    for name, _ in EVENT_COLUMNS:
        cols[name].append(0 if name == "event_time" else None)
