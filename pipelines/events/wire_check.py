"""Check that bytes are a well-formed Avro binary record of a schema before fastavro reads them.

fastavro reads what Avro's Java decoder (and so the realtime tier's JVM decode) rejects: it indexes
an enum's symbols and a union's branches with the decoded integer Python-style, so a corrupt byte
that decodes as -1 yields the *last* symbol or branch instead of an error; and a negative string
length reads to the end of the payload. :func:`compile_checker` walks the encoding the way Java's
``BinaryDecoder`` does and names the first thing that is not a valid encoding:

- an ``int`` varint longer than 5 bytes, a ``long`` varint longer than 10 bytes (a full-length one
  whose last byte has bits past 32 or 64 bits is :class:`Noncanonical`: Java drops them, so the
  caller clears them and reads again);
- a negative or past-the-end length of a string, bytes or a block;
- an enum index or a union branch index outside ``[0, n)``;
- a record that does not use every byte of the payload.

The walk reads no values into Python objects. For the flat records event schemas use (primitives,
enums, unions of them) it is generated as one straight-line function with a fast path for one-byte
varints, so it costs a few microseconds per event; other schemas are walked by composed steps.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from headwater.registry.errors import HeadwaterError

# One step reads the value that starts at ``pos`` in ``data`` and returns the position after it.
Step = Callable[[bytes, int], int]


class WireError(HeadwaterError, ValueError):
    """The bytes are not a valid encoding of the schema; the message says what and at which byte."""


class Noncanonical(WireError):
    """A full-length varint whose last byte carries bits past 32 (int) or 64 (long) bits.

    Java's ``BinaryDecoder`` drops those bits without a word (it shifts them out of its ``int`` or
    ``long``), so the JVM decodes such a record. :meth:`headwater.pipelines.events.codec.EventCodec.decode`
    writes ``byte`` at ``pos`` (the same value with the dropped bits cleared) and reads again, so both
    decoders see the same value and give the same verdict.
    """

    def __init__(self, what: str, pos: int, byte: int) -> None:
        super().__init__(f"{what} varint at byte {pos} has bits past its width (Java drops them)")
        self.pos = pos
        self.byte = byte


def compile_checker(schema: Any) -> Callable[[bytes], None]:
    """Return a function that raises :class:`WireError` unless its argument is one record of ``schema``.

    ``schema`` is the schema as JSON data (the parsed ``.avsc``), logical types allowed.
    """
    flat = _flat_checker(schema)
    if flat is not None:
        return flat
    step = _Compiler().step(schema)

    def check(data: bytes) -> None:
        end = step(data, 0)
        if end != len(data):
            msg = f"{len(data) - end} trailing bytes after a {end}-byte record"
            raise WireError(msg)

    return check


def _varint(data: bytes, pos: int, max_bytes: int, what: str) -> tuple[int, int]:
    """Read a zig-zag varint at ``pos``; return (value, next position)."""
    result = 0
    shift = 0
    start = pos
    size = len(data)
    while True:
        if pos >= size:
            msg = f"the payload ends inside the {what} at byte {start}"
            raise WireError(msg)
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return (result >> 1) ^ -(result & 1), pos
        shift += 7
        if pos - start >= max_bytes:
            msg = f"invalid {what} encoding at byte {start}: more than {max_bytes} varint bytes"
            raise WireError(msg)


def _read_int(data: bytes, pos: int, what: str) -> tuple[int, int]:
    value, end = _varint(data, pos, 5, what)
    if not -(2**31) <= value < 2**31:  # only a 5-byte varint gets here: Java keeps 4 bits of its last
        raise Noncanonical(what, end - 1, data[end - 1] & 0x0F)
    return value, end


def _skip(data: bytes, pos: int, size: int, what: str) -> int:
    end = pos + size
    if end > len(data):
        msg = (
            f"the payload ends inside the {what} at byte {pos} ({size} bytes needed, {len(data) - pos} left)"
        )
        raise WireError(msg)
    return end


class _Compiler:
    def __init__(self) -> None:
        self.named: dict[str, Step] = {}

    def step(self, schema: Any, namespace: str = "") -> Step:
        if isinstance(schema, list):
            return self._union(schema, namespace)
        if isinstance(schema, str):
            primitive = _PRIMITIVES.get(schema)
            if primitive is not None:
                return primitive
            full = schema if "." in schema or not namespace else f"{namespace}.{schema}"
            for name in (full, schema):
                if name in self.named:
                    return self._by_name(name)
            msg = f"unknown Avro type {schema!r}"
            raise ValueError(msg)
        kind = schema["type"]
        if kind == "record" or kind == "error":
            return self._record(schema, namespace)
        if kind == "enum":
            step = _enum_step(schema["name"], len(schema["symbols"]))
            self._register(schema, namespace, step)
            return step
        if kind == "fixed":
            step = _fixed_step(int(schema["size"]))
            self._register(schema, namespace, step)
            return step
        if kind == "array":
            return _block_step(self.step(schema["items"], namespace), with_keys=False)
        if kind == "map":
            return _block_step(self.step(schema["values"], namespace), with_keys=True)
        return self.step(kind, namespace)

    def _register(self, schema: dict[str, Any], namespace: str, step: Step) -> None:
        name = schema["name"]
        space = schema.get("namespace", namespace)
        self.named[name if "." in name or not space else f"{space}.{name}"] = step
        self.named.setdefault(name.rsplit(".", 1)[-1], step)

    def _by_name(self, name: str) -> Step:
        # Looked up when called, so a record may refer to itself (a linked list).
        return lambda data, pos: self.named[name](data, pos)

    def _record(self, schema: dict[str, Any], namespace: str) -> Step:
        space = schema.get("namespace", namespace)
        if "." in schema["name"]:
            space = schema["name"].rsplit(".", 1)[0]
        fields: list[Step] = []

        def record(data: bytes, pos: int) -> int:
            for field_step in fields:
                pos = field_step(data, pos)
            return pos

        self._register(schema, namespace, record)
        fields.extend(self.step(entry["type"], space) for entry in schema["fields"])
        return record

    def _union(self, branches: list[Any], namespace: str) -> Step:
        steps = [self.step(branch, namespace) for branch in branches]
        count = len(steps)

        def union(data: bytes, pos: int) -> int:
            index, end = _read_int(data, pos, "union index")
            if not 0 <= index < count:
                msg = f"union branch index {index} at byte {pos} is outside [0, {count})"
                raise WireError(msg)
            return steps[index](data, end)

        return union


def _enum_step(name: str, count: int) -> Step:
    def enum(data: bytes, pos: int) -> int:
        index, end = _read_int(data, pos, "enum index")
        if not 0 <= index < count:
            msg = f"enum {name} index {index} at byte {pos} is outside [0, {count})"
            raise WireError(msg)
        return end

    return enum


def _fixed_step(size: int) -> Step:
    return lambda data, pos: _skip(data, pos, size, "fixed")


def _block_step(item: Step, *, with_keys: bool) -> Step:
    what = "map" if with_keys else "array"

    def blocks(data: bytes, pos: int) -> int:
        while True:
            count, pos = _varint(data, pos, 10, f"{what} block count")
            if count == 0:
                return pos
            if count < 0:
                # A negative count is followed by the block's size in bytes (to let readers skip it).
                size, pos = _varint(data, pos, 10, f"{what} block size")
                if size < 0:
                    msg = f"negative {what} block size {size} at byte {pos}"
                    raise WireError(msg)
                count = -count
            for _ in range(count):
                if with_keys:
                    pos = _string(data, pos)
                pos = item(data, pos)

    return blocks


def _null(_data: bytes, pos: int) -> int:
    return pos


def _boolean(data: bytes, pos: int) -> int:
    return _skip(data, pos, 1, "boolean")


def _int(data: bytes, pos: int) -> int:
    return _read_int(data, pos, "int")[1]


def _long(data: bytes, pos: int) -> int:
    value, end = _varint(data, pos, 10, "long")
    if not -(2**63) <= value < 2**63:  # only a 10-byte varint gets here: Java keeps 1 bit of its last
        what = "long"
        raise Noncanonical(what, end - 1, data[end - 1] & 0x01)
    return end


def _float(data: bytes, pos: int) -> int:
    return _skip(data, pos, 4, "float")


def _double(data: bytes, pos: int) -> int:
    return _skip(data, pos, 8, "double")


def _string(data: bytes, pos: int) -> int:
    size, start = _varint(data, pos, 10, "length")
    if size < 0:
        msg = f"negative length {size} at byte {pos}"
        raise WireError(msg)
    return _skip(data, start, size, "string or bytes")


_PRIMITIVES: dict[str, Step] = {
    "null": _null,
    "boolean": _boolean,
    "int": _int,
    "long": _long,
    "float": _float,
    "double": _double,
    "string": _string,
    "bytes": _string,
}


# --- the generated checker for flat records -------------------------------------------------------

_FIXED_SIZES = {"boolean": 1, "float": 4, "double": 8}


def _flat_checker(schema: Any) -> Callable[[bytes], None] | None:
    """Generate a straight-line checker for a record of primitives, enums and unions (else None).

    Each value's first byte decides the fast path (a one-byte varint that is in range); anything
    else goes to a helper that reads the whole varint and names what is wrong.
    """
    if not isinstance(schema, dict) or schema.get("type") != "record":
        return None
    # d[p] past the end raises IndexError: one handler instead of a bounds check per value.
    lines = ["def check(d):", "    n = len(d)", "    p = 0", "    try:"]
    try:
        for entry in schema["fields"]:
            lines.extend(_flat_lines(entry["type"], "        "))
    except _NotFlat:
        return None
    lines += ["    except IndexError:", "        _ended(p, n)", "    if p != n:", "        _finish(n, p)"]
    scope: dict[str, Any] = {
        "_ended": _ended,
        "_slow_int": _slow_int,
        "_slow_long": _slow_long,
        "_slow_length": _slow_length,
        "_slow_index": _slow_index,
        "_finish": _finish,
    }
    # Our own code, generated from a parsed schema: no text of the payload gets into it.
    exec(compile("\n".join(lines), f"<wire check of {schema.get('name')}>", "exec"), scope)
    checker: Callable[[bytes], None] = scope["check"]
    return checker


class _NotFlat(Exception):
    """The schema has a type the straight-line checker does not generate (arrays, maps, named refs)."""


def _first_byte(pad: str, _what: str) -> str:
    return f"{pad}b = d[p]"


def _flat_lines(avro_type: Any, pad: str) -> list[str]:
    if isinstance(avro_type, list):
        count = len(avro_type)
        lines = [
            _first_byte(pad, "union index"),
            # one byte, even (zig-zag of a non-negative number), in range: the index is b / 2
            f"{pad}if b < {2 * count} and not b & 1:",
            f"{pad}    v = b >> 1",
            f"{pad}    p += 1",
            f"{pad}else:",
            f"{pad}    v, p = _slow_index(d, p, 'union branch', {count})",
        ]
        for index, branch in enumerate(avro_type):
            body = _flat_lines(branch, pad + "    ") or [f"{pad}    pass"]
            lines += [f"{pad}{'if' if index == 0 else 'elif'} v == {index}:", *body]
        return lines
    kind = avro_type.get("type") if isinstance(avro_type, dict) else avro_type
    if isinstance(kind, dict | list):
        return _flat_lines(kind, pad)
    if kind == "null":
        return []
    if kind in _FIXED_SIZES:
        # An overrun is found by the next read's bounds check or by the final length check.
        return [f"{pad}p += {_FIXED_SIZES[kind]}"]
    if kind in ("int", "long"):
        slow = "_slow_int(d, p)" if kind == "int" else "_slow_long(d, p)"
        return [
            _first_byte(pad, kind),
            f"{pad}if b < 128:",
            f"{pad}    p += 1",
            f"{pad}else:",
            f"{pad}    p = {slow}",
        ]
    if kind in ("string", "bytes"):
        return [
            _first_byte(pad, "length"),
            f"{pad}if not b & 0x81:",  # one byte (< 128) and even: a length of b / 2
            f"{pad}    p += 1 + (b >> 1)",
            f"{pad}else:",
            f"{pad}    p = _slow_length(d, p)",
        ]
    if kind == "enum" and isinstance(avro_type, dict):
        what = "enum " + str(avro_type["name"]).rsplit(".", 1)[-1]
        count = len(avro_type["symbols"])
        return [
            _first_byte(pad, "enum index"),
            f"{pad}if b < {2 * count} and not b & 1:",
            f"{pad}    p += 1",
            f"{pad}else:",
            f"{pad}    p = _slow_index(d, p, {what!r}, {count})[1]",
        ]
    raise _NotFlat


def _slow_int(data: bytes, pos: int) -> int:
    return _read_int(data, pos, "int")[1]


def _slow_long(data: bytes, pos: int) -> int:
    return _long(data, pos)


def _slow_length(data: bytes, pos: int) -> int:
    """Skip a string or bytes value whose length is not a one-byte varint (or is negative)."""
    return _string(data, pos)


def _slow_index(data: bytes, pos: int, what: str, count: int) -> tuple[int, int]:
    """Read an enum or union index that is not a small non-negative one-byte varint; check its range."""
    index, end = _read_int(data, pos, f"{what} index")
    if not 0 <= index < count:
        msg = f"{what} index {index} at byte {pos} is outside [0, {count})"
        raise WireError(msg)
    return index, end


def _ended(pos: int, size: int) -> None:
    if pos > size:
        msg = f"the payload ends inside a value, {pos - size} bytes short (a {size}-byte payload)"
    else:
        msg = f"the payload ends at byte {size}, before the record is complete"
    raise WireError(msg)


def _finish(size: int, pos: int) -> None:
    if pos > size:
        msg = f"the payload ends inside the record ({pos - size} more bytes needed after {size})"
    else:
        msg = f"{size - pos} trailing bytes after a {pos}-byte record"
    raise WireError(msg)
