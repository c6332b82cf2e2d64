"""The two-tower model: the in-batch loss, training beats popularity, artifacts, incremental refresh."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from headwater.pipelines.store import ViewLayout
from headwater.ranking.artifact import ArtifactError
from headwater.ranking.features import BoundRegistry, SideViews
from headwater.ranking.synthetic import make_world, small_registry, training_set
from headwater.ranking.towers import in_batch_loss
from headwater.ranking.trainset import TrainingFileError, TrainingSet
from headwater.serving.item_mirror import ItemMirror
from headwater.serving.retrieval import (
    ExactIndex,
    IndexRefresher,
    ItemIndex,
    TowerOptions,
    TwoTowerModel,
    TwoTowerRetriever,
    load_towers,
    save_towers,
    train_two_tower,
)
from headwater.serving.retrieval.refresh import FeedPosition
from headwater.serving.store import ViewRows

REGISTRY: BoundRegistry = small_registry(
    {"u_a": ["c1", "c2", "c3", "s1:sum"], "u_b": ["c4", "c5"]},
    {"i_a": ["x1", "x2", "x3", "p:avg"], "i_b": ["x4"]},
    "i_a.x1",
)
FAST = TowerOptions(epochs=6, batch_size=256, threads=1)


@pytest.fixture(scope="module")
def trained() -> tuple[TrainingSet, object]:
    world = make_world(REGISTRY, users=300, items=400, seed=1)
    ts = training_set(REGISTRY, world, slates=3000, k=10, seed=1)
    return ts, train_two_tower(ts, FAST)


def test_in_batch_loss_by_hand_and_duplicates_are_not_negatives() -> None:
    u = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]])
    i = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]])
    codes = torch.tensor([0, 1, 0])  # rows 0 and 2 hold the same item
    log_q = torch.zeros(3)
    tau = 0.5
    # Row 0: logits [2, 0, -inf (same item)] -> -log(e^2 / (e^2 + 1)); row 1: [0, 2, 0]; row 2 as row 0.
    row0 = -np.log(np.exp(2) / (np.exp(2) + 1))
    row1 = -np.log(np.exp(2) / (np.exp(2) + 2))
    got = in_batch_loss(u, i, codes, log_q, tau).item()
    assert got == pytest.approx((2 * row0 + row1) / 3, rel=1e-5)
    # The log-frequency correction lowers a popular item's logit: item 1 with log q = 1.
    corrected = in_batch_loss(u, i, codes, torch.tensor([0.0, 1.0, 0.0]), tau).item()
    row1_c = -np.log(np.exp(1) / (np.exp(1) + 2))
    row0_c = -np.log(np.exp(2) / (np.exp(2) + np.exp(-1)))
    assert corrected == pytest.approx((2 * row0_c + row1_c) / 3, rel=1e-5)


def test_training_beats_popularity_on_the_planted_signal(trained: tuple[TrainingSet, object]) -> None:
    _, report = trained
    h = report.metrics["holdout"]  # type: ignore[attr-defined]
    assert h["catalog"] == 400
    assert h["clicks"] > 500
    assert h["two_tower_recall@100"] > h["popularity_recall@100"] + 0.1
    assert h["two_tower_recall@10"] > h["popularity_recall@10"]


def test_embeddings_are_unit_norm_and_nan_means_the_training_mean() -> None:
    torch.manual_seed(0)
    model = TwoTowerModel(3, 2, embed_dim=4, hidden=(8,)).eval()
    model.set_normalization((np.ones(3), np.full(3, 2.0)), (np.zeros(2), np.ones(2)))
    emb = model.embed_users(np.array([[np.nan] * 3, [1.0] * 3], dtype=np.float32))
    np.testing.assert_allclose(np.linalg.norm(emb, axis=1), 1.0, rtol=1e-5)
    np.testing.assert_allclose(emb[0], emb[1], rtol=1e-5)
    with pytest.raises(ValueError, match=r"item vectors must have shape \(n, 2\)"):
        model.embed_items(np.zeros((1, 3), np.float32))


def test_too_few_clicks_is_an_error_that_says_what_to_do() -> None:
    world = make_world(REGISTRY, users=10, items=10, seed=2)
    ts = training_set(REGISTRY, world, slates=3, k=2, seed=2)
    with pytest.raises(TrainingFileError, match="needs at least 32"):
        train_two_tower(ts, FAST)


def test_artifact_round_trip_same_version_and_tamper_refused(
    tmp_path: Path, trained: tuple[TrainingSet, object]
) -> None:
    ts, report = trained
    saved = save_towers(tmp_path, report, ts)  # type: ignore[arg-type]
    assert saved.path.name == f"two_tower-{saved.version}.pt"
    again = save_towers(tmp_path / "again", report, ts)  # type: ignore[arg-type]
    assert again.version == saved.version
    loaded = load_towers(tmp_path)  # through latest.json
    assert loaded.version == saved.version
    assert loaded.metadata["item_features"] == list(REGISTRY.item.slots)
    np.testing.assert_allclose(loaded.model.embed_items(ts.item[:50]), saved.model.embed_items(ts.item[:50]))
    raw = torch.load(saved.path, weights_only=True)
    raw["state"]["item_tower.mlp.0.bias"] += 1.0
    torch.save(raw, tmp_path / "tampered.pt")
    with pytest.raises(ArtifactError, match="content hash"):
        load_towers(tmp_path / "tampered.pt")
    raw["format"] = "headwater.ranker/1"
    torch.save(raw, tmp_path / "other.pt")
    with pytest.raises(ArtifactError, match="expected format"):
        load_towers(tmp_path / "other.pt")


class FakeSource:
    """The store side of a refresh, in memory: per view {id: (write time, vector)}."""

    def __init__(self, side: SideViews) -> None:
        self.side = side
        self.rows: dict[str, dict[str, tuple[int, np.ndarray]]] = {lay.view: {} for lay in side.layouts}

    def put(self, item_id: str, vector: np.ndarray, write_ms: int) -> None:
        for j, lay in enumerate(self.side.layouts):
            lo, hi = self.side.offsets[j], self.side.offsets[j + 1]
            self.rows[lay.view][item_id] = (write_ms, vector[lo:hi])

    def delete(self, item_id: str) -> None:
        for rows in self.rows.values():
            rows.pop(item_id, None)

    def ids(self, layout: ViewLayout) -> set[str]:
        return set(self.rows[layout.view])

    def catalog(self) -> set[str]:
        return set().union(*self.rows.values())

    def headers(self, layout: ViewLayout, ids: list[str]) -> tuple[np.ndarray, np.ndarray]:
        rows = self.rows[layout.view]
        written = np.array([rows[i][0] if i in rows else 0 for i in ids], dtype=np.int64)
        return written, np.zeros(len(ids), dtype=np.int64)

    def view_rows(self, ids: list[str]) -> Iterator[tuple[list[str], list[ViewRows]]]:
        if not ids:
            return
        out = []
        for lay in self.side.layouts:
            rows = self.rows[lay.view]
            found = np.array([i in rows for i in ids])
            values = np.stack(
                [rows[i][1] if i in rows else np.full(lay.dim, np.nan, np.float32) for i in ids]
            ).astype(np.float32)
            times = np.array([rows[i][0] if i in rows else 0 for i in ids], dtype=np.int64)
            out.append(ViewRows(values, found, times))
        yield ids, out

    def log_position(self) -> tuple[bytes, ...] | None:
        return None  # no change log: every look scans

    def written_since(self, position: tuple[bytes, ...]) -> bool:
        return True

    def feed_position(self) -> FeedPosition | None:
        return None  # no change feed

    def fed_since(self, since: FeedPosition) -> tuple[set[str], FeedPosition] | None:
        return None

    def vectors(self, ids: list[str]) -> Iterator[tuple[list[str], np.ndarray, np.ndarray]]:
        if not ids:
            return
        found = np.array([i in self.rows[self.side.layouts[0].view] for i in ids])
        matrix = np.stack(
            [
                np.concatenate([self.rows[lay.view][i][1] for lay in self.side.layouts])
                if f
                else np.full(self.side.dim, np.nan, np.float32)
                for i, f in zip(ids, found, strict=True)
            ]
        ).astype(np.float32)
        yield ids, matrix, found


class LoggedSource(FakeSource):
    """A fake source with a change log, as the store's freshness log: one entry per write (rows written)."""

    def __init__(self, side: SideViews) -> None:
        super().__init__(side)
        self.log: list[int] = []
        self.scans = 0

    def put(self, item_id: str, vector: np.ndarray, write_ms: int) -> None:
        super().put(item_id, vector, write_ms)
        self.log.append(1)

    def progress(self) -> None:
        """A tier's progress entry: no row written."""
        self.log.append(0)

    def expire(self, item_id: str) -> None:
        """A key expiring: gone from the store, nothing in the log."""
        super().delete(item_id)

    def catalog(self) -> set[str]:
        self.scans += 1
        return super().catalog()

    def log_position(self) -> tuple[bytes, ...] | None:
        return (str(len(self.log)).encode(),)

    def written_since(self, position: tuple[bytes, ...]) -> bool:
        return any(self.log[int(position[0]) :])


class FedSource(LoggedSource):
    """A logged source whose writers also name what they wrote in a change feed (``fed=False``: not)."""

    def __init__(self, side: SideViews) -> None:
        super().__init__(side)
        self.feed: list[set[str]] = []
        self.fed = True

    def put(self, item_id: str, vector: np.ndarray, write_ms: int) -> None:
        super().put(item_id, vector, write_ms)
        if self.fed:
            self.feed.append({item_id})

    def delete(self, item_id: str) -> None:  # a delete through the store API: logged and fed
        super().delete(item_id)
        self.log.append(1)
        self.feed.append({item_id})

    def feed_position(self) -> FeedPosition | None:
        return FeedPosition((str(len(self.log)).encode(),), (str(len(self.feed)).encode(),))

    def fed_since(self, since: FeedPosition) -> tuple[set[str], FeedPosition] | None:
        writes = sum(self.log[int(since.fresh[0]) :])
        named = self.feed[int(since.feed[0]) :]
        if writes != len(named):
            return None
        now = self.feed_position()
        assert now is not None
        return set().union(*named), now


def test_the_change_feed_refreshes_only_what_it_names_and_a_gap_in_it_scans(
    trained: tuple[TrainingSet, object],
) -> None:
    from headwater.serving.retrieval.runtime import RetrievalRuntime

    model = trained[1].model  # type: ignore[attr-defined]
    source = FedSource(REGISTRY.item)
    items = np.random.default_rng(4).gamma(2.0, 2.0, size=(40, REGISTRY.item.dim)).astype(np.float32)
    for j in range(40):
        source.put(f"i{j:04d}", items[j], 1000)
    index = ItemIndex(model.embed_dim, threads=1)
    mirror = ItemMirror(REGISTRY.item)
    refresher = IndexRefresher(source, model, index, "abc123", mirror=mirror)
    runtime = RetrievalRuntime(None, index, refresher, None, refresher.refresh())  # type: ignore[arg-type]
    assert (source.scans, len(index), len(mirror)) == (1, 40, 40)
    # Nothing written: no scan, no new version.
    assert runtime.refresh_if_changed(full_scan_s=3600.0) is None
    # Two writes and a delete, all fed: applied without a scan, the rows in the mirror too.
    source.put("i0003", items[5], 2000)
    source.put("new", items[6], 2000)
    source.delete("i0007")
    report = runtime.refresh_if_changed(full_scan_s=3600.0)
    assert report is not None
    assert (report.added, report.updated, report.removed, report.unchanged) == (1, 1, 1, 0)
    assert (source.scans, report.catalog, report.version) == (1, 40, "abc123.2")
    assert "i0007" not in index
    assert "new" in index
    look = mirror.lookup(["i0003", "new", "i0007"], mirror.confirmed_ms)  # age 0: every view from memory
    assert look is not None
    assert look.known.tolist() == [True, True, False]
    np.testing.assert_array_equal(look.rows[0].values[0], items[5][: REGISTRY.item.layouts[0].dim])
    # A writer that does not feed it: the feed cannot say, the freshness log makes a full refresh.
    source.fed = False
    source.put("i0001", items[9], 3000)
    assert runtime.refresh_if_changed(full_scan_s=3600.0, look_log=False) is None  # a feed-only look
    assert source.scans == 1
    report = runtime.refresh_if_changed(full_scan_s=3600.0)
    assert report is not None
    assert (report.updated, source.scans) == (1, 2)
    # From there, fed writes are applied without a scan again.
    source.fed = True
    source.put("i0002", items[9], 4000)
    report = runtime.refresh_if_changed(full_scan_s=3600.0)
    assert report is not None
    assert (report.updated, report.unchanged, source.scans) == (1, 0, 2)


def test_incremental_refresh_upserts_changed_and_removes_deleted(trained: tuple[TrainingSet, object]) -> None:
    ts, report = trained
    model = report.model  # type: ignore[attr-defined]
    source = FakeSource(REGISTRY.item)
    rng = np.random.default_rng(5)
    items = rng.gamma(2.0, 2.0, size=(500, REGISTRY.item.dim)).astype(np.float32)
    for j in range(500):
        source.put(f"i{j:04d}", items[j], 1000)
    index = ItemIndex(model.embed_dim, threads=1)
    refresher = IndexRefresher(source, model, index, "abc123")
    first = refresher.refresh()
    assert (first.added, first.updated, first.removed, first.unchanged, first.catalog) == (500, 0, 0, 0, 500)
    assert first.version == "abc123.1"
    again = refresher.refresh()
    assert (again.added, again.updated, again.removed, again.unchanged) == (0, 0, 0, 500)
    retriever = TwoTowerRetriever(model, index)
    user = ts.user[0]
    top, _ = retriever.retrieve(user, 1)
    # Give a far item the vector of the user's current best: it ties for first after the refresh.
    loser = retriever.retrieve(user, 500)[0][-1]
    source.put(loser, items[int(top[0][1:])], 2000)
    source.delete(top[0])
    source.put("i9999", items[3] * 1.5, 2000)
    step = refresher.refresh()
    assert (step.added, step.updated, step.removed, step.unchanged, step.catalog) == (1, 1, 1, 498, 500)
    assert step.version == "abc123.3"
    got, _ = retriever.retrieve(user, 1)
    assert got == [loser]
    assert top[0] not in retriever.retrieve(user, 500)[0]
    # The index now holds what an index built from scratch over the changed store holds.
    ids = sorted(source.ids(REGISTRY.item.layouts[0]))
    _, matrix, _ = next(source.vectors(ids))
    exact = ExactIndex(model.embed_dim)
    exact.upsert(ids, model.embed_items(matrix))
    query = model.embed_users(user[None])[0]
    assert exact.search(query, 1)[0] == [loser]
    assert sorted(retriever.retrieve(user, 500)[0]) == ids


def test_cli_trains_saves_and_keeps_the_rankers_latest_entries(tmp_path: Path) -> None:
    import json

    from click.testing import CliRunner

    from headwater.cli.retrieval import retrieval
    from headwater.ranking.trainset import write_parquet

    world = make_world(REGISTRY, users=100, items=200, seed=3)
    write_parquet(training_set(REGISTRY, world, slates=600, seed=3), tmp_path / "ts.parquet")
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "latest.json").write_text('{"dcn": "dcn-x.pt", "linear": "linear-y.pt"}')
    args = ["train", "--training-set", str(tmp_path / "ts.parquet"), "--out", str(tmp_path / "models")]
    result = CliRunner().invoke(retrieval, [*args, "--epochs", "2", "--threads", "1"])
    assert result.exit_code == 0, result.output
    assert "recall@100: two-tower" in result.output
    latest = json.loads((tmp_path / "models" / "latest.json").read_text())
    assert latest["dcn"] == "dcn-x.pt"
    assert latest["linear"] == "linear-y.pt"
    assert load_towers(tmp_path / "models").path.name == latest["two_tower"]


def test_a_refresh_scans_only_after_a_write_or_the_full_scan_period(
    trained: tuple[TrainingSet, object],
) -> None:
    from headwater.serving.retrieval.runtime import RetrievalRuntime

    model = trained[1].model  # type: ignore[attr-defined]
    source = LoggedSource(REGISTRY.item)
    items = np.random.default_rng(9).gamma(2.0, 2.0, size=(50, REGISTRY.item.dim)).astype(np.float32)
    for j in range(50):
        source.put(f"i{j:04d}", items[j], 1000)
    index = ItemIndex(model.embed_dim, threads=1)
    refresher = IndexRefresher(source, model, index, "abc123")
    runtime = RetrievalRuntime(None, index, refresher, None, refresher.refresh())  # type: ignore[arg-type]
    assert (source.scans, runtime.version) == (1, "abc123.1")
    # Nothing written, or only progress entries: no scan, same version.
    source.progress()
    assert runtime.refresh_if_changed(full_scan_s=3600.0) is None
    assert (source.scans, runtime.skipped, runtime.version) == (1, 1, "abc123.1")
    # A write: the next look scans and embeds it.
    source.put("new", items[0] * 2.0, 2000)
    report = runtime.refresh_if_changed(full_scan_s=3600.0)
    assert report is not None
    assert (report.added, report.unchanged, report.version) == (1, 50, "abc123.2")
    # An expiry writes nothing: only the full-scan period drops it.
    source.expire("i0001")
    assert runtime.refresh_if_changed(full_scan_s=3600.0) is None
    assert "i0001" in index
    report = runtime.refresh_if_changed(full_scan_s=0.0)
    assert report is not None
    assert (report.removed, report.catalog, report.version) == (1, 50, "abc123.3")
    assert "i0001" not in index
    assert source.scans == 3


def test_a_source_without_a_change_log_scans_at_every_look(trained: tuple[TrainingSet, object]) -> None:
    model = trained[1].model  # type: ignore[attr-defined]
    source = FakeSource(REGISTRY.item)
    source.put("a", np.ones(REGISTRY.item.dim, np.float32), 1)
    refresher = IndexRefresher(source, model, ItemIndex(model.embed_dim, threads=1), "v")
    assert refresher.changed()
    refresher.refresh()
    assert refresher.changed()
    assert refresher.log_position() is None
