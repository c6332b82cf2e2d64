"""IngestClient against the real push API app (in-process): batching, retries with the same ids, flush."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from headwater.client import IngestClient, IngestRequestError, IngestUnavailable
from headwater.pipelines.events.codec import EventCodec
from headwater.pipelines.events.sources import example_sources
from headwater.serving.ingest.core import IngestService, OnDone
from headwater.serving.ingest.rest import ingest_app
from headwater.serving.ingest.sink import MemorySink

from .test_ingest_core import payment

SOURCES = {s.name: s for s in example_sources()}


class FlakySink(MemorySink):
    """Full for the first ``full`` batches, then fails the first ``drop`` deliveries."""

    def __init__(self, full: int = 0, drop: int = 0) -> None:
        super().__init__()
        self.full = full
        self.drop = drop

    def room(self) -> int:
        if self.full:
            self.full -= 1
            return 0
        return super().room()

    def send(
        self, topic: str, value: bytes, key: bytes | None, headers: list[tuple[str, bytes]], on_done: OnDone
    ) -> None:
        if self.drop:
            self.drop -= 1
            on_done(ConnectionError("broker gone"))
            return
        super().send(topic, value, key, headers, on_done)


def client_over(sink: MemorySink, **options: Any) -> tuple[IngestClient, list[float]]:
    waits: list[float] = []
    http = TestClient(ingest_app(IngestService(SOURCES, sink, retry_after_s=2.0)))
    client = IngestClient("http://testserver", "payments", http=http, sleep=waits.append, seed=1, **options)
    return client, waits


def ids_sent(sink: MemorySink) -> list[str]:
    codec = EventCodec(SOURCES["payments"])
    return [codec.decode(r[1], r[3]).event["payment_id"] for r in sink.records]  # type: ignore[union-attr]


def test_batches_and_flush() -> None:
    sink = MemorySink()
    client, waits = client_over(sink, batch_size=3)
    assert client.add(payment(0)) == []
    assert client.add(payment(1)) == []
    sent = client.add(payment(2))  # the third fills the batch
    assert [e.status for e in sent] == ["accepted"] * 3
    client.add(payment(3, amount=-1.0))
    out = client.flush()
    assert [(e.status, e.field) for e in out] == [("rejected", "amount")]
    assert client.stats.requests == 2
    assert waits == []
    assert ids_sent(sink) == ["p0", "p1", "p2"]


def test_429_waits_retry_after_then_sends() -> None:
    sink = FlakySink(full=2)
    client, waits = client_over(sink)
    out = client.send([payment(i) for i in range(4)])
    assert [e.status for e in out] == ["accepted"] * 4
    assert waits == [2.0, 2.0]  # the service's Retry-After, not the jittered backoff
    assert ids_sent(sink) == ["p0", "p1", "p2", "p3"]


def test_unacknowledged_events_resent_with_their_ids() -> None:
    sink = FlakySink(drop=2)
    client, _ = client_over(sink, event_id_field="payment_id")
    rows = [payment(i) for i in range(4)]
    for row in rows:
        del row["payment_id"]  # the client gives each an id, once
    out = client.send(rows)
    assert [e.status for e in out] == ["accepted"] * 4
    sent = ids_sent(sink)
    assert len(sent) == 4
    assert sorted(sent) == sorted(e.event["payment_id"] for e in out)
    assert client.stats.retries == 1


def test_event_id_field_asked_of_the_service() -> None:
    client, _ = client_over(MemorySink())
    assert client.event_id_field == "payment_id"


def test_refused_whole_and_retries_used_up() -> None:
    client, _ = client_over(MemorySink(), event_id_field=None)
    client.source = "nope"
    with pytest.raises(IngestRequestError) as caught:
        client.send([payment(1)])
    assert caught.value.status == 404
    stuck, waits = client_over(FlakySink(full=99), max_attempts=3, event_id_field=None)
    with pytest.raises(IngestUnavailable, match="1 of 1 event"):
        stuck.send([payment(1)])
    assert len(waits) == 2
