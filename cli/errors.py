"""The CLI's one translation of headwater's errors: a :class:`HeadwaterError` ends the command cleanly.

Every command and group of the CLI is a :class:`HeadwaterCommand` or :class:`HeadwaterGroup` (a
group's sub-commands and sub-groups are too), whose ``invoke`` turns a HeadwaterError into click's
``Error: <message>`` and the error's ``exit_code`` (1 unless its class says otherwise). Nothing else
is caught: a plain ValueError or KeyError is a bug and shows its traceback. Click's own exceptions
(usage errors, a ``click.ClickException`` raised on purpose) pass through unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from headwater.registry.errors import HeadwaterError


def clean_error(exc: HeadwaterError) -> click.ClickException:
    """Return the click exception that prints ``exc``'s message and exits with its ``exit_code``."""
    out = click.ClickException(str(exc))
    out.exit_code = exc.exit_code  # type: ignore[misc]  # a ClassVar in click's stubs; this one differs
    return out


def translated(invoke: Callable[[click.Context], Any], ctx: click.Context) -> Any:
    """Call ``invoke(ctx)``; a HeadwaterError (not already a click exception) becomes :func:`clean_error`."""
    try:
        return invoke(ctx)
    except click.ClickException:
        raise
    except HeadwaterError as exc:
        raise clean_error(exc) from exc


class HeadwaterCommand(click.Command):
    """A click command whose HeadwaterError prints ``Error: <message>`` instead of a traceback."""

    def invoke(self, ctx: click.Context) -> Any:
        """Run the command; translate a HeadwaterError (not already a click exception)."""
        return translated(super().invoke, ctx)


class HeadwaterGroup(click.Group):
    """A click group translating a HeadwaterError of its callback; its sub-commands are HeadwaterCommands."""

    command_class = HeadwaterCommand
    group_class = type  # sub-groups are HeadwaterGroups

    def invoke(self, ctx: click.Context) -> Any:
        """Run the group and its sub-command; translate a HeadwaterError (not already a click exception)."""
        return translated(super().invoke, ctx)
