"""Each concept is listed once: the tier names, and the typed Literal that pydantic validates against."""

from __future__ import annotations

from typing import get_args

from headwater.registry.models import TierName
from headwater.registry.tiers import TIER_NAMES, TIERS


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
