"""One list per concept (tier names, aggregations), pinned where a copy must stay (Literal, Java)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import get_args

from headwater.registry.aggs import AGG_NAMES, AGGS, FIELD_REQUIRED, OPERAND_AGG_NAMES
from headwater.registry.models import AggName, OperandAggName, TierName
from headwater.registry.tiers import ALL_AGGS, ALL_OPERANDS, TIER_NAMES, TIERS

ROOT = Path(__file__).resolve().parents[3]
JVM_AGG = ROOT / "infra/maven/flink-udfs/src/main/java/dev/headwater/flink/realtime/Agg.java"


def test_tier_literal_is_the_tier_table() -> None:
    assert get_args(TierName) == TIER_NAMES == ("realtime", "nearline", "offline")
    assert all(TIERS[name].name == name for name in TIER_NAMES)


def test_cli_tier_choice_is_the_tier_table() -> None:
    from headwater.cli.offline import TIER_CHOICE

    assert tuple(TIER_CHOICE.choices) == TIER_NAMES


def test_header_bytes_is_defined_once() -> None:
    from headwater.pipelines.store import codec
    from headwater.registry import cost

    assert codec.HEADER_BYTES is cost.HEADER_BYTES == 72


def test_agg_literals_are_the_agg_table() -> None:
    assert get_args(AggName) == AGG_NAMES == tuple(AGGS)
    assert get_args(OperandAggName) == OPERAND_AGG_NAMES
    assert set(OPERAND_AGG_NAMES) <= set(AGG_NAMES)
    assert {"sum", "avg", "min", "max", "last", "distinct_count", "top_k"} == FIELD_REQUIRED


def test_tiers_and_python_engines_derive_from_the_agg_table() -> None:
    from headwater.pipelines.offline.aggregate import SCALAR_AGGS as SQL_SCALARS
    from headwater.pipelines.offline.aggregate import VALUE_AGGS
    from headwater.pipelines.windows.aggs import scalar_agg
    from headwater.pipelines.windows.spec import ALL_AGGS as WINDOW_AGGS
    from headwater.pipelines.windows.spec import SCALAR_AGGS
    from headwater.registry.calibration import AGG_KINDS

    assert ALL_AGGS == WINDOW_AGGS == set(AGG_NAMES)
    assert set(OPERAND_AGG_NAMES) == ALL_OPERANDS
    assert set(AGG_NAMES) == SQL_SCALARS | VALUE_AGGS
    assert tuple(a for a in AGG_NAMES if a != "ratio") == AGG_KINDS
    assert all(scalar_agg(a, "x") is not None for a in SCALAR_AGGS)


def test_jvm_operator_knows_the_agg_table() -> None:
    source = JVM_AGG.read_text()
    of = source[source.index("static Agg of(") :]
    switch = of[: of.index("default:")]
    assert tuple(re.findall(r'case "(\w+)":', switch)) == AGG_NAMES
