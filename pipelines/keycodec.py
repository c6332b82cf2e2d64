r"""Composite keys whose parts are data, never syntax: one length-prefixed codec for every tier.

A composite key (a nearline pane key: view, entity, pane start; a dedup key; an entry of the
online store's change feed) is its parts, each written as ``<decimal length>:<bytes>``::

    pack_parts(["nl_activity", "u\x1f42", 1000]) == b"11:nl_activity4:u\x1f424:1000"

An entity id, view name or event id of any bytes or Unicode (``\x1f``, ``\n``, ``\x00``, ``:``,
digits, glob characters, lone surrogates) is read back exactly: the length says where a part ends,
so no byte inside it is ever a separator. Text is UTF-8 (``surrogatepass``: every Python ``str``
has an encoding, and it is the UTF-8 bytes for every string that is valid Unicode, the same bytes
Redis keys and Kafka keys carry).

:func:`unpack_parts` reads defensively: a truncated part, a length that is not a decimal number,
trailing bytes or the wrong number of parts raise :class:`KeyFormatError` (a ``HeadwaterError``),
which readers count and skip; nothing here raises anything else on any input.

``write.lua`` writes the change feed in the same format (``#id .. ':' .. id``); keep both in sync.
"""

from __future__ import annotations

from collections.abc import Iterable

from headwater.registry.errors import HeadwaterError

MAX_LENGTH_DIGITS = 10
"""A part is at most 9,999,999,999 bytes: a longer length field is not a key of ours."""


class KeyFormatError(HeadwaterError, ValueError):
    """Bytes that are not a composite key of :func:`pack_parts` (or not the expected number of parts)."""


def to_bytes(part: str | bytes | int) -> bytes:
    """Return the bytes of one part: text as UTF-8 (surrogatepass), an int in decimal, bytes as they are."""
    if isinstance(part, bytes):
        return part
    if isinstance(part, bool) or not isinstance(part, (str, int)):
        msg = f"a key part must be str, bytes or int; got {part!r} ({type(part).__name__})"
        raise KeyFormatError(msg)
    if isinstance(part, int):
        return str(part).encode("ascii")
    return part.encode("utf-8", "surrogatepass")


def to_text(part: bytes) -> str:
    """Return the text of a part written from a ``str`` (the inverse of :func:`to_bytes` for text)."""
    try:
        return part.decode("utf-8", "surrogatepass")
    except UnicodeDecodeError as exc:
        msg = f"key part {part[:40]!r} is not UTF-8: {exc}"
        raise KeyFormatError(msg) from exc


def to_int(part: bytes) -> int:
    """Return the int of a part written from an ``int`` (an optional '-', then ASCII digits)."""
    digits = part[1:] if part[:1] == b"-" else part
    if not digits or not digits.isdigit() or not digits.isascii():
        msg = f"key part {part[:40]!r} is not a decimal integer"
        raise KeyFormatError(msg)
    return int(part)


def pack_parts(parts: Iterable[str | bytes | int]) -> bytes:
    """Return ``parts`` as one key: each part as ``<decimal length>:<bytes>``, concatenated."""
    out = bytearray()
    for part in parts:
        raw = to_bytes(part)
        out += b"%d:" % len(raw)
        out += raw
    return bytes(out)


def unpack_parts(raw: bytes, count: int | None = None) -> list[bytes]:
    """Return the parts of a key written by :func:`pack_parts` (``count``: exactly that many).

    Raises:
        KeyFormatError: ``raw`` is not such a key, or has another number of parts than ``count``.
    """
    parts: list[bytes] = []
    pos, end = 0, len(raw)
    while pos < end:
        colon = raw.find(b":", pos, pos + MAX_LENGTH_DIGITS + 1)
        digits = raw[pos:colon] if colon >= 0 else b""
        if (
            not digits
            or not digits.isdigit()
            or not digits.isascii()
            or (len(digits) > 1 and digits[:1] == b"0")
        ):
            msg = f"key {raw[:60]!r}: no part length ('<digits>:') at byte {pos}"
            raise KeyFormatError(msg)
        start = colon + 1
        stop = start + int(digits)
        if stop > end:
            msg = f"key {raw[:60]!r}: part at byte {pos} says {int(digits)} bytes, {end - start} are left"
            raise KeyFormatError(msg)
        parts.append(raw[start:stop])
        pos = stop
    if count is not None and len(parts) != count:
        msg = f"key {raw[:60]!r}: {len(parts)} parts, expected {count}"
        raise KeyFormatError(msg)
    return parts
