"""Move columnar data between Python and Spark through Parquet files, without PySpark's Arrow path.

PySpark 4.2 needs pyarrow >= 18 for ``createDataFrame(arrow)`` and Arrow-backed ``toPandas``,
while this environment pins pyarrow 16 (apache-beam's cap). Parquet on local disk is the fast
bridge that needs neither: pyarrow writes a batch that Spark reads, and Spark writes a result
that pyarrow reads in file-sized chunks. Never a Python loop over Spark rows.
"""

from __future__ import annotations

import shutil
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.parquet as pq

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


@contextmanager
def staging_dir(base: Path | None = None) -> Iterator[Path]:
    """Return a fresh folder for staged files, removed on exit."""
    if base is not None:
        base.mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix="hw-stage-", dir=base))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def arrow_to_spark(spark: SparkSession, table: pa.Table, folder: Path) -> DataFrame:
    """Return a Spark DataFrame over ``table`` (written to ``folder`` as one Parquet file).

    The file must stay until every action on the DataFrame has run.
    """
    folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, folder / f"part-{uuid.uuid4().hex}.parquet")
    return spark.read.parquet(str(folder))


def spark_batches(frame: DataFrame, folder: Path, columns: list[str] | None = None) -> Iterator[pa.Table]:
    """Write ``frame`` to Parquet under ``folder`` and yield it back file by file as Arrow tables."""
    out = folder / f"out-{uuid.uuid4().hex}"
    frame.write.mode("overwrite").parquet(str(out))
    for path in sorted(out.glob("*.parquet")):
        yield pq.read_table(path, columns=columns)


def spark_to_arrow(frame: DataFrame, folder: Path, columns: list[str] | None = None) -> pa.Table:
    """``frame`` collected into one Arrow table (through Parquet files under ``folder``)."""
    parts = list(spark_batches(frame, folder, columns))
    if not parts:
        msg = f"Spark wrote no Parquet file under {folder}: cannot read the result back"
        raise RuntimeError(msg)
    return pa.concat_tables(parts) if len(parts) > 1 else parts[0]
