"""Turn one row of a user's file into one event of a source, or a reason why it cannot be one.

A row is whatever a reader gives (a JSON object, CSV cells as text, a Parquet row): values are
coerced to the source's current schema field by field (:class:`~headwater.registry.plans.PlanField`):

- ``string``: text (a whole number is taken as its decimal text: ids are often numbers);
- ``enum``: one of the symbols, exactly;
- ``int``/``long``: a whole number, or text of one, within the Avro range;
- ``float``/``double``: a finite number, or text of one;
- ``boolean``: true/false (or 1/0, or their text);
- ``timestamp``: ISO-8601 text (``2024-05-01T12:00:00Z``; text without an offset is read as UTC),
  a date/datetime value (Parquet), or a number in the field's own unit (ms or us since 1970);
- a missing field takes its schema default, else null when nullable; an empty CSV cell is null
  for a nullable field. Columns the schema does not have are ignored (and listed by the reader).

Then the optional time shift moves every timestamp field by the same amount (durations between
them are kept), and the source's codec checks what the schema cannot (event-time bounds, key and
event-id lengths, the source's rules). :meth:`RowChecker.check` never raises on any input.
"""

from __future__ import annotations

import decimal
import json
import math
import numbers
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any

from headwater.pipelines.events.codec import EncodeError, EventCodec, Reason
from headwater.registry.errors import HeadwaterError
from headwater.registry.expr import Compare, InList, IsNull, fields_of, from_json
from headwater.registry.plans import PlanField, PlanSource

INT_RANGE = (-(2**31), 2**31 - 1)
LONG_RANGE = (-(2**63), 2**63 - 1)
FLOAT_MAX = 3.4028234663852886e38
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
UNIT_DELTA = {"ms": timedelta(milliseconds=1), "us": timedelta(microseconds=1)}
UNIT_PER_MS = {"ms": 1, "us": 1000}
MAX_SHOWN = 40
"""Characters of a bad value quoted in a reason."""
MAX_IGNORED = 20
"""Names of ignored columns kept for the run's summary."""
MAX_DIGITS = 40
"""Longer numbers are out of every range here; refusing them early keeps a crafted row cheap."""
_WHOLE = re.compile(r"^[+-]?\d+$")
_TRUE = frozenset({"true", "1", "t", "yes", "y"})
_FALSE = frozenset({"false", "0", "f", "no", "n"})
_MISSING = object()


@dataclass(frozen=True, slots=True)
class RowError:
    """Why a row is not an event: the field at fault (None for the whole row) and what to change."""

    field: str | None
    reason: str
    code: str | None = None
    """The dead-letter reason of the row when it is not ``invalid_field``: ``invalid_id`` for a key
    or event id against the source's id policy (:class:`~headwater.pipelines.events.codec.Reason`)."""

    def __str__(self) -> str:
        return f"{self.field}: {self.reason}" if self.field else self.reason


@dataclass(frozen=True, slots=True)
class CheckedRow:
    """A row that is a valid event of the source: the event, its Avro bytes and its Kafka key."""

    event: dict[str, Any]
    value: bytes
    key: bytes | None
    event_time_ms: int


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= MAX_SHOWN else text[: MAX_SHOWN - 3] + "..."


def _type_name(value: Any) -> str:
    if isinstance(value, str):
        return "text"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, numbers.Number | decimal.Decimal):
        return "a number"
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list | tuple):
        return "a list"
    return type(value).__name__


class CoerceError(HeadwaterError, ValueError):
    """One value that does not fit its field; the message says what was expected."""


def to_whole(value: Any, what: str) -> int:
    """Return a whole number from an int, an integral float/Decimal or their text.

    Raises:
        CoerceError: anything else (a fraction, NaN, a boolean, other text).
    """
    if isinstance(value, bool):
        raise CoerceError(f"expected {what}, found a boolean {value!r}")
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, str):
        text = value.strip()
        if _WHOLE.match(text) and len(text) <= MAX_DIGITS:
            return int(text)
        value = _decimal_text(text, what)
    if isinstance(value, numbers.Real | decimal.Decimal):
        if isinstance(value, decimal.Decimal):
            if not _small_decimal(value) or value != value.to_integral_value():
                raise CoerceError(f"expected {what}, found {_shown(value)}")
            return int(value)
        number = float(value)
        if not math.isfinite(number) or not number.is_integer():
            raise CoerceError(f"expected {what}, found {_shown(value)}")
        return int(number)
    raise CoerceError(f"expected {what}, found {_type_name(value)} {_shown(value)}")


def to_timestamp(value: Any, unit: str) -> int:
    """Return a timestamp in ``unit`` (ms or us since 1970, UTC) from ISO-8601 text, a datetime or a number.

    Text without a UTC offset and a naive datetime are read as UTC; a date is its midnight UTC;
    a number (or text of one) is taken as already in ``unit`` (a fraction is rounded).

    Raises:
        CoerceError: anything else.
    """
    expected = (
        f"an ISO-8601 time such as 2024-05-01T12:00:00Z, or a whole number of "
        f"{'milliseconds' if unit == 'ms' else 'microseconds'} since 1970-01-01 UTC (the field's unit)"
    )
    if isinstance(value, bool):
        raise CoerceError(f"expected {expected}, found a boolean")
    if isinstance(value, str):
        text = value.strip()
        if _WHOLE.match(text) and len(text) <= MAX_DIGITS:
            return int(text)
        try:
            return _round_number(decimal.Decimal(text), expected)
        except decimal.InvalidOperation:
            pass
        try:
            value = datetime.fromisoformat(text)
        except ValueError:
            raise CoerceError(f"expected {expected}, found text {_shown(text)}") from None
    if isinstance(value, datetime):
        moment = value if value.tzinfo is not None else value.replace(tzinfo=UTC)
        try:
            return (moment - EPOCH) // UNIT_DELTA[unit]
        except (OverflowError, ValueError) as exc:  # an offset that pushes the time outside datetime's range
            raise CoerceError(f"expected {expected}, found {_shown(value)} ({exc})") from None
    if isinstance(value, date):
        return (datetime(value.year, value.month, value.day, tzinfo=UTC) - EPOCH) // UNIT_DELTA[unit]
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real | decimal.Decimal):
        return _round_number(value, expected)
    raise CoerceError(f"expected {expected}, found {_type_name(value)} {_shown(value)}")


def _small_decimal(value: decimal.Decimal) -> bool:
    """Finite and fewer than :data:`MAX_DIGITS` digits before the point (cheap to turn into an int)."""
    return value.is_finite() and value.adjusted() < MAX_DIGITS


def _decimal_text(text: str, what: str) -> decimal.Decimal:
    try:
        return decimal.Decimal(text)
    except decimal.InvalidOperation:
        raise CoerceError(f"expected {what}, found text {_shown(text)}") from None


def _round_number(value: numbers.Real | decimal.Decimal, expected: str) -> int:
    if isinstance(value, decimal.Decimal):
        if not _small_decimal(value):
            raise CoerceError(f"expected {expected}, found {_shown(value)}")
        return int(value.to_integral_value(rounding=decimal.ROUND_HALF_EVEN))
    number = float(value)
    if not math.isfinite(number):
        raise CoerceError(f"expected {expected}, found {_shown(value)}")
    return round(number)


def _to_string(value: Any) -> str:
    if isinstance(value, str):
        text = value
    elif isinstance(value, numbers.Integral) and not isinstance(value, bool):
        text = str(int(value))
    elif isinstance(value, bytes):
        try:
            text = value.decode("utf-8")
        except UnicodeDecodeError:
            msg = "expected UTF-8 text, found bytes that are not UTF-8"
            raise CoerceError(msg) from None
    else:
        raise CoerceError(f"expected text, found {_type_name(value)} {_shown(value)}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        msg = "expected UTF-8 text, found bytes that are not UTF-8 (check the file's encoding)"
        raise CoerceError(msg) from None
    return text


def _to_double(value: Any, single: bool) -> float:
    what = "a finite number" + (" (float)" if single else "")
    if isinstance(value, bool):
        raise CoerceError(f"expected {what}, found a boolean {value!r}")
    if isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            raise CoerceError(f"expected {what}, found text {_shown(value)}") from None
    elif isinstance(value, numbers.Real | decimal.Decimal):
        try:
            number = float(value)
        except OverflowError:
            raise CoerceError(f"expected {what}, found {_shown(value)}") from None
    else:
        raise CoerceError(f"expected {what}, found {_type_name(value)} {_shown(value)}")
    if not math.isfinite(number) or (single and abs(number) > FLOAT_MAX):
        raise CoerceError(f"expected {what}, found {_shown(value)}")
    return number


def _to_boolean(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, numbers.Integral) and int(value) in (0, 1):
        return bool(value)
    if isinstance(value, str):
        text = value.strip().lower()
        if text in _TRUE:
            return True
        if text in _FALSE:
            return False
    raise CoerceError(f"expected true or false, found {_type_name(value)} {_shown(value)}")


def _converter(f: PlanField) -> Callable[[Any], Any]:
    """Return the function that turns one value into field ``f``'s Python value (it raises CoerceError)."""
    kind = f.kind
    if kind == "string":
        return _to_string
    if kind == "enum":
        symbols = tuple(f.symbols)
        allowed = ", ".join(symbols)

        def enum(value: Any) -> str:
            if isinstance(value, str) and value in symbols:
                return value
            if isinstance(value, str):
                near = [s for s in symbols if s.lower() == value.strip().lower()]
                hint = f" (did you mean {near[0]!r}? symbols are case-sensitive)" if near else ""
                raise CoerceError(f"expected one of {allowed}, found {_shown(value)}{hint}")
            raise CoerceError(f"expected one of {allowed}, found {_type_name(value)} {_shown(value)}")

        return enum
    if kind in ("int", "long"):
        low, high = INT_RANGE if kind == "int" else LONG_RANGE
        what = f"a whole number ({kind})"

        def whole(value: Any) -> int:
            number = to_whole(value, what)
            if not low <= number <= high:
                raise CoerceError(f"expected {what} in [{low}, {high}], found {_shown(number)}")
            return number

        return whole
    if kind in ("float", "double"):
        single = kind == "float"
        return lambda value: _to_double(value, single)
    if kind == "boolean":
        return _to_boolean
    if kind == "timestamp":
        unit = f.time_unit or "ms"

        def timestamp(value: Any) -> int:
            number = to_timestamp(value, unit)
            if not LONG_RANGE[0] <= number <= LONG_RANGE[1]:
                raise CoerceError(f"expected a time within Avro's long range, found {_shown(value)}")
            return number

        return timestamp
    msg = f"field {f.name!r} has kind {kind!r}, which no reader supports"
    raise ValueError(msg)


def _rule_fields(ast: dict[str, Any]) -> list[str]:
    """Return the fields a rule reads, in order, once each."""
    leaves = fields_of(from_json(ast))
    return list(dict.fromkeys(leaf.field for leaf in leaves if isinstance(leaf, Compare | InList | IsNull)))


def schema_defaults(source: PlanSource) -> dict[str, Any]:
    """Return the ``default`` of each current-schema field that declares one (Avro JSON form)."""
    fields = json.loads(source.current.json_text).get("fields", [])
    return {entry["name"]: entry["default"] for entry in fields if "default" in entry}


class RowChecker:
    """Coerce, time-shift, encode and validate rows for one source; never raises on a bad row.

    Args:
        source: the source of the applied plan.
        codec: its codec (default: built from ``source``).
        text_cells: the rows come from CSV, every value is text: an empty cell is null for a
            nullable field.
        shift_ms: milliseconds added to every timestamp field (see ``--time-shift``).
    """

    def __init__(
        self,
        source: PlanSource,
        codec: EventCodec | None = None,
        *,
        text_cells: bool = False,
        shift_ms: int = 0,
    ) -> None:
        """Build the per-field converters once."""
        self.source = source
        self.codec = codec if codec is not None else EventCodec(source)
        self.text_cells = text_cells
        self.shift_ms = shift_ms
        self._defaults = schema_defaults(source)
        self._fields = [(f, _converter(f)) for f in source.fields]
        self._names = frozenset(f.name for f in source.fields)
        self._time_fields = [
            (f.name, UNIT_PER_MS[f.time_unit or "ms"]) for f in source.fields if f.kind == "timestamp"
        ]
        self._rule_fields = [(w.text, _rule_fields(w.ast)) for w in source.rules]
        self.ignored_columns: set[str] = set()
        """Columns seen in rows that the schema does not have (at most :data:`MAX_IGNORED`)."""

    def coerce(self, row: Any) -> dict[str, Any] | RowError:
        """Return the row as an event of the current schema (no shift, no validation), or what is wrong."""
        if not isinstance(row, Mapping):
            return RowError(
                None, f"expected an object with the source's fields, found {_type_name(row)} {_shown(row)}"
            )
        event: dict[str, Any] = {}
        for f, convert in self._fields:
            value = row.get(f.name, _MISSING)
            if value is _MISSING:
                if f.name in self._defaults:
                    event[f.name] = self._defaults[f.name]
                    continue
                if f.nullable:
                    event[f.name] = None
                    continue
                return RowError(
                    f.name, f"missing ({f.kind}, not nullable): add a column {f.name!r} to the file"
                )
            if self.text_cells and value == "" and (f.nullable or f.kind != "string"):
                if not f.nullable:
                    return RowError(f.name, f"empty cell, but the field is a {f.kind} that is not nullable")
                value = None
            if value is None:
                if not f.nullable:
                    return RowError(f.name, f"null, but the field ({f.kind}) is not nullable")
                event[f.name] = None
                continue
            try:
                event[f.name] = convert(value)
            except CoerceError as exc:
                return RowError(f.name, str(exc))
        if len(self.ignored_columns) < MAX_IGNORED and not self._names.issuperset(row.keys()):
            for key in row:
                if key not in self._names:
                    self.ignored_columns.add(str(key)[:MAX_SHOWN])
                    if len(self.ignored_columns) >= MAX_IGNORED:
                        break
        return event

    def shift(self, event: dict[str, Any]) -> RowError | None:
        """Move every timestamp field by ``shift_ms`` in place; an error if one leaves Avro's range."""
        if not self.shift_ms:
            return None
        for name, per_ms in self._time_fields:
            value = event.get(name)
            if value is not None:
                moved = value + self.shift_ms * per_ms
                if not LONG_RANGE[0] <= moved <= LONG_RANGE[1]:
                    return RowError(name, f"the time shift moves {value} outside Avro's long range")
                event[name] = moved
        return None

    def check(self, row: Any) -> CheckedRow | RowError:
        """Coerce, shift, encode and validate one row; a valid event or the reason it is not one."""
        event = self.coerce(row)
        if isinstance(event, RowError):
            return event
        problem = self.shift(event)
        if problem is not None:
            return problem
        codec = self.codec
        failed = codec.check(event)
        if failed is not None and failed.reason is Reason.INVALID_ID:
            # the id policy's text whole, as the tiers write it (``id-too-long: key user_id is ...``)
            return RowError(failed.field, failed.detail, Reason.INVALID_ID.value)
        if failed is not None:
            return self._invalid(failed.detail, event)
        try:
            value = codec.encode(event)
        except EncodeError as exc:
            return RowError(None, str(exc))
        return CheckedRow(
            event=event, value=value, key=codec.key(event), event_time_ms=codec.event_time_ms(event)
        )

    def _invalid(self, problem: str, event: Mapping[str, Any]) -> RowError:
        """Name the field of a validation failure; for a rule, its fields and their values in the row."""
        name, sep, rest = problem.partition(": ")
        if sep and name in self._names:
            return RowError(name, rest)
        for text, names in self._rule_fields:
            if repr(text) in problem:
                values = ", ".join(f"{n} = {_shown(event.get(n))}" for n in names)
                return RowError(", ".join(names), f"{problem} ({values})")
        return RowError(None, problem)

    def event_time_ms(self, row: Any) -> int | None:
        """Return the row's event time in UTC ms before any shift, or None when it has none that converts."""
        if not isinstance(row, Mapping):
            return None
        f = self.source.field(self.source.event_time)
        value = row.get(self.source.event_time)
        if f is None or value is None or (self.text_cells and value == ""):
            return None
        try:
            return to_timestamp(value, f.time_unit or "ms") // UNIT_PER_MS[f.time_unit or "ms"]
        except CoerceError:
            return None
