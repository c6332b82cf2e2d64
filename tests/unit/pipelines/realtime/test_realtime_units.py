"""Unit tests of the realtime tier's pure parts: SQL compile, decode batches, sink row conversion."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from headwater.pipelines.events.codec import EventCodec
from headwater.pipelines.realtime.decode import decode_batch
from headwater.pipelines.realtime.sink import ViewSink, parse_last
from headwater.pipelines.realtime.sql import JobOptions, RealtimePlanError, compile_job, interval
from headwater.pipelines.windows import compile_view, view_layout
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


def test_interval_literal() -> None:
    assert interval(300_000) == "INTERVAL '0 00:05:00.000' DAY TO SECOND(3)"
    assert interval(90_061_001) == "INTERVAL '1 01:01:01.001' DAY TO SECOND(3)"


def test_compile_makes_one_sink_per_view_and_uses_the_plan_filters(plan: TierPlan) -> None:
    job = compile_job(plan, JobOptions("k:9092", "dlq"))
    assert [v.view.name for v in job.views] == [v.name for v in plan.views]
    assert len(job.inserts) == 1 + len(plan.views)  # the DLQ and one sink per view
    text = "\n".join(job.ddl)
    assert "`event_type` = 'click' AND `category` IS NOT NULL" in text
    assert "WATERMARK FOR `rt` AS `rt` - INTERVAL '0 00:00:05.000' DAY TO SECOND(3)" in text
    session = next(v for v in job.views if v.view.name == "user_session_realtime")
    tops = [s.name for s in session.slots if s.role == "top"]
    assert len(tops) == 10  # two top_k features with k = 5


def test_each_view_passes_only_changed_rows_to_its_sink(plan: TierPlan) -> None:
    job = compile_job(plan, JobOptions("k:9092", "dlq"))
    session = next(v for v in job.views if v.view.name == "user_session_realtime")
    changed = next(d for d in job.ddl if d.startswith(f"CREATE TEMPORARY VIEW {session.merged_table} "))
    assert "OVER (PARTITION BY entity ORDER BY bt)" in changed
    assert changed.count("IS DISTINCT FROM") == len(session.slots)  # a row differing in any slot
    assert "WHERE p_b IS NULL OR" in changed  # an entity's first row is always written


def test_java_decode_gets_the_schema_and_fingerprint_as_literals(plan: TierPlan) -> None:
    codec = EventCodec()
    java = "\n".join(compile_job(plan, JobOptions("k:9092", "dlq", max_future_ms=1234)).ddl)
    assert f"'{codec.fingerprint}', CAST(1234 AS BIGINT), '{{" in java
    assert '"name":"BehaviorEvent"' in java
    python = "\n".join(compile_job(plan, JobOptions("k:9092", "dlq", decode="python")).ddl)
    assert "hw_decode(`value`, `headers`['schema-fp'], `headers`['produce-ts'])," in python
    with pytest.raises(RealtimePlanError, match="'java' or 'python'"):
        compile_job(plan, JobOptions("k:9092", "dlq", decode="rust"))


def test_a_view_with_two_slides_is_rejected_with_its_name(plan: TierPlan) -> None:
    view = plan.views[0]
    first = view.features[0].model_copy(update={"slide_s": 2.0})
    broken = plan.model_copy(
        update={"views": [view.model_copy(update={"features": [first, *view.features[1:]]})]}
    )
    with pytest.raises(RealtimePlanError, match=view.name):
        compile_job(broken, JobOptions("k:9092", "dlq"))


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


def test_parse_last() -> None:
    assert parse_last("1767225600000\x01e9\x01vi3", numeric=False) == "i3"
    assert parse_last("1767225600000\x01e9\x01v2.5", numeric=True) == 2.5
    assert math.isnan(parse_last("1767225600000\x01e9\x01n", numeric=False))  # type: ignore[arg-type]
    assert math.isnan(parse_last(None, numeric=True))  # type: ignore[arg-type]


class FakeDictionary:
    def ids(self, field: str, values: list[object]) -> list[int]:
        return [{"c1": 1, "c2": 2, "i1": 7}[str(v)] for v in values]


class FakeStore:
    def __init__(self) -> None:
        self.calls: list[tuple[list[str], np.ndarray, np.ndarray]] = []

    def write_batch(self, layout, entity_ids, values, event_time_ms, write_time_ms=None):  # type: ignore[no-untyped-def]
        self.calls.append((list(entity_ids), np.asarray(values), np.asarray(event_time_ms)))

    def close(self) -> None:
        pass


def test_sink_turns_merged_columns_into_vectors(plan: TierPlan) -> None:
    job = compile_job(plan, JobOptions("k:9092", "dlq"))
    session = next(v for v in job.views if v.view.name == "user_session_realtime")
    spec = compile_view(session.view)
    store = FakeStore()
    sink = ViewSink(spec, session.slots, view_layout(spec, plan.registry_hash), store, FakeDictionary())
    cols: dict[str, list[object]] = {s.name: [None] for s in session.slots}
    cols.update({"f0": [2.0], "f3": [None], "f4_top1": ["c2"], "f4_cnt1": [3], "f4_top2": ["c1"],
                 "f4_cnt2": [1], "f4_total": [4]})  # fmt: skip
    sink.write(["u1"], np.array([1_000], dtype=np.int64), cols)
    ids, values, times = store.calls[0]
    names = list(view_layout(spec, plan.registry_hash).features)
    row = dict(zip(names, values[0].tolist(), strict=True))
    assert ids == ["u1"]
    assert times.tolist() == [1_000]
    assert row["clicks_30s"] == 2.0
    assert row["clicks_5m"] == 0.0
    assert math.isnan(row["ctr_5m"])  # no impressions -> NaN
    assert (row["category_share_30s.top1"], row["category_share_30s.share1"]) == (2.0, 0.75)
    assert (row["category_share_30s.top2"], row["category_share_30s.share2"]) == (1.0, 0.25)
    assert math.isnan(row["category_share_30s.top3"])
    assert row["category_share_30s.share3"] == 0.0


def test_late_dead_letters_say_within_or_beyond_the_allowed_lateness(plan: TierPlan) -> None:
    from headwater.pipelines.realtime.udfs import DlqHeadersFn

    job = compile_job(plan, JobOptions(kafka_bootstrap="k:9092", dlq_topic="dlq"))
    dlq = job.inserts[0]
    assert "INSERT INTO hw_dlq" in dlq
    assert f"rt > CURRENT_WATERMARK(rt) - {interval(60_000)}" in dlq  # the example source: 1m
    assert "THEN ' but within' ELSE ' and beyond' END" in dlq

    given = "event_time A is at or behind the watermark W but within the allowed lateness"
    headers = DlqHeadersFn("events").eval({"schema-fp": b"x"}, "late", given, 3, 42, 60.0)
    detail = headers["dlq-detail"].decode()
    assert detail.startswith(
        "event_time A is at or behind the watermark W but within the allowed lateness (60 s);"
    )
    assert "drops every event behind its watermark, also within the allowed lateness" in detail
    assert headers["dlq-reason"] == b"late"
