"""Click callbacks that fill the folder options of every command from the one resolver.

A command declares ``--state-dir`` (or ``--lake``, ``--out`` for models) with ``default=None`` and
one of these callbacks: the command then receives the folder the user gave, or the resolved one
(:mod:`headwater.registry.config`), never a path of its own.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from headwater.registry.config import ConfigError, lake_dir, state_dir
from headwater.registry.errors import HeadwaterError

STATE_HELP = "[default: $HEADWATER_STATE_DIR, else state_dir in headwater.yaml, else ./.headwater]"
LAKE_HELP = "[default: $HEADWATER_LAKE, else lake in headwater.yaml, else <state folder>/lake]"
MODELS_HELP = "[default: models/ in the state folder]"
F = TypeVar("F", bound=Callable[..., Any])


def resolved_state_dir(_ctx: click.Context, param: click.Parameter, value: Path | None) -> Path:
    """Return ``value``, else the resolved state folder."""
    try:
        return state_dir(value)
    except ConfigError as exc:
        raise click.BadParameter(str(exc), param=param) from exc


def resolved_lake(_ctx: click.Context, param: click.Parameter, value: Path | None) -> Path:
    """Return ``value``, else the resolved lake folder."""
    try:
        return lake_dir(value)
    except ConfigError as exc:
        raise click.BadParameter(str(exc), param=param) from exc


def resolved_models_dir(_ctx: click.Context, param: click.Parameter, value: Path | None) -> Path:
    """Return ``value``, else ``models/`` in the resolved state folder."""
    if value is not None:
        return value
    return resolved_state_dir(_ctx, param, None) / "models"


def training_set_option(help_text: str) -> Callable[[F], F]:
    """``--training-set FILE``: the Parquet file of `headwater training-set` (every model reads one)."""
    return click.option(
        "--training-set",
        type=click.Path(exists=True, dir_okay=False, path_type=Path),
        required=True,
        help=help_text,
    )


def models_out_option(what: str) -> Callable[[F], F]:
    """``--out DIR``: where a training command writes ``what``; models/ in the state folder by default."""
    return click.option(
        "--out",
        "out_dir",
        type=click.Path(file_okay=False, path_type=Path),
        default=None,
        callback=resolved_models_dir,
        help=f"Directory for {what} {MODELS_HELP}.",
    )


class NotComputed(HeadwaterError, click.ClickException):
    """A check could not compute its figures: exit 2, so that exit 1 stays the verdict (flagged, breached)."""

    exit_code = 2
