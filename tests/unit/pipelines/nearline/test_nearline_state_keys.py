r"""Nearline state keys are data, never syntax (issue 33): any entity id round-trips through the store.

Property tests push arbitrary text (``\x1f``, ``\n``, ``\x00``, glob characters, lone surrogates)
through every composite key of the state; a real rocksdict in a tmp folder is restored from its
local files and from its changelog alone; state written in the old ``\x1f``-separated format is
read, migrated once, and gives the same values.
"""

from __future__ import annotations

import contextlib
import importlib.util
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from headwater.pipelines.events.codec import EventCodec
from headwater.pipelines.events.generator import EventGenerator, GeneratorConfig
from headwater.pipelines.events.testing import Record as Rec
from headwater.pipelines.events.timing import SourceTiming
from headwater.pipelines.keycodec import KeyFormatError
from headwater.pipelines.nearline.state import (
    LEGACY_SEP,
    PartitionStore,
    decode_dedup_key,
    decode_pane_key,
    dedup_key,
    is_legacy,
    pane_key,
)
from headwater.pipelines.nearline.task import PartitionTask
from headwater.pipelines.windows import compile_view

_path = Path(__file__).parents[3] / "integration/pipelines/nearline/harness.py"
_spec = importlib.util.spec_from_file_location("nl_harness_state_keys", _path)
assert _spec is not None
assert _spec.loader is not None
h = importlib.util.module_from_spec(_spec)
sys.modules["nl_harness_state_keys"] = h
_spec.loader.exec_module(h)

NASTY = "\x1f\n\x00*?[]{}\\:0123456789p d\ud800"
TEXT = st.text(st.characters(codec=None) | st.sampled_from(list(NASTY)), max_size=40)
VIEW = st.from_regex(r"[A-Za-z0-9_.\-]{1,20}", fullmatch=True)
INT = st.integers(-(2**63), 2**63)


@given(view=TEXT, entity=TEXT, pane=INT)
def test_pane_key_round_trips_any_text(view: str, entity: str, pane: int) -> None:
    key = pane_key(view, entity, pane)
    assert not is_legacy(key)
    assert decode_pane_key(key) == (view, entity, pane)


@given(bucket=INT, offset=INT)
def test_dedup_key_round_trips(bucket: int, offset: int) -> None:
    assert decode_dedup_key(dedup_key(bucket, offset)) == (bucket, offset)


@given(view=VIEW, entity=TEXT, pane=st.integers(0, 2**62))
def test_an_old_format_pane_key_decodes_whatever_its_entity_holds(view: str, entity: str, pane: int) -> None:
    old = (
        b"p"
        + LEGACY_SEP
        + LEGACY_SEP.join([view.encode(), entity.encode("utf-8", "surrogatepass"), b"%d" % pane])
    )
    assert is_legacy(old)
    assert decode_pane_key(old) == (view, entity, pane)


@given(raw=st.binary(max_size=60))
def test_any_bytes_decode_or_raise_key_format_error(raw: bytes) -> None:
    for key in (raw, b"p" + raw, b"d" + raw, b"p\x1f" + raw, b"d\x1f" + raw):
        with contextlib.suppress(KeyFormatError):
            decode_pane_key(key)
        with contextlib.suppress(KeyFormatError):
            decode_dedup_key(key)


def _events(n: int, seed: int) -> list[dict[str, Any]]:
    """Generated behaviour events, every third user id holding a unit separator or a newline."""
    codec = EventCodec()
    gen = EventGenerator(GeneratorConfig(seed=seed, rate=20.0, users=12, late_share=0.0), codec)
    out = []
    for i, em in enumerate(e for e in gen.take(n) if e.event is not None):
        event = dict(em.event or {})
        if i % 3 == 0:
            event["user_id"] = event["user_id"] + ("\x1fx\x1f1" if i % 2 else "\n*[{")
        out.append(event)
    return out


def _run(
    store: PartitionStore, events: list[dict[str, Any]]
) -> tuple[PartitionTask, list[tuple[bytes, bytes | None]]]:
    """Fold ``events`` into a task over ``store``; return it and every change in changelog order."""
    codec = EventCodec()
    specs = [compile_view(v) for v in h.nearline_views()]
    task = PartitionTask(0, store, specs, SourceTiming.of(h.BEHAVIOUR), codec)
    log: list[tuple[bytes, bytes | None]] = []
    now = max(e["event_time"] for e in events)
    recs = [Rec(i, codec.encode(e), codec.headers()) for i, e in enumerate(events)]
    for s in range(0, len(recs), 300):
        out = task.process(recs[s : s + 300], now_ms=now)
        store.commit(out.changes, len(log) + len(out.changes) - 1)
        log += list(out.changes.items())
    return task, log


def _restored(store: PartitionStore) -> PartitionTask:
    specs = [compile_view(v) for v in h.nearline_views()]
    task = PartitionTask(0, store, specs, SourceTiming.of(h.BEHAVIOUR), EventCodec())
    task.load(store.load())
    return task


def _same_values(a: PartitionTask, b: PartitionTask) -> int:
    checked = 0
    for name, vs in a.views.items():
        entities = sorted(vs.entities)
        assert sorted(b.views[name].entities) == entities
        t_pub = vs.t_pub
        assert b.views[name].t_pub == t_pub
        assert a.values(name, entities, t_pub) == b.values(name, entities, t_pub)
        checked += len(entities)
    assert a.seen == b.seen
    return checked


def test_entities_with_separators_restore_from_local_state_and_from_the_changelog_alone(
    tmp_path: Path,
) -> None:
    events = _events(1500, seed=7)
    task, log = _run(PartitionStore(tmp_path / "a", 0), events)
    odd = {e for vs in task.views.values() for e in vs.entities if "\x1f" in e or "\n" in e}
    assert len(odd) >= 4
    task.store.close()
    local = PartitionStore(tmp_path / "a", 0)  # the same folder: a restart with its local store
    assert local.restored_from == "local"
    from_local = _restored(local)
    assert (local.skipped, local.migration) == (0, {})
    assert _same_values(task, from_local) > 10
    fresh = PartitionStore(tmp_path / "b", 0)  # the folder wiped: the compacted changelog alone
    fresh.apply_changelog(log, len(log) - 1)
    from_changelog = _restored(fresh)
    assert (fresh.skipped, fresh.migration) == (0, {})
    _same_values(task, from_changelog)
    local.close()
    fresh.close()


def _old_format(key: bytes) -> bytes:
    """``key`` as the store wrote it before the length-prefixed format (\\x1f-separated)."""
    if key[:1] == b"p":
        view, entity, pane = decode_pane_key(key)
        return LEGACY_SEP.join([b"p", view.encode(), entity.encode(), b"%d" % pane])
    if key[:1] == b"d":
        return LEGACY_SEP.join([b"d", *(b"%d" % n for n in decode_dedup_key(key))])
    return key


def test_old_format_state_is_read_and_migrated_once(tmp_path: Path) -> None:
    events = _events(1500, seed=11)
    task, log = _run(PartitionStore(tmp_path / "new", 0), events)
    old_log = [(_old_format(k), v) for k, v in log]
    assert any(k[:1] == b"p" and k.count(LEGACY_SEP) > 3 for k, _ in old_log)  # the key that stopped the tier
    for name, load_from in (("changelog", "apply"), ("local", "commit")):
        store = PartitionStore(tmp_path / name, 0)
        if load_from == "apply":
            store.apply_changelog(old_log, len(old_log) - 1)
        else:
            store.commit(dict(old_log), len(old_log) - 1)
        restored = _restored(store)
        assert store.skipped == 0
        _same_values(task, restored)
        migration = dict(store.migration)
        legacy = [k for k in migration if is_legacy(k)]
        assert legacy
        assert all(migration[k] is None for k in legacy)
        assert len(migration) == 2 * len(legacy)
        store.commit(migration, len(old_log))  # what the restore commits (backfill.py), once
        again = _restored(store)
        assert store.migration == {}
        assert not [k for k, _ in store.items() if is_legacy(k)]
        _same_values(task, again)
        store.close()
    task.store.close()


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(junk=st.lists(st.binary(max_size=30), min_size=1, max_size=5))
def test_a_key_that_does_not_decode_is_counted_and_skipped(tmp_path: Path, junk: list[bytes]) -> None:
    store = PartitionStore(tmp_path / uuid.uuid4().hex, 0)  # one folder per example
    try:
        good = pane_key("v", "u\x1f1", 60_000)
        bad = {b"p" + j + b"\xff:" for j in junk} | {b"p\x1f" + j for j in junk if LEGACY_SEP not in j}
        store.commit({good: b"[1]", **dict.fromkeys(bad, b"[2]"), b"d7:garbage": b"{}"}, 0)
        loaded = store.load()
        assert loaded.panes == {"v": [("u\x1f1", 60_000, [1])]}
        assert loaded.skipped == store.skipped == len(bad) + 1
    finally:
        store.close()


def test_a_record_value_that_is_not_json_is_skipped(tmp_path: Path) -> None:
    store = PartitionStore(tmp_path, 0)
    try:
        store.commit({pane_key("v", "a", 0): b"{not json", pane_key("v", "b", 0): b"[3]"}, 0)
        loaded = store.load()
        assert loaded.panes == {"v": [("b", 0, [3])]}
        assert loaded.skipped == 1
    finally:
        store.close()


@pytest.mark.parametrize("bad", [b"", b"x", b"1:ab", b"01:a", b"3:ab", b"-1:a", b"a:" + b"b"])
def test_a_malformed_pane_key_raises_key_format_error(bad: bytes) -> None:
    with pytest.raises(KeyFormatError):
        decode_pane_key(b"p" + bad)
