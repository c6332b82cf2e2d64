"""Push API throughput: events/s of one `headwater ingest serve` process and p99 acknowledgement latency.

Usage: .venv/bin/python bench/bench_ingest.py [--events N] [--batch B] [--concurrency C] [--stream-batches S]

The same N payment rows (JSON Lines, all valid) go to Kafka two ways, each into a fresh topic
``bench.ingest-*`` (4 partitions, created and deleted here), each checked against the topic's
offsets (stored = sent):

1. ``events produce --from``: the file through ``produce_file`` with the CLI's producer settings
   (kafka-python, acks=all, idempotent), one process;
2. HTTP: ``headwater ingest serve`` as its own process (its state folder holds the example plan,
   the payments topic renamed), and C client threads in this process posting JSON arrays of B
   events. An event's acknowledgement latency is its request's (the answer comes when the broker
   acknowledged every event of the batch, acks=all);
3. gRPC streaming: the same server's ``Ingest/Ingest``, C threads each sending client streams of
   S batches of B events; an event's latency runs from its batch leaving the client to the answer.

Prints a table and writes bench/results/ingest.json (with the machine's load: the figures move
with it).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import orjson
from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition
from kafka.admin import NewTopic

from headwater.pipelines.events.ingest import RejectFile, produce_file
from headwater.pipelines.events.producer import ProducerSettings, open_producer
from headwater.pipelines.events.readers import open_rows
from headwater.pipelines.events.sources import example_sources
from headwater.pipelines.settings import Settings
from headwater.registry.plans import build_plans, plan_path, registry_hash
from headwater.registry.validate import check_repo

PARTITIONS = 4
RESULTS = Path(__file__).resolve().parent / "results" / "ingest.json"


def payments(n: int) -> list[dict[str, Any]]:
    """``n`` valid payments over the last ``n`` * 10 ms (occurred_at in microseconds)."""
    start_us = time.time_ns() // 1000 - n * 10_000 - 60_000_000
    return [
        {
            "payment_id": f"bench-{i:08d}",
            "account_id": f"acct-{i % 5000:05d}",
            "merchant_id": f"m-{i % 40:03d}",
            "method": "card",
            "status": "captured",
            "amount": 10.0 + i % 100,
            "currency": "EUR",
            "risk_score": 0.25,
            "occurred_at": start_us + i * 10_000,
        }
        for i in range(n)
    ]


def _topic(admin: KafkaAdminClient) -> str:
    name = f"bench.ingest-{uuid.uuid4().hex[:8]}"
    admin.create_topics([NewTopic(name, PARTITIONS, 1)])
    return name


def stored(bootstrap: str, topic: str) -> int:
    """Return the records on ``topic`` (the sum of its partitions' end offsets)."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap)
    try:
        parts = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        return sum(consumer.end_offsets(parts).values())
    finally:
        consumer.close()


def produce_from_file(bootstrap: str, topic: str, path: Path, rejects: Path) -> dict[str, Any]:
    """``events produce --source payments --from FILE``, in process, with the CLI's settings."""
    source = next(s for s in example_sources() if s.name == "payments")
    target = ProducerSettings(bootstrap=bootstrap, topic=topic, rate=0.0)
    kafka = open_producer(target)
    sink = RejectFile(rejects)
    cpu, started = time.process_time(), time.monotonic()
    with open_rows(path, None) as reader:
        stats = produce_file(kafka, source, reader, sink, topic=topic)
    elapsed, cpu = time.monotonic() - started, time.process_time() - cpu
    sink.close()
    kafka.close(timeout=10)
    return {
        "case": "events produce --from (kafka-python)",
        "sent": stats.sent,
        "elapsed_s": elapsed,
        "cpu_s": cpu,
    }


def write_state(state: Path, topic: str) -> None:
    """Write the example repo's offline plan, payments topic renamed (`ingest serve` reads sources there)."""
    from headwater.pipelines.events.schema import example_repo

    result = check_repo(example_repo())
    plan = build_plans(result, registry_hash(result))["offline"]
    sources = [s.model_copy(update={"topic": topic}) if s.name == "payments" else s for s in plan.sources]
    path = plan_path(state, "offline")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(plan.model_copy(update={"sources": sources}).model_dump_json(), encoding="utf-8")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(state: Path, bootstrap: str, grpc_port: int) -> tuple[subprocess.Popen[bytes], str]:
    """Start `headwater ingest serve` (REST, and gRPC on ``grpc_port``) and wait for its /health."""
    port = _free_port()
    cmd = [str(Path(sys.executable).with_name("headwater")), "ingest", "serve", "--state-dir", str(state)]
    env = {**os.environ, "HEADWATER_KAFKA_BOOTSTRAP": bootstrap}
    proc = subprocess.Popen([*cmd, "--port", str(port), "--grpc-port", str(grpc_port), "--no-auth"], env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.3)
    proc.kill()
    msg = "headwater ingest serve did not answer /health within 60 s"
    raise RuntimeError(msg)


def push_http(url: str, rows: list[dict[str, Any]], batch: int, concurrency: int) -> dict[str, Any]:
    """Post ``rows`` in batches from ``concurrency`` threads; events/s and per-event ack latency."""
    bodies = [orjson.dumps(rows[i : i + batch]) for i in range(0, len(rows), batch)]
    latencies: list[tuple[float, int]] = []
    errors: list[str] = []
    lock = threading.Lock()
    cursor = iter(range(len(bodies)))

    def worker() -> None:
        with httpx.Client(timeout=60, headers={"content-type": "application/json"}) as http:
            while True:
                with lock:
                    i = next(cursor, None)
                if i is None:
                    return
                t0 = time.perf_counter()
                reply = http.post(f"{url}/v1/sources/payments/events", content=bodies[i])
                took = time.perf_counter() - t0
                with lock:
                    if reply.status_code != 200:
                        errors.append(f"{reply.status_code}: {reply.text[:200]}")
                    latencies.append((took, min(batch, len(rows) - i * batch)))

    started = time.monotonic()
    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - started
    per_event = sorted(t for t, n in latencies for _ in range(n))
    return {
        "case": f"HTTP, JSON arrays of {batch}, {concurrency} client threads",
        "sent": len(per_event),
        "elapsed_s": elapsed,
        "ack_p50_ms": round(statistics.median(per_event) * 1000, 1),
        "ack_p99_ms": round(per_event[int(len(per_event) * 0.99) - 1] * 1000, 1),
        "errors": errors[:5],
    }


def push_grpc(
    target: str, rows: list[dict[str, Any]], batch: int, per_stream: int, concurrency: int
) -> dict[str, Any]:
    """Stream ``rows`` as client streams of ``per_stream`` batches from ``concurrency`` threads.

    An event's acknowledgement latency: from its batch leaving the client to the stream's answer.
    """
    import grpc

    from headwater.client.proto.headwater.v1 import ingest_pb2 as pb
    from headwater.client.proto.headwater.v1 import ingest_pb2_grpc as pb_grpc

    bodies = [orjson.dumps(rows[i : i + batch]) for i in range(0, len(rows), batch)]
    streams = [bodies[i : i + per_stream] for i in range(0, len(bodies), per_stream)]
    latencies: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()
    cursor = iter(range(len(streams)))

    def worker() -> None:
        with grpc.insecure_channel(target) as channel:
            stub = pb_grpc.IngestStub(channel)  # type: ignore[no-untyped-call]
            while True:
                with lock:
                    i = next(cursor, None)
                if i is None:
                    return
                sent_at: list[tuple[float, int]] = []

                def messages(chunk: list[bytes] = streams[i], sent: list[tuple[float, int]] = sent_at) -> Any:
                    for body in chunk:
                        sent.append((time.perf_counter(), body.count(b'"payment_id"')))
                        yield pb.IngestBatch(source="payments", body=body)

                answer = stub.Ingest(messages(), timeout=120)
                done = time.perf_counter()
                with lock:
                    if answer.rejected or answer.failed:
                        errors.append(f"rejected {answer.rejected}, failed {answer.failed}")
                    latencies.extend(done - t for t, n in sent_at for _ in range(n))

    started = time.monotonic()
    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - started
    per_event = sorted(latencies)
    return {
        "case": f"gRPC streams of {per_stream} x {batch}, {concurrency} client threads",
        "sent": len(per_event),
        "elapsed_s": elapsed,
        "ack_p50_ms": round(statistics.median(per_event) * 1000, 1),
        "ack_p99_ms": round(per_event[int(len(per_event) * 0.99) - 1] * 1000, 1),
        "errors": errors[:5],
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, default=50_000)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--stream-batches", type=int, default=10, help="Batches per gRPC stream.")
    args = parser.parse_args()
    load_at_start = [round(x, 2) for x in os.getloadavg()]
    bootstrap = Settings.from_env().kafka_bootstrap
    rows = payments(args.events)
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    topics: list[str] = []
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-ingest-") as tmp:
        path = Path(tmp) / "payments.jsonl"
        path.write_bytes(b"\n".join(orjson.dumps(r) for r in rows) + b"\n")
        try:
            topics.append(_topic(admin))
            run = produce_from_file(bootstrap, topics[-1], path, Path(tmp) / "rejects.jsonl")
            runs.append({**run, "stored": stored(bootstrap, topics[-1])})
            for protocol in ("http", "grpc"):
                topics.append(_topic(admin))
                write_state(Path(tmp) / "state", topics[-1])
                grpc_port = _free_port()
                proc, url = start_server(Path(tmp) / "state", bootstrap, grpc_port)
                try:
                    if protocol == "http":
                        run = push_http(url, rows, args.batch, args.concurrency)
                    else:
                        target = f"127.0.0.1:{grpc_port}"
                        run = push_grpc(target, rows, args.batch, args.stream_batches, args.concurrency)
                    runs.append({**run, "stored": stored(bootstrap, topics[-1])})
                finally:
                    proc.terminate()
                    proc.wait(timeout=30)
        finally:
            admin.delete_topics(topics)
            admin.close()
    print(f"{args.events:,} payments, one process each ({os.cpu_count()} CPUs, load {load_at_start}):")
    for run in runs:
        run["events_per_s"] = round(run["sent"] / run["elapsed_s"])
        run["elapsed_s"] = round(run["elapsed_s"], 3)
        ack = f"  ack p50 {run['ack_p50_ms']} ms p99 {run['ack_p99_ms']} ms" if "ack_p99_ms" in run else ""
        print(f"  {run['case']:<50} {run['events_per_s']:>8,} events/s  stored {run['stored']:,}{ack}")
    result = {
        "benchmark": "ingest",
        "command": f"bench/bench_ingest.py --events {args.events} --batch {args.batch} "
        f"--concurrency {args.concurrency} --stream-batches {args.stream_batches}",
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {
            "cpus": os.cpu_count(),
            "load_average_at_start": load_at_start,
            "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
            "python": platform.python_version(),
        },
        "events": args.events,
        "runs": runs,
    }
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {RESULTS}")
    bad = [r["case"] for r in runs if r["stored"] != r["sent"] or r.get("errors")]
    if bad:
        print(f"records sent and stored differ (or requests failed) for: {bad}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
