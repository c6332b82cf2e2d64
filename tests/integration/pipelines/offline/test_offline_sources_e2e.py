"""Both example sources through the offline tier from real Kafka: landing, views, materialize, consistency.

The example repo is checked and planned as ``headwater apply`` does (topics renamed per test run).
``headwater run landing`` lands each source into its own bronze table, the payments one with its
timestamp-micros ``occurred_at``; ``account_spend_offline`` equals the reference; a ratio over
distinct counts computes in Spark; the materialized offline values and reference-valued nearline
values in Redis pass ``headwater consistency`` with 0 mismatches.
"""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from kafka import KafkaAdminClient, KafkaProducer

from headwater.cli.offline import consistency, landing, materialize, offline
from headwater.pipelines.events.codec import EventCodec
from headwater.pipelines.offline.job import read_bronze, run_view
from headwater.pipelines.offline.lake import bronze_path, feature_path
from headwater.pipelines.offline.source_columns import bronze_schema
from headwater.pipelines.offline.testing import DAY_MS, HOUR_MS, T0, event, feature, payment, view
from headwater.pipelines.settings import Settings
from headwater.pipelines.store import OnlineStore
from headwater.pipelines.topics import ensure_topics
from headwater.pipelines.windows import (
    RedisDictionary,
    compile_view,
    empty_values,
    reference_values,
    to_vectors,
    view_layout,
)
from headwater.registry.plans import PlanSource, PlanView, TierPlan, build_plans, plan_path, registry_hash
from headwater.registry.validate import check_repo

METHODS = ["card", "wallet", "bank_transfer"]
STATUSES = ["captured", "captured", "declined", "refunded", "authorized"]
NEARLINE_AT = T0 + 2 * DAY_MS + 12 * HOUR_MS
"""The boundary the nearline view's values are written for (day 3, 12:00)."""
RATIOS = view("merchant_ratios", "merchant", "merchant_id", [
    feature("payers_per_payment_2d", "ratio", "2d", num=("distinct_count", "account_id", None),
            den=("count", None, None)),
    feature("decliners_per_method_1d", "ratio", "1d",
            num=("distinct_count", "account_id", "status = 'declined'"),
            den=("distinct_count", "method", None)),
], source="payments")  # fmt: skip


@dataclass
class Setup:
    state: Path
    lake: Path
    plans: dict[str, TierPlan]
    sources: dict[str, PlanSource]
    dlq: str


def payments_history() -> list[dict[str, Any]]:
    """Three days, three accounts, four merchants; a burst before 12:00 on day 3; a redelivery. Time order."""
    ev = [
        payment(n, f"a{n % 3}", T0 + (n // 24) * DAY_MS + (n % 24) * HOUR_MS + n * 1000,
                merchant_id=f"m{n % 4}", method=METHODS[n % 3], status=STATUSES[n % 5], amount=5.0 + n,
                risk_score=None if n % 4 == 0 else (n % 10) / 10)
        for n in range(72)
    ]  # fmt: skip
    ev += [
        payment(100 + k, f"a{k % 3}", T0 + 2 * DAY_MS + 11 * HOUR_MS + 30 * 60_000 + k * 1000,
                merchant_id=f"m{k % 3}", method=METHODS[k % 2], amount=12.5 * k, risk_score=k / 10,
                status="declined" if k % 2 == 0 else "captured")
        for k in range(6)
    ]  # fmt: skip
    ev.sort(key=lambda e: e["occurred_at"])
    return [*ev, dict(ev[-1])]  # redelivered at once: not late, counted once


def late_payment(history: list[dict[str, Any]]) -> dict[str, Any]:
    """40 s behind the newest payment: past max_out_of_orderness (2 s) + allowed_lateness (30 s)."""
    newest = max(e["occurred_at"] for e in history) // 1000
    return payment(999, "a0", newest - 40_000, merchant_id="m0", amount=1000.0, status="captured")


def behaviour_history() -> list[dict[str, Any]]:
    return [event(n, f"u{n % 2}", "click", T0 + n * HOUR_MS, item_id=f"i{n}") for n in range(1, 9)]


def as_reference(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Payments as the reference reads events: ``event_time`` in ms and ``event_id``."""
    return [{**e, "event_time": e["occurred_at"] // 1000, "event_id": e["payment_id"]} for e in events]


@pytest.fixture(scope="module")
def setup(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    from headwater.pipelines.events.schema import example_repo

    result = check_repo(example_repo())
    assert not result.diagnostics.errors, [d.message for d in result.diagnostics.errors]
    run = uuid.uuid4().hex[:8]
    plans = build_plans(result, registry_hash(result))
    renamed = [s.model_copy(update={"topic": f"{s.topic}-e2e-{run}"}) for s in plans["offline"].sources]
    state = tmp_path_factory.mktemp("state")
    for tier, plan in plans.items():
        plans[tier] = plan.model_copy(update={"sources": renamed})
        plan_path(state, tier).parent.mkdir(parents=True, exist_ok=True)
        plan_path(state, tier).write_text(plans[tier].model_dump_json(), encoding="utf-8")
    sources = {s.name: s for s in renamed}
    dlq = f"offline-e2e-{run}.dlq"
    topics = [s.topic for s in renamed] + [dlq]
    ensure_topics(Settings.from_env(), {name: {} for name in topics}, partitions=1)
    yield Setup(state, tmp_path_factory.mktemp("lake"), plans, sources, dlq)
    admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    admin.delete_topics(topics)
    admin.close()


@pytest.fixture(scope="module")
def landed(setup: Setup, kafka_bootstrap: str) -> list[dict[str, Any]]:
    """Produce both histories (keyed by each source's key) and land them with the command."""
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap)
    payments = [*payments_history(), late_payment(payments_history())]
    for source, events in (
        (setup.sources["payments"], payments),
        (setup.sources["events"], behaviour_history()),
    ):
        codec = EventCodec(source)
        for e in events:
            producer.send(source.topic, value=codec.encode(e), key=codec.key(e), headers=codec.headers())
    producer.flush()
    producer.close()
    mp = pytest.MonkeyPatch()
    mp.setenv("HEADWATER_DLQ_TOPIC", setup.dlq)
    try:
        args = ["--lake", str(setup.lake), "--state-dir", str(setup.state), "--workers", "1"]
        run = CliRunner().invoke(landing, args)
    finally:
        mp.undo()
    assert run.exit_code == 0, run.output
    summaries = {
        s["source"]: s for s in map(json.loads, (x for x in run.output.splitlines() if x.startswith("{")))
    }
    assert {n: (s["records"], s["landed"], s["late"]) for n, s in summaries.items()} == {
        "payments": (len(payments), len(payments), 1), "events": (8, 8, 0)}  # fmt: skip
    return payments


def test_every_source_lands_in_its_own_table_with_its_schema(spark: Any, setup: Setup, landed: Any) -> None:
    pay = read_bronze(spark, setup.lake, setup.sources["payments"])
    assert pay.columns == [*bronze_schema(setup.sources["payments"]).names, "date"]
    rows = {r["payment_id"]: r for r in pay.where("payment_id in ('p00000', 'p00999')").collect()}
    assert rows["p00000"]["occurred_at"] == T0 * 1000  # the raw micros, as sent
    assert str(rows["p00000"]["date"]) == "2026-01-01"
    assert (rows["p00999"]["late"], rows["p00000"]["late"]) == (True, False)
    assert rows["p00000"]["kafka_topic"] == setup.sources["payments"].topic
    assert pay.count() == len(landed)
    events = read_bronze(spark, setup.lake, setup.sources["events"])
    assert sorted(r["event_id"] for r in events.collect()) == [f"e{n:05d}" for n in range(1, 9)]
    assert bronze_path(setup.lake, "payments") != bronze_path(setup.lake, "events")


def test_account_spend_offline_equals_the_reference(spark: Any, setup: Setup, landed: Any) -> None:
    args = ["--view", "account_spend_offline", "--backfill", "2026-01-01", "2026-01-03", "--no-zorder",
            "--lake", str(setup.lake), "--state-dir", str(setup.state)]  # fmt: skip
    run = CliRunner().invoke(offline, args)
    assert run.exit_code == 0, run.output
    plan_view = next(v for v in setup.plans["offline"].views if v.name == "account_spend_offline")
    spec = compile_view(plan_view)
    on_time = as_reference(payments_history())  # the late payment is left out
    table = spark.read.format("delta").load(str(feature_path(setup.lake, plan_view.name))).collect()
    rows = {(str(r["date"]), r["account_id"]): r.asDict(recursive=True) for r in table}
    checked = 0
    for d in range(3):
        expected = reference_values(spec, on_time, T0 + (d + 1) * DAY_MS)
        assert {a for day, a in rows if day == f"2026-01-0{d + 1}"} == set(expected) == {"a0", "a1", "a2"}
        for account, values in expected.items():
            row = rows[(f"2026-01-0{d + 1}", account)]
            for name, want in values.items():
                assert same(want, row[name]), (d, account, name, want, row[name])
                checked += 1
    assert checked == 3 * 3 * len(plan_view.features)
    assert rows[("2026-01-03", "a0")]["refunds_7d"] > 0
    # the job reports the view's CPU (`headwater costs`): its process tree's, over the one 3-day chunk
    told = json.loads((setup.state / "offline" / "reported" / f"{plan_view.name}.json").read_text())
    assert [(r["first"], r["last"], r["days"]) for r in told["runs"]] == [("2026-01-01", "2026-01-03", 3)]
    assert told["runs"][0]["cpu_s"] > 0


def test_a_ratio_over_distinct_counts_runs_in_spark(spark: Any, setup: Setup, landed: Any) -> None:
    source = setup.sources["payments"]
    run_view(spark, read_bronze(spark, setup.lake, source), RATIOS, source, setup.lake,
             [date(2026, 1, 2), date(2026, 1, 3)], zorder=False)  # fmt: skip
    spec = compile_view(RATIOS)
    table = spark.read.format("delta").load(str(feature_path(setup.lake, RATIOS.name))).collect()
    seen = 0
    for r in table:
        as_of = T0 + (r["date"] - date(2025, 12, 31)).days * DAY_MS
        want = reference_values(spec, as_reference(payments_history()), as_of).get(r["merchant_id"])
        want = want or empty_values(spec)
        for name, value in want.items():
            assert same(value, r[name]), (r["date"], r["merchant_id"], name, value, r[name])
            seen += not math.isnan(value)
    assert seen >= 8


def test_materialized_and_nearline_values_are_consistent(
    spark: Any, setup: Setup, landed: Any, redis_url: str
) -> None:
    namespace = f"hwtest-{uuid.uuid4().hex[:8]}"
    store = OnlineStore.from_url(redis_url, namespace=namespace)
    common = ["--lake", str(setup.lake), "--state-dir", str(setup.state), "--redis-url", redis_url,
              "--namespace", namespace]  # fmt: skip
    try:
        mat = CliRunner().invoke(materialize, ["--view", "account_spend_offline", *common])
        assert mat.exit_code == 0, mat.output
        nearline = next(v for v in setup.plans["nearline"].views if v.name == "merchant_risk_nearline")
        merchants = write_reference(store, nearline, setup.plans["nearline"].registry_hash)
        assert len(merchants) >= 3
        args = ["--tier", "offline", "--tier", "nearline", "--view", "account_spend_offline",
                "--view", "merchant_risk_nearline", "--json", *common]  # fmt: skip
        run = CliRunner().invoke(consistency, args)
        assert run.exit_code == 0, run.output
        report = {r["view"]: r for r in json.loads(run.output)}
        assert (
            report["account_spend_offline"]["found"],
            report["account_spend_offline"]["mismatch_rate"],
        ) == (3, 0)
        assert report["merchant_risk_nearline"]["found"] == len(merchants)
        assert report["merchant_risk_nearline"]["mismatch_rate"] == 0, report["merchant_risk_nearline"][
            "examples"
        ]
    finally:
        for key in store.client.scan_iter(match=f"{namespace}:*"):
            store.client.delete(key)
        store.close()


def write_reference(store: OnlineStore, plan_view: PlanView, reg_hash: str) -> list[str]:
    """Write the reference values of ``plan_view`` at :data:`NEARLINE_AT` as the nearline tier would."""
    spec = compile_view(plan_view)
    expected = reference_values(spec, as_reference(payments_history()), NEARLINE_AT)
    entities = sorted(expected)
    ids = RedisDictionary(store.client, store.namespace).ids
    vectors = to_vectors(spec, [list(expected[e].values()) for e in entities], ids)
    store.write_batch(view_layout(spec), entities, vectors, NEARLINE_AT)
    return entities


def same(expected: Any, found: Any) -> bool:
    """A reference value (NaN: missing; top_k: (value, share) pairs) against a feature-table cell."""
    if isinstance(expected, tuple):
        pairs = [(e["value"], e["share"]) for e in found]
        return [v for v, _ in pairs] == [str(v) for v, _ in expected] and all(
            math.isclose(a, b, rel_tol=1e-9) for (_, a), (_, b) in zip(pairs, expected, strict=True)
        )
    if isinstance(expected, str):
        return expected == found
    if math.isnan(expected):
        return found is None or math.isnan(found)
    return found is not None and math.isclose(expected, float(found), rel_tol=1e-9, abs_tol=1e-12)
