"""Hostile bodies to the push API: a 4xx with a reason (or 200 when every event is good), never a 5xx."""

from __future__ import annotations

import io
from typing import Any

import orjson
from fastapi.testclient import TestClient
from fastavro import schemaless_writer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from headwater.pipelines.events.sources import example_sources
from headwater.serving.ingest.core import IngestService
from headwater.serving.ingest.rest import ingest_app
from headwater.serving.ingest.sink import MemorySink

SOURCES = {s.name: s for s in example_sources()}
PAYMENTS = SOURCES["payments"]
FP = PAYMENTS.current.fingerprint
HTTP = TestClient(
    ingest_app(IngestService(SOURCES, MemorySink(), max_batch=50), max_body_bytes=32 * 1024, feast_sources={})
)
FIELDS = [f.name for f in PAYMENTS.fields]
CONTENT_TYPES = [
    "application/json",
    "application/x-ndjson",
    "application/avro",
    "application/json; charset=latin-1",
    "text/plain",
    "",
    "multipart/form-data; boundary=x",
]
NAMES = st.sampled_from(["payments", "events", "nope", "p%00", "..", "a" * 300])

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False),
    st.text(max_size=40),
)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)
rows = st.dictionaries(st.sampled_from([*FIELDS, "extra"]), scalars | json_values, max_size=len(FIELDS) + 1)


def _dumps(value: Any) -> bytes:
    try:
        return orjson.dumps(value)
    except TypeError:  # an integer orjson cannot write: send it as Python writes it
        return repr(value).encode()


def check(reply: Any) -> None:
    """The property: no 5xx; a 4xx says why; a 2xx (only 200) accepted every event."""
    assert reply.status_code < 500, reply.text
    body = reply.json()
    if reply.status_code == 200:
        assert body["rejected"] == body["failed"] == 0
        return
    assert 400 <= reply.status_code < 500
    if "results" in body:
        bad = [r for r in body["results"] if r["status"] != "accepted"]
        assert bad
        assert all(r["reason"] for r in bad)
    else:
        assert body["detail"]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=NAMES, body=st.binary(max_size=2048), content_type=st.sampled_from(CONTENT_TYPES))
def test_any_bytes(name: str, body: bytes, content_type: str) -> None:
    headers = {"content-type": content_type, "x-schema-fp": FP}
    check(HTTP.post(f"/v1/sources/{name}/events", content=body, headers=headers))


@settings(max_examples=150, deadline=None)
@given(value=json_values)
def test_any_json(value: Any) -> None:
    check(HTTP.post("/v1/sources/payments/events", content=_dumps(value)))
    check(HTTP.post("/push", content=_dumps(value)))


@settings(max_examples=150, deadline=None)
@given(batch=st.lists(rows, max_size=8), lines=st.booleans())
def test_rows_near_the_schema(batch: list[dict[str, Any]], lines: bool) -> None:
    if lines:
        content = b"\n".join(_dumps(r) for r in batch)
        check(
            HTTP.post(
                "/v1/sources/payments/events",
                content=content,
                headers={"content-type": "application/x-ndjson"},
            )
        )
    else:
        check(HTTP.post("/v1/sources/payments/events", content=_dumps(batch)))
    frame = {k: [r.get(k) for r in batch] for k in FIELDS}
    check(HTTP.post("/push", content=_dumps({"push_source_name": "payments", "df": frame})))


@settings(max_examples=100, deadline=None)
@given(chunks=st.lists(st.binary(max_size=64), max_size=6), fp=st.sampled_from([FP, "", "zz", FP.upper()]))
def test_avro_framing(chunks: list[bytes], fp: str) -> None:
    framed = io.BytesIO()
    for chunk in chunks:  # well framed Avro bytes of arbitrary content: every datum reaches the codec
        schemaless_writer(framed, "bytes", chunk)
    body = framed.getvalue()
    headers = {"content-type": "application/avro", "x-schema-fp": fp}
    check(HTTP.post("/v1/sources/payments/events", content=body, headers=headers))
