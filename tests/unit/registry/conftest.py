"""Fixtures for registry tests: small feature repos written to tmp_path."""

from __future__ import annotations

from pathlib import Path

import pytest

from headwater.registry.testing import ScratchRepo

EXAMPLE = Path(__file__).resolve().parents[3] / "features"


@pytest.fixture
def example() -> Path:
    """The example feature repo of this checkout."""
    return EXAMPLE


@pytest.fixture
def repo(tmp_path: Path) -> ScratchRepo:
    return ScratchRepo(tmp_path / "features", template=EXAMPLE)


@pytest.fixture(params=["libyaml", "ruamel"])
def yaml_backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run a test once per YAML composer: both must give the same lines and errors."""
    if request.param == "ruamel":
        monkeypatch.setenv("HEADWATER_YAML_PARSER", "ruamel")
    else:
        monkeypatch.delenv("HEADWATER_YAML_PARSER", raising=False)
    return str(request.param)
