"""A source's bronze table, derived from the plan: its columns, its event time in ms, its date partition.

Every source of the plan lands in its own Delta table ``bronze/<source name>`` (:func:`lake.bronze_path`).
Its columns are the source's current Avro fields (:attr:`PlanSource.fields`, Avro order) typed as below,
then the landing's own columns (:data:`META_COLUMNS`), then the ``date`` partition: the UTC date of
the event time. Timestamps keep their raw integer in the field's unit (ms or us), as on the wire, so a
row reads back exactly as it was sent; :func:`event_ms` gives the event time in ms for the window code.

=========================  ==========
Avro (``PlanField.kind``)  column
=========================  ==========
string, enum               string
int                        int32
long                       int64
float                      float32
double                     float64
boolean                    bool
timestamp (ms or us)       int64 (raw)
=========================  ==========
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import pyarrow as pa

from headwater.registry.errors import HeadwaterError
from headwater.registry.plans import PlanSource, PlanView

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

ARROW_TYPES: dict[str, pa.DataType] = {
    "string": pa.string(),
    "enum": pa.string(),
    "int": pa.int32(),
    "long": pa.int64(),
    "float": pa.float32(),
    "double": pa.float64(),
    "boolean": pa.bool_(),
    "timestamp": pa.int64(),
}
META_COLUMNS = pa.schema(
    [
        ("produce_ts_ms", pa.int64()),
        ("kafka_topic", pa.string()),
        ("kafka_partition", pa.int32()),
        ("kafka_offset", pa.int64()),
        ("late", pa.bool_()),
    ]
)
"""What landing adds to a source's fields: the ``produce-ts`` header, the Kafka coordinates, the late flag."""
PARTITION = "date"
"""The partition column: UTC date of the event time."""
RESERVED = frozenset({*META_COLUMNS.names, PARTITION})
BRONZE_WRITE_OPTIONS = {"mergeSchema": "true", "delta.enableTypeWidening": "true"}
"""Options of every write to a bronze table, so that a compatible schema change keeps landing.

A field added to the source's schema becomes a new column (null in the rows landed before it); a
removed one stays, null from then on; a promoted type (int to long, float to double) widens the
column in place (Delta type widening, enabled when the table is created).
"""


class SourceColumnsError(HeadwaterError, ValueError):
    """A source cannot be stored in bronze as declared (a field name or kind the table cannot hold)."""


def event_schema(source: PlanSource) -> pa.Schema:
    """Return the Arrow schema of ``source``'s fields (Avro order), as stored in its bronze table.

    Raises:
        SourceColumnsError: a field has a kind outside the table above, or a name bronze reserves.
    """
    fields = []
    for f in source.fields:
        if f.name in RESERVED:
            msg = (f"source {source.name!r}: field {f.name!r} has the name of a bronze column the landing "
                   f"adds ({sorted(RESERVED)}); rename the field in its schema")  # fmt: skip
            raise SourceColumnsError(msg)
        kind = ARROW_TYPES.get(f.kind)
        if kind is None:
            msg = (f"source {source.name!r}: field {f.name!r} has kind {f.kind!r}, which bronze cannot "
                   f"store; expected one of {sorted(ARROW_TYPES)} (re-run `headwater apply`)")  # fmt: skip
            raise SourceColumnsError(msg)
        fields.append(pa.field(f.name, kind, nullable=True))
    return pa.schema(fields)


def bronze_schema(source: PlanSource) -> pa.Schema:
    """Return the Arrow schema of ``source``'s bronze rows: its fields, then :data:`META_COLUMNS`."""
    return pa.schema([*event_schema(source), *META_COLUMNS])


def time_divisor(source: PlanSource) -> int:
    """Return what divides the raw event-time value to give ms (1000 for timestamp-micros, else 1)."""
    return 1000 if source.event_time_unit == "us" else 1


def event_ms(source: PlanSource) -> Column:
    """Spark column: the event time of ``source``'s rows in UTC epoch ms (a long)."""
    from pyspark.sql import functions as F

    raw = F.col(f"`{source.event_time}`").cast("long")
    div = time_divisor(source)
    return raw if div == 1 else F.floor(raw / F.lit(div)).cast("long")


def time_between(source: PlanSource, lo_ms: int | None, hi_ms: int | None) -> Column:
    """Spark condition ``lo_ms <= event time < hi_ms`` on the raw column (so Parquet statistics prune).

    ``floor(raw / d) >= lo`` iff ``raw >= lo * d``, and ``floor(raw / d) < hi`` iff ``raw < hi * d``.
    """
    from pyspark.sql import functions as F

    raw = F.col(f"`{source.event_time}`")
    div = time_divisor(source)
    cond = F.lit(True)
    if lo_ms is not None:
        cond = cond & (raw >= F.lit(lo_ms * div))
    if hi_ms is not None:
        cond = cond & (raw < F.lit(hi_ms * div))
    return cond


def with_date(frame: DataFrame, source: PlanSource) -> DataFrame:
    """Add the ``date`` partition column: the UTC date of the source's event time."""
    from pyspark.sql import functions as F

    raw = F.col(f"`{source.event_time}`").cast("long")
    instant = F.timestamp_micros(raw) if time_divisor(source) == 1000 else F.timestamp_millis(raw)
    return frame.withColumn(PARTITION, F.to_date(instant))  # the session time zone is UTC (jvm.py)


def source_of(sources: Iterable[PlanSource], view: PlanView) -> PlanSource:
    """Return the plan source ``view`` reads.

    Raises:
        SourceColumnsError: the plan has no such source (the plan and the views are out of step).
    """
    known = {s.name: s for s in sources}
    found = known.get(view.source)
    if found is None:
        msg = (f"view {view.name} ({view.defined_at}) reads source {view.source!r}, which the plan does not "
               f"declare (sources: {sorted(known)}); re-run `headwater apply`")  # fmt: skip
        raise SourceColumnsError(msg)
    return found
