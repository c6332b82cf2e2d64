"""Bring your own data through the real broker: a user's file for `payments`, good rows and bad.

Good rows arrive on the topic keyed by account_id and decode to the file's values; rejected rows
are listed with their line and reason (reject file, or dead letters on the DLQ). Also: random
payments from the schema, `tail --source`, and `topics create` from an applied plan.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition

from headwater.cli.events import events
from headwater.cli.registry import apply
from headwater.cli.topics import topics
from headwater.pipelines.events.codec import (
    HEADER_PRODUCE_TS,
    HEADER_SCHEMA_FP,
    DecodedEvent,
    EventCodec,
    parse_dead_letter,
)
from headwater.registry.plans import PlanSource, plan_path, read_plan

EXAMPLE = Path(__file__).resolve().parents[4] / "features"
T0 = datetime(2026, 11, 30, 10, tzinfo=UTC)
T0_US = int(T0.timestamp()) * 1_000_000


@pytest.fixture(scope="module")
def state(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example repo applied (plans only) into a state folder of this module."""
    folder = tmp_path_factory.mktemp("state")
    result = CliRunner().invoke(apply, [str(EXAMPLE), "--state-dir", str(folder), "--no-feast"])
    assert result.exit_code == 0, result.output
    return folder


@pytest.fixture(scope="module")
def payments(state: Path) -> PlanSource:
    return next(s for s in read_plan(state, "offline").sources if s.name == "payments")


def read_all(bootstrap: str, topic: str, expected: int) -> list[Any]:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False)
    partitions = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())]
    consumer.assign(partitions)
    consumer.seek_to_beginning(*partitions)
    records: list[Any] = []
    deadline = time.monotonic() + 60
    while len(records) < expected and time.monotonic() < deadline:
        for batch in consumer.poll(timeout_ms=500).values():
            records.extend(batch)
    consumer.close()
    return records


def payment(n: int, **change: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "payment_id": f"p-{n:03d}",
        "account_id": f"acc-{n % 7}",
        "merchant_id": f"m-{n % 3}",
        "method": ("card", "wallet", "bank_transfer")[n % 3],
        "status": "captured",
        "amount": round(n * 1.25, 2),
        "currency": "EUR",
        "risk_score": None if n % 4 == 0 else (n % 100) / 100,
        "occurred_at": (T0_US + n * 1_000_000),
    }
    row.update(change)
    return row


def expected_event(row: dict[str, Any]) -> dict[str, Any]:
    """The decoded form of a good row: text numbers as numbers, ISO times as micros."""
    event = {**row, "amount": float(row["amount"])}
    at = row["occurred_at"]
    if isinstance(at, str):
        event["occurred_at"] = int(datetime.fromisoformat(at).timestamp() * 1_000_000)
    event.setdefault("risk_score", None)
    return event


BAD_ROWS: list[tuple[str | dict[str, Any], str | None, str]] = [
    ('{"payment_id": "p-900", "amount": ', None, "not JSON"),
    (payment(901, amount=-3), "amount", "rule 'amount >= 0' of source 'payments' does not hold"),
    (payment(902, method="cash"), "method", "expected one of card, wallet, bank_transfer, found 'cash'"),
    (
        {k: v for k, v in payment(903).items() if k != "account_id"},
        "account_id",
        "missing (string, not nullable)",
    ),
    (payment(904, occurred_at="1999-06-01T00:00:00Z"), "occurred_at", "min_event_time in sources.yaml"),
    (payment(905, risk_score=2.5), "risk_score", "risk_score = 2.5"),
    ("[1, 2, 3]", None, "expected an object with the source's fields, found a list"),
]


def write_file(path: Path, good: list[dict[str, Any]]) -> dict[int, tuple[str | None, str]]:
    """Write good rows with the bad ones spread between them; return line -> (field, reason) of the bad."""
    lines: list[str] = []
    bad_at: dict[int, tuple[str | None, str]] = {}
    bad = iter(BAD_ROWS)
    for i, row in enumerate(good):
        lines.append(json.dumps(row))
        if i % 4 == 1 and (b := next(bad, None)) is not None:
            text, field, reason = b
            lines.append(text if isinstance(text, str) else json.dumps(text))
            bad_at[len(lines)] = (field, reason)
    path.write_text("\n".join(lines) + "\n")
    assert len(bad_at) == len(BAD_ROWS)
    return bad_at


def good_rows() -> list[dict[str, Any]]:
    rows = [payment(n) for n in range(40)]
    rows[3] = payment(3, occurred_at="2026-11-30T11:00:03+01:00")  # ISO text with an offset
    rows[5] = payment(5, amount="6.25")  # a number as text
    del rows[8]["risk_score"]  # a missing nullable field
    rows[9] = payment(9, note="ignored column")
    return rows


def test_a_jsonl_file_for_payments_good_rows_keyed_by_account_rejects_listed(
    kafka_bootstrap: str, new_topic: Callable[[int], str], state: Path, payments: PlanSource, tmp_path: Path
) -> None:
    topic = new_topic(3)
    path = tmp_path / "payments.jsonl"
    good = good_rows()
    bad_at = write_file(path, good)
    before_ms = time.time_ns() // 1_000_000
    result = CliRunner().invoke(
        events,
        ["produce", "--source", "payments", "--from", str(path), "--topic", topic, "--state-dir", str(state)],
        env={"HEADWATER_KAFKA_BOOTSTRAP": kafka_bootstrap},
    )
    after_ms = time.time_ns() // 1_000_000
    assert result.exit_code == 0, result.output
    counts = json.loads(result.stdout.strip().splitlines()[-1])
    assert (counts["read"], counts["sent"], counts["rejected"], counts["failed"]) == (47, 40, 7, 0)
    assert counts["ignored_columns"] == ["note"]
    assert counts["rejects"] == str(path) + ".rejects.jsonl"
    assert f"{path}:{min(bad_at)}: not JSON" in result.stderr
    assert "7 rejected row(s) (2 more not shown)" in result.stderr
    assert "read 47 (100%)  sent 40  rejected 7" in result.stderr  # the final progress line

    codec = EventCodec(payments)
    records = read_all(kafka_bootstrap, topic, 40)
    assert len(records) == 40
    want = {row["payment_id"]: expected_event({k: v for k, v in row.items() if k != "note"}) for row in good}
    partition_of: dict[str, int] = {}
    for record in records:
        headers = dict(record.headers)
        assert headers[HEADER_SCHEMA_FP] == codec.fingerprint_header
        assert before_ms <= int(headers[HEADER_PRODUCE_TS]) <= after_ms
        decoded = codec.decode(record.value, record.headers)
        assert isinstance(decoded, DecodedEvent), decoded
        assert decoded.event == want.pop(decoded.event["payment_id"])
        assert record.key == decoded.event["account_id"].encode()
        assert partition_of.setdefault(decoded.event["account_id"], record.partition) == record.partition
    assert not want
    assert len(set(partition_of.values())) > 1

    rejects = [json.loads(line) for line in Path(counts["rejects"]).read_text().splitlines()]
    assert [(r["line"], r["field"]) for r in rejects] == [
        (line, f) for line, (f, _) in sorted(bad_at.items())
    ]
    for r in rejects:
        assert bad_at[r["line"]][1] in r["reason"], r


def test_rejects_to_the_dlq_carry_file_line_and_reason(
    kafka_bootstrap: str, new_topic: Callable[[int], str], state: Path, tmp_path: Path
) -> None:
    topic, dlq = new_topic(2), new_topic(1)
    path = tmp_path / "payments.jsonl"
    bad_at = write_file(path, good_rows())
    result = CliRunner().invoke(
        events,
        [
            "produce",
            "--source",
            "payments",
            "--from",
            str(path),
            "--topic",
            topic,
            "--state-dir",
            str(state),
            "--rejects-to",
            "dlq",
            "--quiet",
        ],
        env={"HEADWATER_KAFKA_BOOTSTRAP": kafka_bootstrap, "HEADWATER_DLQ_TOPIC": dlq},
    )
    assert result.exit_code == 0, result.output
    counts = json.loads(result.stdout.strip().splitlines()[-1])
    assert (counts["sent"], counts["rejected"], counts["rejects"]) == (40, 7, f"topic {dlq}")
    assert not (tmp_path / "payments.jsonl.rejects.jsonl").exists()
    letters = [parse_dead_letter(r.value, r.key, r.headers) for r in read_all(kafka_bootstrap, dlq, 7)]
    assert [(d.source_topic, d.source_partition, d.source_offset) for d in letters] == [
        (topic, -1, line) for line in sorted(bad_at)
    ]
    for letter in letters:
        _, reason = bad_at[letter.source_offset]
        assert letter.detail.startswith(f"{path}:{letter.source_offset}: ")
        assert reason in letter.detail
        assert letter.reason == (
            "corrupt_payload" if letter.source_offset == min(bad_at) else "invalid_field"
        )
        assert dict(letter.original_headers)["source-line"] == str(letter.source_offset).encode()
    assert letters[0].value == b'{"payment_id": "p-900", "amount": '


def test_parquet_history_from_the_1990s_replayed_to_now(
    kafka_bootstrap: str, new_topic: Callable[[int], str], state: Path, payments: PlanSource, tmp_path: Path
) -> None:
    topic = new_topic(2)
    path = tmp_path / "old.parquet"
    first = datetime(1996, 3, 1, tzinfo=UTC)
    rows = [payment(n) for n in range(0, 300)]
    times = [
        datetime.fromtimestamp(first.timestamp() + 3600 * ((n * 37) % 300), tz=UTC) for n in range(300)
    ]  # any order
    table = pa.Table.from_pylist(
        [{**row, "occurred_at": t} for row, t in zip(rows, times, strict=True)],
        schema=pa.schema(
            [
                (k, pa.float64() if k in ("amount", "risk_score") else pa.string())
                for k in rows[0]
                if k != "occurred_at"
            ]
            + [("occurred_at", pa.timestamp("us", tz="UTC"))]
        ),
    )
    pq.write_table(table, path, row_group_size=64)
    before_ms = time.time_ns() // 1_000_000
    result = CliRunner().invoke(
        events,
        [
            "produce",
            "--source",
            "payments",
            "--from",
            str(path),
            "--topic",
            topic,
            "--state-dir",
            str(state),
            "--time-shift",
            "to-now",
            "--quiet",
        ],
        env={"HEADWATER_KAFKA_BOOTSTRAP": kafka_bootstrap},
    )
    after_ms = time.time_ns() // 1_000_000
    assert result.exit_code == 0, result.output
    counts = json.loads(result.stdout.strip().splitlines()[-1])
    assert (counts["sent"], counts["rejected"]) == (300, 0)
    assert before_ms <= counts["last_event_ms"] <= after_ms
    assert counts["last_event_ms"] - counts["first_event_ms"] == 299 * 3_600_000
    codec = EventCodec(payments)
    decoded = [codec.decode(r.value, r.headers) for r in read_all(kafka_bootstrap, topic, 300)]
    shift_us = (counts["last_event_ms"] - int(max(times).timestamp() * 1000)) * 1000
    by_id = {
        row["payment_id"]: int(t.timestamp() * 1_000_000) + shift_us
        for row, t in zip(rows, times, strict=True)
    }
    assert len(decoded) == 300
    for d in decoded:
        assert isinstance(d, DecodedEvent)
        assert d.event["occurred_at"] == by_id[d.event["payment_id"]]


def test_random_payments_from_the_schema_then_tail_with_its_codec(
    kafka_bootstrap: str, new_topic: Callable[[int], str], state: Path, payments: PlanSource
) -> None:
    topic = new_topic(2)
    env = {"HEADWATER_KAFKA_BOOTSTRAP": kafka_bootstrap}
    produced = CliRunner().invoke(
        events,
        [
            "produce",
            "--source",
            "payments",
            "--rate",
            "0",
            "--max-events",
            "500",
            "--duration",
            "120",
            "--topic",
            topic,
            "--state-dir",
            str(state),
            "--quiet",
        ],
        env=env,
    )
    assert produced.exit_code == 0, produced.output
    counts = json.loads(produced.stdout.strip().splitlines()[-1])
    assert (counts["source"], counts["read"], counts["sent"], counts["rejected"]) == ("payments", 500, 500, 0)
    codec = EventCodec(payments)
    records = read_all(kafka_bootstrap, topic, 500)
    assert len(records) == 500
    for record in records:
        decoded = codec.decode(record.value, record.headers)
        assert isinstance(decoded, DecodedEvent)
        assert record.key == decoded.event["account_id"].encode()
        assert decoded.event["amount"] >= 0

    tailed = CliRunner().invoke(
        events,
        [
            "tail",
            "--source",
            "payments",
            "--topic",
            topic,
            "--state-dir",
            str(state),
            "--from-beginning",
            "--timeout",
            "3",
        ],
        env=env,
    )
    assert tailed.exit_code == 0, tailed.output
    lines = [json.loads(line) for line in tailed.stdout.splitlines()]
    assert len(lines) == 500, tailed.stderr
    assert all(set(line) == {f.name for f in payments.fields} for line in lines)
    assert "records 500  valid 500  duplicate ids 0" in tailed.stderr
    assert "by method:" in tailed.stderr


def test_topics_create_makes_every_source_topic_of_the_plan(
    kafka_bootstrap: str, state: Path, tmp_path: Path
) -> None:
    # a copy of the applied plan whose sources have topics of their own, so nothing shared is touched
    own = tmp_path / "state"
    plan = read_plan(state, "offline")
    suffix = uuid.uuid4().hex[:8]
    renamed = [s.model_copy(update={"topic": f"test.{s.topic}.{suffix}"}) for s in plan.sources]
    plan_path(own, "offline").parent.mkdir(parents=True)
    plan_path(own, "offline").write_text(plan.model_copy(update={"sources": renamed}).model_dump_json())
    dlq = f"test.dlq.{suffix}"
    wanted = [s.topic for s in renamed] + [dlq]
    admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap, client_id="test-ingest-admin")
    try:
        env = {"HEADWATER_KAFKA_BOOTSTRAP": kafka_bootstrap, "HEADWATER_DLQ_TOPIC": dlq}
        result = CliRunner().invoke(topics, ["create", "--state-dir", str(own), "--partitions", "2"], env=env)
        assert result.exit_code == 0, result.output
        assert f"test.payments.{suffix}: created (source payments" in result.output
        assert f"test.events.{suffix}: created (source events" in result.output
        assert f"{dlq}: created (dead letters" in result.output
        deadline = time.monotonic() + 30  # creation is asynchronous on the broker: wait until it lists them
        while not set(wanted) <= set(admin.list_topics()):
            assert time.monotonic() < deadline, f"topics {wanted} were not listed"
            time.sleep(0.2)
        again = CliRunner().invoke(topics, ["create", "--state-dir", str(own)], env=env)
        assert again.output.count(": exists (") == 3
    finally:
        admin.delete_topics([t for t in wanted if t in admin.list_topics()])
        admin.close()
