"""The id policy of a source: one check of its key and event-id text, the same in every tier.

A source's ``ids:`` block in ``sources.yaml`` (resolved into :class:`~headwater.registry.plans.PlanSource`
as ``id_max_bytes`` and ``id_charset``) bounds the text of its string key and event-id fields:

- ``max_bytes``: the UTF-8 length (default 256): ids are stored in every key, changelog and state of
  every tier, so one huge id must not bloat them;
- ``charset: any`` (default): any valid UTF-8 but NUL; ``charset: printable``: also none of
  :data:`NOT_PRINTABLE` (controls, line separators, bidirectional and invisible format characters).

:func:`check_id` returns a reason text (``id-<kind>: <role> <field> ...``) or None, never raises; the
codec (:class:`~headwater.pipelines.events.codec.EventCodec`) dead-letters an event with it as
``invalid_id``, and the JVM decode of the realtime tier (infra/maven/flink-udfs ``EventDecoder``) is
given the same policy and :data:`NOT_PRINTABLE` by pipelines/realtime/decode.py and writes the same text.
The set is a fixed list of code points, not a Unicode category, so Python and Java (whose Unicode
versions differ) agree on every string.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from headwater.registry.sources import DEFAULT_ID_CHARSET, DEFAULT_ID_MAX_BYTES

NOT_PRINTABLE: tuple[tuple[int, int], ...] = (
    (0x0000, 0x001F),  # C0 controls (NUL, tab, newline, escape...)
    (0x007F, 0x009F),  # DEL and the C1 controls
    (0x061C, 0x061C),  # Arabic letter mark (bidirectional)
    (0x180E, 0x180E),  # Mongolian vowel separator (invisible)
    (0x200B, 0x200F),  # zero-width space/joiners, left-to-right and right-to-left marks
    (0x2028, 0x2029),  # line and paragraph separators
    (0x202A, 0x202E),  # bidirectional embeddings and overrides
    (0x2060, 0x2064),  # word joiner and invisible operators
    (0x2066, 0x2069),  # bidirectional isolates
    (0xFEFF, 0xFEFF),  # zero-width no-break space (byte-order mark)
)
"""Inclusive code point ranges a ``printable`` id may not hold: every Unicode control character
(category Cc) and the characters that change how text around them shows without showing themselves."""
ANY_FORBIDDEN: tuple[tuple[int, int], ...] = ((0x0000, 0x0000),)
"""What an ``any`` id may not hold: NUL (C strings, Redis tools and logs end at it)."""
CHARSETS = {"any": ANY_FORBIDDEN, "printable": NOT_PRINTABLE}


def _pattern(ranges: tuple[tuple[int, int], ...]) -> re.Pattern[str]:
    return re.compile("[" + "".join(f"\\U{lo:08x}-\\U{hi:08x}" for lo, hi in ranges) + "]")


_PATTERNS = {name: _pattern(ranges) for name, ranges in CHARSETS.items()}


@dataclass(frozen=True, slots=True)
class IdPolicy:
    """A source's bound on its id text: at most ``max_bytes`` UTF-8 bytes, of ``charset``."""

    max_bytes: int = DEFAULT_ID_MAX_BYTES
    charset: str = DEFAULT_ID_CHARSET

    @property
    def forbidden(self) -> tuple[tuple[int, int], ...]:
        """The code point ranges an id may not hold under this policy."""
        return CHARSETS[self.charset]


def _forbidden_at(text: str, charset: str) -> tuple[int, int] | None:
    """Return (index, code point) of the first character of ``text`` that ``charset`` forbids, or None."""
    if text.isascii() and text.isprintable():  # the common id: no charset forbids any of U+0020..U+007E
        return None
    hit = _PATTERNS[charset].search(text)
    return None if hit is None else (hit.start(), ord(hit.group()))


def check_id(role: str, name: str, value: object, policy: IdPolicy) -> str | None:
    """Return why ``value`` breaks ``policy`` as the ``role`` (``key``/``event_id``) field ``name``, or None.

    ``value`` is the decoded text (``bytes`` are read as UTF-8; anything else, an integer id, is
    within any policy whose ``max_bytes`` holds its digits). Checks in order: null or empty
    (``id-empty``), not valid UTF-8 (``id-invalid-utf8``: a lone surrogate, or bytes that do not
    decode), over ``max_bytes`` (``id-too-long``), a forbidden character (``id-has-nul`` under ``any``,
    ``id-not-printable`` under ``printable``, naming the code point and its character index).
    Never raises.
    """
    what = f"{role} {name}"
    if value is None:
        return f"id-empty: {what} is null"
    if isinstance(value, bytes | bytearray):
        try:
            value = bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            return f"id-invalid-utf8: {what} is not valid UTF-8"
    text = value if isinstance(value, str) else str(value)
    if not text:
        return f"id-empty: {what} is empty"
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError:
        return f"id-invalid-utf8: {what} is not valid UTF-8"
    if size > policy.max_bytes:
        return f"id-too-long: {what} is {size} bytes, limit {policy.max_bytes}"
    found = _forbidden_at(text, policy.charset)
    if found is not None:
        index, cp = found
        kind = "id-not-printable" if policy.charset == "printable" else "id-has-nul"
        return f"{kind}: {what} has U+{cp:04X} at character {index} (ids.charset {policy.charset})"
    return None
