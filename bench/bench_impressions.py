"""CPU per impression of the service's Kafka impressions producer, per Kafka client, and nothing lost.

Usage: .venv/bin/python bench/bench_impressions.py [--answers 2000] [--k 20] [--clients a,b]

For each client (``confluent``: librdkafka; ``kafka-python``), on a topic of its own (created and
deleted here) of the Kafka at ``HEADWATER_KAFKA_BOOTSTRAP``:

1. starts a :class:`~headwater.serving.feedback.FeedbackProducer` as ``headwater serve`` does and
   waits until it is connected;
2. builds ``--answers`` answers of ``--k`` impressions each (:func:`impression_events`, what the
   request path does; its CPU is reported apart) and offers them all at once, so the buffer holds
   them when
3. the producer is stopped at once (the service's shutdown): ``stop`` must send the whole buffer;
4. reads the topic's end offset: every impression must be there (``lost`` must be 0).

The process's CPU time (all threads: the sender thread and the client's own) from the first offer
to the end of ``stop``, divided by the impressions, is the producer's CPU per impression; times
``k`` it is the CPU one /v1/recommend answer costs the service. Writes bench/results/bench_impressions.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from kafka import KafkaConsumer, TopicPartition

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_serve import ROOT, create_topic, delete_topics

from headwater.pipelines.settings import Settings
from headwater.serving.feedback import FeedbackProducer, impression_events, kafka_sink_factory, new_request_id


def end_offset(bootstrap: str, topic: str) -> int:
    """Return the records in partition 0 of ``topic``."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap)
    tp = TopicPartition(topic, 0)
    try:
        return int(consumer.end_offsets([tp])[tp])
    finally:
        consumer.close()


def run_client(client: str, bootstrap: str, answers: int, k: int) -> dict[str, Any]:
    """Run steps 1-4 for one client."""
    topic = f"hwbench-impr-{uuid.uuid4().hex[:8]}"
    if not create_topic(bootstrap, topic):
        raise SystemExit(f"Kafka at {bootstrap} unreachable")
    try:
        producer = FeedbackProducer(
            topic, kafka_sink_factory(bootstrap, 5, client), max_buffer=answers * k + 10
        )
        producer.start()
        deadline = time.monotonic() + 60
        while not producer.connected and time.monotonic() < deadline:
            time.sleep(0.05)
        items = [f"b-i{i:06d}" for i in range(k)]
        t0 = time.process_time()
        built = [impression_events(new_request_id(), f"b-u{j % 5000:06d}", items) for j in range(answers)]
        build_cpu = time.process_time() - t0
        wall0, cpu0 = time.perf_counter(), time.process_time()
        offered = sum(producer.offer(events) for events in built)
        buffered = producer.buffered
        producer.stop(timeout_s=120.0)
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
        stored = end_offset(bootstrap, topic)
    finally:
        delete_topics(bootstrap, [topic])
    n = answers * k
    c = producer.counters
    return {
        "client": client,
        "impressions": n,
        "offered": offered,
        "buffered_at_stop": buffered,
        "sent": c.sent,
        "failed": c.failed,
        "dropped": c.dropped,
        "stored": stored,
        "lost": n - stored,
        "build_us_per_impression": round(build_cpu * 1e6 / n, 2),
        "producer_cpu_us_per_impression": round(cpu * 1e6 / n, 2),
        "producer_cpu_ms_per_answer": round(cpu * 1e3 / answers, 3),
        "wall_s": round(wall, 2),
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }


def main() -> None:
    """Run each client, print a line each, write the JSON."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--answers", type=int, default=2000)
    ap.add_argument("--k", type=int, default=20)
    ap.add_argument("--clients", default="confluent,kafka-python")
    ap.add_argument("--bootstrap", default=Settings.from_env().kafka_bootstrap)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "bench_impressions.json")
    args = ap.parse_args()
    runs = []
    for client in args.clients.split(","):
        r = run_client(client, args.bootstrap, args.answers, args.k)
        runs.append(r)
        print(f"{client:>12}: {r['producer_cpu_us_per_impression']} us CPU/impression"
              f" ({r['producer_cpu_ms_per_answer']} ms per answer of {args.k}), build"
              f" {r['build_us_per_impression']} us, {r['stored']}/{r['impressions']} in Kafka after stop"
              f" (buffered at stop {r['buffered_at_stop']}), lost {r['lost']}, load {r['load_avg_1m']}",
              flush=True)  # fmt: skip
    out = {
        "benchmark": "impressions",
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "runs": runs,
    }
    args.out.write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
