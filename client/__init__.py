"""The Python client of the headwater ranking service, apart from the service (no torch, no FastAPI).

:class:`RankingClient` ranks over REST (``POST /v1/rank``, the default) or gRPC
(``headwater.v1.Ranking/Rank``) with timeouts, retries with jitter and a circuit breaker that answers
from the user's last good result plus the popularity list while the service is slow or down
(:mod:`headwater.client.ranking`). ``headwater rank`` and ``headwater feedback`` are its command
line (:mod:`headwater.cli.client`). :class:`IngestClient` pushes any source's events to ``headwater
ingest serve`` (:mod:`headwater.client.ingest`).
"""

from headwater.client.ingest import (
    IngestClient,
    IngestError,
    IngestRequestError,
    IngestUnavailable,
    PushedEvent,
)
from headwater.client.ranking import (
    Backoff,
    BreakerConfig,
    CircuitBreaker,
    RankedItem,
    RankingClient,
    RankingError,
    RankingRequestError,
    RankingUnavailable,
    RankResult,
)

__all__ = [
    "Backoff",
    "BreakerConfig",
    "CircuitBreaker",
    "IngestClient",
    "IngestError",
    "IngestRequestError",
    "IngestUnavailable",
    "PushedEvent",
    "RankResult",
    "RankedItem",
    "RankingClient",
    "RankingError",
    "RankingRequestError",
    "RankingUnavailable",
]
