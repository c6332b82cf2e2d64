"""Cluster profile benchmark (issue 19): realtime throughput, session cluster vs mini-cluster, one run.

Then (``--failures``) the recovery time of each failure test.

Throughput: the registry's realtime views of the behaviour source (``features/`` applied to a scratch
state) read a backlog of ``--events`` events (realistic templates from bench/bench_realtime.py, 4
partitions, on the cluster profile's 3-broker Kafka, RF 3) that was produced before the job starts
(``--from-earliest``, parallelism 2, checkpoints every 2 s). The figure is the drain rate: growth of
the job's committed offsets (committed at each checkpoint) per second, between the first commit
and the commit that reaches the backlog's end. Both targets read the same Kafka and write the same
single Redis (the sink writes to Redis Cluster too, tests/integration/cluster/test_cluster_redis.py;
one store for both keeps the comparison to the engine); only the Flink engine differs:
``mini``: `headwater run realtime` (local mini-cluster in the CLI's JVM); ``session``: the same with
``--jobmanager`` (JobManager + 2 TaskManagers of infra/cluster.sh, 1280m each, 2 slots).

Recovery (``--failures``): runs tests/integration/cluster (pytest -m cluster) with
HEADWATER_CLUSTER_FIGURES set; each test records the seconds from the failure to the job running
again / the values published / the Spark job done. ``--tests FILE,...`` runs only those test files
and keeps the other figures of the previous JSON (each entry carries its own load and time).

This 2-core machine is shared by other agents: the load averages are in the JSON next to the figures.
Needs `make cluster-up`. Usage: python bench/bench_cluster.py [--events 200000] [--failures]
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
HOST = os.environ.get("HEADWATER_HOST", "127.0.0.1")
KAFKA_BASE = int(os.environ.get("HEADWATER_KAFKA_CLUSTER_PORT", "19092"))
KAFKA = ",".join(f"{HOST}:{KAFKA_BASE + i}" for i in range(3))
JOBMANAGER = f"{HOST}:{os.environ.get('HEADWATER_FLINK_REST_PORT', '8281')}"
# Both jobs and the producers use the cluster profile's Kafka (set before Settings are read).
os.environ["HEADWATER_KAFKA_BOOTSTRAP"] = KAFKA

_spec = importlib.util.spec_from_file_location("bench_realtime", ROOT / "bench" / "bench_realtime.py")
assert _spec is not None
assert _spec.loader is not None
bench_realtime = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = bench_realtime
_spec.loader.exec_module(bench_realtime)


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def committed(group: str, topic: str) -> int:
    from kafka import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=KAFKA)
    try:
        offsets = admin.list_group_offsets(group).get(group, {})
        return sum(o.offset for tp, o in offsets.items() if tp.topic == topic and o.offset >= 0)
    finally:
        admin.close()


def end_offsets(topic: str) -> int:
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=KAFKA)
    try:
        parts = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or ()]
        return sum(consumer.end_offsets(parts).values())
    finally:
        consumer.close()


def drain(
    target: str, state: Path, work: Path, events: int, partitions: int, timeout_s: float
) -> dict[str, Any]:
    """Produce a backlog, start the job on ``target``, return its drain rate."""
    from kafka import KafkaAdminClient
    from kafka.admin import NewTopic

    from headwater.pipelines.settings import Settings

    tag = uuid.uuid4().hex[:8]
    topic, group, namespace = f"bench.cl.{tag}", f"bench-cl-{tag}", f"hwbcl{tag}"
    admin = KafkaAdminClient(bootstrap_servers=KAFKA)
    admin.create_topics([NewTopic(topic, partitions, 3), NewTopic(f"{topic}.dlq", 1, 3)])
    pieces, _, _ = bench_realtime.templates(5000, 2000, 60_000)
    rate, sent = 20_000.0, 0
    while sent < events:  # producers on a loaded machine send less than the rate: top up to the backlog
        got, _ = bench_realtime.run_phase(
            Settings.from_env(), topic, rate, (events - sent) / rate, f"{tag}{sent}", pieces, 10_000.0
        )
        sent += got["sent"]
    total = end_offsets(topic)
    cmd = [sys.executable, "-m", "headwater.cli.realtime", "--state-dir", str(state),
           "--checkpoint-dir", str(work / f"chk-{target}"), "--source", "events",
           "--topic", f"events={topic}",
           "--dlq-topic", f"{topic}.dlq", "--namespace", namespace, "--group-id", group,
           "--checkpoint-interval", "2", "--parallelism", "2", "--from-earliest"]  # fmt: skip
    if target == "session":
        cmd += ["--jobmanager", JOBMANAGER]
    log = work / f"job-{target}.log"
    load_start = load()
    started = time.monotonic()
    proc = subprocess.Popen(
        cmd, cwd=ROOT, stdout=log.open("ab"), stderr=subprocess.STDOUT, start_new_session=True
    )
    job_id = None
    rows: list[tuple[float, int]] = []
    try:
        while time.monotonic() - started < timeout_s:
            if target == "session" and job_id is None and proc.poll() is not None:
                found = re.search(r"realtime job ([0-9a-f]{32}) submitted", log.read_text(errors="replace"))
                if proc.returncode != 0 or not found:
                    sys.exit(f"submit failed; see {log}")
                job_id = found.group(1)
            if target == "mini" and proc.poll() is not None:
                sys.exit(f"the mini-cluster job exited ({proc.returncode}); see {log}")
            with contextlib.suppress(Exception):
                done = committed(group, topic)
                if not rows or rows[-1][1] != done:
                    rows.append((time.monotonic(), done))
                if done >= total:
                    break
            time.sleep(0.5)
    finally:
        if target == "session" and job_id:
            import urllib.request

            req = urllib.request.Request(f"http://{JOBMANAGER}/jobs/{job_id}?mode=cancel", method="PATCH")
            with contextlib.suppress(OSError):
                urllib.request.urlopen(req, timeout=10).close()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        admin.delete_topics([topic, f"{topic}.dlq"])
        admin.close()
        import redis

        from headwater.pipelines.settings import Settings as S

        client = redis.Redis.from_url(S.from_env().redis_url)
        keys = list(client.scan_iter(match=f"{namespace}:*", count=1000))
        if keys:
            client.delete(*keys)
        client.close()
    moving = [r for r in rows if r[1] > 0]
    reached = bool(rows) and rows[-1][1] >= total
    eps = None
    if len(moving) >= 2 and moving[-1][0] > moving[0][0]:
        # from the first commit (the job is up, the first checkpoint done) to the last one
        eps = round((moving[-1][1] - moving[0][1]) / (moving[-1][0] - moving[0][0]))
    return {
        "target": target, "backlog": total, "produced": sent, "drained": reached,
        "drain_eps": eps, "first_commit_after_s": round(moving[0][0] - started, 1) if moving else None,
        "commits_seen": len(moving), "load_average_start": load_start, "load_average_end": load(),
    }  # fmt: skip


def failures(out_json: Path, tests: list[str]) -> dict[str, Any]:
    """Run the cluster failure tests (``tests``: files, default all); return their recovery figures.

    Each figure carries the load averages and the time of its run.
    """
    figures = out_json.with_suffix(".figures.json")
    figures.unlink(missing_ok=True)
    env = {**os.environ, "HEADWATER_CLUSTER_FIGURES": str(figures)}
    load_start = load()
    cmd = [sys.executable, "-m", "pytest", "-m", "cluster", "-q", *(tests or ["tests/integration/cluster"])]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    print(done.stdout[-3000:])
    result = json.loads(figures.read_text()) if figures.exists() else {}
    figures.unlink(missing_ok=True)
    stamp = {"load_average_start": load_start, "load_average_end": load(),
             "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}  # fmt: skip
    result = {name: {**value, **stamp} for name, value in result.items()}
    ran = tests or ["tests/integration/cluster"]
    return {"tests_passed": done.returncode == 0, "tests_run": ran, **result}


def main() -> None:
    """Run the benchmark and write bench/results/bench_cluster.json."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--events", type=int, default=200_000, help="backlog size per target")
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--timeout-s", type=float, default=900.0, help="per target")
    ap.add_argument("--targets", default="mini,session")
    ap.add_argument("--failures", action="store_true", help="also run the failure tests (about 10 min)")
    ap.add_argument("--tests", default="", help="with --failures: only these test files (comma-separated)")
    ap.add_argument("--out", type=Path, default=ROOT / "bench/results/bench_cluster.json")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench_cluster_"))
    state = work / "state"
    done = subprocess.run([str(Path(sys.executable).parent / "headwater"), "apply", str(ROOT / "features"),
                           "--state-dir", str(state), "--no-feast"], cwd=ROOT, capture_output=True, text=True,
                          check=False)  # fmt: skip
    if done.returncode != 0:
        sys.exit(f"headwater apply failed:\n{done.stdout}{done.stderr}")
    result: dict[str, Any] = {
        "benchmark": "cluster",
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"cpus": os.cpu_count(), "load_average_at_start": load(),
                    "note": "2 cores shared with other agents: the load averages say what else ran"},
        "setup": {"kafka": f"3 brokers (RF 3, min.insync.replicas 2) at {KAFKA}",
                  "partitions": args.partitions,
                  "parallelism": 2, "checkpoint_interval_s": 2, "backlog_events": args.events,
                  "session_cluster": "1 JobManager 768m + 2 TaskManagers 1280m x 2 slots (infra/cluster.sh)",
                  "mini_cluster": "the CLI's JVM (-Xmx2g)"},
        "throughput": {},
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
    }  # fmt: skip
    for target in [t for t in args.targets.split(",") if t]:  # --targets '' with --failures: recovery only
        figure = drain(target, state, work, args.events, args.partitions, args.timeout_s)
        print(json.dumps(figure))
        result["throughput"][target] = figure
    if args.failures:
        result["recovery"] = failures(args.out, [t for t in args.tests.split(",") if t])
    result["machine"]["load_average_at_end"] = load()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    previous = json.loads(args.out.read_text()) if args.out.exists() else {}
    if not result["throughput"] and previous.get("throughput"):  # a recovery-only run keeps the figures
        result["throughput"] = previous["throughput"]
        result["throughput_measured_at"] = previous.get("throughput_measured_at", previous.get("measured_at"))
    if "recovery" not in result and "recovery" in previous:
        result["recovery"] = previous["recovery"]  # figures of an earlier --failures run stay
        result["recovery_measured_at"] = previous.get("recovery_measured_at", previous.get("measured_at"))
    elif "recovery" in result and args.tests and "recovery" in previous:  # a partial run adds to the rest
        # the machine's loads and the time stay those of the figures' run; the new entries carry their own
        result["machine"], result["measured_at"] = previous["machine"], previous["measured_at"]
        kept = {k: v for k, v in previous["recovery"].items() if k not in result["recovery"]}
        result["recovery"] = {**kept, **result["recovery"], "tests_passed": previous["recovery"].get(
            "tests_passed", False) and result["recovery"]["tests_passed"]}  # fmt: skip
        result["recovery_measured_at"] = previous.get("recovery_measured_at", previous.get("measured_at"))
        result["recovery_partial_run_at"] = result["measured_at"]
    elif "recovery" in result:
        result["recovery_measured_at"] = result["measured_at"]
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
