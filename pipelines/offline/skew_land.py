"""Land the service's prediction log (a Kafka topic of JSON records) in a Delta table, exactly once.

The table is ``<lake>/predictions/<topic>``: one row per logged answer, its Kafka position
(``kafka_partition``, ``kafka_offset``), the fields a query filters on (``request_id``, ``at_ms``,
``day``, ``user_id``, ``model_version``, ``fallback``, ``record_version``: the record's ``v``,
``view_versions``: the served ``{view: version}`` as JSON) and the whole record as JSON (``record``:
the model inputs with each value's event time, the scores, :func:`headwater.serving.skew.prediction_record`).

Old tables stay readable: the columns added with record version 2 (``record_version``,
``view_versions``) are merged into a table landed before them on its next append (Delta's
``mergeSchema``), null in the rows landed earlier; ``record`` is what the report reads, of any version.

Exactly once without a separate checkpoint: the positions live in the rows themselves, so one
Delta append commits the rows and the position they cover together; the next run resumes each
partition at ``max(kafka_offset) + 1``. A crash before the commit lands nothing (the records are
read again), a crash after it leaves the position past them. Two runs at once could both append
the same records, so a run holds the table's :class:`~.landing_lock.LandingLock` while it lands.

Why not the bronze lander (:mod:`.landing`): it decodes the Avro sources of the plan; the prediction
log is the service's own JSON, not a feature source, and declaring it in ``features/sources.yaml``
would make every tier consume it. Records that are not JSON objects are landed with ``record`` as
read and ``request_id`` null, and counted (``not_json``), never dropped: the skew report says so.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from headwater.pipelines import kafka as kafka_clients
from headwater.pipelines.offline.arrow_io import arrow_to_spark, staging_dir
from headwater.pipelines.offline.lake import is_delta_table
from headwater.pipelines.offline.landing_lock import LandingLock
from headwater.registry.errors import HeadwaterError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

SCHEMA = pa.schema(
    [
        ("kafka_partition", pa.int32()),
        ("kafka_offset", pa.int64()),
        ("request_id", pa.string()),
        ("at_ms", pa.int64()),
        ("day", pa.date32()),
        ("user_id", pa.string()),
        ("model_version", pa.string()),
        ("fallback", pa.string()),
        ("record", pa.string()),
        ("record_version", pa.int32()),
        ("view_versions", pa.string()),
    ]
)
"""The landed table's columns."""
MAX_AT_MS = int(datetime.max.replace(tzinfo=UTC).timestamp() * 1000)
"""The last millisecond a date holds (9999-12-31): a later ``at_ms`` lands as no time, not as a crash."""
BATCH_RECORDS = 50_000
"""Records per Delta commit (each commit holds the positions of its own rows)."""


class PredictionLandingError(HeadwaterError, ValueError):
    """The prediction topic cannot be landed; the message names the topic and what to do."""


@dataclass(frozen=True)
class LandedPredictions:
    """What one landing run did."""

    path: Path
    landed: int
    """Records appended by this run."""
    not_json: int
    """Of those, records that are not a JSON object (kept with a null request_id)."""
    total: int
    """Rows in the table after the run."""


def predictions_path(lake: Path, topic: str) -> Path:
    """Return the table of ``topic``'s landed predictions: ``<lake>/predictions/<topic>``."""
    if not re.fullmatch(r"[A-Za-z0-9._-]{1,249}", topic) or topic in (".", ".."):
        msg = f"topic {topic!r}: a Kafka topic name is 1-249 of letters, digits, '.', '_' and '-'"
        raise PredictionLandingError(msg)
    return lake / "predictions" / topic


def landed_positions(spark: SparkSession, path: Path) -> dict[int, int]:
    """Return ``{partition: next offset}`` of the records already in the table at ``path``."""
    if not is_delta_table(path):
        return {}
    from pyspark.sql import functions as F

    rows = (
        spark.read.format("delta")
        .load(str(path))
        .groupBy("kafka_partition")
        .agg(F.max("kafka_offset").alias("last"))
        .collect()
    )
    return {int(r["kafka_partition"]): int(r["last"]) + 1 for r in rows}


def row_of(partition: int, offset: int, value: bytes | None) -> dict[str, Any]:
    """Return the table row of one Kafka record (a record that is not a JSON object keeps its text)."""
    text = (value or b"").decode("utf-8", errors="replace")
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if not isinstance(data, dict):
        empty = dict.fromkeys(("request_id", "at_ms", "day", "user_id", "model_version", "fallback",
                               "record_version", "view_versions"))  # fmt: skip
        return {"kafka_partition": partition, "kafka_offset": offset, **empty, "record": text}
    at = data.get("at_ms")
    at_ms = at if isinstance(at, int) and not isinstance(at, bool) and 0 <= at <= MAX_AT_MS else None

    def text_of(key: str) -> str | None:
        value = data.get(key)
        # A JSON escape may hold a lone surrogate ("\\ud800"), which Arrow cannot store: it becomes "?".
        return None if value is None else str(value).encode("utf-8", "replace").decode("utf-8")

    return {
        "kafka_partition": partition,
        "kafka_offset": offset,
        "request_id": text_of("request_id"),
        "at_ms": at_ms,
        "day": None if at_ms is None else datetime.fromtimestamp(at_ms / 1000, UTC).date(),
        "user_id": text_of("user_id"),
        "model_version": text_of("model_version"),
        "fallback": text_of("fallback"),
        "record": text,
        "record_version": _record_version(data.get("v")),
        "view_versions": _view_versions(data.get("views")),
    }


def _record_version(v: object) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and 0 < v < 2**31 else None


def _view_versions(views: object) -> str | None:
    """``{view: version}`` of a record's ``views`` as JSON; None when the record has none (version 1)."""
    if not isinstance(views, dict):
        return None
    out = {str(k): str(v.get("version")) for k, v in views.items() if isinstance(v, dict)}
    return json.dumps(out, sort_keys=True).encode("utf-8", "replace").decode("utf-8")


def land_predictions(
    spark: SparkSession, bootstrap: str, topic: str, lake: Path, timeout_s: float = 10.0
) -> LandedPredictions:
    """Append the records of ``topic`` not yet landed to ``<lake>/predictions/<topic>``.

    Reads every partition from its landed position (the beginning when none) to the end offsets
    taken at the start, so a run ends even while the service keeps logging.

    Raises:
        PredictionLandingError: the topic does not exist, or Kafka stops answering before the end.
        LandingError: another process is landing the same table.
    """
    from kafka import TopicPartition

    path = predictions_path(lake, topic)
    with LandingLock(path, f"predictions:{topic}"):
        consumer = kafka_clients.consumer(
            bootstrap,
            enable_auto_commit=False,
            client_id="headwater-skew-landing",
            consumer_timeout_ms=int(timeout_s * 1000),
        )
        try:
            partitions = sorted(consumer.partitions_for_topic(topic) or ())
            if not partitions:
                msg = (
                    f"topic {topic!r} does not exist at {bootstrap}: enable `predictions` in the serving"
                    " config (it names the topic) and serve some requests first"
                )
                raise PredictionLandingError(msg)
            parts = [TopicPartition(topic, p) for p in partitions]
            start = landed_positions(spark, path)
            end = consumer.end_offsets(parts)
            begin = consumer.beginning_offsets(parts)
            first = {tp: max(start.get(tp.partition, 0), begin[tp]) for tp in parts}
            for tp in parts:  # landed past the end: the topic was created again, its offsets restarted at 0
                if start.get(tp.partition, 0) > end[tp]:
                    first[tp] = begin[tp]
            todo = [tp for tp in parts if first[tp] < end[tp]]
            landed = not_json = 0
            if todo:
                consumer.assign(todo)
                for tp in todo:
                    consumer.seek(tp, first[tp])
                rows: list[dict[str, Any]] = []
                left = set(todo)
                while left:
                    polled = consumer.poll(timeout_ms=int(timeout_s * 1000))
                    if not polled:
                        ends = ", ".join(f"{t.partition}: {end[t]}" for t in left)
                        msg = (
                            f"topic {topic!r}: Kafka at {bootstrap} returned nothing for {timeout_s:g} s"
                            f" before the end offsets ({ends}); this batch was not committed: run it again"
                        )
                        raise PredictionLandingError(msg)
                    for tp, records in polled.items():
                        for r in records:
                            if r.offset < end[tp]:
                                rows.append(row_of(tp.partition, r.offset, r.value))
                        if consumer.position(tp) >= end[tp]:
                            left.discard(tp)
                            consumer.pause(tp)
                    if len(rows) >= BATCH_RECORDS:
                        _append(spark, rows, path, lake)
                        landed += len(rows)
                        not_json += sum(1 for r in rows if r["request_id"] is None)
                        rows = []
                if rows:
                    _append(spark, rows, path, lake)
                    landed += len(rows)
                    not_json += sum(1 for r in rows if r["request_id"] is None)
        finally:
            consumer.close()
    total = spark.read.format("delta").load(str(path)).count() if is_delta_table(path) else 0
    return LandedPredictions(path, landed, not_json, total)


def _append(spark: SparkSession, rows: list[dict[str, Any]], path: Path, lake: Path) -> None:
    """One Delta commit: the rows and, with them, the positions the next run resumes from."""
    table = pa.Table.from_pylist(rows, schema=SCHEMA)
    with staging_dir(lake / "_staging") as folder:
        frame = arrow_to_spark(spark, table, folder)
        # mergeSchema: a table landed before record version 2 gains its columns (null in old rows).
        frame.write.format("delta").mode("append").option("mergeSchema", "true").save(str(path))


def read_landed(spark: SparkSession, path: Path, since_ms: int | None = None) -> DataFrame:
    """Return the landed rows at ``path`` (those at or after ``since_ms`` when given).

    Raises:
        PredictionLandingError: nothing was landed there.
    """
    if not is_delta_table(path):
        msg = f"{path}: no landed predictions; `headwater skew` lands the topic first"
        raise PredictionLandingError(msg)
    from pyspark.sql import functions as F

    frame = spark.read.format("delta").load(str(path))
    if since_ms is not None:
        frame = frame.where(F.col("at_ms") >= F.lit(since_ms))
    return frame
