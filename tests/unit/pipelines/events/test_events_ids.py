"""The id policy (pipelines/events/ids.py): the check itself, and the same reason in every Python tier.

The Python tiers share one codec, so each path is driven here with the same bad events: the codec's
decode (what the nearline tasks, the landing and ``events tail`` call), the landing's batch decode
into bronze (``decode_records``), and the row check of ``events produce --from`` / ``events import``
(``RowChecker``). Each must reject with ``invalid_id`` and the same detail text. The JVM decode is
compared in tests/unit/pipelines/realtime/test_java_ids.py; a real Kafka run of the nearline tier in
tests/integration/pipelines/nearline/test_nearline_ids.py.
"""

from __future__ import annotations

import sys
import unicodedata
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headwater.pipelines.events.codec import DecodedEvent, DecodeError, EventCodec, Reason
from headwater.pipelines.events.ids import ANY_FORBIDDEN, NOT_PRINTABLE, IdPolicy, check_id
from headwater.pipelines.events.rows import RowChecker, RowError
from headwater.pipelines.events.schema import behavior_source
from headwater.pipelines.events.testing import Record
from headwater.pipelines.events.timing import SourceTiming
from headwater.pipelines.offline.landing_batch import decode_records
from headwater.pipelines.offline.testing import T0, event
from headwater.registry.plans import PlanSource

KINDS = ("id-empty", "id-invalid-utf8", "id-too-long", "id-has-nul", "id-not-printable")
PRINTABLE = IdPolicy(max_bytes=256, charset="printable")
CONTROLS = [chr(c) for c in range(sys.maxunicode + 1) if unicodedata.category(chr(c)) == "Cc"]


def _forbidden(ranges: tuple[tuple[int, int], ...], text: str) -> bool:
    return any(lo <= ord(c) <= hi for c in text for lo, hi in ranges)


# ---------------------------------------------------------------- the check


def test_each_kind_has_its_text() -> None:
    default = IdPolicy()
    assert (default.max_bytes, default.charset) == (256, "any")
    assert check_id("key", "user_id", "u" * 256, default) is None
    assert (
        check_id("key", "user_id", "u" * 300, default) == "id-too-long: key user_id is 300 bytes, limit 256"
    )
    assert (
        check_id("key", "user_id", "ü" * 129, default) == "id-too-long: key user_id is 258 bytes, limit 256"
    )
    assert check_id("event_id", "event_id", "", default) == "id-empty: event_id event_id is empty"
    assert check_id("event_id", "event_id", None, default) == "id-empty: event_id event_id is null"
    assert (
        check_id("key", "k", "a\x00b", default)
        == "id-has-nul: key k has U+0000 at character 1 (ids.charset any)"
    )
    assert check_id("key", "k", "a\x07b", default) is None  # `any`: only NUL is refused
    assert check_id("key", "k", "éa\x07b", PRINTABLE) == (
        "id-not-printable: key k has U+0007 at character 2 (ids.charset printable)"
    )
    assert check_id("key", "k", "a\u202eb", PRINTABLE) == (
        "id-not-printable: key k has U+202E at character 1 (ids.charset printable)"
    )
    assert check_id("key", "k", "\ud800", default) == "id-invalid-utf8: key k is not valid UTF-8"
    assert check_id("key", "k", b"\xff\xfe", default) == "id-invalid-utf8: key k is not valid UTF-8"
    assert check_id("key", "k", "naïve 用户 🙂", PRINTABLE) is None
    assert check_id("key", "k", 12345678901234567890, IdPolicy(max_bytes=20)) is None  # an int id: its digits


def test_printable_refuses_every_control_character_anywhere() -> None:
    assert len(CONTROLS) == 65  # C0, DEL, C1
    for c in CONTROLS:
        for text in (c, f"a{c}", f"{c}b", f"user{c}42"):
            got = check_id("key", "user_id", text, PRINTABLE)
            assert got is not None, repr(text)
            assert got.startswith("id-not-printable: key user_id has U+"), got
    assert _forbidden(ANY_FORBIDDEN, "\x00")
    assert not _forbidden(ANY_FORBIDDEN, "\x01")


@settings(max_examples=400, deadline=None)
@given(
    value=st.one_of(st.text(), st.binary(), st.none(), st.integers()),
    max_bytes=st.integers(1, 4096),
    charset=st.sampled_from(["any", "printable"]),
)
def test_the_check_never_raises_and_answers_none_or_a_reason(
    value: Any, max_bytes: int, charset: str
) -> None:
    got = check_id("key", "user_id", value, IdPolicy(max_bytes, charset))
    assert got is None or (isinstance(got, str) and got.split(":")[0] in KINDS), got
    if got is None and isinstance(value, str | bytes):
        text = value.decode() if isinstance(value, bytes) else value
        assert 0 < len(text.encode()) <= max_bytes
        assert not _forbidden(IdPolicy(max_bytes, charset).forbidden, text)


@settings(max_examples=300, deadline=None)
@given(st.text(min_size=1, max_size=60), st.sampled_from(CONTROLS), st.data())
def test_printable_refuses_text_holding_any_control(text: str, control: str, data: st.DataObject) -> None:
    at = data.draw(st.integers(0, len(text)))
    got = check_id("event_id", "event_id", text[:at] + control + text[at:], PRINTABLE)
    assert got is not None
    assert got.split(":")[0] in ("id-not-printable", "id-invalid-utf8", "id-too-long")


@settings(max_examples=300, deadline=None)
@given(st.text(st.characters(codec="utf-8", exclude_characters="\x00"), min_size=1, max_size=40))
def test_any_accepts_every_utf8_text_without_nul_within_the_bound(text: str) -> None:
    assert check_id("key", "user_id", text, IdPolicy(max_bytes=4096)) is None
    assert check_id("key", "user_id", text.encode(), IdPolicy(max_bytes=4096)) is None  # bytes too


@settings(max_examples=200, deadline=None)
@given(st.text(min_size=1, max_size=80))
def test_printable_accepts_exactly_the_text_without_a_listed_code_point(text: str) -> None:
    got = check_id("key", "k", text, IdPolicy(max_bytes=4096, charset="printable"))
    encodable = not any(0xD800 <= ord(c) <= 0xDFFF for c in text)
    assert (got is None) == (encodable and not _forbidden(NOT_PRINTABLE, text)), got


# ---------------------------------------------------------------- the same reason in every Python tier


def printable_source(max_bytes: int = 32) -> PlanSource:
    return behavior_source().model_copy(update={"id_charset": "printable", "id_max_bytes": max_bytes})


BAD = [
    ({"user_id": "u" * 33}, "id-too-long: key user_id is 33 bytes, limit 32"),
    (
        {"user_id": "bad\x07user"},
        "id-not-printable: key user_id has U+0007 at character 3 (ids.charset printable)",
    ),
    (
        {"event_id": "e\u2028x"},
        "id-not-printable: event_id event_id has U+2028 at character 1 (ids.charset printable)",
    ),
    ({"event_id": "é" * 17}, "id-too-long: event_id event_id is 34 bytes, limit 32"),
]


@pytest.mark.parametrize(("change", "detail"), BAD)
def test_codec_decode_dead_letters_with_the_check_text(change: dict[str, Any], detail: str) -> None:
    codec = EventCodec(printable_source())
    good = event(1, "u1", "click", T0, item_id="i1")
    assert isinstance(codec.decode(codec.encode(good), codec.headers()), DecodedEvent)
    got = codec.decode(codec.encode({**good, **change}), codec.headers())
    assert got == DecodeError(Reason.INVALID_ID, detail, next(iter(change)))
    assert codec.validate({**good, **change}) == detail
    assert codec.check_ids({**good, **change}) == detail


def test_a_bad_event_time_is_named_before_a_bad_id_as_in_the_jvm() -> None:
    codec = EventCodec(printable_source())
    got = codec.decode(codec.encode(event(1, "u" * 40, "click", 5, item_id="i1")), codec.headers())
    assert isinstance(got, DecodeError)
    assert got.reason is Reason.INVALID_FIELD


def test_every_python_tier_gives_the_same_reason_and_text() -> None:
    source = printable_source()
    codec = EventCodec(source)
    events = [
        {**event(i, "u1", "click", T0 + i, item_id="i1"), **change} for i, (change, _) in enumerate(BAD)
    ]
    records = [Record(i, codec.encode(e), codec.headers(), b"k") for i, e in enumerate(events)]
    want = [(Reason.INVALID_ID.value, detail) for _, detail in BAD]
    # 1. the codec's decode: nearline tasks (task.py _accept), the landing, `events tail`
    decoded = [codec.decode(r.value, r.headers) for r in records]
    assert [(str(d.reason), d.detail) for d in decoded if isinstance(d, DecodeError)] == want
    # 2. the landing's batch decode into bronze
    timing = SourceTiming(max_out_of_orderness_ms=0, allowed_lateness_ms=60_000, max_future_ms=300_000)
    chunk = decode_records(codec, records, timing, {}, T0 + 60_000)
    assert [(str(r.reason), r.detail) for r in sorted(chunk.rejected, key=lambda r: r.record.offset)] == want
    # 3. the rows of `events produce --from` and `events import`
    checker = RowChecker(source)
    rows = [checker.check({k: v for k, v in e.items() if v is not None}) for e in events]
    assert all(isinstance(r, RowError) for r in rows)
    assert [(r.code, r.reason) for r in rows if isinstance(r, RowError)] == want
    assert [r.field for r in rows if isinstance(r, RowError)] == [
        "user_id",
        "user_id",
        "event_id",
        "event_id",
    ]
