"""Offline tier pieces that need no Spark: checkpoints, day ranges, columnar packing."""

from __future__ import annotations

import math
from datetime import date
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from headwater.pipelines.offline.lake import day_of_ms, day_start_ms, days
from headwater.pipelines.offline.landing import Checkpoint
from headwater.pipelines.offline.testing import T0, feature, view
from headwater.pipelines.offline.vectors import pack
from headwater.pipelines.windows import compile_view, to_vectors


def fake_ids(field: str, values: Any) -> list[int]:
    return [sum(map(ord, f"{field}:{v}")) % 1000 for v in values]


def test_checkpoint_round_trips_through_commit_metadata() -> None:
    cp = Checkpoint(seq=3, offsets={0: 10, 1: 7}, max_event_ms={0: T0, 1: T0 + 5})
    assert Checkpoint.parse(cp.metadata("app-a"), "app-a") == cp
    assert Checkpoint.parse(cp.metadata("app-a"), "app-b") is None
    assert Checkpoint.parse("not json", "app-a") is None


def test_days_and_day_arithmetic() -> None:
    assert days(date(2026, 1, 30), date(2026, 2, 2)) == [date(2026, 1, d) for d in (30, 31)] + [
        date(2026, 2, 1), date(2026, 2, 2)]  # fmt: skip
    assert day_start_ms(date(2026, 1, 1)) == T0
    assert day_of_ms(T0 - 1) == date(2025, 12, 31)
    with pytest.raises(ValueError, match="before FROM"):
        days(date(2026, 1, 2), date(2026, 1, 1))


def test_columnar_pack_equals_the_shared_row_packer() -> None:
    plan_view = view("v", "user", "user_id", [
        feature("n", "count", "1d", dtype="int64"),
        feature("avg", "avg", "1d", field="price"),
        feature("last", "last", "1d", field="item_id", dtype="string"),
        feature("top", "top_k", "1d", field="category", k=3),
    ])  # fmt: skip
    spec = compile_view(plan_view)
    rows: list[list[Any]] = [
        [3.0, 2.5, "i1", (("books", 0.5), ("art", 0.25), ("music", 0.25))],
        [0.0, math.nan, math.nan, ()],
        [1.0, 4.0, "i2", (("books", 1.0),)],
    ]
    table = pa.table({
        "n": pa.array([3, 0, 1], pa.int64()),
        "avg": pa.array([2.5, None, 4.0]),
        "last": pa.array(["i1", None, "i2"]),
        "top": pa.array([[{"value": v, "share": s} for v, s in r[3]] for r in rows],
                        pa.list_(pa.struct([("value", pa.string()), ("share", pa.float64())]))),
    })  # fmt: skip
    np.testing.assert_array_equal(pack(spec, table, fake_ids), to_vectors(spec, rows, fake_ids))
