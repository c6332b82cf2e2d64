"""The one root of the errors headwater raises on purpose.

Every error class of registry/, pipelines/, ranking/, serving/ and cli/ derives from
:class:`HeadwaterError` (most keep their older base too, e.g. ``ConfigError(HeadwaterError,
ValueError)``), so a boundary can catch "ours" alone: the CLI prints ``Error: <message>`` for a
HeadwaterError and lets anything else (a bug, a library's surprise) show its traceback.
headwater.client imports nothing of ours and has its own root, ``RankingError``.
"""

from __future__ import annotations

from typing import ClassVar


class HeadwaterError(Exception):
    """An error headwater raises on purpose: a bad input, a missing file, a refused state.

    ``str(exc)`` is the message for the user (what, expected, found, what to do). ``exit_code`` is
    the status the CLI exits with when this error ends a command (1; a class may say otherwise).
    """

    exit_code: ClassVar[int] = 1
