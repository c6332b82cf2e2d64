"""Recording requests to rotating JSON Lines and reading them back (any bytes: records or a diagnostic)."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from headwater.ranking.synthetic import small_registry
from headwater.serving.app import create_app
from headwater.serving.config import ServingConfig
from headwater.serving.recording import (
    RECORD_VERSION,
    Recorded,
    Recorder,
    RecordFileError,
    RecordingConfig,
    read_records,
)
from headwater.serving.replay import Outcome, summarise
from headwater.serving.runtime import LoadedModels
from headwater.serving.store import InMemoryFeatureStore, now_ms

REGISTRY = small_registry({"u": ["a"]}, {"i": ["x"]}, "i.x")


def answer(items: list[str]) -> dict[str, Any]:
    return {
        "items": [{"item_id": i, "score": 1.0} for i in items],
        "model_version": None,
        "fallback": "popularity",
    }


def wait_for(recorder: Recorder, count: int) -> None:
    deadline = time.monotonic() + 5
    while recorder.counters.recorded < count and time.monotonic() < deadline:
        time.sleep(0.01)


def test_recorded_lines_read_back_in_arrival_order(tmp_path: Path) -> None:
    path = tmp_path / "rec" / "requests.jsonl"
    recorder = Recorder(RecordingConfig(enabled=True, sample_rate=1.0), path)
    recorder.start_thread()
    recorder.offer(2_000, {"user_id": "u2", "candidates": ["a", "b"], "k": 1}, 200, 3.5, answer(["b"]))
    recorder.offer(1_000, {"user_id": "u1", "candidates": ["a", "b"], "k": 2}, 200, 1.25, answer(["a", "b"]))
    recorder.stop_thread()
    records = read_records([path])
    assert [(r.at_ms, r.request["user_id"], r.items, r.fallback) for r in records] == [
        (1_000, "u1", ["a", "b"], "popularity (unknown)"),
        (2_000, "u2", ["b"], "popularity (unknown)"),
    ]
    assert records[0].source == f"{path}:2"
    assert json.loads(path.read_text().splitlines()[0])["v"] == RECORD_VERSION


class FakeProducer:
    def __init__(self, fail_first: int = 0) -> None:
        self.sent: list[tuple[str, bytes, bytes]] = []
        self.fail_first = fail_first

    def send(self, topic: str, *, value: bytes, key: bytes) -> None:
        from kafka.errors import KafkaTimeoutError

        if self.fail_first:
            self.fail_first -= 1
            raise KafkaTimeoutError("no broker")
        self.sent.append((topic, value, key))

    def flush(self, timeout: float | None = None) -> None:
        return None

    def close(self, timeout: float | None = None) -> None:
        return None


def test_records_go_to_the_topic_as_well_or_only(tmp_path: Path) -> None:
    producer = FakeProducer()
    path = tmp_path / "both.jsonl"
    config = RecordingConfig(enabled=True, sample_rate=1.0, topic="rec")
    recorder = Recorder(config, path, connect=lambda: producer)
    recorder.start_thread()
    recorder.offer(1_000, {"user_id": "u1", "candidates": ["a"], "k": 1}, 200, 1.0, answer(["a"]))
    recorder.stop_thread()
    ((topic, value, key),) = producer.sent
    assert (topic, key) == ("rec", b"u1")
    assert value + b"\n" == path.read_bytes()  # the same record in both places
    assert recorder.counters.recorded == 1

    only = RecordingConfig(enabled=True, sample_rate=1.0, topic="rec", file=False)
    flaky = FakeProducer(fail_first=1)
    recorder = Recorder(only, tmp_path / "never.jsonl", connect=lambda: flaky)
    recorder.start_thread()
    for n in range(3):
        recorder.offer(n, {"user_id": f"u{n}", "candidates": ["a"], "k": 1}, 200, 1.0, answer(["a"]))
    recorder.stop_thread()
    assert not (tmp_path / "never.jsonl").exists()
    assert [k for _, _, k in flaky.sent] == [b"u1", b"u2"]  # the first send failed: counted, not retried
    assert (recorder.counters.recorded, recorder.counters.failed) == (2, 1)
    with pytest.raises(ValueError, match="file: false needs a topic"):
        RecordingConfig(enabled=True, file=False)


def test_rotation_bounds_the_disk_and_keeps_whole_lines(tmp_path: Path) -> None:
    path = tmp_path / "requests.jsonl"
    config = RecordingConfig(enabled=True, sample_rate=1.0, max_bytes=4096, max_files=2)
    recorder = Recorder(config, path)
    recorder.start_thread()
    for n in range(200):
        recorder.offer(
            n, {"user_id": f"u{n}", "candidates": ["i1", "i2"], "k": 2}, 200, 1.0, answer(["i1", "i2"])
        )
    recorder.stop_thread()
    files = sorted(tmp_path.iterdir())
    assert [f.name for f in files] == ["requests.jsonl", "requests.jsonl.1", "requests.jsonl.2"]
    assert all(f.stat().st_size <= 4096 for f in files)
    assert recorder.counters.recorded == 200
    assert recorder.counters.rotations >= 3
    kept = read_records(files)
    ats = [r.at_ms for r in kept]
    assert ats == list(range(200 - len(ats), 200))  # the newest lines, none cut


def test_sampling_follows_the_rate() -> None:
    recorder = Recorder(RecordingConfig(sample_rate=0.1), Path("unused"), seed=7)
    hits = sum(recorder.sampled() for _ in range(20_000))
    assert 1_800 < hits < 2_200
    assert not Recorder(RecordingConfig(sample_rate=0.0), Path("unused")).sampled()


def test_the_service_records_a_sample_with_the_answer(tmp_path: Path) -> None:
    store = InMemoryFeatureStore()
    store.write(REGISTRY.item.layouts[0], ["i1", "i2"], np.array([[1.0], [5.0]], np.float32), now_ms())
    path = tmp_path / "requests.jsonl"
    recorder = Recorder(RecordingConfig(enabled=True, sample_rate=1.0), path)
    app = create_app(
        ServingConfig(), REGISTRY, store, LoadedModels(None, None, None, None, "cpu"), recorder=recorder
    )
    body = {"user_id": "u1", "candidates": ["i1", "i2"], "k": 2, "session_id": "s1"}
    with TestClient(app) as c:
        before = now_ms()
        got = c.post("/v1/rank", json=body).json()
        c.post("/v1/rank", json={"user_id": "u1", "candidates": ["x"], "k": 5})  # invalid: not recorded
        c.post("/v1/rank", json={**body, "log_impressions": False})  # a replay's: not recorded
        metrics = c.get("/metrics").text
    (record,) = read_records([path])
    assert record.request == body  # only the fields the client set
    assert record.items == ["i2", "i1"] == [x["item_id"] for x in got["items"]]
    assert record.fallback == "popularity (missing_user_features)"
    assert before <= record.at_ms <= now_ms()
    assert 'headwater_recorded_requests{result="recorded"}' in metrics


# --- the reader: whatever a user points it at ------------------------------------------------------

LINE = re.compile(r"requests\.jsonl(:\d+|, line \d+)")


def read(path: Path) -> tuple[list[Recorded], str | None]:
    """Return the records, or none and the diagnostic (never another exception)."""
    try:
        return read_records([path]), None
    except RecordFileError as exc:
        return [], str(exc)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=2_000))
def test_any_bytes_read_as_records_or_a_diagnostic_naming_file_and_line(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "requests.jsonl"
    path.write_bytes(data)
    records, problem = read(path)
    if problem is not None:
        assert LINE.search(problem), problem
        return
    assert all(isinstance(r.request, dict) for r in records)


GOOD = {"v": 1, "at_ms": 5, "request": {"user_id": "u"}, "status": 200, "answer": {"items": ["a"]}}
values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.sampled_from(sorted(GOOD)), values, st.integers(0, 3))
def test_records_with_any_field_value_read_or_name_their_line(
    tmp_path: Path, field: str, value: Any, blank_lines: int
) -> None:
    path = tmp_path / "requests.jsonl"
    bad = {**GOOD, field: value}
    path.write_text(json.dumps(GOOD) + "\n" + "\n" * blank_lines + json.dumps(bad) + "\n")
    records, problem = read(path)
    if problem is not None:
        assert f"requests.jsonl:{2 + blank_lines}: " in problem, problem
        return
    assert len(records) == 2


def test_reader_diagnostics_say_what_is_wrong(tmp_path: Path) -> None:
    path = tmp_path / "requests.jsonl"
    path.write_bytes(json.dumps(GOOD).encode() + b'\n{"v": 1, "at_ms": 3, "request"')
    with pytest.raises(
        RecordFileError, match=r"requests\.jsonl:2: not a JSON line .*cut while being written"
    ):
        read_records([path])
    path.write_bytes(b"\xff\xfe\n")
    with pytest.raises(RecordFileError, match=r"requests\.jsonl:1: not UTF-8 text"):
        read_records([path])
    with pytest.raises(RecordFileError, match=r"missing\.jsonl: cannot be read"):
        read_records([tmp_path / "missing.jsonl"])


def test_summary_counts_changes_errors_and_fallbacks(tmp_path: Path) -> None:
    path = tmp_path / "requests.jsonl"
    lines = [
        {**GOOD, "at_ms": 0, "answer": {"items": ["a", "b"]}},
        {**GOOD, "at_ms": 1_000, "answer": {"items": ["a", "b"]}},
        {
            **GOOD,
            "at_ms": 2_000,
            "answer": {"items": ["a", "b"], "fallback": "linear", "fallback_reason": "deadline"},
        },
        {**GOOD, "at_ms": 3_000, "answer": None},
    ]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    records = read_records([path])
    outcomes = [
        Outcome(1.0, 200, None, None, False, 0.0),
        Outcome(2.0, 200, None, "popularity (store_error)", True, 0.0),
        Outcome(3.0, 503, "http_503", None, None, 40.0),
        Outcome(4.0, 200, None, None, None, 0.0),
    ]
    report = summarise(records, outcomes, "http://x", 2.0, 1.5)
    assert (report.compared, report.changed, report.changed_share) == (2, 1, 0.5)
    assert report.errors == {"http_503": 1}
    assert report.fallbacks == {"none": 2, "popularity (store_error)": 1}
    assert report.recorded_fallbacks == {"none": 2, "linear (deadline)": 1}
    assert report.recorded_span_s == 3.0
    assert report.latency_ms["p50"] == 2.0
    assert (report.behind_schedule, report.max_behind_ms) == (1, 40.0)  # over the 10 ms tolerance
    assert report.recorded_server_latency_ms["p50"] is None  # GOOD has no latency_ms
