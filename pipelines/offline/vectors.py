"""Columnar packing of feature-table rows into online vectors (the layout of headwater.pipelines.windows).

:func:`headwater.pipelines.windows.to_vectors` packs row by row; this packs whole Arrow columns
with numpy into the same slots (``slot_names``: one per feature, 2k per top_k) with the same
dictionary ids, which is what materializing millions of rows needs. A unit test checks that
both give the same matrix.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from headwater.pipelines.windows import slot_names
from headwater.pipelines.windows.spec import FeatureSpec, ViewSpec

IdLookup = Callable[[str, Sequence[Any]], list[int]]


def _numbers(column: pa.ChunkedArray | pa.Array) -> npt.NDArray[np.float32]:
    filled = pc.fill_null(column.cast(pa.float64()), float("nan"))
    return np.asarray(filled.to_numpy(zero_copy_only=False), dtype=np.float32)


def _ids(column: pa.ChunkedArray | pa.Array, field: str, ids: IdLookup) -> npt.NDArray[np.float32]:
    text = column.cast(pa.string())
    uniques = [v for v in pc.unique(text).to_pylist() if v is not None]
    out = np.full(len(text), np.nan, dtype=np.float32)
    if uniques:
        table = np.asarray(ids(field, sorted(uniques)), dtype=np.float32)
        index = pc.index_in(text, value_set=pa.array(sorted(uniques), pa.string()))
        idx = np.asarray(pc.fill_null(index, -1).to_numpy(zero_copy_only=False))
        out[idx >= 0] = table[idx[idx >= 0]]
    return out


def _top_k(column: pa.ChunkedArray, f: FeatureSpec, ids: IdLookup) -> npt.NDArray[np.float32]:
    lists = pa.concat_arrays(column.chunks) if isinstance(column, pa.ChunkedArray) else column
    n, k = len(lists), f.k
    out = np.full((n, 2 * k), np.nan, dtype=np.float32)
    out[:, k:] = 0.0
    if n == 0:
        return out
    lengths = np.asarray(
        pc.fill_null(pc.list_value_length(lists), 0).to_numpy(zero_copy_only=False), dtype=np.int64
    )
    flat = lists.flatten()
    rows = np.repeat(np.arange(n), lengths)
    pos = np.arange(len(flat)) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    keep = pos < k
    values = _ids(flat.field("value"), f.field or "", ids)
    shares = _numbers(flat.field("share"))
    out[rows[keep], pos[keep]] = values[keep]
    out[rows[keep], k + pos[keep]] = shares[keep]
    return out


def pack(view: ViewSpec, table: pa.Table, ids: IdLookup) -> npt.NDArray[np.float32]:
    """Return an (n, slots) float32 matrix of ``table``'s feature columns (named as the features)."""
    blocks: list[npt.NDArray[np.float32]] = []
    for f in view.features:
        column = table.column(f.name)
        if f.agg == "top_k":
            blocks.append(_top_k(column, f, ids))
        elif pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
            blocks.append(_ids(column, f.field or "", ids)[:, None])
        else:
            blocks.append(_numbers(column)[:, None])
    out = np.hstack(blocks) if blocks else np.zeros((table.num_rows, 0), dtype=np.float32)
    expected = len(slot_names(view))
    if out.shape[1] != expected:
        msg = (
            f"view {view.name}: packed {out.shape[1]} slots, the layout has {expected}; "
            f"columns {table.column_names}"
        )
        raise ValueError(msg)
    return out
