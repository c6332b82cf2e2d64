"""Shared helpers of the nearline integration tests and the benchmark: plan, topics, events, oracle."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import subprocess
import sys
import uuid
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition

from headwater.pipelines.events.codec import DecodedEvent, EventCodec, parse_dead_letter
from headwater.pipelines.events.generator import EventGenerator, GeneratorConfig
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
from headwater.registry.plans import (
    SCHEMA_VERSION,
    PlanOperand,
    PlanSource,
    PlanView,
    TierPlan,
    plan_path,
)

OOO_S, LATENESS_S = 5.0, 60.0


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


def write_plan(state_dir: Path, slide_s: int | None = None, with_items: bool = False) -> TierPlan:
    """Write a nearline plan with :func:`nearline_views` (and :func:`item_views`) where apply would."""
    views = nearline_views(slide_s) + (item_views() if with_items else [])
    digest = hashlib.sha256(str([v.model_dump() for v in views]).encode()).hexdigest()
    plan = TierPlan(
        schema_version=SCHEMA_VERSION,
        tier="nearline",
        registry_hash=f"sha256:{digest}",
        generated_at="2026-01-01T00:00:00+00:00",
        tier_spec={},
        entities={"user": "user_id", "item": "item_id"} if with_items else {"user": "user_id"},
        sources=[
            PlanSource(
                name="events",
                topic="events",
                schema_path="schemas/behavior_event.avsc",
                schema_sha256="0" * 64,
                event_time="event_time",
                expected_rate_per_s=10,
                max_out_of_orderness_s=OOO_S,
                allowed_lateness_s=LATENESS_S,
            )
        ],
        views=views,
    )
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

    @property
    def store_dir(self) -> Path:
        return self.tmp / "stores"

    def create(self, slide_s: int | None = None, with_items: bool = False) -> None:
        suffix = uuid.uuid4().hex[:10]
        self.settings = dataclasses.replace(
            self.settings,
            events_topic=f"nl-events-{suffix}",
            dlq_topic=f"nl-dlq-{suffix}",
            partitions=self.partitions,
        )
        ensure_topics(
            self.settings, {self.settings.events_topic: {}, self.settings.dlq_topic: {}}, self.partitions
        )
        write_plan(self.tmp, slide_s, with_items)

    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "HEADWATER_KAFKA_BOOTSTRAP": self.settings.kafka_bootstrap,
            "HEADWATER_REDIS_URL": self.settings.redis_url,
            "HEADWATER_EVENTS_TOPIC": self.settings.events_topic,
            "HEADWATER_DLQ_TOPIC": self.settings.dlq_topic,
        }

    def start(
        self, idle_exit_s: float = 6.0, max_poll: int = 2000, processes: int = 1, *extra: str
    ) -> subprocess.Popen[bytes]:
        cmd = [
            sys.executable,
            "-m",
            "headwater.pipelines.nearline.cli",
            "--state-dir",
            str(self.tmp),
            "--store-dir",
            str(self.store_dir),
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
        return subprocess.Popen(cmd, env=self.env(), stdout=log, stderr=subprocess.STDOUT)

    def committed(self) -> int:
        admin = KafkaAdminClient(bootstrap_servers=self.settings.kafka_bootstrap)
        try:
            offsets = admin.list_group_offsets(self.group).get(self.group, {})
        finally:
            admin.close()
        return sum(o.offset for tp, o in offsets.items() if tp.topic == self.settings.events_topic)

    def cleanup(self) -> None:
        admin = KafkaAdminClient(bootstrap_servers=self.settings.kafka_bootstrap)
        try:
            existing = set(admin.list_topics())
            mine = [self.settings.events_topic, self.settings.dlq_topic, f"{self.group}-changelog"]
            mine += [t for t in existing if t.startswith(f"{self.group}-by-")]
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


def read_topic(settings: Settings, topic: str) -> Iterator[Any]:
    """Every record of ``topic`` (all partitions, offset order within each)."""
    consumer = KafkaConsumer(bootstrap_servers=settings.kafka_bootstrap, enable_auto_commit=False)
    try:
        tps = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or []]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        end = consumer.end_offsets(tps)
        left = {tp for tp in tps if end[tp] > 0}
        while left:
            for tp, recs in consumer.poll(timeout_ms=1000).items():
                yield from recs
                if recs and recs[-1].offset >= end[tp] - 1:
                    left.discard(tp)
    finally:
        consumer.close()


@dataclass
class Expected:
    """What the nearline tier must have computed: accepted events and boundary per partition."""

    accepted: dict[int, list[dict[str, Any]]]
    late: int
    malformed: int
    partition_of: dict[str, int]


def expected(settings: Settings) -> Expected:
    codec = EventCodec()
    per_part: dict[int, list[dict[str, Any]]] = {}
    malformed = 0
    for rec in sorted(read_topic(settings, settings.events_topic), key=lambda r: (r.partition, r.offset)):
        d = codec.decode(rec.value, rec.headers)
        if isinstance(d, DecodedEvent):
            per_part.setdefault(rec.partition, []).append(dict(d.event))
        else:
            malformed += 1
    accepted, late, owner = {}, 0, {}
    for p, evs in per_part.items():
        ok, bad = split_late(evs, int(OOO_S * 1000), int(LATENESS_S * 1000))
        accepted[p], late = ok, late + len(bad)
        owner.update({e["user_id"]: p for e in ok})
    return Expected(accepted, late, malformed, owner)


def dlq_reasons(settings: Settings) -> dict[str, int]:
    out: dict[str, int] = {}
    for rec in read_topic(settings, settings.dlq_topic):
        reason = parse_dead_letter(rec.value, rec.key, rec.headers).reason
        out[reason] = out.get(reason, 0) + 1
    return out


def compare_online(env: Env, exp: Expected) -> int:
    """Assert the user views' vectors equal the reference at each partition boundary; return rows checked."""
    return _compare(env, [compile_view(v) for v in nearline_views()], exp, items=False)


def compare_items(env: Env, exp: Expected) -> int:
    """Assert the item view's vectors equal the reference over every partition's events at the boundary
    of the slowest partition (the repartitioned watermark); return rows checked."""
    return _compare(env, [compile_view(v) for v in item_views()], exp, items=True)


def _compare(env: Env, specs: list[ViewSpec], exp: Expected, items: bool) -> int:
    reg_hash = TierPlan.model_validate_json(plan_path(env.tmp, "nearline").read_text()).registry_hash
    store = OnlineStore.from_url(env.settings.redis_url, namespace=env.namespace)
    dictionary = RedisDictionary(store.client, namespace=env.namespace)
    checked = 0
    try:
        for spec in specs:
            if not items:
                checked += _compare_view(env, spec, exp, store, dictionary, reg_hash)
                continue
            every = [e for evs in exp.accepted.values() for e in evs]
            wm = min(max(e["event_time"] for e in evs) for evs in exp.accepted.values()) - int(OOO_S * 1000)
            boundary = wm // spec.tick_ms * spec.tick_ms
            checked += _compare_entities(spec, every, boundary, store, dictionary, reg_hash)
    finally:
        store.close()
    return checked


def _compare_view(
    env: Env, spec: ViewSpec, exp: Expected, store: OnlineStore, dictionary: RedisDictionary, reg_hash: str
) -> int:
    checked = 0
    for evs in exp.accepted.values():
        boundary = (max(e["event_time"] for e in evs) - int(OOO_S * 1000)) // spec.tick_ms * spec.tick_ms
        checked += _compare_entities(spec, evs, boundary, store, dictionary, reg_hash)
    return checked


def _compare_entities(
    spec: ViewSpec,
    evs: list[dict[str, Any]],
    boundary: int,
    store: OnlineStore,
    dictionary: RedisDictionary,
    reg_hash: str,
) -> int:
    layout = view_layout(spec, reg_hash)
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
