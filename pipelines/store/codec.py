"""The packed value of one (view, entity) key: a fixed 72-byte header and float32 features.

Byte layout (little-endian), format 1::

    offset size field
         0    2 magic            b"HW"
         2    1 format           1
         3    1 version_len      bytes used in ``version``
         4    4 n                number of float32 features (uint32)
         8    8 event_time_ms    event time of the newest event in the vector (int64)
        16    8 write_time_ms    wall clock of the writer when it wrote the value (int64)
        24    8 expire_at_ms     absolute expiry in epoch ms (now + view TTL), 0 = none (int64)
        32    4 schema_hash      CRC32 of the ordered feature names (uint32)
        36    4 reserved         0
        40   32 version          the view's version id, ASCII, NUL padded
        72  4*n payload          float32 features in layout order

``write.lua`` reads ``event_time_ms`` at offset 8 and ``expire_at_ms`` at offset 24: keep the
two in sync. A whole batch is packed or unpacked with one NumPy structured array, no Python
loop over rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import numpy.typing as npt

from headwater.registry.cost import HEADER_BYTES

MAGIC = b"HW"
MAGIC_U16 = int.from_bytes(MAGIC, "little")
FORMAT = 1
EVENT_TIME_OFFSET = 8
EXPIRE_AT_OFFSET = 24


@lru_cache(maxsize=256)
def record_dtype(n: int) -> np.dtype[np.void]:
    """Return the NumPy structured dtype of one packed value with ``n`` features."""
    return np.dtype(
        [
            ("magic", "<u2"),
            ("format", "u1"),
            ("version_len", "u1"),
            ("n", "<u4"),
            ("event_time_ms", "<i8"),
            ("write_time_ms", "<i8"),
            ("expire_at_ms", "<i8"),
            ("schema_hash", "<u4"),
            ("reserved", "<u4"),
            ("version", "S32"),
            ("payload", "<f4", (n,)),
        ]
    )


def record_size(n: int) -> int:
    """Bytes of one packed value with ``n`` features."""
    return HEADER_BYTES + 4 * n


def pack(
    values: npt.NDArray[np.float32],
    event_time_ms: npt.NDArray[np.int64],
    write_time_ms: int,
    expire_at_ms: int,
    schema_hash: int,
    version: str,
) -> npt.NDArray[np.void]:
    """Pack ``values`` (n, d) into n records; ``.tobytes()`` gives the concatenated values."""
    n, d = values.shape
    rec = np.zeros(n, dtype=record_dtype(d))
    encoded = version.encode("ascii")
    rec["magic"] = MAGIC_U16
    rec["format"] = FORMAT
    rec["version_len"] = len(encoded)
    rec["n"] = d
    rec["event_time_ms"] = event_time_ms
    rec["write_time_ms"] = write_time_ms
    rec["expire_at_ms"] = expire_at_ms
    rec["schema_hash"] = schema_hash
    rec["version"] = encoded
    rec["payload"] = values
    return rec


def unpack(raw: Sequence[bytes | None], d: int, schema_hash: int) -> Unpacked:
    """Decode the replies of one ``MGET`` (bytes or None per key) for a view with ``d`` features.

    A value that is missing, of another size, of another format or packed for another feature
    order counts as not found; ``mismatch`` flags the present-but-unreadable ones.
    """
    n = len(raw)
    size = record_size(d)
    if None in raw:
        present = np.array([v is not None for v in raw], dtype=bool)
        vals = [v for v in raw if v is not None]
    else:
        present = np.ones(n, dtype=bool)
        vals = raw  # type: ignore[assignment]
    if not vals or set(map(len, vals)) == {size}:
        sized = present
    else:
        sized = np.array([v is not None and len(v) == size for v in raw], dtype=bool)
        vals = [v for v in vals if len(v) == size]
    joined = b"".join(vals)
    rec = np.frombuffer(joined, dtype=record_dtype(d))
    ok = (rec["magic"] == MAGIC_U16) & (rec["format"] == FORMAT) & (rec["n"] == d)
    ok &= rec["schema_hash"] == schema_hash
    if ok.all() and len(rec) == n:  # every key found and readable: no masking
        times = np.array(rec["event_time_ms"]), np.array(rec["write_time_ms"])
        return Unpacked(np.array(rec["payload"]), present, ~present, *times, rec["version"])
    found = sized.copy()
    found[sized] = ok
    good = rec[ok]
    values = np.full((n, d), np.nan, dtype=np.float32)
    values[found] = good["payload"]
    event_time = np.zeros(n, dtype=np.int64)
    event_time[found] = good["event_time_ms"]
    write_time = np.zeros(n, dtype=np.int64)
    write_time[found] = good["write_time_ms"]
    return Unpacked(values, found, present & ~found, event_time, write_time, good["version"])


@dataclass(frozen=True, slots=True)
class Unpacked:
    """Decoded columns of a batch read (see :func:`unpack`)."""

    values: npt.NDArray[np.float32]
    found: npt.NDArray[np.bool_]
    mismatch: npt.NDArray[np.bool_]
    event_time_ms: npt.NDArray[np.int64]
    write_time_ms: npt.NDArray[np.int64]
    version_raw: npt.NDArray[np.bytes_]


def decode_versions(version_raw: npt.NDArray[np.bytes_], found: npt.NDArray[np.bool_]) -> list[str | None]:
    """Per-row view version ids (None where not found), decoding each distinct id once."""
    out: list[str | None] = [None] * len(found)
    if not len(version_raw):
        return out
    uniq, inverse = np.unique(version_raw, return_inverse=True)
    names: list[str] = [u.decode("ascii", errors="replace") for u in uniq.tolist()]
    for row, idx in zip(np.flatnonzero(found).tolist(), inverse.tolist(), strict=True):
        out[row] = names[idx]
    return out
