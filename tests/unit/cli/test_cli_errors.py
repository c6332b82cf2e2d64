"""The CLI's one translation of errors (issue 31): a HeadwaterError is ``Error: ...``, a bug a traceback."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from headwater.cli.main import main
from headwater.cli.topics import topics
from headwater.pipelines.events import sources
from headwater.pipelines.events.sources import SourceError
from headwater.registry.errors import HeadwaterError


@pytest.fixture(autouse=True)
def _no_repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A folder with no headwater.yaml: the root group resolves the defaults."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("HEADWATER_REPO", raising=False)


def _raising(exc: BaseException) -> Callable[..., None]:
    def raise_it(*_args: object, **_kwargs: object) -> None:
        raise exc

    return raise_it


def test_a_headwater_error_prints_error_and_exits_1(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        sources, "sources_or_examples", _raising(SourceError("no source 'clicks' in the plan"))
    )
    for command, args in ((main, ["topics", "create"]), (topics, ["create"])):  # via the root, and directly
        result = CliRunner().invoke(command, args)
        assert result.exit_code == 1, result.output
        assert "Error: no source 'clicks' in the plan" in result.output
        assert isinstance(result.exception, SystemExit)  # click's clean exit, no traceback


def test_a_headwater_error_exits_with_its_class_exit_code(monkeypatch: pytest.MonkeyPatch) -> None:
    class Refused(HeadwaterError):
        exit_code = 3

    monkeypatch.setattr(sources, "sources_or_examples", _raising(Refused("the plan is refused")))
    result = CliRunner().invoke(main, ["topics", "create"])
    assert result.exit_code == 3
    assert "Error: the plan is refused" in result.output


@pytest.mark.parametrize("bug", [KeyError("views"), ValueError("not ours")])
def test_a_plain_bug_is_not_swallowed(monkeypatch: pytest.MonkeyPatch, bug: Exception) -> None:
    monkeypatch.setattr(sources, "sources_or_examples", _raising(bug))
    result = CliRunner().invoke(main, ["topics", "create"])
    assert result.exception is bug  # the bug itself reaches the caller: a traceback, not a ClickException
    assert not isinstance(result.exception, click.ClickException)
    assert "Error:" not in result.output
