"""Device-dependent defaults and runtime knobs of the service."""

from __future__ import annotations

import sys

import pytest
from pydantic import ValidationError

from headwater.ranking.model import pick_device
from headwater.serving.config import BatcherConfig, ServingConfig
from headwater.serving.runtime import configure_switch_interval


@pytest.mark.parametrize(("device", "expected"), [("cpu", 1024), ("cuda", 8192), ("cuda:1", 8192)])
def test_batch_rows_default_by_device(device: str, expected: int) -> None:
    assert BatcherConfig().rows_for(device) == expected
    assert BatcherConfig(max_batch_rows=300).rows_for(device) == 300


def test_switch_interval_is_set_and_none_keeps_it() -> None:
    before = sys.getswitchinterval()
    try:
        assert configure_switch_interval(0.5) == pytest.approx(0.5)
        assert sys.getswitchinterval() == pytest.approx(0.0005)
        assert configure_switch_interval(None) == pytest.approx(0.5)
    finally:
        sys.setswitchinterval(before)


def test_switch_interval_must_be_positive() -> None:
    with pytest.raises(ValidationError, match="gil_switch_interval_ms"):
        ServingConfig(gil_switch_interval_ms=0.0)
    assert ServingConfig().gil_switch_interval_ms == 1.0


def test_requested_device_wins() -> None:
    assert pick_device("cpu") == "cpu"
    assert pick_device("cuda:0") == "cuda:0"
