"""A backlog over partitions, a kill -9 and a restore: the late letters are exactly the nearline rule's.

Issue 16. The chaos soak's realtime restarts (a kill -9, then a restore with minutes of backlog over 4
partitions on 2 subtasks) dead-lettered 127,288 events as ``late`` where 18,027 were due, and CI once
missed the one late event of test_realtime_job.py: the verdict was Flink's ``CURRENT_WATERMARK``,
periodic (a burst is read before it moves), global over the splits (a partition behind the others held
it back), idle-aware and not checkpointed (a restored job started without one). Now it is the JVM's
``LateCheck``: per partition, in offset order, against the partition's greatest accepted event time,
checkpointed; the same function of the stream as the nearline tier's, which
:func:`~headwater.pipelines.events.timing.late_verdicts` computes here.

The script, at parallelism 2 (4 partitions on 2 subtasks): each partition holds its own stretch of event
time (partitions 200 s apart, so a watermark global over them differs from each one's horizon by more
than the lateness), mostly in order, with events out of order within the lateness, some exactly at the
horizon, and some far behind. The first half is read as a backlog (``--from-earliest``) up to a
checkpoint; the second half starts with an event far behind in every partition, is sent, and the job
is killed with SIGKILL whenever that lands (before, during or after it is read: the verdicts may not
depend on it), then restored from its checkpoint. The committed dead letters (``read_committed``: the
killed job's open transaction is aborted and its letters written again by the restored job) are exactly
the reference's late records, each once, and nothing else.
"""

from __future__ import annotations

import random
import time
import uuid
from pathlib import Path
from typing import Any

import redis
from kafka import KafkaAdminClient, KafkaProducer
from kafka.admin import NewTopic

from headwater.pipelines.events.codec import EventCodec
from headwater.pipelines.events.timing import SourceTiming, late_verdicts
from headwater.registry.plans import TierPlan

from .conftest import T0, JobProcess, Names, committed, dead_letters, event, wait_for

PARTITIONS = 4
HALF = 400
"""Records per partition in each half."""
OOO, LATENESS = 5_000, 60_000
TIMING = SourceTiming(OOO, LATENESS, max_future_ms=300_000)  # max_future is not part of the late rule
"""The behaviour events' max out-of-orderness and allowed lateness (features/sources.yaml)."""


def script(rnd: random.Random) -> list[list[tuple[int, bool]]]:
    """Per partition, its records' (event time offset from T0 ms, second half) in offset order."""
    out = []
    for p in range(PARTITIONS):
        clock, rows = p * 200_000, []
        for i in range(2 * HALF):
            second = i >= HALF
            clock += 250
            roll = rnd.random()
            if i == HALF:  # the first record after the restore: far behind the checkpointed greatest time
                t = clock - 90_000
            elif roll < 0.04:
                t = clock - rnd.randrange(OOO + LATENESS + 1, 150_000)  # far behind
            elif roll < 0.06:
                t = clock - OOO - LATENESS - rnd.choice((0, 1))  # at the horizon, or 1 ms past it
            elif roll < 0.2:
                t = clock - rnd.randrange(0, OOO + LATENESS - 1_000)  # out of order, within the lateness
            else:
                t = clock
            rows.append((t, second))
        out.append(rows)
    return out


def send(producer: KafkaProducer, codec: EventCodec, topic: str, rows: list[tuple[int, int, int]]) -> None:
    for p, i, t in rows:
        e: dict[str, Any] = event(p * 10_000 + i, f"u{p}-{i % 20}", "click", t)
        producer.send(topic, codec.encode(e), key=codec.key(e), headers=codec.headers(), partition=p)
    producer.flush()


def test_a_restored_job_at_parallelism_2_dead_letters_exactly_the_nearline_late_records(
    plan: tuple[TierPlan, Path], kafka_bootstrap: str, redis_url: str, tmp_path: Path
) -> None:
    _, state = plan
    tag = uuid.uuid4().hex[:8]
    names = Names(f"test.rtb.{tag}", f"test.rtb.{tag}.dlq", f"hwtest{tag}")
    admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    admin.create_topics([NewTopic(names.topic, PARTITIONS, 1), NewTopic(names.dlq, 1, 1)])
    codec = EventCodec()
    parts = script(random.Random(16))
    rows = [(p, i, t, second) for p, part in enumerate(parts) for i, (t, second) in enumerate(part)]
    first = [(p, i, t) for p, i, t, second in rows if not second]
    second = [(p, i, t) for p, i, t, second in rows if second]
    now = int(time.time() * 1000)
    want = sorted(
        (p, i)
        for p, part in enumerate(parts)
        for i, late in enumerate(late_verdicts([(p, T0 + t, now) for t, _ in part], TIMING))
        if late
    )
    assert sum(1 for _, i in want if i == HALF) == PARTITIONS  # every partition's first record after the kill
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all", linger_ms=20)
    log, chk = tmp_path / "job.log", tmp_path / "chk"
    extra = ("--from-earliest", "--parallelism", "2")
    group = f"g-{names.namespace}"
    job = None
    try:
        send(producer, codec, names.topic, first)
        job = JobProcess(state, names, chk, log, redis_url=redis_url, extra=extra)
        # committed at a completed checkpoint: its state holds every partition's greatest time of the half
        wait_for(lambda: committed(kafka_bootstrap, group, names.topic, PARTITIONS) >= len(first), 300,
                 "the first half read and checkpointed", log)  # fmt: skip
        send(producer, codec, names.topic, second)
        job.kill()
        job = JobProcess(state, names, chk, log, redis_url=redis_url, extra=extra)
        total = len(first) + len(second)
        wait_for(lambda: committed(kafka_bootstrap, group, names.topic, PARTITIONS) >= total, 300,
                 "the second half read after the restore", log)  # fmt: skip
        letters = dead_letters(kafka_bootstrap, names.dlq, expected=len(want), timeout_s=120)
    finally:
        if job is not None:
            job.kill()
        producer.close()
        admin.delete_topics([names.topic, names.dlq])
        admin.close()
        client = redis.Redis.from_url(redis_url)
        keys = list(client.scan_iter(match=f"{names.namespace}:*", count=1000))
        if keys:
            client.delete(*keys)
        client.close()
    assert {d.reason for d in letters} <= {"late"}, sorted({(d.reason, d.detail) for d in letters})[:5]
    got = sorted((d.source_partition, d.source_offset) for d in letters)
    missing, extra_letters = sorted(set(want) - set(got)), sorted(set(got) - set(want))
    assert (missing, extra_letters) == ([], []), f"{len(want)} due, {len(got)} letters"
    assert got == want  # each once: the killed job's uncommitted letters were written again, not twice
