"""The edge in-process (issue 32 items 3 and 5): request ids, the impression ledger, the body deadline.

- a caller's ``X-Request-Id`` is held to a plain alphabet (422 otherwise) and becomes the answer's
  ``request_id``; the same id twice logs its impressions once (:class:`ImpressionLedger`), per user;
- the ledger forgets an id after its TTL, and past its bound the oldest early (counted);
- a body that does not arrive within ``body_timeout_s`` is answered 408 with ``Connection: close``;
- hostile bodies and headers to the REST adapter are answered 4xx (or 200), never 5xx.
"""

from __future__ import annotations

import asyncio
import json
import string
from collections.abc import Sequence
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from headwater.pipelines.events.schema import BehaviorEvent
from headwater.ranking.synthetic import small_registry
from headwater.serving.app import create_app
from headwater.serving.config import EdgeConfig, ServingConfig
from headwater.serving.edge import uvicorn_options
from headwater.serving.feedback import FeedbackProducer
from headwater.serving.impressions import (
    ImpressionLedger,
    Impressions,
    InvalidRequestId,
    checked_request_id,
)
from headwater.serving.rest import BodyLimit
from headwater.serving.runtime import LoadedModels
from headwater.serving.store import InMemoryFeatureStore

REGISTRY = small_registry({"u": ["a", "b"]}, {"i": ["x"]}, "i.x", registry_hash="sha256:" + "56" * 32)
CONFIG = ServingConfig(editorial_items=("i2",), item_cache_ttl_s=0.0, io_threads=2, max_body_bytes=16 * 1024)
BODY: dict[str, Any] = {"user_id": "u1", "candidates": ["i0", "i1", "i2"], "k": 2}
NO_MODELS = LoadedModels(None, None, None, None, "cpu")
ID_CHARS = string.ascii_letters + string.digits + "._-"


class Offered(FeedbackProducer):
    """A producer that keeps what it is offered (no thread, no Kafka)."""

    def __init__(self) -> None:
        super().__init__("t", lambda: None)  # type: ignore[arg-type,return-value]
        self.offered: list[Impressions | Sequence[BehaviorEvent]] = []

    def start(self) -> None:
        return None

    def stop(self, timeout_s: float = 5.0) -> None:
        return None

    def offer(self, events: Sequence[BehaviorEvent] | Impressions) -> int:
        self.offered.append(events)
        return len(events)


def _client(config: ServingConfig = CONFIG, feedback: FeedbackProducer | None = None) -> TestClient:
    app = create_app(config, REGISTRY, InMemoryFeatureStore(), NO_MODELS, feedback)
    return TestClient(app, raise_server_exceptions=False)


# --- request ids and the ledger ---------------------------------------------------------------------


def test_a_retried_request_id_logs_its_impressions_once() -> None:
    feedback = Offered()
    with _client(feedback=feedback) as c:
        first = c.post("/v1/rank", json=BODY, headers={"X-Request-Id": "call-1"})
        retry = c.post("/v1/rank", json=BODY, headers={"X-Request-Id": "call-1"})
        other_user = c.post("/v1/rank", json={**BODY, "user_id": "u2"}, headers={"X-Request-Id": "call-1"})
        fresh = [c.post("/v1/rank", json=BODY) for _ in range(2)]
        ledger = c.app.state.service.ledger  # type: ignore[attr-defined]
    assert [r.status_code for r in (first, retry, other_user, *fresh)] == [200] * 5
    assert first.json()["request_id"] == retry.json()["request_id"] == "call-1"
    assert first.json()["items"] == retry.json()["items"]
    shown = [(i.request_id, i.user_id) for i in feedback.offered if isinstance(i, Impressions)]
    assert shown[:2] == [("call-1", "u1"), ("call-1", "u2")]  # the retry logged nothing
    assert len(shown) == 4  # and each id-less request its own, under a fresh id
    assert len({rid for rid, _ in shown[2:]}) == 2
    assert ledger.repeats == 1


def test_an_invalid_request_id_is_refused_422_naming_the_header() -> None:
    with _client() as c:
        bad = c.post("/v1/rank", json=BODY, headers={"X-Request-Id": "a:b"})
        long = c.post("/v1/recommend", json={"user_id": "u1", "k": 2}, headers={"X-Request-Id": "x" * 65})
    assert bad.status_code == 422
    assert bad.json()["errors"][0]["field"] == "X-Request-Id"
    assert "must be 1 to 64 characters of A-Z a-z 0-9 . _ -; got 3 characters ('a:b')" in bad.json()["detail"]
    assert long.status_code in (404, 422)  # no funnel: 404 comes first only if the id were fine
    assert long.status_code == 422, long.text


@given(st.text(max_size=80))
def test_a_request_id_is_kept_as_given_or_refused(value: str) -> None:
    valid = 1 <= len(value) <= 64 and all(ch in ID_CHARS for ch in value)
    if valid:
        assert checked_request_id(value) == value
    else:
        with pytest.raises(InvalidRequestId, match="X-Request-Id: must be 1 to 64 characters"):
            checked_request_id(value)


def test_the_ledger_forgets_after_its_ttl_and_past_its_bound() -> None:
    now = [0.0]
    ledger = ImpressionLedger(ttl_s=10.0, max_entries=3, clock=lambda: now[0])
    assert ledger.first("u1", "a")
    assert not ledger.first("u1", "a")
    assert ledger.first("u2", "a")  # another user's id is another request
    now[0] = 9.9
    assert not ledger.first("u1", "a")
    now[0] = 10.0
    assert ledger.first("u1", "a")  # expired, so a new request
    assert [ledger.first("u1", x) for x in ("b", "c", "d")] == [True, True, True]
    assert len(ledger) == 3
    assert ledger.evicted_early == 1  # the two at 0 s expired; of the four at 10 s the oldest went early
    assert ledger.repeats == 2


# --- the body deadline ---------------------------------------------------------------------------------


def test_a_body_slower_than_the_timeout_is_answered_408_and_closed() -> None:
    sent: list[dict[str, Any]] = []
    reached: list[bytes] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        reached.append((await receive())["body"])

    async def trickle() -> dict[str, Any]:
        await asyncio.sleep(0.05)
        return {"type": "http.request", "body": b"x", "more_body": True}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def main() -> float:
        loop = asyncio.get_running_loop()
        began = loop.time()
        scope = {"type": "http", "method": "POST", "path": "/v1/rank", "headers": []}
        await BodyLimit(app, limit=1024, timeout_s=0.3)(scope, trickle, send)
        return loop.time() - began

    took = asyncio.run(main())
    assert 0.3 <= took < 1.0
    assert reached == []  # the app never saw the request
    start = sent[0]
    assert start["status"] == 408
    assert (b"connection", b"close") in start["headers"]
    detail = json.loads(sent[1]["body"])["detail"]
    assert detail.startswith("the request body did not arrive within 0.3 s (")


def test_the_uvicorn_options_are_the_configured_limits() -> None:
    edge = EdgeConfig(max_connections=7, backlog=9, keep_alive_s=3.0, header_timeout_s=2.5)
    options = uvicorn_options(edge)
    assert {k: options[k] for k in ("limit_concurrency", "backlog", "timeout_keep_alive")} == {
        "limit_concurrency": 7,
        "backlog": 9,
        "timeout_keep_alive": 3.0,
    }
    assert options["http"].header_timeout_s == 2.5


# --- hostile input to the REST adapter --------------------------------------------------------------

HEADER_TEXT = st.text(
    st.characters(min_codepoint=0x20, max_codepoint=0xFF, exclude_characters="\x7f"), max_size=90
)
JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=10), inner, max_size=5),
    max_leaves=20,
)
BODIES = st.one_of(
    st.binary(max_size=300),
    JSONISH.map(lambda v: json.dumps(v).encode()),
    st.fixed_dictionaries({"user_id": JSONISH, "candidates": JSONISH, "k": JSONISH}).map(
        lambda v: json.dumps(v).encode()
    ),
    st.integers(0, 40_000).map(
        lambda n: json.dumps({**BODY, "candidates": [str(i) for i in range(n)]}).encode()
    ),
)


@pytest.fixture(scope="module")
def hostile() -> Any:
    with _client() as c:
        yield c


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    path=st.sampled_from(["/v1/rank", "/v1/recommend", "/v1/feedback"]),
    body=BODIES,
    request_id=st.none() | HEADER_TEXT,
    user_class=st.none() | HEADER_TEXT,
    content_type=st.sampled_from(
        ["application/json", "text/plain", "application/x+json", "", "multipart/form-data"]
    ),
)
def test_hostile_bodies_and_headers_are_never_a_5xx(
    hostile: TestClient,
    path: str,
    body: bytes,
    request_id: str | None,
    user_class: str | None,
    content_type: str,
) -> None:
    headers = {"content-type": content_type.encode()}
    if request_id is not None:  # any byte a client can put in a header (latin-1), not only ASCII
        headers["X-Request-Id"] = request_id.encode("latin-1")
    if user_class is not None:
        headers["X-User-Class"] = user_class.encode("latin-1")
    response = hostile.post(path, content=body, headers=headers)
    assert response.status_code < 500, response.text
    if response.status_code != 200 and response.status_code != 202:
        assert 400 <= response.status_code < 500
        assert isinstance(response.json()["detail"], str)
    if content_type in ("text/plain", "", "multipart/form-data"):  # not JSON: refused before the body
        assert response.status_code == 415
    elif len(body) > CONFIG.max_body_bytes:
        assert response.status_code == 413
