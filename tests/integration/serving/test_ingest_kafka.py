"""The push API on real Kafka, with the nearline tier behind it: a client retry storm counts each event once.

``headwater ingest serve`` runs as its own process over a state folder holding the example repo's
plan (topics renamed for the test). :class:`~headwater.client.ingest.IngestClient` pushes payments
over HTTP, and then the very same batches twice more (the storm: a client that never saw the
answers). The topic then holds every payment three times, on the partition murmur2 gives its key
(as ``events produce`` would), and the nearline tier's views of payments equal the reference
computed from the payments sent once: its dedup by event id (the ``payment_id``) absorbed the storm.
"""

from __future__ import annotations

import importlib.util
import random
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from kafka.partitioner.default import murmur2

from headwater.client import IngestClient
from headwater.pipelines.events.codec import DecodedEvent, EventCodec
from headwater.pipelines.settings import Settings
from headwater.pipelines.windows import compile_view
from headwater.registry.plans import TierPlan, build_plans, plan_path, registry_hash

pytestmark = pytest.mark.integration

_HARNESS = Path(__file__).parents[1] / "pipelines" / "nearline" / "harness.py"
_spec = importlib.util.spec_from_file_location("nl_harness_ingest", _HARNESS)
assert _spec is not None
assert _spec.loader is not None
h = importlib.util.module_from_spec(_spec)
sys.modules["nl_harness_ingest"] = h
_spec.loader.exec_module(h)


@pytest.fixture
def example(
    settings: Settings, kafka_bootstrap: str, redis_url: str, tmp_path: Path
) -> Iterator[tuple[h.Env, TierPlan]]:
    env = h.Env(settings=settings, tmp=tmp_path)
    plan = env.create_example()
    # the offline plan too: `ingest serve` reads the sources where `events produce --source` does
    result = h.example_check()
    offline = build_plans(result, registry_hash(result))["offline"]
    sources = [s.model_copy(update={"topic": env.topics.get(s.name, s.topic)}) for s in offline.sources]
    path = plan_path(tmp_path, "offline")
    path.write_text(offline.model_copy(update={"sources": sources}).model_dump_json(), encoding="utf-8")
    yield env, plan
    env.cleanup()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def server(example: tuple[h.Env, TierPlan]) -> Iterator[str]:
    env, _ = example
    port = _free_port()
    cmd = [
        str(Path(sys.executable).with_name("headwater")),
        "ingest", "serve", "--state-dir", str(env.tmp), "--port", str(port), "--rejects-to", "dlq",
        "--no-auth",
    ]  # fmt: skip
    log = open(env.tmp / "ingest.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(cmd, env=env.env(), stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        assert proc.poll() is None, (env.tmp / "ingest.log").read_text()
        time.sleep(0.3)
    yield url
    proc.terminate()
    proc.wait(timeout=30)


def payments(n: int, seed: int) -> list[dict[str, Any]]:
    """``n`` valid payments in event-time order over the last few minutes (occurred_at in microseconds)."""
    rng = random.Random(seed)
    start_us = (time.time_ns() // 1000) - n * 200_000 - 60_000_000
    return [
        {
            "payment_id": f"push-{seed}-{i:06d}",
            "account_id": f"acct-{rng.randrange(200):04d}",
            "merchant_id": f"m-{rng.randrange(30):03d}",
            "method": rng.choice(["card", "wallet", "bank_transfer"]),
            "status": rng.choice(["authorized", "captured", "declined"]),
            "amount": round(rng.uniform(1, 500), 2),
            "currency": "EUR",
            "risk_score": round(rng.random(), 4),
            "occurred_at": start_us + i * 200_000,
        }
        for i in range(n)
    ]


def test_retry_storm_counts_each_event_once(example: tuple[h.Env, TierPlan], server: str) -> None:
    env, plan = example
    topic = env.topics["payments"]
    sent = payments(1_500, seed=36)
    bad = {**sent[0], "payment_id": "push-bad", "amount": -3.0}
    with IngestClient(server, "payments", batch_size=250) as client:
        first = client.send([*sent, bad])
        for _ in range(2):  # the storm: the same batches again, same ids
            again = client.send(sent)
            assert {e.status for e in again} == {"accepted"}
    assert [e.status for e in first[:-1]] == ["accepted"] * len(sent)
    assert (first[-1].status, first[-1].field) == ("rejected", "amount")

    # the topic: every payment three times, each on the partition murmur2 gives its key
    source = h.example_source("payments", topic)
    codec = EventCodec(source)
    counts: Counter[str] = Counter()
    for rec in h.read_topic(env.settings, topic):
        decoded = codec.decode(rec.value, rec.headers)
        assert isinstance(decoded, DecodedEvent)
        counts[decoded.event["payment_id"]] += 1
        key = decoded.event["account_id"].encode()
        assert rec.key == key
        assert rec.partition == (murmur2(key) & 0x7FFFFFFF) % env.partitions
    assert counts == Counter({p["payment_id"]: 3 for p in sent})
    assert h.dlq_reasons(env.settings, topic) == {"invalid_field": 1}

    # the nearline tier: its payments views equal the reference over the payments sent once
    proc = env.start(8.0, 2000, 1, "--source", "payments")
    assert proc.wait(timeout=240) == 0
    exp = h.expected(env.settings, source, topic)
    unique = {e["event_id"] for evs in exp.accepted.values() for e in evs}
    assert unique == {p["payment_id"] for p in sent}
    specs = [compile_view(v) for v in plan.views if v.source == "payments"]
    assert specs
    assert h.compare_views(env, specs, exp) >= 25
