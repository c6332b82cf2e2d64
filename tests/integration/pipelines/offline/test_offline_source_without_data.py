"""A source with no data yet does not fail the offline tier (issue 37 item 5), on real Kafka, Spark, Delta.

The plan has two sources: ``events`` gets a few behaviour events on its topic, ``payments`` has no
topic at all (as in a repo made with ``headwater init`` plus one own source: the other example
source was never produced to). ``headwater run landing`` lands ``events`` and skips ``payments`` with
one warning; ``run offline`` computes the events view and skips the payments view with one warning
naming the view, the source and the fixes; ``materialize`` does the same. A view asked for by name
with ``--view`` still fails, with the reason.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from kafka import KafkaAdminClient, KafkaProducer

from headwater.cli.offline import landing, materialize, offline
from headwater.pipelines.events.codec import EventCodec
from headwater.pipelines.offline.lake import bronze_path, feature_path, is_delta_table
from headwater.pipelines.offline.testing import (
    HOUR_MS,
    T0,
    behaviour,
    event,
    feature,
    payments,
    view,
    write_plan,
)
from headwater.pipelines.settings import Settings
from headwater.pipelines.store import OnlineStore
from headwater.pipelines.topics import ensure_topics

CLICKS = view("user_clicks_offline", "user", "user_id", [
    feature("clicks_1d", "count", "1d", filter_="event_type = 'click'"),
])  # fmt: skip
SPEND = view("account_spend_small", "account", "account_id", [
    feature("amount_1d", "sum", "1d", field="amount"),
], source="payments")  # fmt: skip


@dataclass
class Repo:
    state: Path
    lake: Path
    events_topic: str
    payments_topic: str


@pytest.fixture(scope="module")
def repo(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Repo]:
    run = uuid.uuid4().hex[:8]
    events = behaviour().model_copy(update={"topic": f"events-nodata-{run}"})
    pays = payments().model_copy(update={"topic": f"payments-nodata-{run}"})  # never created
    state = tmp_path_factory.mktemp("state")
    write_plan(state, "offline", [CLICKS, SPEND], sources=[events, pays])
    dlq = f"offline-nodata-{run}.dlq"
    ensure_topics(Settings.from_env(), {events.topic: {}, dlq: {}}, partitions=1)
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap)
    codec = EventCodec(events)
    for n in range(1, 7):
        e = event(n, f"u{n % 2}", "click", T0 + n * HOUR_MS, item_id=f"i{n}")
        producer.send(events.topic, value=codec.encode(e), key=codec.key(e), headers=codec.headers())
    producer.flush()
    producer.close()
    mp = pytest.MonkeyPatch()
    mp.setenv("HEADWATER_DLQ_TOPIC", dlq)
    yield Repo(state, tmp_path_factory.mktemp("lake"), events.topic, pays.topic)
    mp.undo()
    admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    admin.delete_topics([events.topic, dlq])
    admin.close()


def _args(repo: Repo) -> list[str]:
    return ["--lake", str(repo.lake), "--state-dir", str(repo.state)]


def test_landing_lands_the_source_with_events_and_skips_the_one_without(spark: Any, repo: Repo) -> None:
    result = CliRunner().invoke(landing, [*_args(repo), "--workers", "1"])
    assert result.exit_code == 0, result.output
    summaries = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert [(s["source"], s["records"], s["landed"]) for s in summaries] == [("events", 6, 6)]
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1, result.stderr
    assert f"source 'payments': topic {repo.payments_topic!r} not found" in warnings[0]
    assert "headwater events produce --source payments" in warnings[0]
    assert is_delta_table(bronze_path(repo.lake, "events"))
    assert not is_delta_table(bronze_path(repo.lake, "payments"))


def test_offline_computes_the_view_with_data_and_warns_once_for_the_other(spark: Any, repo: Repo) -> None:
    args = ["--backfill", "2026-01-01", "2026-01-01", "--no-zorder", *_args(repo)]
    result = CliRunner().invoke(offline, args)
    assert result.exit_code == 0, result.output
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    assert warnings == [
        "warning: skipping view account_spend_small: its source 'payments' has no data yet (no bronze"
        " table). Produce events (`headwater events produce --source payments`) and land them"
        " (`headwater run landing`), or import a history (`headwater events import --source payments`);"
        " or name only the views that have data with --view"
    ]
    assert "[1/1] user_clicks_offline (source events)" in result.stdout
    rows = spark.read.format("delta").load(str(feature_path(repo.lake, CLICKS.name))).collect()
    assert {r["user_id"]: r["clicks_1d"] for r in rows} == {"u0": 3, "u1": 3}
    assert not is_delta_table(feature_path(repo.lake, SPEND.name))


def test_a_view_named_with_view_still_fails_with_the_reason(spark: Any, repo: Repo) -> None:
    args = ["--view", SPEND.name, "--date", "2026-01-01", "--no-zorder", *_args(repo)]
    result = CliRunner().invoke(offline, args)
    assert result.exit_code == 1
    assert "no bronze table of source 'payments'" in result.output
    assert "headwater run landing" in result.output


def test_materialize_writes_the_view_with_data_and_warns_for_the_other(
    spark: Any, repo: Repo, redis_url: str
) -> None:
    namespace = f"hwtest-{uuid.uuid4().hex[:8]}"
    args = [*_args(repo), "--redis-url", redis_url, "--namespace", namespace]
    store = OnlineStore.from_url(redis_url, namespace=namespace)
    try:
        result = CliRunner().invoke(materialize, args)
        assert result.exit_code == 0, result.output
        assert [line.split(":")[0] for line in result.stdout.splitlines()] == [CLICKS.name]
        assert "2 rows of 2026-01-01, 2 written" in result.stdout
        warnings = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
        assert len(warnings) == 1
        assert warnings[0].startswith("warning: skipping view account_spend_small: its source 'payments'")
    finally:
        for key in store.client.scan_iter(match=f"{namespace}:*"):
            store.client.delete(key)
        store.close()
