"""headwater.v1.Ranking/Recommend calls the funnel POST /v1/recommend calls (in process, a real gRPC port)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import grpc
import httpx

from headwater.client.proto.headwater.v1 import ranking_pb2 as pb
from headwater.serving.grpc_server import GrpcEdge

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling test's in-memory service
from test_funnel_stages import FakeRetriever, app_client


def _both(app: Any, body: dict[str, Any]) -> tuple[Any, list[Any]]:
    edge = GrpcEdge.for_app(app, "127.0.0.1", 0)

    async def main() -> tuple[Any, list[Any]]:
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
                rest = (await client.post("/v1/recommend", json=body)).json()
            async with grpc.aio.insecure_channel(f"127.0.0.1:{edge.port}") as channel:
                call = channel.unary_unary(
                    "/headwater.v1.Ranking/Recommend",
                    request_serializer=pb.RecommendRequest.SerializeToString,
                    response_deserializer=pb.RecommendResponse.FromString,
                )
                answers = [await call(pb.RecommendRequest(**body), timeout=30)]
                try:
                    await call(pb.RecommendRequest(user_id="u1", k=0), timeout=30)
                except grpc.aio.AioRpcError as exc:
                    answers.append((exc.code(), exc.details()))
            return rest, answers

    return asyncio.run(main())


def test_recommend_over_grpc_matches_rest() -> None:
    c, _ = app_client(FakeRetriever())
    rest, (answer, refused) = _both(c.app, {"user_id": "u1", "k": 5, "log_impressions": False})
    assert [i.item_id for i in answer.items] == [i["item_id"] for i in rest["items"]]
    assert [i.category for i in answer.items] == [i["category"] for i in rest["items"]]
    assert [(s.stage, s.candidates) for s in answer.stages] == [
        (s["stage"], s["candidates"]) for s in rest["stages"]
    ]
    assert answer.stages[3].fallback_reason == "no_reranker"
    assert answer.model_version == rest["model_version"]
    assert refused[0] == grpc.StatusCode.INVALID_ARGUMENT
    assert "k:" in refused[1]


def test_recommend_over_grpc_without_the_funnel_is_unavailable() -> None:
    c, _ = app_client(on=False)
    edge = GrpcEdge.for_app(c.app, "127.0.0.1", 0)

    async def main() -> Any:
        async with (
            c.app.router.lifespan_context(c.app),
            grpc.aio.insecure_channel(f"127.0.0.1:{edge.port}") as channel,
        ):
            call = channel.unary_unary(
                "/headwater.v1.Ranking/Recommend",
                request_serializer=pb.RecommendRequest.SerializeToString,
                response_deserializer=pb.RecommendResponse.FromString,
            )
            try:
                await call(pb.RecommendRequest(user_id="u1", k=2), timeout=30)
            except grpc.aio.AioRpcError as exc:
                return exc.code(), exc.details()
        return None

    code, details = asyncio.run(main())
    assert code == grpc.StatusCode.UNIMPLEMENTED
    assert "without the funnel" in details
