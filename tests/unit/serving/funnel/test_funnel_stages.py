"""/v1/recommend end to end in process: the in-memory store, fake retriever and re-ranker, and fallbacks."""

from __future__ import annotations

import time
from collections.abc import Collection, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from fastapi.testclient import TestClient
from hypothesis import given, settings
from hypothesis import strategies as st

from headwater.ranking.synthetic import small_registry
from headwater.serving.app import create_app
from headwater.serving.config import FeedbackConfig, ServingConfig
from headwater.serving.funnel.config import FunnelConfig
from headwater.serving.funnel.recent import MemoryRecentItems
from headwater.serving.funnel.rules import apply_rules
from headwater.serving.funnel.stages import FunnelParts
from headwater.serving.runtime import LoadedModels
from headwater.serving.served import FeedbackTrustConfig
from headwater.serving.store import InMemoryFeatureStore

REGISTRY = small_registry({"u": ["a", "b"]}, {"i": ["x", "y"]}, "i.x")
U, ITEM_VIEW = REGISTRY.user.layouts[0], REGISTRY.item.layouts[0]
ITEMS = [f"i{j}" for j in range(30)]
CATEGORY = {item: "abc"[j % 3] for j, item in enumerate(ITEMS)}


class FakeNeural:
    """Scores = the item's x feature (i29 best, i0 worst)."""

    def score_batch(self, jobs: Sequence[tuple[Any, Any]]) -> list[Any]:
        return [items[:, 0].astype(np.float32) for _, items in jobs]


class FakeRetriever:
    """Returns the catalog in its order (or raises)."""

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.asked: list[int] = []

    def retrieve(
        self, user_vector: npt.NDArray[np.float32], n: int, exclude: Collection[str] = ()
    ) -> tuple[list[str], npt.NDArray[np.float32]]:
        self.asked.append(n)
        if self.fail:
            raise RuntimeError("index is being rebuilt")
        out = [i for i in ITEMS if i not in exclude][:n]
        return out, np.zeros(len(out), np.float32)


class ReverseReranker:
    """Reverses the DCN's top (lower x first), so its effect is visible."""

    version = "rrrrrrrrrrrr"

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.clicks_seen: list[int] = []

    def score(self, candidates: Any, base: Any, clicks: Any) -> Any:
        if self.fail:
            raise RuntimeError("broken")
        self.clicks_seen.append(len(clicks))
        return -candidates[:, 0]


def store() -> InMemoryFeatureStore:
    s = InMemoryFeatureStore()
    now = int(time.time() * 1000)
    s.write(U, ["u1"], np.array([[1.0, 2.0]], np.float32), now)
    x = np.arange(len(ITEMS), dtype=np.float32)
    s.write(ITEM_VIEW, ITEMS, np.stack([x, x], axis=1), now)
    return s


def app_client(
    retriever: Any = None, reranker: Any = None, funnel: FunnelConfig | None = None, on: bool = True
) -> tuple[TestClient, MemoryRecentItems]:
    cfg = funnel or FunnelConfig(retrieve_n=20, rank_keep=15, rerank_top=5, max_per_category=None)
    # The clicks these tests post stand for a trusted caller's (items of the catalog, never served).
    trusted = FeedbackConfig(trust=FeedbackTrustConfig(allow_unsolicited=True))
    config = ServingConfig(item_cache_ttl_s=0.0, editorial_items=("i7", "i8"), funnel=cfg, feedback=trusted)
    recent = MemoryRecentItems(cfg, CATEGORY)
    art = type("A", (), {"version": "abc123abc123"})()
    loaded = LoadedModels(FakeNeural(), art, None, None, "cpu")  # type: ignore[arg-type]
    parts = FunnelParts(recent, retriever, reranker) if on else None
    return TestClient(create_app(config, REGISTRY, store(), loaded, funnel=parts)), recent


def recommend(c: TestClient, **body: Any) -> dict[str, Any]:
    response = c.post("/v1/recommend", json={"user_id": "u1", "k": 5, **body})
    assert response.status_code == 200, response.text
    return dict(response.json())


def ids(answer: dict[str, Any]) -> list[str]:
    return [x["item_id"] for x in answer["items"]]


def stage(answer: dict[str, Any], name: str) -> dict[str, Any]:
    return next(s for s in answer["stages"] if s["stage"] == name)


def test_the_funnel_retrieves_ranks_and_reports_each_stage() -> None:
    retriever = FakeRetriever()
    c, _ = app_client(retriever)
    with c:
        answer = recommend(c, log_impressions=False)
    # Retrieved i0..i19; the DCN orders by x: i19 first; no re-ranker: the DCN's order stays.
    assert ids(answer) == ["i19", "i18", "i17", "i16", "i15"]
    assert [s["stage"] for s in answer["stages"]] == ["retrieve", "seen", "rank", "rerank", "rules"]
    assert [s["candidates"] for s in answer["stages"]] == [20, 20, 15, 5, 5]
    assert stage(answer, "rerank")["fallback"] == "dcn_order"
    assert stage(answer, "rerank")["fallback_reason"] == "no_reranker"
    assert stage(answer, "retrieve")["fallback"] is None
    assert answer["fallback"] is True
    assert answer["model_version"] == "abc123abc123"
    assert all(s["ms"] >= 0 for s in answer["stages"])
    assert sum(s["ms"] for s in answer["stages"]) <= answer["latency_ms"] + 1e-6
    assert answer["items"][0]["category"] == CATEGORY["i19"]
    assert retriever.asked == [20]


def test_items_served_are_dropped_from_the_next_answer() -> None:
    retriever = FakeRetriever()
    c, recent = app_client(retriever)
    with c:
        first = recommend(c)
        second = recommend(c)
    assert set(ids(first)).isdisjoint(ids(second))
    assert ids(second) == ["i24", "i23", "i22", "i21", "i20"]  # i0..i24 less the 5 seen: the next best
    assert retriever.asked == [20, 25]  # asked for n + the 5 seen, so 20 remain after the filter
    assert stage(second, "seen")["candidates"] == 20
    assert set(recent.seen["u1"]) == set(ids(first)) | set(ids(second))


def test_rank_impressions_count_as_seen_too() -> None:
    c, _ = app_client(FakeRetriever())
    with c:
        r = c.post("/v1/rank", json={"user_id": "u1", "candidates": ["i19", "i18"], "k": 2})
        assert r.status_code == 200
        answer = recommend(c)
    assert "i19" not in ids(answer)
    assert "i18" not in ids(answer)


def test_the_reranker_reorders_the_top_and_reads_the_clicks() -> None:
    reranker = ReverseReranker()
    c, _ = app_client(FakeRetriever(), reranker)
    with c:
        for item in ("i3", "i4"):
            posted = c.post("/v1/feedback", json={"user_id": "u1", "item_id": item, "event_type": "click"})
            assert posted.status_code == 202
        answer = recommend(c, log_impressions=False)
    assert ids(answer) == ["i15", "i16", "i17", "i18", "i19"]  # the DCN's top 5, reversed
    assert stage(answer, "rerank")["fallback"] is None
    assert answer["reranker_version"] == "rrrrrrrrrrrr"
    assert reranker.clicks_seen == [2]
    assert answer["items"][0]["score"] == pytest.approx(-15.0)


def test_a_failing_reranker_keeps_the_dcn_order() -> None:
    c, _ = app_client(FakeRetriever(), ReverseReranker(fail=True))
    with c:
        answer = recommend(c, log_impressions=False)
    assert ids(answer) == ["i19", "i18", "i17", "i16", "i15"]
    assert stage(answer, "rerank")["fallback_reason"] == "reranker_error"


def test_retrieval_down_falls_back_to_the_most_clicked_items() -> None:
    c, _ = app_client(FakeRetriever(fail=True))
    with c:
        for item, times in (("i2", 3), ("i5", 2), ("i9", 1)):
            for _ in range(times):
                c.post("/v1/feedback", json={"user_id": "u9", "item_id": item, "event_type": "click"})
        answer = recommend(c, k=3, log_impressions=False)
        metrics = c.get("/metrics").text
    retrieve = stage(answer, "retrieve")
    assert (retrieve["fallback"], retrieve["fallback_reason"]) == ("popularity", "retrieval_error")
    assert retrieve["candidates"] == 3
    assert ids(answer) == ["i9", "i5", "i2"]  # the DCN orders the popular candidates by x
    assert 'headwater_funnel_fallbacks_total{reason="retrieval_error",stage="retrieve"} 1.0' in metrics
    assert 'headwater_funnel_stage_seconds_count{stage="rank"} 1.0' in metrics
    assert 'headwater_funnel_stage_candidates_sum{stage="retrieve"} 3.0' in metrics


def test_no_retriever_and_no_clicks_gives_the_editorial_list() -> None:
    c, _ = app_client(None)
    with c:
        answer = recommend(c, k=2, log_impressions=False)
    retrieve = stage(answer, "retrieve")
    assert (retrieve["fallback"], retrieve["fallback_reason"]) == ("editorial", "no_retriever")
    assert ids(answer) == ["i8", "i7"]


def test_unknown_user_falls_back_for_retrieval_and_ranking() -> None:
    c, recent = app_client(FakeRetriever())
    recent.clicked("u2", "i4", 1)
    with c:
        answer = recommend(c, user_id="nobody", k=1, log_impressions=False)
    assert stage(answer, "retrieve")["fallback_reason"] == "missing_user_features"
    assert stage(answer, "rank")["fallback_reason"] == "missing_user_features"
    assert ids(answer) == ["i4"]


def test_diversity_and_pins_shape_the_answer() -> None:
    cfg = FunnelConfig(retrieve_n=20, rank_keep=15, rerank_top=0, max_per_category=1, pins={"i0": 2})
    c, _ = app_client(FakeRetriever(), funnel=cfg)
    with c:
        answer = recommend(c, k=4, log_impressions=False)
    # DCN order i19 (b), i18 (a), i17 (c), i16 (b: full) ...; i0 pinned at position 2.
    assert ids(answer) == ["i19", "i0", "i18", "i17"]
    assert stage(answer, "rerank")["fallback_reason"] == "off"
    assert answer["items"][1]["score"] is not None or answer["items"][1]["item_id"] == "i0"


def test_without_a_funnel_the_route_answers_404_and_bad_bodies_422() -> None:
    c, _ = app_client(on=False)
    with c:
        assert c.post("/v1/recommend", json={"user_id": "u1", "k": 5}).status_code == 404
        bad = c.post("/v1/recommend", json={"user_id": "u1", "k": 0})
        assert bad.status_code == 422
        assert bad.json()["errors"][0]["field"] == "k"
        extra = c.post("/v1/recommend", json={"user_id": "u1", "k": 1, "candidates": ["i1"]})
        assert extra.status_code == 422
        assert "expected user_id, k" in extra.json()["errors"][0]["message"]


class CountingStore(InMemoryFeatureStore):
    """Records the views of each read."""

    def __init__(self) -> None:
        super().__init__()
        self.views: list[list[str]] = []

    def read_many(self, requests: Sequence[tuple[Any, Sequence[str]]]) -> Any:
        self.views.append([layout.view for layout, _ in requests])
        return super().read_many(requests)


def test_the_users_rows_are_read_once_per_request_and_a_store_failure_falls_back() -> None:
    counting = CountingStore()
    source = store()
    counting._rows = source._rows  # the same rows
    cfg = FunnelConfig(retrieve_n=20, rank_keep=15, rerank_top=5, max_per_category=None)
    config = ServingConfig(item_cache_ttl_s=60.0, editorial_items=("i7", "i8"), funnel=cfg)
    art = type("A", (), {"version": "abc123abc123"})()
    loaded = LoadedModels(FakeNeural(), art, None, None, "cpu")  # type: ignore[arg-type]
    parts = FunnelParts(MemoryRecentItems(cfg, CATEGORY), FakeRetriever())
    with TestClient(create_app(config, REGISTRY, counting, loaded, funnel=parts)) as c:
        first = recommend(c, log_impressions=False)
        assert [v.count(U.view) for v in counting.views] == [1, 0]  # the context read, then items only
        second = recommend(c, log_impressions=False)
        assert len(counting.views) == 3  # every candidate cached: the rank stage read nothing
        assert ids(second) == ids(first)
        counting.fail = "down"
        down = recommend(c, log_impressions=False)
    assert stage(down, "retrieve")["fallback_reason"] == "store_error"
    assert stage(down, "rank")["fallback"] is not None


class CountingRecent(MemoryRecentItems):
    """Records how many ids each category read asked for."""

    def __init__(self, cfg: FunnelConfig, category: dict[str, str]) -> None:
        super().__init__(cfg, category)
        self.asked: list[int] = []

    def categories(self, ids: Sequence[str]) -> list[str | None]:
        self.asked.append(len(ids))
        return super().categories(ids)


@settings(max_examples=40, deadline=None)
@given(
    cats=st.lists(st.sampled_from("abcd"), min_size=len(ITEMS), max_size=len(ITEMS)),
    k=st.integers(1, 12),
    cap=st.none() | st.integers(1, 3),
    pins=st.dictionaries(st.sampled_from(ITEMS), st.integers(1, 12), max_size=2),
)
def test_the_rules_read_a_head_of_the_order_and_answer_as_over_all_of_it(
    cats: list[str], k: int, cap: int | None, pins: dict[str, int]
) -> None:
    if len(set(pins.values())) < len(pins):
        pins = dict(list(pins.items())[:1])
    category = dict(zip(ITEMS, cats, strict=True))
    cfg = FunnelConfig(retrieve_n=30, rank_keep=30, rerank_top=0, max_per_category=cap, pins=pins)
    recent = CountingRecent(cfg, category)
    art = type("A", (), {"version": "abc123abc123"})()
    loaded = LoadedModels(FakeNeural(), art, None, None, "cpu")  # type: ignore[arg-type]
    config = ServingConfig(item_cache_ttl_s=0.0, funnel=cfg)
    app = create_app(config, REGISTRY, store(), loaded, funnel=FunnelParts(recent, FakeRetriever()))
    with TestClient(app) as c:
        answer = recommend(c, k=k, log_impressions=False)
    order = list(reversed(ITEMS))  # the fake DCN ranks by x: i29 first
    want = apply_rules(order, [category[i] for i in order], k, cap, pins)
    assert ids(answer) == want.items
    assert [x["category"] for x in answer["items"]] == [category[i] for i in want.items]
    assert recent.asked[0] <= 3 * k + len(pins)  # the first read covers a head, not all 30
