"""Unit tests of the realtime tier's pure parts: the SQL half, the JVM program, decode batches."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from headwater.pipelines.events.codec import EventCodec
from headwater.pipelines.realtime.decode import decode_batch
from headwater.pipelines.realtime.program import RealtimeProgram, StoreTarget, compile_program
from headwater.pipelines.realtime.sql import JobOptions, RealtimePlanError, check_plan, compile_job, interval
from headwater.pipelines.store.store import WRITE_SCRIPT
from headwater.pipelines.windows import compile_view, layout_version, slot_names, view_layout
from headwater.registry.plans import TierPlan, read_plan

ROOT = Path(__file__).resolve().parents[4]


@pytest.fixture(scope="module")
def plan(tmp_path_factory: pytest.TempPathFactory) -> TierPlan:
    import subprocess
    import sys

    base = tmp_path_factory.mktemp("plan")
    state = base / "state"
    exe = str(Path(sys.executable).parent / "headwater")
    done = subprocess.run([exe, "apply", str(ROOT / "features"), "--state-dir", str(state), "--no-feast"],
                          capture_output=True, text=True, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return read_plan(state, "realtime")


def program_of(plan: TierPlan) -> RealtimeProgram:
    return compile_program(plan, check_plan(plan), StoreTarget("redis://127.0.0.1:6379/0", namespace="hwx"))


def job_of(plan: TierPlan, options: JobOptions) -> str:
    return "\n".join(compile_job(plan, options, program_of(plan)).ddl)


def test_interval_literal() -> None:
    assert interval(300_000) == "INTERVAL '0 00:05:00.000' DAY TO SECOND(3)"
    assert interval(90_061_001) == "INTERVAL '1 01:01:01.001' DAY TO SECOND(3)"


def test_the_routed_view_carries_one_column_per_distinct_filter(plan: TierPlan) -> None:
    program = program_of(plan)
    text = job_of(plan, JobOptions("k:9092", "dlq"))
    assert "WATERMARK FOR `rt` AS `rt` - INTERVAL '0 00:00:05.000' DAY TO SECOND(3)" in text
    hits = [c for c in program.columns if c.sql_type == "BOOLEAN"]
    sqls = [c.sql for c in hits]
    assert len(sqls) == len(set(sqls))  # a filter shared by features is evaluated once
    assert "COALESCE((`event_type` = 'click' AND `category` IS NOT NULL), FALSE)" in sqls
    for c in program.columns:
        assert f"{c.sql} AS `{c.name}`" in text
    # rejected records keep their raw bytes for the dead-letter topic; good ones travel without
    assert "CASE WHEN reason IS NOT NULL THEN `value` END AS `value`" in text


def test_program_groups_views_by_join_key_and_slide_and_lays_out_their_slots(plan: TierPlan) -> None:
    data = program_of(plan).data
    assert [g["id"] for g in data["groups"]] == ["item_id@5000", "user_id@1000"]
    assert data["version"] == layout_version(plan.registry_hash)
    assert data["namespace"] == "hwx"
    assert data["store"]["write_script"] == WRITE_SCRIPT  # the JVM writes through the same Lua
    columns = data["columns"]
    for group in data["groups"]:
        assert columns[group["key_column"]] == group["id"].split("@")[0]
        for v in group["views"]:
            spec = compile_view(next(p for p in plan.views if p.name == v["name"]))
            layout = view_layout(spec, plan.registry_hash)
            assert (v["dim"], v["schema_hash"], v["ttl_ms"]) == (
                layout.dim,
                layout.schema_hash,
                layout.ttl_ms,
            )
            assert v["dim"] == len(slot_names(spec))
    session = next(v for g in data["groups"] for v in g["views"] if v["name"] == "user_session_realtime")
    share = next(f for f in session["features"] if f["name"] == "category_share_30s")
    assert (share["agg"], share["k"], share["dict_field"]) == ("top_k", 5, "category")
    assert columns[share["field"]] == "category"
    assert data["column_types"][share["hit"]] == "BOOLEAN"
    ctr = next(f for f in session["features"] if f["name"] == "ctr_5m")
    clicks = next(f for f in session["features"] if f["name"] == "clicks_5m")
    assert ctr["numerator"]["hit"] == clicks["hit"]  # the same filter, the same column
    dwell = next(v for g in data["groups"] for v in g["views"] if v["name"] == "user_dwell_realtime")
    last = next(f for f in dwell["features"] if f["agg"] == "last")
    assert last["dict_field"] == "item_id"  # a text value is stored as its dictionary id
    json.loads(program_of(plan).text)  # the JVM reads it as JSON


def test_a_numeric_aggregation_over_a_text_field_is_rejected_with_the_view(plan: TierPlan) -> None:
    view = next(v for v in plan.views if v.name == "user_dwell_realtime")
    bad = [f.model_copy(update={"field": "category"}) if f.agg == "avg" else f for f in view.features]
    broken = plan.model_copy(update={"views": [view.model_copy(update={"features": bad})]})
    with pytest.raises(RealtimePlanError, match=r"user_dwell_realtime.*avg needs a numeric field"):
        program_of(broken)


def test_java_decode_gets_the_schema_and_fingerprint_as_literals(plan: TierPlan) -> None:
    codec = EventCodec()
    java = job_of(plan, JobOptions("k:9092", "dlq", max_future_ms=1234))
    assert f"'{codec.fingerprint}', CAST(1234 AS BIGINT), '{{" in java
    assert '"name":"BehaviorEvent"' in java
    python = job_of(plan, JobOptions("k:9092", "dlq", decode="python"))
    assert "hw_decode(`value`, `headers`['schema-fp'], `headers`['produce-ts'])," in python
    with pytest.raises(RealtimePlanError, match="'java' or 'python'"):
        job_of(plan, JobOptions("k:9092", "dlq", decode="rust"))


def test_a_view_with_two_slides_is_rejected_with_its_name(plan: TierPlan) -> None:
    view = plan.views[0]
    first = view.features[0].model_copy(update={"slide_s": 2.0})
    broken = plan.model_copy(
        update={"views": [view.model_copy(update={"features": [first, *view.features[1:]]})]}
    )
    with pytest.raises(RealtimePlanError, match=view.name):
        check_plan(broken)


def test_decode_batch_keeps_bad_records_with_a_reason() -> None:
    codec = EventCodec()
    good = {"event_id": "e1", "user_id": "u1", "item_id": "i1", "event_type": "click",
            "event_time": 1_767_225_600_000, "session_id": "s", "category": None, "price": None,
            "dwell_ms": None, "query": None, "position": 2, "device": "ios"}  # fmt: skip
    future = {**good, "event_id": "e2", "event_time": 1_767_225_600_000 + 3_600_000}
    fp = dict(codec.headers())
    batch = decode_batch(codec, [codec.encode(good), b"\x01", codec.encode(future)], [fp, fp, fp],
                         max_future_ms=60_000, now_ms=1_767_225_600_000)  # fmt: skip
    assert batch.columns["reason"] == [None, "corrupt_payload", "future_dated"]
    assert batch.columns["event_time"] == [1_767_225_600_000, 0, 0]
    assert batch.columns["position"][0] == 2


def test_late_means_behind_the_watermark_by_more_than_the_allowed_lateness(plan: TierPlan) -> None:
    job = compile_job(plan, JobOptions(kafka_bootstrap="k:9092", dlq_topic="dlq"), program_of(plan))
    routed = job.ddl[-1]
    assert f"CASE WHEN rt < CURRENT_WATERMARK(rt) - {interval(60_000)} THEN 'late' END" in routed
    assert "by more than the allowed lateness (60 s)" in routed
    assert job.inserts == [
        "INSERT INTO hw_dlq SELECT `k`, `value`, "
        "hw_dlq_headers(`headers`, reason, detail, `partition`, `offset`, 'events') FROM hw_dlq_rows"
    ]
    assert job.reason_column == len(program_of(plan).columns)  # the JVM routes on it
