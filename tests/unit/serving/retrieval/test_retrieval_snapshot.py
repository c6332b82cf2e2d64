"""The item index's snapshot: a restart loads it and re-embeds only what changed; a bad one is refused."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from headwater.serving.item_mirror import ItemMirror
from headwater.serving.retrieval import IndexRefresher, ItemIndex, TwoTowerModel, TwoTowerRetriever
from headwater.serving.retrieval.runtime import RetrievalRuntime, SnapshotPlan
from headwater.serving.retrieval.snapshot import (
    META,
    NoSnapshot,
    SnapshotError,
    load_snapshot,
    save_snapshot,
    snapshot_key,
)

from .test_retrieval_towers import REGISTRY, FakeSource

ITEMS = 300


def tower() -> TwoTowerModel:
    torch.manual_seed(7)
    model = TwoTowerModel(REGISTRY.user.dim, REGISTRY.item.dim, embed_dim=8, hidden=(16,)).eval()
    model.set_normalization(
        (np.zeros(REGISTRY.user.dim), np.ones(REGISTRY.user.dim)),
        (np.full(REGISTRY.item.dim, 4.0), np.full(REGISTRY.item.dim, 3.0)),
    )
    return model


MODEL = tower()


def store_of(n: int = ITEMS, seed: int = 3) -> tuple[FakeSource, np.ndarray]:
    source = FakeSource(REGISTRY.item)
    items = np.random.default_rng(seed).gamma(2.0, 2.0, size=(n, REGISTRY.item.dim)).astype(np.float32)
    for j in range(n):
        source.put(f"i{j:04d}", items[j], 1000 + j)
    return source, items


def parts(source: FakeSource, version: str = "tower1") -> tuple[ItemIndex, IndexRefresher, dict[str, object]]:
    index = ItemIndex(MODEL.embed_dim, threads=1)
    refresher = IndexRefresher(source, MODEL, index, version, mirror=ItemMirror(REGISTRY.item))
    key = snapshot_key(version, None, REGISTRY.item, "hw", index, mirror=True)
    return index, refresher, key


def users(n: int = 5) -> np.ndarray:
    return np.random.default_rng(11).normal(size=(n, REGISTRY.user.dim)).astype(np.float32)


def test_a_loaded_snapshot_answers_as_the_saved_index_and_a_refresh_re_embeds_nothing(tmp_path: Path) -> None:
    source, _ = store_of()
    index, refresher, key = parts(source)
    refresher.refresh()
    saved = save_snapshot(tmp_path, key, index, refresher)
    assert (saved.version, saved.items) == ("tower1.1", ITEMS)
    assert sorted(p.name.split("-")[0] for p in tmp_path.iterdir()) == ["graph", META, "state"]

    index2, refresher2, _ = parts(source)
    loaded = load_snapshot(tmp_path, key, index2, refresher2)
    assert (loaded.version, loaded.items, loaded.saved_at_ms) == ("tower1.1", ITEMS, saved.saved_at_ms)
    before, after = TwoTowerRetriever(MODEL, index), TwoTowerRetriever(MODEL, index2)
    for user in users():
        ids, scores = before.retrieve(user, 50)
        ids2, scores2 = after.retrieve(user, 50)
        assert ids2 == ids
        np.testing.assert_allclose(scores2, scores, rtol=1e-6)
    # The mirror holds the same rows (served once a refresh confirms it).
    mirror, mirror2 = refresher.mirror, refresher2.mirror
    assert mirror is not None
    assert mirror2 is not None
    assert (len(mirror2), mirror2.confirmed_ms) == (ITEMS, None)
    report = refresher2.refresh()
    assert (report.added, report.updated, report.removed, report.unchanged) == (0, 0, 0, ITEMS)
    assert report.version == "tower1.2"  # the count goes on from the snapshot's
    at = mirror2.confirmed_ms
    ids = ["i0000", "i0123", "i0299", "nope"]
    a, b = mirror.lookup(ids, at), mirror2.lookup(ids, at)
    assert a is not None
    assert b is not None
    assert b.known.tolist() == [True, True, True, False]
    for ra, rb in zip(a.rows, b.rows, strict=True):
        assert ra is not None
        assert rb is not None
        np.testing.assert_array_equal(ra.values[:3], rb.values[:3])
        np.testing.assert_array_equal(ra.event_time_ms[:3], rb.event_time_ms[:3])


def test_what_changed_after_the_save_is_re_embedded_at_the_first_refresh(tmp_path: Path) -> None:
    source, items = store_of()
    index, refresher, key = parts(source)
    refresher.refresh()
    save_snapshot(tmp_path, key, index, refresher)
    user = users(1)[0]
    top = TwoTowerRetriever(MODEL, index).retrieve(user, 1)[0][0]
    last = TwoTowerRetriever(MODEL, index).retrieve(user, ITEMS)[0][-1]
    # While the service was down: the last item takes the best one's vector, the best one is
    # deleted, one item is new, one rewritten with its own values (a new write time).
    source.put(last, items[int(top[1:])], 5000)
    source.delete(top)
    source.put("new", items[7] * 0.5, 5000)
    source.put("i0010", items[10], 5000)
    index2, refresher2, _ = parts(source)
    load_snapshot(tmp_path, key, index2, refresher2)
    report = refresher2.refresh()
    assert (report.added, report.updated, report.removed, report.unchanged) == (1, 2, 1, ITEMS - 3)
    retriever = TwoTowerRetriever(MODEL, index2)
    assert retriever.retrieve(user, 1)[0] == [last]
    assert sorted(retriever.retrieve(user, ITEMS + 5)[0]) == sorted(source.catalog())
    mirror = refresher2.mirror
    assert mirror is not None
    look = mirror.lookup([last, top], mirror.confirmed_ms)
    assert look is not None
    assert look.known.tolist() == [True, False]
    first = REGISTRY.item.layouts[0]
    np.testing.assert_array_equal(look.rows[0].values[0], items[int(top[1:])][: first.dim])  # type: ignore[union-attr]


def test_a_snapshot_made_another_way_or_damaged_is_refused_with_the_reason(tmp_path: Path) -> None:
    source, _ = store_of(60)
    index, refresher, key = parts(source)
    with pytest.raises(NoSnapshot, match="no snapshot yet"):
        load_snapshot(tmp_path, key, index, refresher)
    refresher.refresh()
    save_snapshot(tmp_path, key, index, refresher)

    other_model = parts(source, "tower2")
    with pytest.raises(SnapshotError, match=r"another two tower \('tower1', now 'tower2'\)"):
        load_snapshot(tmp_path, other_model[2], other_model[0], other_model[1])
    other_ns = {**key, "namespace": "elsewhere"}
    with pytest.raises(SnapshotError, match="another namespace"):
        load_snapshot(tmp_path, other_ns, *parts(source)[:2])

    graph = next(tmp_path.glob("graph-*"))
    good = graph.read_bytes()
    blob = bytearray(good)
    blob[len(blob) // 2] ^= 0xFF
    graph.write_bytes(bytes(blob))
    with pytest.raises(SnapshotError, match="checksum differs"):
        load_snapshot(tmp_path, key, *parts(source)[:2])
    graph.write_bytes(good)
    next(tmp_path.glob("state-*")).unlink()
    with pytest.raises(SnapshotError, match="cannot be loaded"):
        load_snapshot(tmp_path, key, *parts(source)[:2])


def test_a_second_save_replaces_the_first_and_leaves_one_set_of_files(tmp_path: Path) -> None:
    source, items = store_of(50)
    index, refresher, key = parts(source)
    refresher.refresh()
    first = save_snapshot(tmp_path, key, index, refresher)
    source.put("new", items[1], 9000)
    refresher.refresh()
    second = save_snapshot(tmp_path, key, index, refresher)
    assert (first.version, second.version, second.items) == ("tower1.1", "tower1.2", 51)
    assert len(list(tmp_path.glob("graph-*"))) == len(list(tmp_path.glob("state-*"))) == 1
    index2, refresher2, _ = parts(source)
    assert load_snapshot(tmp_path, key, index2, refresher2).items == 51
    assert "new" in index2


def test_the_runtime_saves_when_changed_and_due_and_at_stop(tmp_path: Path) -> None:
    source, items = store_of(40)
    index, refresher, key = parts(source)
    first = refresher.refresh()
    plan = SnapshotPlan(tmp_path, key, every_s=3600.0)
    runtime = RetrievalRuntime(None, index, refresher, None, first, snapshot=plan)  # type: ignore[arg-type]
    runtime.count(first)
    assert runtime.save_snapshot() is not None  # a build never saved: due at once
    assert runtime.save_snapshot() is None  # nothing changed
    source.put("new", items[0], 9000)
    runtime.count(runtime.refresh_once())
    assert runtime.save_snapshot() is None  # changed, but saved less than every_s ago
    runtime.stop()  # at stop, what changed is saved whatever the time
    assert plan.saved is not None
    assert (plan.saved.version, plan.saved.items) == ("tower1.2", 41)
    # A folder that cannot be written: counted and logged, no exception.
    plan.folder = tmp_path / META / "under-a-file"
    source.put("newer", items[1], 9001)
    runtime.count(runtime.refresh_once())
    assert runtime.save_snapshot(force=True) is None
    assert plan.failures == 1


# The loader's boundary: whatever the folder holds, a SnapshotError (the index is then built from
# the store), never another exception and never a half-trusted index.
@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, object], bytes, bytes]:
    folder = tmp_path_factory.mktemp("snap")
    source, _ = store_of(30)
    index, refresher, key = parts(source)
    refresher.refresh()
    save_snapshot(folder, key, index, refresher)
    return folder, key, (folder / META).read_bytes(), next(folder.glob("state-*")).read_bytes()


def _reset(folder: Path, meta: bytes, state: bytes) -> Path:
    (folder / META).write_bytes(meta)
    path = next(folder.glob("state-*"))
    path.write_bytes(state)
    return path


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(raw=st.binary(max_size=3000))
def test_any_meta_bytes_are_refused_or_loaded_never_a_traceback(
    saved: tuple[Path, dict[str, object], bytes, bytes], raw: bytes
) -> None:
    folder, key, meta, state = saved
    _reset(folder, meta, state)
    (folder / META).write_bytes(raw)
    with pytest.raises(SnapshotError):
        load_snapshot(folder, key, *parts(FakeSource(REGISTRY.item))[:2])


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(field=st.sampled_from(["files", "refreshes", "saved_at_ms", "version", "items"]), value=JSON)
def test_any_meta_field_value_is_refused_or_loaded_never_a_traceback(
    saved: tuple[Path, dict[str, object], bytes, bytes], field: str, value: object
) -> None:
    folder, key, meta, state = saved
    _reset(folder, meta, state)
    doc = json.loads(meta)
    doc[field] = value
    (folder / META).write_text(json.dumps(doc), encoding="utf-8")
    index, refresher, _ = parts(FakeSource(REGISTRY.item))
    try:
        info = load_snapshot(folder, key, index, refresher)
    except SnapshotError:
        return
    # informative fields only; a whole refresh count is taken as the count to go on from
    assert field in ("saved_at_ms", "version", "items") or (field == "refreshes" and isinstance(value, int))
    assert info.items == len(index) == 30


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_state_bytes_with_a_matching_checksum_are_refused_or_loaded(
    saved: tuple[Path, dict[str, object], bytes, bytes], data: st.DataObject
) -> None:
    import hashlib

    folder, key, meta, state = saved
    mode = data.draw(st.sampled_from(["random", "truncated", "flipped"]))
    if mode == "random":
        blob = data.draw(st.binary(max_size=4000))
    elif mode == "truncated":
        blob = state[: data.draw(st.integers(0, len(state) - 1))]
    else:
        at = data.draw(st.integers(0, len(state) - 1))
        blob = state[:at] + bytes([state[at] ^ data.draw(st.integers(1, 255))]) + state[at + 1 :]
    path = _reset(folder, meta, state)
    path.write_bytes(blob)
    doc = json.loads(meta)
    doc["files"][path.name] = hashlib.sha256(blob).hexdigest()  # past the checksum: the arrays' own checks
    (folder / META).write_text(json.dumps(doc), encoding="utf-8")
    index, refresher, _ = parts(FakeSource(REGISTRY.item))
    try:
        load_snapshot(folder, key, index, refresher)
    except SnapshotError:
        return
    assert len(index) == 30  # a flip inside a value loads: what the checksum is there for
