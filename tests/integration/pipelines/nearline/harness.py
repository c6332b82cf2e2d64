"""Shared helpers of the nearline integration tests and the benchmark: plan, topics, events, oracle.

Sources come from the example feature repo (``features/``, checked with the registry's own
``check_repo`` and turned into plan sources by ``plan_source``), with their topics renamed per
test; the hand-written views (:func:`nearline_views`, :func:`item_views`) read the behaviour
source, :func:`write_example_plan` writes the example repo's whole nearline plan (both sources).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
import random
import subprocess
import sys
import time
import uuid
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.errors import CoordinatorLoadInProgressError, CoordinatorNotAvailableError, NotCoordinatorError

from headwater.pipelines.events.codec import DecodedEvent, EventCodec, parse_dead_letter
from headwater.pipelines.events.generator import EventGenerator, GeneratorConfig
from headwater.pipelines.events.schema import example_repo
from headwater.pipelines.settings import Settings
from headwater.pipelines.store import OnlineStore
from headwater.pipelines.topics import ensure_topics
from headwater.pipelines.windows import (
    RedisDictionary,
    ViewSpec,
    compile_view,
    empty_values,
    reference_values,
    split_late,
    to_vectors,
    view_layout,
)
from headwater.pipelines.windows.testing import plan_feature, plan_view, plan_where
from headwater.registry.compiled import CheckResult
from headwater.registry.plans import (
    SCHEMA_VERSION,
    PlanOperand,
    PlanSource,
    PlanView,
    TierPlan,
    build_plans,
    plan_path,
    plan_source,
    registry_hash,
)
from headwater.registry.validate import check_repo


@functools.cache
def example_check() -> CheckResult:
    """The example feature repo, checked once per process (it must check without errors)."""
    result = check_repo(example_repo())
    errors = [f"{d.file}:{d.line}: {d.message}" for d in result.diagnostics.errors]
    assert not errors, errors
    return result


def example_source(name: str, topic: str | None = None) -> PlanSource:
    """The plan form of the example repo's source ``name`` (its topic renamed to ``topic``)."""
    src = plan_source(example_check().sources[name])
    return src if topic is None else src.model_copy(update={"topic": topic})


BEHAVIOUR = example_source("events")
PAYMENTS = example_source("payments")
OOO_MS, LATENESS_MS = BEHAVIOUR.max_out_of_orderness_ms, BEHAVIOUR.allowed_lateness_ms


def nearline_views(slide_s: int | None = None) -> list[PlanView]:
    """Two user views covering every aggregation kind (``slide_s``: every feature's slide instead)."""
    ctr = dict(
        numerator=PlanOperand(agg="count", field=None, where=plan_where("event_type = 'click'")),
        denominator=PlanOperand(agg="count", field=None, where=plan_where("event_type = 'impression'")),
    )
    a = plan_view(
        "nl_activity",
        [
            plan_feature("clicks_10m", "count", 10, 1, flt="event_type = 'click'"),
            plan_feature("dwell_sum_30m", "sum", 30, 5, "dwell_ms", "event_type = 'dwell'"),
            plan_feature("price_avg_30m", "avg", 30, 5, "price"),
            plan_feature("price_min_10m", "min", 10, 1, "price"),
            plan_feature("position_max_10m", "max", 10, 1, "position"),
            plan_feature("ctr_30m", "ratio", 30, 5, **ctr),
        ],
    )
    b = plan_view(
        "nl_taste",
        [
            plan_feature("last_query_10m", "last", 10, 1, "query", "event_type = 'search'"),
            plan_feature("categories_60m", "distinct_count", 60, 5, "category"),
            plan_feature("top_categories_60m", "top_k", 60, 5, "category", k=3),
        ],
    )
    if slide_s is not None:
        return [
            v.model_copy(update={"features": [f.model_copy(update={"slide_s": slide_s}) for f in v.features]})
            for v in (a, b)
        ]
    return [a, b]


def item_views() -> list[PlanView]:
    """One view keyed by item_id (events are keyed by user_id: computed behind a repartition)."""
    ctr = dict(
        numerator=PlanOperand(agg="count", field=None, where=plan_where("event_type = 'click'")),
        denominator=PlanOperand(agg="count", field=None, where=plan_where("event_type = 'impression'")),
    )
    return [
        nearline_views()[0].model_copy(
            update={
                "name": "nl_item",
                "entity": "item",
                "join_key": "item_id",
                "features": [
                    plan_feature("item_impressions_10m", "count", 10, 1, flt="event_type = 'impression'"),
                    plan_feature("item_position_avg_30m", "avg", 30, 5, "position"),
                    plan_feature("item_users_30m", "distinct_count", 30, 5, "user_id"),
                    plan_feature("item_ctr_30m", "ratio", 30, 5, **ctr),
                ],
            }
        )
    ]


def write_plan(
    state_dir: Path, slide_s: int | None = None, with_items: bool = False, topic: str = "events"
) -> TierPlan:
    """Write a nearline plan with :func:`nearline_views` (and :func:`item_views`) where apply would.

    The views read the example behaviour source, its topic renamed to ``topic``.
    """
    views = nearline_views(slide_s) + (item_views() if with_items else [])
    digest = hashlib.sha256(str([v.model_dump() for v in views]).encode()).hexdigest()
    plan = TierPlan(
        schema_version=SCHEMA_VERSION,
        tier="nearline",
        registry_hash=f"sha256:{digest}",
        generated_at="2026-01-01T00:00:00+00:00",
        tier_spec={},
        entities={"user": "user_id", "item": "item_id"} if with_items else {"user": "user_id"},
        sources=[example_source("events", topic)],
        views=views,
    )
    return _write(state_dir, plan)


def example_plan(topics: dict[str, str] | None = None) -> TierPlan:
    """The example repo's nearline plan (every source, every view), source topics renamed."""
    result = example_check()
    plan = build_plans(result, registry_hash(result))["nearline"]
    names = topics or {}
    sources = [s.model_copy(update={"topic": names.get(s.name, s.topic)}) for s in plan.sources]
    return plan.model_copy(update={"sources": sources})


def write_example_plan(state_dir: Path, topics: dict[str, str]) -> TierPlan:
    """Write :func:`example_plan` where apply would."""
    return _write(state_dir, example_plan(topics))


def _write(state_dir: Path, plan: TierPlan) -> TierPlan:
    path = plan_path(state_dir, "nearline")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(plan.model_dump_json(), encoding="utf-8")
    return plan


@dataclass
class Env:
    """One test's isolated world: topics, group, Redis namespace, folders."""

    settings: Settings
    tmp: Path
    group: str = field(default_factory=lambda: f"nl-{uuid.uuid4().hex[:10]}")
    namespace: str = field(default_factory=lambda: f"t{uuid.uuid4().hex[:8]}")
    partitions: int = 4
    topics: dict[str, str] = field(default_factory=dict)
    """Source name -> this test's topic for it (``settings.events_topic`` is the behaviour source's)."""
    extra_env: dict[str, str] = field(default_factory=dict)
    """Added to the workers' environment (the benchmark's baseline runs: another PYTHONPATH)."""

    @property
    def store_dir(self) -> Path:
        return self.tmp / "stores"

    def _topics(self, sources: tuple[str, ...]) -> None:
        suffix = uuid.uuid4().hex[:10]
        self.topics = {name: f"nl-{name}-{suffix}" for name in sources}
        self.settings = dataclasses.replace(
            self.settings,
            events_topic=self.topics["events"],
            dlq_topic=f"nl-dlq-{suffix}",
            partitions=self.partitions,
        )
        wanted = {t: {} for t in self.topics.values()}
        ensure_topics(self.settings, {**wanted, self.settings.dlq_topic: {}}, self.partitions)

    def create(self, slide_s: int | None = None, with_items: bool = False) -> None:
        """Topics for the behaviour source and the dead letters; a plan of the hand-written views."""
        self._topics(("events",))
        write_plan(self.tmp, slide_s, with_items, topic=self.settings.events_topic)

    def create_example(self) -> TierPlan:
        """Topics for every example source and the dead letters; the example repo's nearline plan."""
        self._topics(tuple(sorted(example_check().sources)))
        return write_example_plan(self.tmp, self.topics)

    def env(self) -> dict[str, str]:
        # No topic of a source here: the tier reads them from the plan (HEADWATER_EVENTS_TOPIC is
        # removed, so a tier that still read it would consume the default `events` topic, not ours).
        env = {k: v for k, v in os.environ.items() if k != "HEADWATER_EVENTS_TOPIC"}
        return {
            **env,
            "HEADWATER_KAFKA_BOOTSTRAP": self.settings.kafka_bootstrap,
            "HEADWATER_REDIS_URL": self.settings.redis_url,
            "HEADWATER_DLQ_TOPIC": self.settings.dlq_topic,
            **self.extra_env,
        }

    def start(
        self,
        idle_exit_s: float = 6.0,
        max_poll: int = 2000,
        processes: int = 1,
        *extra: str,
        store_dir: Path | None = None,
        env: dict[str, str] | None = None,
    ) -> subprocess.Popen[bytes]:
        """Start a worker process (``store_dir``: its own state folder, like another host; ``env``: added)."""
        cmd = [
            sys.executable,
            "-m",
            "headwater.cli.nearline",
            "--state-dir",
            str(self.tmp),
            "--store-dir",
            str(store_dir or self.store_dir),
            "--group",
            self.group,
            "--namespace",
            self.namespace,
            "--max-poll-records",
            str(max_poll),
            "--idle-exit",
            str(idle_exit_s),
            "--processes",
            str(processes),
            "--session-timeout-ms",
            "6000",
            *extra,
        ]
        log = open(self.tmp / f"worker-{uuid.uuid4().hex[:6]}.log", "wb")  # noqa: SIM115
        return subprocess.Popen(cmd, env={**self.env(), **(env or {})}, stdout=log, stderr=subprocess.STDOUT)

    def committed(self, topic: str | None = None) -> int:
        """Offsets the group committed on ``topic`` (default: the behaviour source's topic)."""
        topic = topic or self.settings.events_topic
        admin = KafkaAdminClient(bootstrap_servers=self.settings.kafka_bootstrap)
        try:
            offsets = admin.list_group_offsets(self.group).get(self.group, {})
        except (CoordinatorNotAvailableError, CoordinatorLoadInProgressError, NotCoordinatorError):
            return 0  # a fresh broker creates __consumer_offsets on the first group's request
        finally:
            admin.close()
        return sum(o.offset for tp, o in offsets.items() if tp.topic == topic)

    def cleanup(self) -> None:
        admin = KafkaAdminClient(bootstrap_servers=self.settings.kafka_bootstrap)
        try:
            existing = set(admin.list_topics())
            mine = [*self.topics.values(), self.settings.dlq_topic]
            mine += [t for t in existing if t.startswith(f"{self.group}-")]
            admin.delete_topics([t for t in mine if t in existing])
        except Exception:
            pass
        finally:
            admin.close()
        store = OnlineStore.from_url(self.settings.redis_url, namespace=self.namespace)
        for key in store.client.scan_iter(match=f"{self.namespace}:*", count=1000):
            store.client.unlink(key)
        store.close()


def produce(
    settings: Settings,
    n: int,
    seed: int,
    start_ms: int | None = None,
    only_partitions: int | None = None,
    **cfg: Any,
) -> int:
    """Produce ``n`` generator emissions (with late, out-of-order, duplicate and malformed ones).

    ``only_partitions``: send to partitions ``0 .. only_partitions - 1`` only (crc32 of the key),
    leaving the topic's other partitions without a record.
    """
    codec = EventCodec()
    gen_cfg = GeneratorConfig(
        seed=seed,
        rate=cfg.pop("rate", 25.0),
        users=cfg.pop("users", 150),
        **({"start_ms": start_ms} if start_ms else {}),
        **cfg,
    )
    gen = EventGenerator(gen_cfg, codec)
    producer = KafkaProducer(bootstrap_servers=settings.kafka_bootstrap, linger_ms=20, acks="all")
    last = 0

    def part(key: bytes) -> int | None:
        return None if only_partitions is None else zlib.crc32(key) % only_partitions

    for em in gen.take(n):
        headers = codec.headers()
        if em.event is not None:
            key = em.event["user_id"].encode()
            producer.send(
                settings.events_topic,
                key=key,
                value=codec.encode(em.event),
                headers=headers,
                partition=part(key),
            )
        elif em.malformed is not None:
            producer.send(
                settings.events_topic,
                key=b"malformed",
                value=em.malformed.value,
                headers=list(em.malformed.headers) + headers[1:],
                partition=part(b"malformed"),
            )
        last = em.sim_time_ms
    producer.flush()
    producer.close()
    return last


def list_topics(settings: Settings) -> list[str]:
    """Every topic of the broker."""
    admin = KafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap)
    try:
        return list(admin.list_topics())
    finally:
        admin.close()


def read_topic(settings: Settings, topic: str) -> Iterator[Any]:
    """Every committed record of ``topic`` (all partitions, offset order within each).

    ``read_committed``: the nearline tier writes its dead letters, changelogs and repartition topics
    in transactions (``fence.py``); an aborted batch is not there. Read up to each partition's end by
    position (transaction markers take offsets no record has).
    """
    consumer = KafkaConsumer(
        bootstrap_servers=settings.kafka_bootstrap, enable_auto_commit=False, isolation_level="read_committed"
    )
    try:
        tps = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or []]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        end = consumer.end_offsets(tps)
        left = {tp for tp in tps if consumer.position(tp) < end[tp]}
        while left:
            for recs in consumer.poll(timeout_ms=1000).values():
                yield from recs
            left = {tp for tp in left if consumer.position(tp) < end[tp]}
    finally:
        consumer.close()


def produce_payments(
    settings: Settings, topic: str, n: int, seed: int, start_ms: int = 1_767_225_600_000
) -> int:
    """Produce ``n`` records of the example payments source to ``topic``, keyed by ``account_id``.

    Mean gap 200 ms of event time (``occurred_at`` in MICROseconds, with a sub-ms part); among
    them, by a seeded draw: out of order (up to 2.5 s behind, some beyond the source's 2 s), late
    (40 s to 3 min behind: beyond its 30 s lateness), duplicates (an earlier record sent again),
    invalid (a negative amount, a risk score above 1: rules of the source) and corrupt bytes.
    Return the last event time in ms.
    """
    rng = random.Random(seed)
    codec = EventCodec(example_source("payments", topic))
    accounts = [f"acct-{i:04d}" for i in range(300)]
    merchants = [f"m-{i:03d}" for i in range(40)]
    statuses = ["authorized", "captured", "declined", "refunded"]
    producer = KafkaProducer(bootstrap_servers=settings.kafka_bootstrap, linger_ms=20, acks="all")
    clock_us = start_ms * 1000
    sent: list[tuple[bytes | None, bytes]] = []
    for i in range(n):
        clock_us += int(rng.expovariate(1 / 200_000))
        draw = rng.random()
        if draw < 0.02 and sent:
            key, value = rng.choice(sent[-500:])  # a retried delivery: same payment_id, same bytes
            producer.send(topic, key=key, value=value, headers=codec.headers())
            continue
        if draw < 0.025:
            producer.send(topic, key=b"corrupt", value=rng.randbytes(12), headers=codec.headers())
            continue
        t_us = clock_us
        if draw < 0.08:
            t_us -= rng.randint(0, 2_500_000)  # out of order, a few beyond max_out_of_orderness
        elif draw < 0.09:
            t_us -= rng.randint(40_000_000, 180_000_000)  # late
        event: dict[str, Any] = {
            "payment_id": f"pay-{seed}-{i:07d}",
            "account_id": rng.choice(accounts),
            "merchant_id": merchants[min(int(rng.paretovariate(1.2)) - 1, len(merchants) - 1)],
            "method": rng.choice(["card", "card", "wallet", "bank_transfer"]),
            "status": rng.choices(statuses, weights=[20, 60, 15, 5])[0],
            "amount": round(rng.uniform(1, 500), 2),
            "currency": "EUR",
            "risk_score": None if rng.random() < 0.2 else round(rng.random(), 4),
            "occurred_at": t_us,
        }
        if draw > 0.995:
            event["amount"] = -1.0  # breaks the rule `amount >= 0`: invalid_field
        elif draw > 0.99:
            event["risk_score"] = 1.5  # breaks the rule on risk_score
        key, value = codec.key(event), codec.encode(event)
        sent.append((key, value))
        producer.send(topic, key=key, value=value, headers=codec.headers())
    producer.flush()
    producer.close()
    return clock_us // 1000


def window_event(source: PlanSource, decoded: DecodedEvent) -> dict[str, Any]:
    """The event as the window code reads it: ``event_time`` in UTC ms, ``event_id`` its identity.

    Written here, not imported from the tier, so the oracle does not share the tier's code.
    """
    assert source.event_id is not None
    return {
        **decoded.event,
        "event_time": decoded.event_time_ms,
        "event_id": str(decoded.event[source.event_id]),
    }


@dataclass
class Expected:
    """What the nearline tier must have computed from one source: accepted events per partition."""

    accepted: dict[int, list[dict[str, Any]]]
    late: int
    malformed: int
    partition_of: dict[str, int]
    source: PlanSource = BEHAVIOUR


def expected(settings: Settings, source: PlanSource = BEHAVIOUR, topic: str | None = None) -> Expected:
    """Decode ``topic`` (default: ``settings.events_topic``) with ``source``'s codec; apply its lateness.

    Every event lies in the past, so the tier's wall-clock cap on the watermark never applies.
    """
    topic = topic or settings.events_topic
    codec = EventCodec(source)
    per_part: dict[int, list[dict[str, Any]]] = {}
    malformed = 0
    for rec in sorted(read_topic(settings, topic), key=lambda r: (r.partition, r.offset)):
        d = codec.decode(rec.value, rec.headers)
        if isinstance(d, DecodedEvent):
            per_part.setdefault(rec.partition, []).append(window_event(source, d))
        else:
            malformed += 1
    now_ms = int(time.time() * 1000)
    accepted, late, owner = {}, 0, {}
    for p, evs in per_part.items():
        assert max(e["event_time"] for e in evs) < now_ms
        ok, bad = split_late(evs, source.max_out_of_orderness_ms, source.allowed_lateness_ms)
        accepted[p], late = ok, late + len(bad)
        if source.key is not None:
            owner.update({e[source.key]: p for e in ok})
    return Expected(accepted, late, malformed, owner, source)


def dlq_reasons(settings: Settings, topic: str | None = None, distinct: bool = False) -> dict[str, int]:
    """Dead letters by reason (only those of source topic ``topic``, when given).

    ``distinct`` counts each rejected record once by its source coordinates: the nearline tier sends
    dead letters before it commits (step 1 of its commit order), so a kill -9 between the two resends
    them on restart, at least once, never lost.
    """
    out: dict[str, int] = {}
    seen: set[tuple[str, int, int]] = set()
    for rec in read_topic(settings, settings.dlq_topic):
        dead = parse_dead_letter(rec.value, rec.key, rec.headers)
        where = (dead.source_topic, dead.source_partition, dead.source_offset)
        if (topic is None or dead.source_topic == topic) and not (distinct and where in seen):
            seen.add(where)
            out[dead.reason] = out.get(dead.reason, 0) + 1
    return out


def compare_online(env: Env, exp: Expected) -> int:
    """Assert the user views' vectors equal the reference at each partition boundary; return rows checked."""
    return compare_views(env, [compile_view(v) for v in nearline_views()], exp)


def compare_items(env: Env, exp: Expected) -> int:
    """Assert the item view's vectors equal the reference over every partition's events at the boundary
    of the slowest partition (the repartitioned watermark); return rows checked."""
    return compare_views(env, [compile_view(v) for v in item_views()], exp)


def compare_views(env: Env, specs: list[ViewSpec], exp: Expected) -> int:
    """Assert each view's online vectors equal the reference; return rows checked.

    A view keyed by the source's key is checked per partition at that partition's boundary; any
    other view (behind a repartition) over every partition's events at the boundary of the
    slowest partition (the repartitioned watermark).
    """
    reg_hash = TierPlan.model_validate_json(plan_path(env.tmp, "nearline").read_text()).registry_hash
    store = OnlineStore.from_url(env.settings.redis_url, namespace=env.namespace)
    dictionary = RedisDictionary(store.client, namespace=env.namespace)
    ooo = exp.source.max_out_of_orderness_ms
    checked = 0
    try:
        for spec in specs:
            if spec.join_key == exp.source.key:
                for evs in exp.accepted.values():
                    boundary = (max(e["event_time"] for e in evs) - ooo) // spec.tick_ms * spec.tick_ms
                    checked += _compare_entities(spec, evs, boundary, store, dictionary, reg_hash)
                continue
            every = [e for evs in exp.accepted.values() for e in evs]
            wm = min(max(e["event_time"] for e in evs) for evs in exp.accepted.values()) - ooo
            boundary = wm // spec.tick_ms * spec.tick_ms
            checked += _compare_entities(spec, every, boundary, store, dictionary, reg_hash)
    finally:
        store.close()
    return checked


def _compare_entities(
    spec: ViewSpec,
    evs: list[dict[str, Any]],
    boundary: int,
    store: OnlineStore,
    dictionary: RedisDictionary,
    reg_hash: str,
) -> int:
    layout = view_layout(spec)
    checked = 0
    ref = reference_values(spec, evs, boundary)
    entities = sorted({e[spec.join_key] for e in evs if e.get(spec.join_key) is not None})
    got = store.read_batch(layout, entities)
    empty = list(empty_values(spec).values())
    rows = [list(ref[u].values()) if u in ref else empty for u in entities]
    want = to_vectors(spec, rows, dictionary.ids)
    for i, u in enumerate(entities):
        if not got.found[i]:
            assert u not in ref, f"{spec.name}: no online value for {u}"
            continue
        # every live entity is re-written at each new boundary (--refresh-unchanged); one whose
        # state emptied keeps the (empty) value of the boundary it emptied at
        if u in ref:
            assert got.event_time_ms[i] == boundary, (spec.name, u, got.event_time_ms[i], boundary)
        else:
            assert got.event_time_ms[i] <= boundary, (spec.name, u, got.event_time_ms[i], boundary)
        np.testing.assert_allclose(
            got.values[i], want[i], rtol=1e-6, atol=1e-6, err_msg=f"{spec.name} entity {u} at {boundary}"
        )
        checked += 1
    return checked
