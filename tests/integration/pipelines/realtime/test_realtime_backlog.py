"""A job that starts on a backlog spread over partitions dead-letters no on-time event as late.

The chaos soak's realtime restarts (a kill -9, then a restore with minutes of backlog) sent 127,288
on-time events to the DLQ as ``late`` where 18,027 were due. Here: 4 partitions, each holding 300 s of
event time in order (a whole partition fits one default 1 MiB fetch), read from the start by one job.
Every event is within the allowed lateness of its own partition, so none may be late. This holds with
Kafka's default fetch size as well as a 64 KiB one (both runs passed, 2026-12-02): the source keeps a
watermark per partition, so reading one partition's backlog ahead of another's is not the soak's cause.
What is left to test: a split marked idle (``scan.watermark.idle-timeout``, 5 s) while a slow,
loaded job works through the other's backlog, and a restore from a checkpoint at parallelism 2.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import NewTopic

from headwater.pipelines.events.codec import EventCodec
from headwater.registry.plans import TierPlan

from .conftest import JobProcess, Names, dead_letters, event, wait_for

PARTITIONS = 4
PER_PARTITION = 6_000
SPAN_MS = 300_000


def _committed(bootstrap: str, group: str, topic: str) -> int:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    try:
        parts = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        return sum(consumer.committed(tp) or 0 for tp in parts)
    finally:
        consumer.close()


def test_a_backlog_over_partitions_makes_no_event_late(
    plan: tuple[TierPlan, Path], kafka_bootstrap: str, redis_url: str, tmp_path: Path
) -> None:
    _, state = plan
    tag = uuid.uuid4().hex[:8]
    names = Names(f"test.rtb.{tag}", f"test.rtb.{tag}.dlq", f"hwtest{tag}")
    admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    admin.create_topics([NewTopic(names.topic, PARTITIONS, 1), NewTopic(names.dlq, 1, 1)])
    codec = EventCodec()
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all", linger_ms=20)
    for p in range(PARTITIONS):
        for i in range(PER_PARTITION):
            e = event(p * PER_PARTITION + i, f"u{p}-{i % 50}", "click", i * SPAN_MS // PER_PARTITION)
            producer.send(
                names.topic, codec.encode(e), key=codec.key(e), headers=codec.headers(), partition=p
            )
    producer.flush()
    producer.close()
    log = tmp_path / "job.log"
    job = JobProcess(state, names, tmp_path / "chk", log, redis_url=redis_url, extra=("--from-earliest",))
    try:
        total = PARTITIONS * PER_PARTITION
        group = f"g-{names.namespace}"
        wait_for(
            lambda: _committed(kafka_bootstrap, group, names.topic) >= total, 600, "the backlog read", log
        )
        time.sleep(3)  # the last checkpoint's dead-letter transaction commits with it
        letters = dead_letters(kafka_bootstrap, names.dlq, expected=1, timeout_s=5)
    finally:
        job.kill()
        admin.delete_topics([names.topic, names.dlq])
        admin.close()
    late = [d for d in letters if d.reason == "late"]
    assert late == [], f"{len(late)} of {len(letters)} dead letters are 'late'"
