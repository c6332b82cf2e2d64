"""The protocol-neutral core answers rank, recommend, feedback and health with no HTTP or gRPC,
and the REST and gRPC adapters over it give the same answer to the same request.

The world is ``four_items``: a linear model weighting the item feature ``y`` (i1 > i3 > i0 > i2), a
fake retriever that returns the catalog, no neural model (so the linear model answers, a fallback).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Collection
from typing import Any

import grpc
import httpx
import numpy as np
import numpy.typing as npt
import pytest

from headwater.client.proto.headwater.v1 import ranking_pb2 as pb
from headwater.ranking.model import LinearRanker
from headwater.serving.app import create_app
from headwater.serving.config import ServingConfig
from headwater.serving.core import FunnelOff, NotStarted, RankingService, ServiceParts
from headwater.serving.feedback import FeedbackRefused
from headwater.serving.funnel.config import FunnelConfig
from headwater.serving.funnel.recent import MemoryRecentItems
from headwater.serving.funnel.stages import FunnelParts
from headwater.serving.grpc_server import GrpcEdge
from headwater.serving.runtime import LoadedModels
from headwater.serving.schemas import FeedbackRequest, RankRequest, RecommendRequest

from .four_items import ITEMS, REGISTRY, four_item_store

FUNNEL = FunnelConfig(retrieve_n=4, rank_keep=4, rerank_top=0, max_per_category=None)
CONFIG = ServingConfig(editorial_items=("i3",), item_cache_ttl_s=0.0, funnel=FUNNEL)


class CatalogRetriever:
    """Returns the catalog in its order, less the excluded items."""

    def retrieve(
        self, user_vector: npt.NDArray[np.float32], n: int, exclude: Collection[str] = ()
    ) -> tuple[list[str], npt.NDArray[np.float32]]:
        out = [i for i in ITEMS if i not in exclude][:n]
        return out, np.zeros(len(out), np.float32)


def _loaded() -> LoadedModels:
    f32 = np.float32
    linear = LinearRanker(
        {
            "user_mean": np.zeros(2, f32), "user_scale": np.ones(2, f32), "item_mean": np.zeros(3, f32),
            "item_scale": np.ones(3, f32), "w_user": np.zeros(2, f32), "w_item": np.array([0, 1, 0], f32),
            "w_cross": np.zeros((2, 3), f32), "bias": np.zeros(1, f32),
        }
    )  # fmt: skip
    art = type("A", (), {"version": "linlinlinlin"})()
    return LoadedModels(None, None, linear, art, "cpu")


def _funnel() -> FunnelParts:
    return FunnelParts(MemoryRecentItems(FUNNEL, dict.fromkeys(ITEMS, "c")), CatalogRetriever())


def _service(funnel: bool = True) -> RankingService:
    parts = ServiceParts.build(
        CONFIG, REGISTRY, four_item_store(), _loaded(), funnel=_funnel() if funnel else None
    )
    return RankingService(parts)


def test_core_answers_every_call_without_a_protocol() -> None:
    service = _service()

    async def main() -> tuple[Any, ...]:
        await service.start()
        try:
            rank = await service.rank(RankRequest(user_id="u1", candidates=ITEMS, k=2, log_impressions=False))
            recommend = await service.recommend(RecommendRequest(user_id="u1", k=3, log_impressions=False))
            click = FeedbackRequest(user_id="u1", item_id="i1", event_type="click", idempotency_key="k1")
            # i1 was not served (log_impressions false): a caller allowed unsolicited events
            first = await service.feedback(click, unsolicited_allowed=True)
            again = await service.feedback(click, unsolicited_allowed=True)
            return rank, recommend, first, again, await service.health()
        finally:
            await service.stop()

    rank, recommend, first, again, health = asyncio.run(main())
    assert [x["item_id"] for x in rank["items"]] == ["i1", "i3"]
    assert rank["items"][0]["score"] > rank["items"][1]["score"]
    assert (rank["fallback"], rank["arm"]) == ("linear", None)
    assert [x["item_id"] for x in recommend["items"]] == ["i1", "i3", "i0"]
    assert [s["stage"] for s in recommend["stages"]] == ["retrieve", "seen", "rank", "rerank", "rules"]
    assert (first["queued"], first["replayed"], again["replayed"]) == (False, False, True)
    assert again["event_id"] == first["event_id"]
    assert (health.status, health.linear_version, health.device) == ("degraded", "linlinlinlin", "cpu")


def test_core_refuses_by_raising() -> None:
    service = _service(funnel=False)
    body = RankRequest(user_id="u1", candidates=ITEMS, k=2, log_impressions=False)
    old = FeedbackRequest(
        user_id="u1", item_id="i1", event_type="click", event_time_ms=int(time.time() * 1000) - 3_600_000
    )

    async def main() -> None:
        with pytest.raises(NotStarted, match="not started"):
            await service.rank(body)
        await service.start()
        try:
            with pytest.raises(FunnelOff, match="without the funnel"):
                await service.recommend(RecommendRequest(user_id="u1", k=2))
            with pytest.raises(FeedbackRefused) as refused:
                await service.feedback(old)
            assert refused.value.field == "event_time_ms"
        finally:
            await service.stop()

    asyncio.run(main())


async def _grpc(port: int, method: str, message: Any, answer: Any) -> Any:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = channel.unary_unary(
            f"/headwater.v1.Ranking/{method}",
            request_serializer=type(message).SerializeToString,
            response_deserializer=answer.FromString,
        )
        return await call(message, timeout=30)


def _optional(message: Any, name: str) -> Any:
    """Return a message's optional field, None when absent (as the REST answer has it)."""
    return getattr(message, name) if message.HasField(name) else None


def _rank_fields(message: pb.RankResponse) -> dict[str, Any]:
    """Return a gRPC rank answer as the REST answer's fields (less the per-request ones and the arm)."""
    return {
        "items": [{"item_id": i.item_id, "score": i.score} for i in message.items],
        "model_version": _optional(message, "model_version"),
        "fallback": _optional(message, "fallback"),
        "fallback_reason": _optional(message, "fallback_reason"),
        "user_feature_event_ms": dict(message.user_feature_event_ms),
    }


def _recommend_fields(message: pb.RecommendResponse) -> dict[str, Any]:
    """Return a gRPC recommend answer as the REST answer's fields (less the per-request ones)."""
    items = [
        {"item_id": i.item_id, "score": _optional(i, "score"), "category": _optional(i, "category")}
        for i in message.items
    ]
    stages = [(s.stage, s.candidates, _optional(s, "fallback")) for s in message.stages]
    names = ("model_version", "reranker_version", "retrieval_version")
    return {
        "items": items,
        "fallback": message.fallback,
        "stages": stages,
        **{n: _optional(message, n) for n in names},
    }


def test_rest_and_grpc_answer_the_same_request_alike() -> None:
    app = create_app(CONFIG, REGISTRY, four_item_store(), _loaded(), funnel=_funnel())
    edge = GrpcEdge.for_app(app, "127.0.0.1", 0)
    rank: dict[str, Any] = {"user_id": "u1", "candidates": ITEMS, "k": 3, "log_impressions": False}
    recommend: dict[str, Any] = {"user_id": "u1", "k": 3, "log_impressions": False}

    async def main() -> tuple[Any, ...]:
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
                rest_rank = (await client.post("/v1/rank", json=rank)).json()
                rest_recommend = (await client.post("/v1/recommend", json=recommend)).json()
            grpc_rank = await _grpc(edge.port, "Rank", pb.RankRequest(**rank), pb.RankResponse)
            message = pb.RecommendRequest(**recommend)
            grpc_recommend = await _grpc(edge.port, "Recommend", message, pb.RecommendResponse)
        return rest_rank, grpc_rank, rest_recommend, grpc_recommend

    rest_rank, grpc_rank, rest_recommend, grpc_recommend = asyncio.run(main())
    assert [x["item_id"] for x in rest_rank["items"]] == ["i1", "i3", "i0"]
    assert _rank_fields(grpc_rank) == {k: rest_rank[k] for k in _rank_fields(grpc_rank)}
    rest_recommend["stages"] = [
        (s["stage"], s["candidates"], s["fallback"]) for s in rest_recommend["stages"]
    ]
    assert _recommend_fields(grpc_recommend) == {
        k: rest_recommend[k] for k in _recommend_fields(grpc_recommend)
    }
    assert grpc_rank.request_id != rest_rank["request_id"]  # two calls, two rankings
