"""Import a history of any age and order straight into a source's bronze table, exactly once.

Replaying old data through Kafka fails twice over: the streaming tiers drop what falls more than the
allowed lateness behind a partition's newest event (a bulk load is rarely in time order), and old
events look "late" by definition. History therefore has its own path, past Kafka: each row of a
file (JSON Lines, CSV/TSV, Parquet; :mod:`headwater.pipelines.events.readers`) is coerced to the
source's schema and validated by the source's own codec (:class:`headwater.pipelines.events.rows.RowChecker`:
``min_event_time``, key/event-id lengths, the source's rules), then lands in ``bronze/<source>``
with ``late = false`` and no Kafka coordinates. No watermark applies: order does not matter.

Rejected rows go to a reject file (JSON Lines: ``line``, ``reason``, ``field``, ``detail``, ``raw``):
``unparsable`` (the reader could not parse the row), ``invalid_field`` (coercion or validation),
``future_dated`` (more than the source's ``max_future`` ahead of the clock: history is in the past).

Exactly once, by two mechanisms:

1. A file is identified by the SHA-256 of its bytes. It is cut into chunks of ``chunk_rows`` input
   rows; chunk ``i`` is one Delta commit with ``txnAppId = headwater_import:<source>:<digest>`` and
   ``txnVersion = i`` (and the same in ``userMetadata``). Delta skips a commit whose version it already
   holds for that app id, and a rerun skips the chunks the table's history lists, so re-importing the
   same file (under any name), or resuming one that crashed half way, lands nothing twice. The chunk
   size of the first import of a file is kept for its reruns.
2. When the source declares an ``event_id``, a row whose id is already in the table (landed from
   Kafka, or imported from another file, on the same date) or repeats an earlier row of the same chunk
   is skipped and counted as a duplicate.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import orjson

from headwater.pipelines.events.codec import EventCodec, Reason
from headwater.pipelines.events.ingest import Reject
from headwater.pipelines.events.readers import FileRow, RowReader, open_rows
from headwater.pipelines.events.rows import RowChecker, RowError
from headwater.pipelines.offline.arrow_io import arrow_to_spark, staging_dir
from headwater.pipelines.offline.bronze import events_table
from headwater.pipelines.offline.lake import bronze_path, is_delta_table
from headwater.pipelines.offline.source_columns import BRONZE_WRITE_OPTIONS, with_date
from headwater.registry.errors import HeadwaterError
from headwater.registry.plans import PlanSource

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

MARKER = "headwater_import"
DEFAULT_CHUNK_ROWS = 500_000
"""Input rows per Delta commit (a crash re-reads at most one chunk)."""
UNPARSABLE = "unparsable"
"""Reject reason: the reader could not parse the row (bad JSON, wrong CSV cell count)."""


class HistoryImportError(HeadwaterError, RuntimeError):
    """An import cannot run (no such file, unreadable format); the message says what to do."""


@dataclass
class ImportResult:
    """What an import did (counts are rows of the input)."""

    source: str
    digest: str
    rows: int = 0
    valid: int = 0
    landed: int = 0
    duplicates: int = 0
    """Valid rows not landed: their event id is already in the table, or repeats an earlier row."""
    rejected: int = 0
    reasons: dict[str, int] = field(default_factory=dict)
    chunks: int = 0
    skipped_chunks: int = 0
    """Chunks an earlier import of the same input already committed (not written again)."""
    reject_file: Path | None = None
    ignored_columns: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        """Return the result as a JSON object."""
        return {
            "source": self.source, "sha256": self.digest, "rows": self.rows, "valid": self.valid,
            "landed": self.landed, "duplicates": self.duplicates, "rejected": self.rejected,
            "reasons": self.reasons, "chunks": self.chunks, "skipped_chunks": self.skipped_chunks,
            "reject_file": str(self.reject_file) if self.reject_file else None,
            "ignored_columns": self.ignored_columns, "seconds": round(self.seconds, 2),
        }  # fmt: skip


def file_digest(path: Path) -> str:
    """Return the SHA-256 of the file's bytes (hex)."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def rows_digest(rows: list[Mapping[str, Any]]) -> str:
    """Return the SHA-256 of rows given in hand (canonical JSON, one per line)."""
    digest = hashlib.sha256()
    for row in rows:
        digest.update(orjson.dumps(row, option=orjson.OPT_SORT_KEYS, default=str) + b"\n")
    return digest.hexdigest()


def app_id(source: PlanSource, digest: str) -> str:
    """Return the Delta ``txnAppId`` of importing the input with ``digest`` into ``source``."""
    return f"{MARKER}:{source.name}:{digest}"


def imported_chunks(spark: SparkSession, table: Path, app: str) -> tuple[set[int], int | None]:
    """Return the chunks of ``app`` the table's history holds, and the chunk size they were cut with."""
    if not is_delta_table(table):
        return set(), None
    from delta.tables import DeltaTable

    history = DeltaTable.forPath(spark, str(table)).history()
    rows = history.where(history.userMetadata.contains(f'"app":"{app}"')).select("userMetadata").collect()
    done: set[int] = set()
    size: int | None = None
    for row in rows:
        meta = json.loads(row["userMetadata"])
        if isinstance(meta, dict) and meta.get(MARKER) == 1 and meta.get("app") == app:
            done.add(int(meta["chunk"]))
            size = int(meta["chunk_rows"])
    return done, size


def import_history(
    spark: SparkSession,
    lake: Path,
    source: PlanSource,
    rows_or_file: Path | str | Iterable[Mapping[str, Any]],
    *,
    fmt: str | None = None,
    reject_file: Path | None = None,
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
    now_ms: int | None = None,
    progress: Callable[[ImportResult, float | None], None] | None = None,
) -> ImportResult:
    """Import ``rows_or_file`` into ``source``'s bronze table under ``lake``, exactly once, in any order.

    ``rows_or_file`` is a file (JSON Lines, CSV/TSV, Parquet; ``fmt`` or its extension says which) or
    rows in hand (dicts; row ``n`` is "line" ``n``). Rejected rows are written to ``reject_file``
    (created only when a row is rejected, unless given). ``progress`` is called after each chunk with
    the counts so far and the share of the input read (None when unknown).

    Raises:
        HistoryImportError: the file is missing or cannot be read as its format.
    """
    from headwater.pipelines.events.readers import FileFormatError

    started = time.monotonic()
    now = now_ms if now_ms is not None else time.time_ns() // 1_000_000
    table = bronze_path(lake, source.name)
    reader: RowReader | None = None
    try:
        if isinstance(rows_or_file, str | Path):
            path = Path(rows_or_file)
            reader = open_rows(path, fmt)
            digest, text_cells = file_digest(path), reader.text_cells
            rows: Iterable[FileRow] = reader
            done_share: Callable[[], float | None] = lambda: reader.done if reader else None  # noqa: E731
        else:
            given = list(rows_or_file)
            digest, text_cells = rows_digest(given), False
            rows = (FileRow(n, r) for n, r in enumerate(given, start=1))
            done_share = lambda: None  # noqa: E731
    except FileFormatError as exc:
        raise HistoryImportError(str(exc)) from exc
    app = app_id(source, digest)
    done, size = imported_chunks(spark, table, app)
    chunk_rows = size or chunk_rows
    result = ImportResult(source.name, digest)
    checker = RowChecker(source, EventCodec(source), text_cells=text_cells)
    rejects: IO[bytes] | None = None
    try:
        for number, chunk in enumerate(_chunks(rows, chunk_rows)):
            events: list[dict[str, Any]] = []
            for row in chunk:
                result.rows += 1
                bad = _check(checker, row, source, now, events)
                if bad is None:
                    continue
                result.rejected += 1
                result.reasons[bad.reason] = result.reasons.get(bad.reason, 0) + 1
                if rejects is None:
                    where = reject_file or lake / "_rejects" / f"{source.name}-{digest[:16]}.jsonl"
                    where.parent.mkdir(parents=True, exist_ok=True)
                    rejects, result.reject_file = where.open("wb"), where
                rejects.write(bad.json().encode() + b"\n")
            result.valid += len(events)
            result.chunks += 1
            if number in done:
                result.skipped_chunks += 1
            elif events:
                lines = (chunk[0].line, chunk[-1].line)
                landed = _commit(spark, source, table, events, app, number, chunk_rows, lines)
                result.landed += landed
                result.duplicates += len(events) - landed
            if progress is not None:
                result.seconds = time.monotonic() - started
                progress(result, done_share())
    except FileFormatError as exc:
        raise HistoryImportError(str(exc)) from exc
    finally:
        if rejects is not None:
            rejects.close()
        if reader is not None:
            reader.close()
    if reject_file is not None and result.reject_file is None:
        reject_file.parent.mkdir(parents=True, exist_ok=True)
        reject_file.write_bytes(b"")
        result.reject_file = reject_file
    result.ignored_columns = sorted(checker.ignored_columns)
    result.seconds = time.monotonic() - started
    return result


def _chunks(rows: Iterable[FileRow], size: int) -> Iterator[list[FileRow]]:
    """Cut ``rows`` into lists of ``size`` input rows (rejected ones included: chunk i is always the same)."""
    chunk: list[FileRow] = []
    for row in rows:
        chunk.append(row)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _check(
    checker: RowChecker, row: FileRow, source: PlanSource, now_ms: int, out: list[dict[str, Any]]
) -> Reject | None:
    """Append the row's event to ``out``, or return why it is rejected."""
    if row.error is not None:
        return Reject(row.line, None, UNPARSABLE, raw=row.raw, detail=row.error)
    checked = checker.check(row.values)
    if isinstance(checked, RowError):
        return Reject(
            row.line, checked.field, checked.code or Reason.INVALID_FIELD.value, detail=checked.reason
        )
    if checked.event_time_ms > now_ms + source.max_future_ms:
        ahead = (checked.event_time_ms - now_ms) / 1000
        detail = (f"{source.event_time} is {ahead:.0f} s ahead of the clock (source {source.name!r} allows "
                  f"{source.max_future_ms / 1000:g} s: max_future in sources.yaml)")  # fmt: skip
        return Reject(row.line, source.event_time, str(Reason.FUTURE_DATED), detail=detail)
    out.append(checked.event)
    return None


def _commit(
    spark: SparkSession,
    source: PlanSource,
    table: Path,
    events: list[dict[str, Any]],
    app: str,
    number: int,
    chunk_rows: int,
    lines: tuple[int, int],
) -> int:
    """Append one chunk's events as one idempotent Delta commit; return the rows written."""
    metadata = json.dumps(
        {MARKER: 1, "app": app, "source": source.name, "chunk": number, "chunk_rows": chunk_rows,
         "lines": list(lines)}, separators=(",", ":"),
    )  # fmt: skip
    with staging_dir(table.parent / "_staging") as folder:
        frame = with_date(arrow_to_spark(spark, events_table(source, events), folder), source)
        if source.event_id is not None:
            frame = _new_ids(spark, frame, source, table)
        frame = frame.cache()
        try:
            landed = frame.count()
            (
                frame.write.format("delta")
                .mode("append")
                .options(**BRONZE_WRITE_OPTIONS)
                .partitionBy("date")
                .option("txnAppId", app)
                .option("txnVersion", number)
                .option("userMetadata", metadata)
                .save(str(table))
            )
        finally:
            frame.unpersist()
    return landed


def _new_ids(spark: SparkSession, frame: DataFrame, source: PlanSource, table: Path) -> DataFrame:
    """Keep one row per event id, and none whose id the table already holds on the same date."""
    from pyspark.sql import functions as F

    ident = source.event_id or ""
    frame = frame.dropDuplicates([ident])
    if not is_delta_table(table):
        return frame
    dates = [r["date"] for r in frame.select("date").distinct().collect()]
    existing = (
        spark.read.format("delta")
        .load(str(table))
        .where(F.col("date").isin(dates))
        .select(F.col("date").alias("__d"), F.col(f"`{ident}`").alias("__id"))
    )
    on = (F.col("date") == F.col("__d")) & (F.col(f"`{ident}`") == F.col("__id"))
    return frame.join(existing, on, "left_anti")


def read_rejects(path: Path) -> list[dict[str, Any]]:
    """Return the rows of a reject file (for tests and tools)."""
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]
