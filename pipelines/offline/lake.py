"""Where the offline tier's Delta tables live, and the bronze table's columns.

The lake root is ``<repo>/.headwater/lake`` by default (``$HEADWATER_LAKE`` or ``--lake``
override it). Under it: ``bronze/events`` (landed events) and ``features/<view>`` (one table per
feature view). Event times are UTC epoch milliseconds everywhere (``event_time``), the ``date``
partition column is the UTC date of ``event_time``.
"""

from __future__ import annotations

import os
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import pyarrow as pa

from headwater.registry.config import lake_dir

DAY_MS = 86_400_000
LAKE_ENV = "HEADWATER_LAKE"

BRONZE_SCHEMA = pa.schema(
    [
        ("event_id", pa.string()),
        ("user_id", pa.string()),
        ("item_id", pa.string()),
        ("event_type", pa.string()),
        ("event_time", pa.int64()),
        ("session_id", pa.string()),
        ("category", pa.string()),
        ("price", pa.float64()),
        ("dwell_ms", pa.int64()),
        ("query", pa.string()),
        ("position", pa.int64()),
        ("device", pa.string()),
        ("produce_ts_ms", pa.int64()),
        ("kafka_topic", pa.string()),
        ("kafka_partition", pa.int32()),
        ("kafka_offset", pa.int64()),
        ("late", pa.bool_()),
    ]
)
"""Columns of ``bronze/events`` (plus the ``date`` partition column Spark derives)."""

EVENT_COLUMNS = tuple(BRONZE_SCHEMA.names[:12])


def lake_root(lake: str | os.PathLike[str] | None = None) -> Path:
    """Return the lake folder: the argument (``--lake``), else the resolved one.

    That is ``$HEADWATER_LAKE``, else ``lake`` in the repo's headwater.yaml, else ``lake/`` in the
    state folder (:func:`headwater.registry.config.lake_dir`).
    """
    return lake_dir(lake)


def bronze_path(lake: Path) -> Path:
    """Return the bronze events table."""
    return lake / "bronze" / "events"


def feature_path(lake: Path, view: str) -> Path:
    """Return the feature table of ``view``."""
    return lake / "features" / view


def day_start_ms(day: date) -> int:
    """UTC midnight at the start of ``day``, in epoch ms."""
    return int(datetime(day.year, day.month, day.day, tzinfo=UTC).timestamp() * 1000)


def day_of_ms(ms: int) -> date:
    """Return the UTC date holding the instant ``ms``."""
    return datetime.fromtimestamp(ms / 1000, tz=UTC).date()


def days(first: date, last: date) -> list[date]:
    """Every date from ``first`` to ``last`` inclusive.

    Raises:
        ValueError: ``last`` is before ``first``.
    """
    if last < first:
        msg = f"backfill range: TO ({last}) is before FROM ({first}); give FROM <= TO"
        raise ValueError(msg)
    return [first + timedelta(days=i) for i in range((last - first).days + 1)]


def is_delta_table(path: Path) -> bool:
    """Whether ``path`` holds a Delta table (a ``_delta_log`` folder)."""
    return (path / "_delta_log").is_dir()
