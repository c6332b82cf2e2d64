"""Durations as written in feature YAML: short forms (``30s``, ``5m``, ``1h``, ``7d``) and ISO-8601.

Every window, slide, freshness SLA and lateness in the registry goes through :func:`parse_duration`,
so all tiers read the same number of seconds from the compiled plans. Months and years are refused:
they have no fixed length, and a window must mean the same thing on every tier.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from headwater.registry.errors import HeadwaterError

SHORT_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_SHORT = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)\s*$")
_ISO = re.compile(
    r"^P(?:(?P<w>\d+(?:\.\d+)?)W)?(?:(?P<d>\d+(?:\.\d+)?)D)?"
    r"(?:T(?:(?P<h>\d+(?:\.\d+)?)H)?(?:(?P<m>\d+(?:\.\d+)?)M)?(?:(?P<s>\d+(?:\.\d+)?)S)?)?$"
)
_ISO_SECONDS = {"w": 604800, "d": 86400, "h": 3600, "m": 60, "s": 1}
EXPECTED_FORMS = "a duration such as 30s, 5m, 1h, 7d, or ISO-8601 PT30S, PT5M, PT1H, P7D"


class DurationError(HeadwaterError, ValueError):
    """A text that is not a duration; the message says what was found and what is accepted."""


@dataclass(frozen=True, order=True)
class Duration:
    """A positive length of time, kept in (possibly fractional) seconds with the text it came from."""

    seconds: float
    text: str = ""

    def __str__(self) -> str:
        return self.text or format_seconds(self.seconds)

    @property
    def millis(self) -> int:
        """The duration in whole milliseconds (how the pipelines compare event times)."""
        return round(self.seconds * 1000)


def parse_duration(text: str) -> Duration:
    """Parse ``text`` into a :class:`Duration`.

    Raises:
        DurationError: when the text is neither a short form nor an ISO-8601 duration without
            months/years, or when it is zero.
    """
    raw = text.strip()
    short = _SHORT.match(raw)
    seconds = float(short.group(1)) * SHORT_UNITS[short.group(2)] if short else _parse_iso(raw)
    if seconds <= 0:
        msg = f"duration '{text}' is zero; expected a positive {EXPECTED_FORMS}"
        raise DurationError(msg)
    return Duration(seconds=seconds, text=raw)


def _parse_iso(raw: str) -> float:
    upper = raw.upper()
    iso = _ISO.match(upper)
    if not iso or upper in ("P", "PT") or upper.endswith("T"):
        hint = ""
        if re.match(r"^P.*\d+[MY]", upper) and "T" not in upper.split("M")[0]:
            hint = " (months and years have no fixed length: write days, e.g. P30D)"
        msg = f"'{raw}' is not a duration{hint}; expected {EXPECTED_FORMS}"
        raise DurationError(msg)
    return sum(float(value) * _ISO_SECONDS[unit] for unit, value in iso.groupdict().items() if value)


def format_seconds(seconds: float) -> str:
    """Render seconds in the largest short unit that divides them (``300`` -> ``5m``)."""
    if seconds < 1:
        return f"{round(seconds * 1000)}ms"
    for unit in ("w", "d", "h", "m"):
        size = SHORT_UNITS[unit]
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"
