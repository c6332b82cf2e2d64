"""Where the offline tier's Delta tables live.

The lake root comes from :func:`lake_root`. Under it: ``bronze/<source>`` (one table per source of the
plan: its landed and imported events, columns from its schema, see :mod:`.source_columns`) and
``features/<view>`` (one table per feature view), ``tiles/<view>/<version>`` (a tiled view's daily
partial aggregates, :mod:`.tile_table`); for a ``late: heal`` view also ``features_healed/<view>`` and
``tiles_healed/<view>/<version>``, the same with the late events counted (:mod:`.heal`). Day
arithmetic is in UTC epoch milliseconds; a bronze ``date`` partition is the UTC date of its source's
event time.
"""

from __future__ import annotations

import os
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

from headwater.registry.config import lake_dir

DAY_MS = 86_400_000
FEATURE_TIME = "event_time"
"""Column of a feature table (``features/<view>``) holding the boundary T its row's values are as of."""


def lake_root(lake: str | os.PathLike[str] | None = None) -> Path:
    """Return the lake folder: the argument (``--lake``), else the resolved one.

    That is ``$HEADWATER_LAKE``, else ``lake`` in the repo's headwater.yaml, else ``lake/`` in the
    state folder (:func:`headwater.registry.config.lake_dir`).
    """
    return lake_dir(lake)


def bronze_path(lake: Path, source: str) -> Path:
    """Return the bronze table of the source named ``source``."""
    return lake / "bronze" / source


def feature_path(lake: Path, view: str) -> Path:
    """Return the feature table of ``view``."""
    return lake / "features" / view


def tiles_path(lake: Path, view: str, version: str) -> Path:
    """Return the daily tiles table of ``view`` at ``version`` (a new version starts new tiles)."""
    return lake / "tiles" / view / (version or "unversioned")


def healed_path(lake: Path, view: str) -> Path:
    """Return the healed values of a ``late: heal`` view: its feature table with the late events counted."""
    return lake / "features_healed" / view


def healed_tiles_path(lake: Path, view: str, version: str) -> Path:
    """Return the daily tiles of a ``late: heal`` view's healed values (late rows counted)."""
    return lake / "tiles_healed" / view / (version or "unversioned")


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
