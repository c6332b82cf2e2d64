"""Which days `headwater run offline` computes: never one that has not ended."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import click
import pytest

from headwater.cli.offline import _days


def test_default_is_yesterday_and_a_backfill_lists_every_day() -> None:
    today = datetime.now(UTC).date()
    assert _days(None, None) == [today - timedelta(days=1)]
    first = today - timedelta(days=3)
    assert _days(None, (first.isoformat(), (today - timedelta(days=1)).isoformat())) == [
        first + timedelta(days=n) for n in range(3)
    ]


@pytest.mark.parametrize("ahead", [0, 1])
def test_a_day_that_has_not_ended_is_refused_with_the_last_day_to_use(ahead: int) -> None:
    today = datetime.now(UTC).date()
    day = (today + timedelta(days=ahead)).isoformat()
    with pytest.raises(click.BadParameter, match=f"compute days up to {today - timedelta(days=1)}"):
        _days(day, None)
    with pytest.raises(click.BadParameter, match="has not ended yet"):
        _days(None, ((today - timedelta(days=2)).isoformat(), day))
