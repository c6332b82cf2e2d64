"""Probes the soak benchmark samples while the system runs: memory per component, consumer lag, counts.

Kept apart from ``bench_soak.py`` (the orchestration) so each file reads on its own. Everything here
talks to the real processes and services: ``/proc`` through psutil, Kafka through kafka-python.
"""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import psutil
from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition

from headwater.pipelines.events.codec import DeadLetter, parse_dead_letter


def tree_rss_mb(pid: int) -> float:
    """Resident memory of a process and all its descendants, in MB (0 when it is gone)."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0.0
    total = 0
    for proc in procs:
        try:
            total += proc.memory_info().rss
        except psutil.NoSuchProcess:
            continue
    return total / 1e6


def end_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    """Return the end offset of every partition of ``topic``."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False)
    try:
        parts = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())]
        return {tp.partition: off for tp, off in consumer.end_offsets(parts).items()}
    finally:
        consumer.close()


def group_lag(bootstrap: str, group: str, topic: str) -> int | None:
    """Return how many records of ``topic`` ``group`` has not committed (None before its first commit)."""
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="headwater-soak")
    try:
        committed = admin.list_group_offsets(group).get(group, {})
    finally:
        admin.close()
    mine = {tp.partition: meta.offset for tp, meta in committed.items() if tp.topic == topic}
    if not mine:
        return None
    ends = end_offsets(bootstrap, topic)
    return int(sum(end - max(mine.get(p, 0), 0) for p, end in ends.items()))


def dead_letters(bootstrap: str, topic: str) -> list[DeadLetter]:
    """Return the committed records of a dead-letter topic (every tier writes its own letters there).

    ``read_committed``: the nearline tier's dead letters are in its batches' transactions, the realtime
    tier's in its checkpoints' (exactly once), so no letter is read twice and none of an aborted
    transaction is read. Reads up to the end offsets (the last stable offset: an open transaction of a
    tier still running holds it back, so call this once the tiers stopped).
    """
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False, isolation_level="read_committed"
    )
    out: list[DeadLetter] = []
    try:
        parts = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())]
        if not parts:
            return []
        consumer.assign(parts)
        consumer.seek_to_beginning(*parts)
        ends = consumer.end_offsets(parts)
        while any(consumer.position(tp) < end for tp, end in ends.items()):
            for batch in consumer.poll(timeout_ms=1000).values():
                out += [parse_dead_letter(rec.value, rec.key, rec.headers) for rec in batch]
    finally:
        consumer.close()
    return out


def unstable_records(bootstrap: str, topic: str) -> int:
    """Return the records of ``topic`` past its last stable offset: held back by an open transaction."""
    ends = []
    for level in ("read_uncommitted", "read_committed"):  # high watermark, last stable offset
        consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, isolation_level=level)
        try:
            parts = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())]
            ends.append(sum(consumer.end_offsets(parts).values()) if parts else 0)
        finally:
            consumer.close()
    return ends[0] - ends[1]


def dead_letters_by_reason(bootstrap: str, topic: str) -> dict[str, int]:
    """Count the committed records of a dead-letter topic by reason (see :func:`dead_letters`)."""
    return dict(Counter(d.reason for d in dead_letters(bootstrap, topic)))


@dataclass
class MemoryTrack:
    """RSS samples of one component over the run, and whether it stayed flat."""

    samples: list[tuple[float, float]] = field(default_factory=list)
    """(seconds since start, MB)."""

    def add(self, t_s: float, mb: float) -> None:
        """Record one sample."""
        if mb > 0:
            self.samples.append((t_s, mb))

    def summary(self) -> dict[str, Any]:
        """Start/end/peak MB and the slope over the second half of the run (MB per minute).

        The first half holds the warm-up (JIT, caches, window state filling up to its longest window),
        so "flat" is judged on the second half only.
        """
        if len(self.samples) < 4:
            return {"samples": len(self.samples)}
        half = self.samples[len(self.samples) // 2 :]
        xs = [t / 60 for t, _ in half]
        ys = [mb for _, mb in half]
        slope = statistics.linear_regression(xs, ys).slope
        return {
            "samples": len(self.samples),
            "start_mb": round(self.samples[0][1], 1),
            "end_mb": round(self.samples[-1][1], 1),
            "min_mb": round(min(mb for _, mb in self.samples), 1),
            "peak_mb": round(max(mb for _, mb in self.samples), 1),
            "second_half_slope_mb_per_min": round(slope, 2),
            "flat": abs(slope) * 10 < 0.05 * max(ys),
        }
