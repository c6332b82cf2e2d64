"""Unit tests of the realtime tier's pure parts: the SQL half (per source), the JVM programs, CLI options."""

from __future__ import annotations

import json
from pathlib import Path

import click
import pytest

from headwater.cli.realtime import _topic_overrides
from headwater.pipelines.events.codec import MAX_EVENT_BYTES, MAX_STRING_CHARS
from headwater.pipelines.realtime.decode import decoder_config, event_columns, id_fields
from headwater.pipelines.realtime.program import RealtimeProgram, StoreTarget, compile_program
from headwater.pipelines.realtime.sql import (
    CompiledJob,
    JobOptions,
    RealtimePlanError,
    check_plan,
    compile_job,
    interval,
    rule_checks,
)
from headwater.pipelines.store.store import WRITE_SCRIPT
from headwater.pipelines.windows import compile_view, slot_names, view_layout
from headwater.registry.plans import PlanSource, TierPlan, read_plan

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


def source(plan: TierPlan, name: str) -> PlanSource:
    return next(s for s in plan.sources if s.name == name)


def program_of(plan: TierPlan, name: str = "events") -> RealtimeProgram:
    store = StoreTarget("redis://127.0.0.1:6379/0", namespace="hwx")
    return compile_program(plan, source(plan, name), store)


def job_of(plan: TierPlan, options: JobOptions) -> CompiledJob:
    return compile_job(plan, options, [program_of(plan, s.name) for s in check_plan(plan, options.sources)])


def ddl_of(plan: TierPlan, options: JobOptions) -> str:
    return "\n".join(job_of(plan, options).ddl)


def test_interval_literal() -> None:
    assert interval(300_000) == "INTERVAL '0 00:05:00.000' DAY TO SECOND(3)"
    assert interval(90_061_001) == "INTERVAL '1 01:01:01.001' DAY TO SECOND(3)"


def test_one_job_has_a_pipeline_per_source_with_its_own_topic_decode_and_watermark(plan: TierPlan) -> None:
    job = job_of(plan, JobOptions("k:9092", "dlq", topics={"payments": "pay.test"}))
    assert [p.source for p in job.pipelines] == ["events", "payments"]
    assert [p.topic for p in job.pipelines] == ["events", "pay.test"]
    text = "\n".join(job.ddl)
    # each source's own out-of-orderness (5 s and 2 s), decode function and topic
    assert "WATERMARK FOR `hw_rt` AS `hw_rt` - INTERVAL '0 00:00:05.000' DAY TO SECOND(3)" in text
    assert "WATERMARK FOR `hw_rt` AS `hw_rt` - INTERVAL '0 00:00:02.000' DAY TO SECOND(3)" in text
    assert "`hw_ev` AS hw_decode_1(`hw_value`" in text
    assert "'topic' = 'pay.test'" in text
    assert [f.name for f in job.functions] == [
        "hw_decode_0",
        "hw_event_time_0",
        "hw_decode_1",
        "hw_event_time_1",
    ]
    assert job.functions[2].config == decoder_config(source(plan, "payments"))
    assert len(job.inserts) == 2
    assert "'pay.test') FROM hw_dlq_rows_1" in job.inserts[1]
    only = job_of(plan, JobOptions("k:9092", "dlq", sources=("payments",)))
    assert [p.source for p in only.pipelines] == ["payments"]


def test_the_routed_view_carries_one_column_per_distinct_filter(plan: TierPlan) -> None:
    program = program_of(plan)
    text = ddl_of(plan, JobOptions("k:9092", "dlq", sources=("events",)))
    hits = [c for c in program.columns if c.sql_type == "BOOLEAN"]
    sqls = [c.sql for c in hits]
    assert len(sqls) == len(set(sqls))  # a filter shared by features is evaluated once
    assert "COALESCE((`event_type` = 'click' AND `category` IS NOT NULL), FALSE)" in sqls
    for c in program.columns:
        assert f"{c.sql} AS `{c.name}`" in text
    # every record keeps its raw bytes for the dead-letter topic: the JVM's LateCheck drops them from the
    # good ones, after its late verdict
    tail = "`hw_reason`, `hw_detail`, `hw_k`, `hw_value`, `hw_headers`, `hw_partition`, `hw_offset` FROM"
    assert tail in text


def test_the_decode_config_and_columns_come_from_the_plan_source(plan: TierPlan) -> None:
    pay = source(plan, "payments")
    config = json.loads(decoder_config(pay))
    assert (config["time_unit"], config["event_time"]) == ("us", "occurred_at")
    assert [s["fingerprint"] for s in config["schemas"]] == [s.fingerprint for s in pay.schemas]
    assert config["id_fields"] == ["account_id", "payment_id"] == id_fields(pay)
    assert (config["max_future_ms"], config["min_event_time_ms"]) == (
        pay.max_future_ms,
        pay.min_event_time_ms,
    )
    # the codec's size bounds travel with the config (one definition, in codec.py)
    assert (config["max_event_bytes"], config["max_string_chars"]) == (MAX_EVENT_BYTES, MAX_STRING_CHARS)
    small = json.loads(decoder_config(pay, max_event_bytes=300, max_string_chars=20))
    assert (small["max_event_bytes"], small["max_string_chars"]) == (300, 20)
    cols = dict(event_columns(pay))
    assert (cols["status"], cols["amount"], cols["risk_score"], cols["occurred_at"]) == (
        "STRING", "DOUBLE", "DOUBLE", "BIGINT",
    )  # fmt: skip


def test_program_groups_views_by_join_key_and_slide_and_lays_out_their_slots(plan: TierPlan) -> None:
    data = program_of(plan).data
    assert data["source"] == "events"
    assert [g["id"] for g in data["groups"]] == ["item_id@5000", "user_id@1000"]
    assert "version" not in data  # each view carries its own (below)
    assert data["namespace"] == "hwx"
    assert data["store"]["write_script"] == WRITE_SCRIPT  # the JVM writes through the same Lua
    columns = data["columns"]
    assert (columns[data["event_id_column"]], columns[data["event_time_column"]]) == (
        "hw_event_id",
        "hw_time_ms",
    )
    assert data["out_of_orderness_ms"] == source(plan, "events").max_out_of_orderness_ms
    for group in data["groups"]:
        assert columns[group["key_column"]] == group["id"].split("@")[0]
        for v in group["views"]:
            spec = compile_view(next(p for p in plan.views if p.name == v["name"]))
            layout = view_layout(spec)
            assert (v["dim"], v["schema_hash"], v["ttl_ms"], v["version"]) == (
                layout.dim,
                layout.schema_hash,
                layout.ttl_ms,
                spec.version,
            )
            assert v["version"].startswith("v")
            assert len(v["version"]) == 17
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


def test_the_payments_program_reads_its_own_key_id_and_fields(plan: TierPlan) -> None:
    program = program_of(plan, "payments")
    data = program.data
    assert [g["id"] for g in data["groups"]] == ["account_id@1000"]
    assert [v["name"] for v in data["groups"][0]["views"]] == ["account_payments_realtime"]
    assert [c.sql for c in program.columns[:2]] == ["`payment_id`", "`hw_time_ms`"]
    assert data["columns"][data["groups"][0]["key_column"]] == "account_id"
    nobody = source(plan, "payments").model_copy(update={"event_id": None})
    bare = compile_program(plan, nobody, StoreTarget("redis://x"))
    assert bare.data["event_id_column"] == -1  # no event id: nothing is de-duplicated
    assert bare.columns[0].name == "hw_time_ms"


def test_a_numeric_aggregation_over_a_text_field_is_rejected_with_the_view(plan: TierPlan) -> None:
    view = next(v for v in plan.views if v.name == "user_dwell_realtime")
    bad = [f.model_copy(update={"field": "category"}) if f.agg == "avg" else f for f in view.features]
    broken = plan.model_copy(update={"views": [view.model_copy(update={"features": bad})]})
    with pytest.raises(RealtimePlanError, match=r"user_dwell_realtime.*avg needs a numeric field"):
        program_of(broken)


def test_a_field_of_another_source_is_rejected_with_the_view(plan: TierPlan) -> None:
    view = next(v for v in plan.views if v.name == "account_payments_realtime")
    bad = [f.model_copy(update={"field": "price"}) if f.agg == "sum" else f for f in view.features]
    broken = plan.model_copy(update={"views": [view.model_copy(update={"features": bad})]})
    with pytest.raises(
        RealtimePlanError, match=r"account_payments_realtime.*'price' is not a field of source"
    ):
        program_of(broken, "payments")


def test_check_plan_names_what_cannot_run(plan: TierPlan) -> None:
    view = plan.views[0]
    first = view.features[0].model_copy(update={"slide_s": 2.0})
    broken = plan.model_copy(
        update={"views": [view.model_copy(update={"features": [first, *view.features[1:]]})]}
    )
    with pytest.raises(RealtimePlanError, match=view.name):
        check_plan(broken)
    with pytest.raises(
        RealtimePlanError, match=r"--source nope: no realtime view reads it.*events, payments"
    ):
        check_plan(plan, ["nope"])
    pay = source(plan, "payments")
    odd = pay.model_copy(update={"fields": [*pay.fields, pay.fields[0].model_copy(update={"name": "hw_x"})]})
    clash = plan.model_copy(update={"sources": [odd if s.name == "payments" else s for s in plan.sources]})
    with pytest.raises(RealtimePlanError, match=r"source 'payments': field\(s\) hw_x start with 'hw_'"):
        check_plan(clash)
    assert [s.name for s in check_plan(clash, ["events"])] == ["events"]  # only the sources that run


def test_rules_are_rejected_when_false_in_order_with_the_python_detail(plan: TierPlan) -> None:
    pay = source(plan, "payments")
    checks = rule_checks(pay)
    assert checks[0] == (
        "hw_is_false(`amount` >= 0)",
        "rule 'amount >= 0' of source 'payments' does not hold",
    )
    routed = ddl_of(plan, JobOptions("k:9092", "dlq", sources=("payments",)))
    order = [routed.index(x) for x in ("`hw_decode_reason` IS NOT NULL THEN `hw_decode_reason`",
                                       "'invalid_field'", "'future_dated'")]  # fmt: skip
    assert order == sorted(order)  # decode, rules, future-dated (then late, in the JVM): the Python order


def test_late_is_the_jvms_per_partition_verdict_not_the_watermarks(plan: TierPlan) -> None:
    """The SQL decides no ``late`` (issue 16): ``LateCheck`` does, per partition, from the program."""
    job = job_of(plan, JobOptions(kafka_bootstrap="k:9092", dlq_topic="dlq"))
    for n, name in enumerate(("events", "payments")):
        routed = job.ddl[2 + 2 * n]
        assert "CURRENT_WATERMARK" not in routed
        assert "'late'" not in routed
        # every row keeps its raw record: the JVM may still dead-letter it as late
        assert "`hw_k`, `hw_value`, `hw_headers`, `hw_partition`, `hw_offset` FROM (" in routed
        data = json.loads(program_of(plan, name).text)
        src = source(plan, name)
        assert data["allowed_lateness_ms"] == src.allowed_lateness_ms
        assert data["event_time_field"] == src.event_time
    assert source(plan, "events").allowed_lateness_ms == 60_000
    assert source(plan, "payments").allowed_lateness_ms == 30_000


def test_topic_overrides_name_their_source() -> None:
    assert _topic_overrides(("t1",), ["events"]) == {"events": "t1"}
    assert _topic_overrides(("payments=p", "events=e"), ["events", "payments"]) == {
        "payments": "p",
        "events": "e",
    }
    with pytest.raises(click.UsageError, match="2 sources run"):
        _topic_overrides(("t1",), ["events", "payments"])
    with pytest.raises(click.UsageError, match="one of the sources this job runs"):
        _topic_overrides(("other=t",), ["events"])


def test_dead_letter_sink_is_exactly_once_with_a_prefix_per_job_kept_across_restarts(plan: TierPlan) -> None:
    dlq = job_of(plan, JobOptions("k:9092", "t.dlq", group_id="g1")).ddl[0]
    assert "'sink.delivery-guarantee' = 'exactly-once'" in dlq
    assert "'sink.transactional-id-prefix' = 'hw-dlq.g1.t.dlq'" in dlq
    # below the broker's transaction.max.timeout.ms (15 min by default), or the job fails at start
    assert "'properties.transaction.timeout.ms' = '600000'" in dlq
    again = job_of(plan, JobOptions("k:9092", "t.dlq", group_id="g1", startup_mode="earliest-offset")).ddl[0]
    other = job_of(plan, JobOptions("k:9092", "t.dlq", group_id="g2")).ddl[0]
    assert again == dlq  # a restart (same command line) aborts its predecessor's open transactions
    assert "'hw-dlq.g2.t.dlq'" in other  # another job never fences this one's producers
