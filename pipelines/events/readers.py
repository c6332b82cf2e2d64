"""Read a user's file of events row by row: JSON Lines, CSV (or TSV), Parquet; gzip for the text ones.

Each reader yields :class:`FileRow` in file order with the row's number in the file (the line
where it starts for JSON Lines and CSV, counting the header; the 1-based row for Parquet), so a
reject can be found again. A row that cannot be parsed comes back with ``error`` set instead of
stopping the read: one bad line never ends a run. Only a file that cannot be opened or whose
structure is broken (a CSV header, a Parquet footer or row group) raises :class:`FileFormatError`.
"""

from __future__ import annotations

import csv
import gzip
import io
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Literal, cast

import orjson

from headwater.registry.errors import HeadwaterError

Format = Literal["jsonl", "csv", "tsv", "parquet"]
FORMATS: tuple[Format, ...] = ("jsonl", "csv", "tsv", "parquet")
_EXTENSIONS: dict[str, Format] = {
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "jsonl",
    ".csv": "csv",
    ".tsv": "tsv",
    ".parquet": "parquet",
    ".pq": "parquet",
}
MAX_RAW_CHARS = 2_000
"""Characters of an unparsable line kept in its reject."""
PARQUET_BATCH_ROWS = 8_192
_BOM = b"\xef\xbb\xbf"


class FileFormatError(HeadwaterError, ValueError):
    """The file cannot be read as the format (missing, unreadable, broken structure); says which and why."""


@dataclass(frozen=True, slots=True)
class FileRow:
    """One row of the file: its number and values, or why it did not parse (then ``values`` is None)."""

    line: int
    values: Any
    """A dict for a well-formed row; for JSON Lines, whatever the line held (an object is expected)."""
    error: str | None = None
    raw: str | None = None
    """The text of a row that did not parse (cut to :data:`MAX_RAW_CHARS`)."""


def _opens_an_array(line: bytes) -> bool:
    """Whether a file's first line starts a JSON array of objects (a .json export, not JSON Lines).

    A first line that is a whole array of objects, or the opening of one that goes on over more
    lines (``[`` or ``[{...``), is; a one-line array of anything else is just a bad row.
    """
    text = line.strip()
    if not text.startswith(b"["):
        return False
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        return text == b"[" or text[1:].lstrip().startswith(b"{")
    return isinstance(value, list) and bool(value) and all(isinstance(v, dict) for v in value)


def detect_format(path: Path, given: str | None = None) -> Format:
    """Return the format named by ``given``, else the one of the file's extension (``.gz`` looked through).

    Raises:
        FileFormatError: no ``given`` and an extension none of the readers knows.
    """
    if given is not None:
        if given not in FORMATS:
            msg = f"unknown format {given!r}; expected one of {', '.join(FORMATS)}"
            raise FileFormatError(msg)
        return given
    suffixes = [s.lower() for s in path.suffixes]
    if suffixes and suffixes[-1] == ".gz":
        suffixes.pop()
    fmt = _EXTENSIONS.get(suffixes[-1]) if suffixes else None
    if fmt is None:
        known = ", ".join(sorted(_EXTENSIONS))
        msg = f"{path}: cannot tell the format from the extension (known: {known}, .gz too); pass --format"
        raise FileFormatError(msg)
    return fmt


class RowReader:
    """Iterate the rows of one file; :attr:`done` tells the share of the file read so far."""

    def __init__(self, path: Path, fmt: Format) -> None:
        """Open ``path`` (checked at once, so a missing file is an error before anything is sent).

        Raises:
            FileFormatError: the file does not exist, cannot be read, or is not ``fmt``.
        """
        self.path = path
        self.fmt = fmt
        self.text_cells = fmt in ("csv", "tsv")
        """Every value is text (CSV): an empty cell is read as null for a nullable field."""
        if not path.is_file():
            msg = f"{path}: no such file"
            raise FileFormatError(msg)
        try:
            self._size = path.stat().st_size
            self._raw: io.BufferedReader = path.open("rb")
        except OSError as exc:
            msg = f"{path}: cannot be read ({exc.strerror or exc})"
            raise FileFormatError(msg) from exc
        self._rows_total: int | None = None
        self._rows_read = 0
        if fmt == "parquet":
            self._parquet = self._open_parquet()
            self._rows_total = self._parquet.metadata.num_rows

    def close(self) -> None:
        """Close the file."""
        self._raw.close()

    def __enter__(self) -> RowReader:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    @property
    def done(self) -> float | None:
        """Share of the file read so far, in [0, 1] (None when unknown)."""
        if self._rows_total is not None:
            return self._rows_read / self._rows_total if self._rows_total else 1.0
        if not self._size or self._raw.closed:
            return None
        return min(1.0, self._raw.tell() / self._size)

    def __iter__(self) -> Iterator[FileRow]:
        """Rows from the start of the file (each call reads it again)."""
        self._raw.seek(0)
        self._rows_read = 0
        if self.fmt == "jsonl":
            return self._jsonl()
        if self.fmt == "parquet":
            return self._parquet_rows(None)
        return self._csv("\t" if self.fmt == "tsv" else ",")

    def column(self, name: str) -> Iterator[FileRow]:
        """Rows with only column ``name`` (cheaper for Parquet; the same rows as iterating otherwise)."""
        if self.fmt == "parquet":
            self._raw.seek(0)
            self._rows_read = 0
            return self._parquet_rows(name)
        return iter(self)

    def _binary(self) -> IO[bytes]:
        if self._raw.read(2) == b"\x1f\x8b":
            self._raw.seek(0)
            return cast("IO[bytes]", gzip.GzipFile(fileobj=self._raw, mode="rb"))
        self._raw.seek(0)
        return self._raw

    def _jsonl(self) -> Iterator[FileRow]:
        stream = self._binary()
        first = True
        try:
            for number, line in enumerate(stream, start=1):
                if first:
                    line, first = line.removeprefix(_BOM), False
                    if _opens_an_array(line):
                        msg = (
                            f"{self.path}: a JSON array, not JSON Lines; write one object per line, "
                            f"e.g. jq -c '.[]' {self.path} > rows.jsonl"
                        )
                        raise FileFormatError(msg)
                if not line.strip():
                    continue
                self._rows_read += 1
                try:
                    values = orjson.loads(line)
                except orjson.JSONDecodeError as exc:
                    raw = line.decode("utf-8", "replace").rstrip("\r\n")[:MAX_RAW_CHARS]
                    yield FileRow(number, None, error=f"not JSON: {exc}", raw=raw)
                    continue
                yield FileRow(number, values)
        except (OSError, EOFError, gzip.BadGzipFile) as exc:
            msg = f"{self.path}: read failed after {self._rows_read} rows: {exc}"
            raise FileFormatError(msg) from exc

    def _csv(self, delimiter: str) -> Iterator[FileRow]:
        text = io.TextIOWrapper(self._binary(), encoding="utf-8-sig", errors="surrogateescape", newline="")
        reader = csv.reader(text, delimiter=delimiter)
        try:
            header = next(reader, None)
            if header is None:
                return
            names = [h.strip() for h in header]
            duplicates = sorted({n for n in names if names.count(n) > 1})
            if duplicates or not all(names):
                problem = f"repeated column(s) {duplicates}" if duplicates else "an empty column name"
                msg = f"{self.path}:1: the header has {problem}; name each column once after a field"
                raise FileFormatError(msg)
            line = reader.line_num
            while True:
                start = line + 1
                try:
                    cells = next(reader)
                except StopIteration:
                    return
                except csv.Error as exc:
                    line = reader.line_num
                    self._rows_read += 1
                    yield FileRow(start, None, error=f"not a CSV row: {exc}")
                    continue
                line = reader.line_num
                if not cells:
                    continue
                self._rows_read += 1
                if len(cells) != len(names):
                    raw = delimiter.join(cells)[:MAX_RAW_CHARS]
                    error = f"{len(cells)} cells, the header has {len(names)} columns"
                    yield FileRow(start, None, error=error, raw=raw)
                    continue
                yield FileRow(start, dict(zip(names, cells, strict=True)))
        except (OSError, EOFError, gzip.BadGzipFile) as exc:
            msg = f"{self.path}: read failed after {self._rows_read} rows: {exc}"
            raise FileFormatError(msg) from exc
        finally:
            text.detach()

    def _open_parquet(self) -> Any:
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            return pq.ParquetFile(self._raw)
        except (pa.ArrowException, OSError) as exc:
            msg = f"{self.path}: not a Parquet file ({exc})"
            raise FileFormatError(msg) from exc

    def _parquet_rows(self, column: str | None) -> Iterator[FileRow]:
        import pyarrow as pa

        pf = self._parquet
        if column is not None and column not in pf.schema_arrow.names:
            return
        columns = [column] if column is not None else None
        number = 0
        try:
            for batch in pf.iter_batches(batch_size=PARQUET_BATCH_ROWS, columns=columns):
                for values in batch.to_pylist():
                    number += 1
                    self._rows_read = number
                    yield FileRow(number, values)
        except (pa.ArrowException, OSError) as exc:
            msg = f"{self.path}: row {number + 1} and after cannot be read: {exc}"
            raise FileFormatError(msg) from exc


def open_rows(path: Path, fmt: str | None = None) -> RowReader:
    """Open ``path`` for reading rows in ``fmt`` (default: from its extension).

    Raises:
        FileFormatError: unknown format, missing or unreadable file.
    """
    return RowReader(path, detect_format(path, fmt))
