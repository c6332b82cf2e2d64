"""The item indexes: exact search against brute force, HNSW recall, incremental changes, exclusions."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headwater.serving.retrieval import ExactIndex, ItemIndex, ItemIndexError, recall_at_k


def unit(rng: np.random.Generator, n: int, d: int) -> np.ndarray:
    x = rng.standard_normal((n, d)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def clustered(n: int, d: int, seed: int) -> np.ndarray:
    """Unit vectors around 64 centres on a basis of decaying spectrum, as trained embeddings are
    (bench/bench_ann.py's generator, smaller); the basis is the same for every seed."""
    basis = np.random.default_rng(99).standard_normal((d, d)) * (np.arange(1, d + 1) ** -0.5)[:, None]
    centres = np.random.default_rng(98).standard_normal((64, d)) @ basis
    rng = np.random.default_rng(seed)
    x = centres[rng.integers(0, 64, n)] + 0.6 * (rng.standard_normal((n, d)) @ basis)
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def ids(n: int, prefix: str = "i") -> list[str]:
    return [f"{prefix}{j:06d}" for j in range(n)]


def test_exact_index_agrees_with_brute_force() -> None:
    rng = np.random.default_rng(0)
    vectors, queries = unit(rng, 500, 16), unit(rng, 20, 16)
    index = ExactIndex(16)
    assert index.upsert(ids(500), vectors) == (500, 0)
    for q in queries:
        got, scores = index.search(q, 10)
        scores_all = vectors @ q
        want = np.argsort(-scores_all, kind="stable")[:10]
        assert got == [f"i{j:06d}" for j in want]
        np.testing.assert_allclose(scores, scores_all[want], rtol=1e-6)


def test_exact_index_remove_moves_the_last_row() -> None:
    vectors = np.eye(4, dtype=np.float32)
    index = ExactIndex(4)
    index.upsert(["a", "b", "c", "d"], vectors)
    assert index.remove(["a", "zz"]) == 1
    assert len(index) == 3
    assert index.search(vectors[3], 1)[0] == ["d"]
    assert index.search(vectors[0], 3)[1].tolist() == [0.0, 0.0, 0.0]


def test_hnsw_recall_at_100_on_a_seeded_set() -> None:
    vectors, queries = clustered(10_000, 32, seed=1), clustered(200, 32, seed=2)
    approx, exact = ItemIndex(32, threads=1), ExactIndex(32)
    approx.upsert(ids(10_000), vectors)
    exact.upsert(ids(10_000), vectors)
    assert len(approx) == 10_000
    assert recall_at_k(approx, exact, queries, 100) >= 0.95


def test_upsert_makes_a_changed_item_retrievable_and_remove_drops_it() -> None:
    vectors = clustered(3_000, 16, seed=3)
    index = ItemIndex(16, threads=1)
    index.upsert(ids(3_000), vectors)
    target = unit(np.random.default_rng(4), 1, 16)[0]
    before, _ = index.search(target, 5)
    assert "i000042" not in before
    assert index.upsert(["i000042"], target[None, :]) == (0, 1)
    got, scores = index.search(target, 5)
    assert got[0] == "i000042"
    assert scores[0] == pytest.approx(1.0, abs=1e-5)
    assert index.remove(["i000042", "unknown"]) == 1
    assert "i000042" not in index.search(target, 100)[0]
    assert len(index) == 2_999
    # A new id reuses the freed key, and is found.
    assert index.upsert(["new"], target[None, :]) == (1, 0)
    assert index.search(target, 1)[0] == ["new"]


def test_exclude_is_honoured_and_n_still_returned() -> None:
    vectors = clustered(2_000, 16, seed=5)
    approx, exact = ItemIndex(16, threads=1), ExactIndex(16)
    approx.upsert(ids(2_000), vectors)
    exact.upsert(ids(2_000), vectors)
    q = vectors[7]
    top, _ = exact.search(q, 20)
    got, scores = approx.search(q, 20, exclude=set(top[:10]))
    assert len(got) == 20
    assert not set(got) & set(top[:10])
    assert list(scores) == sorted(scores, reverse=True)
    want, _ = exact.search(q, 20, exclude=set(top[:10]))
    assert len(set(got) & set(want)) >= 19


def test_shape_errors_name_the_expected_shape() -> None:
    index = ItemIndex(8, threads=1)
    with pytest.raises(ItemIndexError, match=r"2 vectors of dim 8"):
        index.upsert(["a", "b"], np.zeros((2, 7), np.float32))
    with pytest.raises(ItemIndexError, match="names an id twice"):
        index.upsert(["a", "a"], np.zeros((2, 8), np.float32))
    with pytest.raises(ItemIndexError, match="dim 8"):
        index.search(np.zeros(3, np.float32), 1)
    assert index.search(np.ones(8, np.float32), 5) == ([], pytest.approx(np.empty(0)))


ops = st.lists(
    st.tuples(
        st.sampled_from(["upsert", "remove"]),
        st.lists(st.integers(0, 40), min_size=1, max_size=10, unique=True),
    ),
    min_size=1,
    max_size=25,
)


@settings(max_examples=60, deadline=None)
@given(ops=ops, seed=st.integers(0, 2**16))
def test_any_sequence_of_changes_returns_only_present_items_with_their_latest_vectors(
    ops: list[tuple[str, list[int]]], seed: int
) -> None:
    """After any upserts and removes: the same ids present, never a removed id returned, and each
    returned score is the one of the id's latest vector (the exact index's)."""
    rng = np.random.default_rng(seed)
    approx, exact = ItemIndex(8, threads=1), ExactIndex(8)
    for op, keys in ops:
        names = [f"k{k}" for k in keys]
        if op == "upsert":
            vectors = unit(rng, len(names), 8)
            assert approx.upsert(names, vectors) == exact.upsert(names, vectors)
        else:
            assert approx.remove(names) == exact.remove(names)
        assert len(approx) == len(exact)
        assert all((f"k{k}" in approx) == (f"k{k}" in exact) for k in range(41))
    q = unit(rng, 1, 8)[0]
    got, got_scores = approx.search(q, len(exact))
    want, want_scores = exact.search(q, len(exact))
    truth = dict(zip(want, want_scores.tolist(), strict=True))
    assert len(set(got)) == len(got)
    assert set(got) <= set(want)
    np.testing.assert_allclose(got_scores, [truth[g] for g in got], atol=1e-5)


def test_churn_keeps_the_graph_searchable() -> None:
    """300 seeded sequences of upserts and removes on small sets, then a query for every item: HNSW
    is approximate under churn (removed nodes leave holes): 4,396 of 4,400 found when written."""
    found = total = 0
    for seed in range(300):
        rng = np.random.default_rng(seed)
        approx, exact = ItemIndex(8, threads=1), ExactIndex(8)
        for _ in range(int(rng.integers(1, 25))):
            names = [f"k{k}" for k in rng.choice(41, int(rng.integers(1, 10)), replace=False)]
            if rng.random() < 0.5:
                vectors = unit(rng, len(names), 8)
                approx.upsert(names, vectors)
                exact.upsert(names, vectors)
            else:
                approx.remove(names)
                exact.remove(names)
        q = unit(rng, 1, 8)[0]
        want, _ = exact.search(q, len(exact))
        got, _ = approx.search(q, len(exact))
        found += len(set(got) & set(want))
        total += len(want)
    assert found / total >= 0.995


def test_each_index_names_its_library_without_spaces() -> None:
    import usearch

    assert ItemIndex(4, threads=1).library == f"usearch-{usearch.__version__}"
    assert ExactIndex(4).library == f"exact-numpy-{np.__version__}"


def test_a_search_runs_while_the_index_is_written_to_a_snapshot(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    rng = np.random.default_rng(3)
    vectors = unit(rng, 200, 8)
    index = ItemIndex(8, threads=1)
    index.upsert(ids(200), vectors)
    graph = index._index
    save = graph.save
    during: list[list[str]] = []

    def search_then_save(path: str) -> None:
        # A search here would wait forever if the export held the search lock.
        during.append(index.search(vectors[5], 3)[0])
        save(path)

    monkeypatch.setattr(graph, "save", search_then_save)
    arrays = index.export(tmp_path / "graph.usearch")
    assert during == [index.search(vectors[5], 3)[0]]
    assert during[0][0] == "i000005"
    assert int(arrays["held"].sum()) == 200
