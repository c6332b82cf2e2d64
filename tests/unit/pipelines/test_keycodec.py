r"""The one composite-key codec (issue 33): any parts round-trip, any bytes decode or raise KeyFormatError."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from headwater.pipelines.keycodec import KeyFormatError, pack_parts, to_int, to_text, unpack_parts
from headwater.pipelines.store.layout import LayoutError, check_namespace, feed_entry_ids, glob_escape

NASTY = [*"\x1f\n\x00*?[]{}\\:^0123456789", "\ud800", "\udfff"]
TEXT = st.text(st.characters(codec=None) | st.sampled_from(NASTY), max_size=30)


@given(parts=st.lists(st.binary(max_size=30), max_size=8))
def test_bytes_parts_round_trip(parts: list[bytes]) -> None:
    assert unpack_parts(pack_parts(parts)) == parts
    assert unpack_parts(pack_parts(parts), len(parts)) == parts


@given(parts=st.lists(TEXT, max_size=8), n=st.integers(-(2**70), 2**70))
def test_text_and_int_parts_round_trip(parts: list[str], n: int) -> None:
    raw = unpack_parts(pack_parts([*parts, n]))
    assert [to_text(p) for p in raw[:-1]] == parts
    assert to_int(raw[-1]) == n


@given(raw=st.binary(max_size=80), count=st.none() | st.integers(0, 4))
def test_any_bytes_unpack_or_raise_key_format_error(raw: bytes, count: int | None) -> None:
    try:
        parts = unpack_parts(raw, count)
    except KeyFormatError:
        return
    assert pack_parts(parts) == raw  # what decodes is exactly one encoding: no two keys collide


@given(ids=st.lists(TEXT, min_size=1, max_size=8))
def test_feed_entries_round_trip(ids: list[str]) -> None:
    assert feed_entry_ids({b"e": pack_parts(ids)}) == ids


def test_feed_entries_of_the_old_format_and_the_subscription() -> None:
    assert feed_entry_ids({b"k": b"a\nb"}) == ["a", "b"]
    assert feed_entry_ids({b"k": b""}) is None
    with pytest.raises(KeyFormatError):
        feed_entry_ids({b"e": b"9:short"})


@pytest.mark.parametrize("bad", [True, 1.5, None, object()])
def test_a_part_of_another_type_is_refused(bad: object) -> None:
    with pytest.raises(KeyFormatError, match="must be str, bytes or int"):
        pack_parts([bad])  # type: ignore[list-item]


@given(text=TEXT)
def test_glob_escape_leaves_no_bare_metacharacter(text: str) -> None:
    out, i = glob_escape(text), 0
    unescaped = []
    while i < len(out):
        if out[i] == "\\":
            unescaped.append(out[i + 1])
            i += 2
            continue
        assert out[i] not in "*?[]{}^"
        unescaped.append(out[i])
        i += 1
    assert "".join(unescaped) == text


@pytest.mark.parametrize("namespace", ["", "a{", "}", 3])
def test_a_namespace_that_would_move_the_hash_tag_is_refused(namespace: object) -> None:
    with pytest.raises(LayoutError, match="namespace"):
        check_namespace(namespace)  # type: ignore[arg-type]
