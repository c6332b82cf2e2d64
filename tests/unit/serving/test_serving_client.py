"""The `headwater rank` / `feedback` client: id ranges and the messages of a failed call."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from headwater.cli.client import item_range, rank


def test_item_range_keeps_prefix_and_padding() -> None:
    assert item_range("i000009..i000011") == ["i000009", "i000010", "i000011"]
    assert item_range("item-7") == ["item-7"]


@pytest.mark.parametrize("spec", ["i1..j3", "i..i3", "i1..ix"])
def test_item_range_names_a_bad_range(spec: str) -> None:
    with pytest.raises(click.BadParameter, match="PREFIX<digits>"):
        item_range(spec)


def test_rank_without_a_service_says_how_to_start_one() -> None:
    result = CliRunner().invoke(rank, ["u1", "i1", "--url", "http://127.0.0.1:9"])
    assert result.exit_code == 1
    assert "no ranking service at http://127.0.0.1:9" in result.output
    assert "headwater serve" in result.output
