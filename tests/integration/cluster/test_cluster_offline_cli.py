"""The offline tier's commands on Spark standalone: landing -> offline -> materialize -> consistency,
and a training set, each command with ``--master spark://`` (jars passed by the session).

Both example sources are produced to topics on the 3-broker Kafka (RF 3). ``run landing`` lands them
into bronze, ``run offline`` computes a payments view and a behaviour view for 3 days (every row
equals the reference semantics), ``materialize`` writes the latest day into the profile's Redis
Cluster and ``consistency`` recomputes those online values with 0 mismatches; ``training-set`` on the
cluster builds one from the landed labels. The lake is a local folder: every process of the
loopback cluster reaches it (on several hosts it is a shared filesystem or an object store).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import redis
from click.testing import CliRunner
from kafka import KafkaAdminClient, KafkaProducer

from headwater.pipelines.events.codec import EventCodec
from headwater.pipelines.offline.lake import feature_path
from headwater.pipelines.offline.testing import DAY_MS, T0
from headwater.pipelines.settings import Settings
from headwater.pipelines.store.connect import redis_client
from headwater.pipelines.topics import ensure_topics
from headwater.pipelines.windows import compile_view, reference_values
from headwater.registry.plans import PlanSource, PlanView, build_plans, plan_path, registry_hash
from headwater.registry.validate import check_repo

from .conftest import KAFKA, REDIS_CLUSTER, ROOT, SPARK_MASTER, record_figure
from .test_cluster_offline import history

pytestmark = pytest.mark.cluster

VIEWS = ("account_spend_offline", "item_popularity_offline")

_spec = importlib.util.spec_from_file_location(
    "offline_e2e", ROOT / "tests" / "integration" / "pipelines" / "offline" / "test_offline_sources_e2e.py"
)
assert _spec is not None
assert _spec.loader is not None
e2e = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = e2e
_spec.loader.exec_module(e2e)  # its payments history, reference conversion and cell comparison


@dataclass
class World:
    state: Path
    lake: Path
    views: dict[str, PlanView]
    sources: dict[str, PlanSource]
    env: dict[str, str]
    namespace: str


@pytest.fixture
def world(cluster: None, tmp_path: Path) -> Iterator[World]:
    """The example repo's plans (topics renamed to this test's, RF 3 on the profile's Kafka)."""
    from headwater.pipelines.events.schema import example_repo

    try:
        probe = redis_client(REDIS_CLUSTER, socket_timeout=5.0)
        probe.ping()
        probe.close()
    except redis.RedisError as exc:
        pytest.skip(f"no Redis Cluster answers at {REDIS_CLUSTER} ({exc}): run `make cluster-up`")
    result = check_repo(example_repo())
    assert not result.diagnostics.errors, [d.message for d in result.diagnostics.errors]
    run = uuid.uuid4().hex[:8]
    plans = build_plans(result, registry_hash(result))
    renamed = [s.model_copy(update={"topic": f"{s.topic}-cl-{run}"}) for s in plans["offline"].sources]
    state = tmp_path / "state"
    for tier, plan in plans.items():
        # without the on-demand views: they read user views too, which a one-view training set lacks
        plans[tier] = plan.model_copy(update={"sources": renamed, "on_demand": []})
        plan_path(state, tier).parent.mkdir(parents=True, exist_ok=True)
        plan_path(state, tier).write_text(plans[tier].model_dump_json(), encoding="utf-8")
    dlq = f"offline-cl-{run}.dlq"
    topics = [s.topic for s in renamed] + [dlq]
    env = {**os.environ, "HEADWATER_KAFKA_BOOTSTRAP": KAFKA, "HEADWATER_DLQ_TOPIC": dlq,
           "HEADWATER_KAFKA_REPLICATION": "3", "HEADWATER_REDIS_URL": REDIS_CLUSTER}  # fmt: skip
    on_profile = dataclasses.replace(Settings.from_env(), kafka_bootstrap=KAFKA)
    ensure_topics(on_profile, {name: {} for name in topics}, 1, 3)
    views = {v.name: v for v in plans["offline"].views}
    yield World(state, tmp_path / "lake", views, {s.name: s for s in renamed}, env, f"hwcl{run}")
    admin = KafkaAdminClient(bootstrap_servers=KAFKA)
    admin.delete_topics(topics)
    admin.close()
    client = redis_client(REDIS_CLUSTER)
    for key in list(client.scan_iter(match=f"hwcl{run}:*", count=1000)):
        client.delete(key)
    client.close()


def headwater(command: Any, *args: str) -> tuple[str, float]:
    """Run one headwater command (click, in this process: its Spark session is the test's, on the
    cluster); return its output and seconds, or fail with its output."""
    started = time.monotonic()
    run = CliRunner().invoke(command, list(args))
    assert run.exit_code == 0, (args, run.output[-4000:], run.exception)
    return run.output, time.monotonic() - started


def json_lines(out: str) -> list[Any]:
    return [json.loads(x) for x in out.splitlines() if x.startswith(("{", "["))]


def produce(world: World) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Payments (a redelivery, one late) and behaviour events (in time order: none late), keyed."""
    payments = [*e2e.payments_history(), e2e.late_payment(e2e.payments_history())]
    behaviour = sorted(history(), key=lambda e: (e["event_time"], e["event_id"]))
    producer = KafkaProducer(bootstrap_servers=KAFKA, acks="all")
    for source, events in ((world.sources["payments"], payments), (world.sources["events"], behaviour)):
        codec = EventCodec(source)
        for e in events:
            producer.send(source.topic, value=codec.encode(e), key=codec.key(e), headers=codec.headers())
    producer.flush()
    producer.close()
    return payments, behaviour


def assert_table_is_reference(spark: Any, world: World, name: str, events: list[dict[str, Any]]) -> int:
    """Every (day, entity) row of view ``name`` equals the reference as of that day's end; cells checked."""
    spec = compile_view(world.views[name])
    rows = spark.read.format("delta").load(str(feature_path(world.lake, name))).collect()
    by_key = {(str(r["date"]), r[spec.join_key]): r.asDict(recursive=True) for r in rows}
    assert len(by_key) == len(rows)  # each (day, entity) once
    assert not [k for k in by_key if k[0] == "2025-12-31"]  # no event yet: no row
    checked = 0
    for d in range(3):
        expected = reference_values(spec, events, T0 + (d + 1) * DAY_MS)
        day = str(date(2026, 1, 1 + d))
        assert {k for t, k in by_key if t == day} == set(expected), (name, day)
        for entity, values in expected.items():
            row = by_key[(day, entity)]
            for feature, want in values.items():
                assert e2e.same(want, row[feature]), (name, day, entity, feature, want, row[feature])
                checked += 1
    return checked


def test_landing_offline_materialize_training_set_on_spark_standalone(
    world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from headwater.cli.offline import consistency, landing, materialize, offline, training_set
    from headwater.pipelines.offline.session import offline_session

    for name in ("HEADWATER_KAFKA_BOOTSTRAP", "HEADWATER_DLQ_TOPIC", "HEADWATER_KAFKA_REPLICATION",
                 "HEADWATER_REDIS_URL"):  # fmt: skip
        monkeypatch.setenv(name, world.env[name])
    payments, behaviour = produce(world)
    common = ["--lake", str(world.lake), "--state-dir", str(world.state), "--master", SPARK_MASTER]
    seconds: dict[str, float] = {}
    started = time.monotonic()
    # One application on the master for every command (each command's offline_session finds it): a
    # driver and an executor start once, which on this shared 2-core machine is most of the time.
    spark = offline_session("headwater-cluster-cli", SPARK_MASTER)
    seconds["session"] = time.monotonic() - started
    try:
        assert spark.sparkContext.master == SPARK_MASTER
        out, seconds["landing"] = headwater(landing, *common, "--workers", "1")
        landed = {s["source"]: (s["records"], s["landed"], s["late"]) for s in json_lines(out)}
        assert landed == {"payments": (len(payments), len(payments), 1),
                          "events": (len(behaviour), len(behaviour), 0)}  # fmt: skip

        view_args = [arg for v in VIEWS for arg in ("--view", v)]
        # from the day before the first event: a training label of day D reads the values as of D-1
        _, seconds["offline"] = headwater(offline, *view_args, "--backfill", "2025-12-31", "2026-01-03",
                                          "--no-zorder", *common)  # fmt: skip
        cells = assert_table_is_reference(spark, world, "account_spend_offline",
                                          e2e.as_reference(e2e.payments_history()))  # fmt: skip
        cells += assert_table_is_reference(spark, world, "item_popularity_offline", behaviour)
        assert cells > 100

        store = ["--redis-url", REDIS_CLUSTER, "--namespace", world.namespace]
        out, seconds["materialize"] = headwater(materialize, *view_args, *common, *store)
        assert all(f"{v}:" in out for v in VIEWS), out
        out, seconds["consistency"] = headwater(consistency, "--tier", "offline", *view_args, "--json",
                                                *common, *store)  # fmt: skip
        report = {r["view"]: r for r in json.loads(out)}
        assert report["account_spend_offline"]["found"] == 3  # accounts a0..a2
        assert report["item_popularity_offline"]["found"] > 0
        assert all(report[v]["mismatch_rate"] == 0 for v in VIEWS), report

        out, seconds["training_set"] = headwater(
            training_set, "--labels", "bronze", "--view", "item_popularity_offline", "--out",
            str(tmp_path / "train.parquet"), "--redis-url", REDIS_CLUSTER, *common,
        )  # fmt: skip
        summary = json_lines(out)[0]
        assert summary["rows"] == pq.read_metadata(tmp_path / "train.parquet").num_rows > 0
        # history(): a user's impression (item u+0) and click (item u+1) name different items
        assert summary["positives"] == 0
    finally:
        spark.stop()
    record_figure("spark_cli_on_standalone", {k: round(v, 1) for k, v in seconds.items()})
