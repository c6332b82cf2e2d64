"""The push API's core and REST adapter over the in-memory sink: an answer per event, refusals with status."""

from __future__ import annotations

import io
import json
import time
from typing import Any

import orjson
import pytest
from fastapi.testclient import TestClient
from fastavro import schemaless_reader, schemaless_writer

from headwater.pipelines.events.codec import HEADER_SCHEMA_FP, EventCodec, wire_schema
from headwater.pipelines.events.sources import example_sources
from headwater.registry.plans import PlanSource
from headwater.serving.ingest.core import (
    BatchTooLarge,
    BufferFull,
    IngestService,
    NotAuthorized,
    UnknownSource,
)
from headwater.serving.ingest.rest import ingest_app
from headwater.serving.ingest.sink import MemorySink


@pytest.fixture(scope="module")
def sources() -> dict[str, PlanSource]:
    return {s.name: s for s in example_sources()}


def payment(i: int, **changes: Any) -> dict[str, Any]:
    now_us = time.time_ns() // 1_000  # payments' occurred_at is in microseconds
    row = {
        "payment_id": f"p{i}",
        "account_id": f"a{i % 3}",
        "merchant_id": "m1",
        "method": "card",
        "status": "captured",
        "amount": 10.0 + i,
        "currency": "EUR",
        "risk_score": 0.1,
        "occurred_at": now_us - 1_000_000,
    }
    row.update(changes)
    return row


def service(sources: dict[str, PlanSource], sink: MemorySink, **options: Any) -> IngestService:
    return IngestService(sources, sink, **options)


def test_accepts_and_keys_like_the_producer(sources: dict[str, PlanSource]) -> None:
    sink = MemorySink()
    answer = service(sources, sink).accept("payments", [payment(1), payment(2)])
    assert answer.status == 200
    assert (answer.accepted, answer.rejected, answer.failed) == (2, 0, 0)
    assert answer.dedup is True
    codec = EventCodec(sources["payments"])
    topics = [r[0] for r in sink.records]
    assert topics == ["payments", "payments"]
    # the key is the source's key; the value is the codec's Avro; the headers the producer's
    assert [r[2] for r in sink.records] == [b"a1", b"a2"]
    decoded = codec.decode(sink.records[0][1], sink.records[0][3])
    assert not hasattr(decoded, "reason")
    assert decoded.event["payment_id"] == "p1"
    assert dict(sink.records[0][3])[HEADER_SCHEMA_FP] == codec.fingerprint_header


def test_rejects_per_event_with_field_and_reason(sources: dict[str, PlanSource]) -> None:
    sink = MemorySink()
    rows: list[Any] = [payment(1), payment(2, amount=-5.0), payment(3, method="barter"), 42, payment(4)]
    answer = service(sources, sink).accept("payments", rows)
    assert answer.status == 422
    assert [r.status for r in answer.results] == ["accepted", "rejected", "rejected", "rejected", "accepted"]
    neg, enum, scalar = answer.results[1], answer.results[2], answer.results[3]
    assert neg.field == "amount"
    assert "amount >= 0" in (neg.reason or "")
    assert enum.field == "method"
    assert "barter" in (enum.reason or "")
    assert scalar.field is None
    assert "expected an object" in (scalar.reason or "")
    assert [r[2] for r in sink.records] == [b"a1", b"a1"]  # p1 and p4 only
    body = answer.as_dict()
    assert body["results"][0] == {"index": 0, "status": "accepted"}
    assert body["results"][1]["code"] == "invalid_field"


def test_rejects_go_to_the_dlq_when_configured(sources: dict[str, PlanSource]) -> None:
    sink = MemorySink()
    svc = service(sources, sink, dlq_topic="events.dlq")
    svc.accept("payments", [payment(1, amount=-1.0)])
    assert len(sink.records) == 1
    topic, value, key, headers = sink.records[0]
    assert topic == "events.dlq"
    assert key is None
    assert json.loads(value)["payment_id"] == "p1"
    meta = dict(headers)
    assert meta["dlq-reason"] == b"invalid_field"
    assert meta["dlq-source-topic"] == b"payments"
    assert svc.stats.as_dict()["dead_letters"] == 1


def test_id_policy_reason(sources: dict[str, PlanSource]) -> None:
    answer = service(sources, MemorySink()).accept("payments", [payment(1, account_id="x" * 300)])
    result = answer.results[0]
    assert (result.status, result.field, result.code) == ("rejected", "account_id", "invalid_id")
    assert "id-too-long" in (result.reason or "")


def test_buffer_full_refuses_the_whole_batch(sources: dict[str, PlanSource]) -> None:
    sink = MemorySink(room=1)
    svc = service(sources, sink, retry_after_s=2.0)
    with pytest.raises(BufferFull) as caught:
        svc.accept("payments", [payment(1), payment(2)])
    assert caught.value.status == 429
    assert caught.value.retry_after_s == 2.0
    assert sink.records == []  # nothing of it was sent


def test_failed_delivery_is_a_retryable_answer(sources: dict[str, PlanSource]) -> None:
    answer = service(sources, MemorySink(failing=frozenset({"payments"}))).accept("payments", [payment(1)])
    assert answer.status == 503
    assert answer.results[0].status == "failed"
    assert answer.results[0].code == "delivery_failed"


def test_unknown_source_too_large_and_auth(sources: dict[str, PlanSource]) -> None:
    svc = service(sources, MemorySink(), max_batch=2)
    with pytest.raises(UnknownSource, match="payments"):
        svc.accept("nope", [])
    with pytest.raises(BatchTooLarge, match="at most 2"):
        svc.accept("payments", [payment(1), payment(2), payment(3)])

    def authorize(headers: Any) -> None:
        if headers.get("authorization") != "Bearer k":
            raise NotAuthorized("no ingest credential", 401)

    guarded = service(sources, MemorySink(), authorize=authorize)
    with pytest.raises(NotAuthorized):
        guarded.accept("payments", [payment(1)], {})
    assert guarded.accept("payments", [payment(1)], {"authorization": "Bearer k"}).accepted == 1


@pytest.fixture
def client(sources: dict[str, PlanSource]) -> tuple[TestClient, MemorySink]:
    sink = MemorySink()
    app = ingest_app(
        service(sources, sink, max_batch=100), max_body_bytes=64 * 1024, feast_sources={"pp": "payments"}
    )
    return TestClient(app), sink


def test_rest_json_array_and_lines(client: tuple[TestClient, MemorySink]) -> None:
    http, sink = client
    reply = http.post("/v1/sources/payments/events", json=[payment(1), payment(2)])
    assert reply.status_code == 200
    assert reply.json()["accepted"] == 2
    lines = b"\n".join(orjson.dumps(payment(i)) for i in range(3)) + b"\n{not json\n"
    reply = http.post(
        "/v1/sources/payments/events", content=lines, headers={"content-type": "application/x-ndjson"}
    )
    assert reply.status_code == 422
    body = reply.json()
    assert (body["accepted"], body["rejected"]) == (3, 1)
    assert body["results"][3]["code"] == "corrupt_payload"
    assert "line 4 is not JSON" in body["results"][3]["reason"]
    assert len(sink.records) == 5


def test_rest_avro_with_fingerprint(
    client: tuple[TestClient, MemorySink], sources: dict[str, PlanSource]
) -> None:
    http, sink = client
    source = sources["payments"]
    wire = wire_schema(source.current.json_text)
    body = io.BytesIO()
    for i in range(2):
        datum = io.BytesIO()
        schemaless_writer(datum, wire, payment(i))
        raw = datum.getvalue()
        schemaless_writer(body, "bytes", raw)  # each datum framed as Avro bytes
    headers = {"content-type": "application/avro", "x-schema-fp": source.current.fingerprint}
    reply = http.post("/v1/sources/payments/events", content=body.getvalue(), headers=headers)
    assert reply.status_code == 200, reply.text
    assert reply.json()["accepted"] == 2
    event = schemaless_reader(io.BytesIO(sink.records[1][1]), wire, None)
    assert event["payment_id"] == "p1"  # type: ignore[index, call-overload]
    bad = http.post(
        "/v1/sources/payments/events", content=b"\x04ab", headers={**headers, "x-schema-fp": "0" * 16}
    )
    assert bad.status_code == 400
    assert "no schema version" in bad.json()["detail"]


def test_rest_refusals(client: tuple[TestClient, MemorySink]) -> None:
    http, _ = client
    json_type = {"content-type": "application/json"}
    csv_type = {"content-type": "text/csv"}
    cases = [
        (http.post("/v1/sources/nope/events", json=[]), 404, "not in the applied plan"),
        (http.post("/v1/sources/payments/events", content=b"{", headers=json_type), 400,
         "not JSON"),
        (http.post("/v1/sources/payments/events", json={"a": 1}), 400, "expected a JSON array"),
        (http.post("/v1/sources/payments/events", content=b"x", headers=csv_type), 415, "text/csv"),
        (http.post("/v1/sources/payments/events", content=b"[" + b"1," * 40_000 + b"1]"), 413, "over 65,536"),
        (http.post("/v1/sources/payments/events", json=[payment(i) for i in range(101)]), 413, "at most 100"),
    ]  # fmt: skip
    for reply, status, text in cases:
        assert reply.status_code == status, reply.text
        assert text in reply.json()["detail"]


def test_rest_429_has_retry_after(sources: dict[str, PlanSource]) -> None:
    http = TestClient(ingest_app(service(sources, MemorySink(room=0), retry_after_s=3.0)))
    reply = http.post("/v1/sources/payments/events", json=[payment(1)])
    assert reply.status_code == 429
    assert reply.headers["retry-after"] == "3"
    assert "buffer is full" in reply.json()["detail"]


def test_feast_push(client: tuple[TestClient, MemorySink]) -> None:
    http, sink = client
    rows = [payment(1), payment(2)]
    frame = {k: [r[k] for r in rows] for k in rows[0]}
    reply = http.post("/push", json={"push_source_name": "pp", "df": frame, "to": "online"})
    assert reply.status_code == 200, reply.text
    assert reply.json()["source"] == "payments"
    assert [r[2] for r in sink.records] == [b"a1", b"a2"]
    uneven = http.post("/push", json={"push_source_name": "pp", "df": {"a": [1], "b": []}})
    assert uneven.status_code == 400
    assert "different lengths" in uneven.json()["detail"]


def test_describe(client: tuple[TestClient, MemorySink], sources: dict[str, PlanSource]) -> None:
    http, _ = client
    body = http.get("/v1/sources/payments").json()
    assert body["fingerprint"] == sources["payments"].current.fingerprint
    assert (body["key"], body["event_id"]) == ("account_id", "payment_id")
    assert http.get("/health").json()["status"] == "ok"


def test_a_newly_applied_plan_is_read(sources: dict[str, PlanSource]) -> None:
    sink = MemorySink()
    moved = {**sources, "payments": sources["payments"].model_copy(update={"topic": "payments-v2"})}
    plans = iter([None, moved])
    svc = service(sources, sink, reload=lambda: next(plans, None), reload_s=0.0)
    svc.accept("payments", [payment(1)])  # the reload said: unchanged
    svc.accept("payments", [payment(2)])  # the new plan: its topic, and a new checker for it
    assert [r[0] for r in sink.records] == ["payments", "payments-v2"]
