"""A restored realtime job with a backlog: how soon does it checkpoint while it catches up.

Why: in rt16c's soak (session 7) a job restored under a backlog completed no checkpoint in the 86 s it
lived, so the next kill restored the same old checkpoint and the backlog compounded. With aligned
checkpoints a barrier waits behind the in-flight records of every input channel; unaligned checkpoints
(``execution.checkpointing.unaligned.enabled``) let it overtake them (the in-flight buffers go into the
checkpoint), and buffer debloating (``taskmanager.network.memory.buffer-debloat.enabled``) shrinks
what is in flight.

What runs (the real CLI, ``headwater run realtime``, local mini-cluster, parallelism 2, checkpoints
every ``--checkpoint-interval`` s): the registry's realtime views of the behaviour source
(``features/``, applied to a scratch state folder) reading a fresh 2-partition topic.

1. A first job reads ``--warm`` events and checkpoints; it is killed with SIGKILL (its process group).
2. ``--backlog`` events are produced while no job runs (event time = the wall clock at send).
3. Per variant (in the order of ``--variants``, ``--repeats`` times): a copy of the killed job's
   checkpoint folder is restored by a job started with the variant's ``--conf``, writing its own Redis
   namespace and committing as its own consumer group, so every variant restores the very same
   checkpoint and reads the very same backlog. Measured from the job's "submitted" line:
   ``first_checkpoint_s`` (the restored job's first complete ``chk-N``, by its ``_metadata`` time),
   ``committed`` (its consumer group's committed records over time: Flink commits a checkpoint's
   offsets when it completes), ``drained_s`` (the first time the committed offsets reach the topic's
   end: caught up, at a checkpoint), the checkpoints completed until then and the longest gap between
   two of them, and ``catch_up_eps`` (records a second between its first and last commit). The job is
   then killed. ``null`` where it did not happen within ``--timeout``.

Figures depend on the machine's load: the load averages are in the JSON beside each run.
Usage: python bench/bench_realtime_catchup.py [--backlog 400000] [--variants aligned,unaligned,debloat]
       [--repeats 2] [--out bench/results/realtime_catchup.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_realtime import splice, templates

from headwater.pipelines.events.codec import EventCodec
from headwater.pipelines.events.producer import ProducerSettings
from headwater.pipelines.settings import Settings

ROOT = Path(__file__).resolve().parents[1]
SOURCE = "events"
PARTITIONS = 2
VARIANTS: dict[str, tuple[str, ...]] = {
    "aligned": (),
    "unaligned": ("execution.checkpointing.unaligned.enabled=true",),
    "unaligned-timeout": (
        "execution.checkpointing.unaligned.enabled=true",
        "execution.checkpointing.aligned-checkpoint-timeout=2 s",
    ),
    "debloat": ("taskmanager.network.memory.buffer-debloat.enabled=true",),
    "unaligned-debloat": (
        "execution.checkpointing.unaligned.enabled=true",
        "taskmanager.network.memory.buffer-debloat.enabled=true",
    ),
}
"""The ``--conf`` of each variant (aligned: the job's defaults)."""


def start_job(state: Path, topic: str, namespace: str, group: str, chk: Path, log: Path, interval_s: float,
              conf: tuple[str, ...]) -> subprocess.Popen[bytes]:  # fmt: skip
    """Start ``headwater run realtime`` in its own process group (so SIGKILL takes the JVM with it)."""
    cmd = [sys.executable, "-m", "headwater.cli.realtime", "--state-dir", str(state),
           "--checkpoint-dir", str(chk), "--source", SOURCE, "--topic", f"{SOURCE}={topic}",
           "--dlq-topic", f"{topic}.dlq", "--namespace", namespace, "--group-id", group,
           "--checkpoint-interval", f"{interval_s:g}", "--parallelism", "2", "--from-earliest"]  # fmt: skip
    for item in conf:
        cmd += ["--conf", item]
    return subprocess.Popen(
        cmd, cwd=ROOT, stdout=log.open("ab"), stderr=subprocess.STDOUT, start_new_session=True
    )


def kill(job: subprocess.Popen[bytes]) -> None:
    """SIGKILL the job's process group."""
    if job.poll() is None:
        os.killpg(job.pid, signal.SIGKILL)
        job.wait(timeout=60)


def produce(bootstrap: str, topic: str, n: int, tag: str) -> float:
    """Send ``n`` events as fast as one producer can (event time = now); return the seconds it took."""
    from kafka import KafkaProducer

    pieces, _, _ = templates(5000, 2000, 20_000)
    producer = KafkaProducer(**ProducerSettings(bootstrap, topic).kafka_config())
    fp = EventCodec().headers()[0]
    start = time.monotonic()
    for i in range(n):
        middle, tail, _, _ = pieces[i % len(pieces)]
        producer.send(topic, splice(f"{tag}-{i}", time.time_ns() // 1_000_000, middle, tail), headers=[fp])
    producer.flush()
    producer.close()
    return time.monotonic() - start


class Offsets:
    """The topic's end offsets and a group's committed offsets, summed over the partitions."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition

        self.admin = KafkaAdminClient(bootstrap_servers=bootstrap)
        self.consumer = KafkaConsumer(bootstrap_servers=bootstrap)
        self.topic = topic
        self.parts = [TopicPartition(topic, p) for p in range(PARTITIONS)]

    def end(self) -> int:
        """Return the end offsets, summed."""
        return int(sum(self.consumer.end_offsets(self.parts).values()))

    def committed(self, group: str) -> int:
        """Return ``group``'s committed offsets of the topic, summed (0 where none)."""
        got = self.admin.list_group_offsets(group).get(group, {})
        return sum(o.offset for tp, o in got.items() if tp.topic == self.topic and o.offset >= 0)

    def close(self) -> None:
        """Close the clients."""
        self.admin.close()
        self.consumer.close()


NAMESPACES: list[str] = []
"""The Redis namespaces the runs wrote (deleted at the end)."""


def namespace() -> str:
    """Return a fresh Redis namespace for one job."""
    NAMESPACES.append(f"hwcu{uuid.uuid4().hex[:8]}")
    return NAMESPACES[-1]


def drop_namespaces(redis_url: str) -> None:
    """Delete the keys the runs wrote."""
    import redis

    client = redis.Redis.from_url(redis_url)
    try:
        for ns in NAMESPACES:
            keys = list(client.scan_iter(match=f"{ns}:*", count=1000))
            for at in range(0, len(keys), 1000):
                client.delete(*keys[at : at + 1000])
    finally:
        client.close()


def complete(folder: Path) -> dict[tuple[str, int], float]:
    """Complete checkpoints under ``folder``: (job id, N) -> the time their ``_metadata`` was written."""
    out = {}
    for meta in folder.glob("*/chk-*/_metadata"):
        try:
            out[(meta.parent.parent.name, int(meta.parent.name.removeprefix("chk-")))] = meta.stat().st_mtime
        except (OSError, ValueError):
            continue
    return out


def wait_line(log: Path, text: str, job: subprocess.Popen[bytes], timeout_s: float) -> float | None:
    """Wait until ``text`` is in ``log``; return the time it was seen (None: timeout or the job exited)."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if text in log.read_text(errors="replace"):
            return time.time()
        if job.poll() is not None:
            return None
        time.sleep(0.2)
    return None


def first_run(args: argparse.Namespace, work: Path, state: Path, topic: str, offsets: Offsets) -> Path:
    """Run the first job over ``--warm`` events until a checkpoint holds them all, kill it; its folder."""
    settings = Settings.from_env()
    chk, log, group = work / "chk-first", work / "first.log", f"bench-cu-first-{uuid.uuid4().hex[:6]}"
    job = start_job(state, topic, namespace(), group, chk, log, args.checkpoint_interval, ())
    try:
        produce(settings.kafka_bootstrap, topic, args.warm, "warm")
        deadline = time.time() + args.timeout
        while offsets.committed(group) < args.warm:
            if job.poll() is not None or time.time() > deadline:
                sys.exit(f"the first job did not checkpoint {args.warm} events; log: {log}")
            time.sleep(1)
    finally:
        kill(job)
    print(
        f"first job killed after a checkpoint of {args.warm} events (load {os.getloadavg()[0]:.1f})",
        flush=True,
    )
    return chk


def restore_run(args: argparse.Namespace, name: str, work: Path, state: Path, topic: str, first: Path,
                offsets: Offsets, run: int) -> dict[str, Any]:  # fmt: skip
    """Restore a copy of the first job's checkpoints with variant ``name``; measure its catch-up."""
    chk = work / f"chk-{name}-{run}"
    shutil.copytree(first, chk)
    before = set(complete(chk))
    log, group = work / f"{name}-{run}.log", f"bench-cu-{name}-{run}-{uuid.uuid4().hex[:6]}"
    end = offsets.end()
    load = os.getloadavg()
    started = time.time()
    job = start_job(state, topic, namespace(), group, chk, log, args.checkpoint_interval, VARIANTS[name])
    out: dict[str, Any] = {"variant": name, "run": run, "conf": list(VARIANTS[name]), "records_end": end}
    try:
        submitted = wait_line(log, "submitted:", job, args.timeout)
        if submitted is None:
            out["error"] = f"not submitted; log: {log}"
            return out
        out["submit_s"] = round(submitted - started, 1)
        seen: dict[tuple[str, int], float] = {}
        series: list[tuple[float, int]] = []
        drained = None
        deadline = submitted + args.timeout
        while time.time() < deadline and job.poll() is None:
            for k, t in complete(chk).items():
                if k not in before and k not in seen:
                    seen[k] = t
            done = offsets.committed(group)
            if not series or series[-1][1] != done:
                series.append((round(time.time() - submitted, 1), done))
            if done >= end:
                drained = time.time()
                break
            time.sleep(0.25)
        times = sorted(seen.values())
        gaps = [b - a for a, b in zip([submitted, *times], times, strict=False)]
        out.update({
            "first_checkpoint_s": round(times[0] - submitted, 1) if times else None,
            "drained_s": round(drained - submitted, 1) if drained else None,
            "checkpoints_until_drained": len(times),
            "longest_gap_s": round(max(gaps), 1) if gaps else None,
            "checkpoint_s": [round(t - submitted, 1) for t in times],
            "committed": series,
            "job_exited": job.poll(),
            "load_start": [round(x, 2) for x in load],
            "load_end": [round(x, 2) for x in os.getloadavg()],
        })  # fmt: skip
    finally:
        kill(job)
    return out


def catch_up_rate(series: list[tuple[float, int]] | list[list[float]]) -> int | None:
    """Return the records a second between the first and the last commit of a ``committed`` series."""
    moved = [(t, c) for t, c in series if c > 0]
    if len(moved) < 2 or moved[-1][0] <= moved[0][0]:
        return None
    return round((moved[-1][1] - moved[0][1]) / (moved[-1][0] - moved[0][0]))


def write(out: Path, result: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """Add the per-variant summary to ``result``, write it to ``out``; return the summary."""
    summary: dict[str, Any] = {}
    for name in names:
        rows = [r for r in result["runs"] if r["variant"] == name]
        summary[name] = {
            key: [r.get(key) for r in rows]
            for key in ("first_checkpoint_s", "drained_s", "checkpoints_until_drained", "longest_gap_s")
        }
        summary[name]["catch_up_eps"] = [catch_up_rate(r.get("committed") or []) for r in rows]
    result["summary"] = summary
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    return summary


def main() -> None:
    """Run the benchmark; print each run and write the JSON."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--backlog", type=int, default=400_000, help="events produced while no job runs")
    ap.add_argument("--warm", type=int, default=20_000, help="events the first job reads before its kill")
    ap.add_argument("--variants", default="aligned,unaligned,debloat", help=f"of {', '.join(VARIANTS)}")
    ap.add_argument("--repeats", type=int, default=1, help="runs of each variant, interleaved")
    ap.add_argument("--checkpoint-interval", type=float, default=5.0, help="seconds (the CLI's default)")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for each step")
    ap.add_argument("--registry", type=Path, default=ROOT / "features", help="feature repo to apply")
    ap.add_argument("--out", type=Path, default=ROOT / "bench/results/realtime_catchup.json")
    args = ap.parse_args()
    names = [v for v in args.variants.split(",") if v]
    unknown = [v for v in names if v not in VARIANTS]
    if unknown:
        sys.exit(f"unknown variants {unknown}; known: {', '.join(VARIANTS)}")
    settings = Settings.from_env()
    work = Path(tempfile.mkdtemp(prefix="bench_catchup_"))
    state = work / "state"
    done = subprocess.run([str(Path(sys.executable).parent / "headwater"), "apply", str(args.registry),
                           "--state-dir", str(state), "--no-feast"], cwd=ROOT, capture_output=True, text=True,
                          check=False)  # fmt: skip
    if done.returncode != 0:
        sys.exit(f"headwater apply failed:\n{done.stdout}{done.stderr}")
    from kafka import KafkaAdminClient
    from kafka.admin import NewTopic

    topic = f"bench.catchup.{uuid.uuid4().hex[:8]}"
    admin = KafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap)
    admin.create_topics([NewTopic(topic, PARTITIONS, 1), NewTopic(f"{topic}.dlq", 1, 1)])
    offsets = Offsets(settings.kafka_bootstrap, topic)
    runs: list[dict[str, Any]] = []
    result: dict[str, Any] = {
        "benchmark": "realtime_catchup",
        "backlog": args.backlog,
        "warm": args.warm,
        "checkpoint_interval_s": args.checkpoint_interval,
        "cpus": os.cpu_count(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "runs": runs,
    }
    try:
        first = first_run(args, work, state, topic, offsets)
        produced_s = produce(settings.kafka_bootstrap, topic, args.backlog, "backlog")
        result["backlog_produced_s"] = round(produced_s, 1)
        print(f"backlog of {args.backlog} events produced in {produced_s:.1f} s", flush=True)
        for run in range(args.repeats):
            for name in names:
                row = restore_run(args, name, work, state, topic, first, offsets, run)
                runs.append(row)
                print(json.dumps(row), flush=True)
                write(args.out, result, names)  # after each run: a stopped bench keeps what it measured
    finally:
        offsets.close()
        admin.delete_topics([topic, f"{topic}.dlq"])
        admin.close()
        shutil.rmtree(work, ignore_errors=True)
        drop_namespaces(settings.redis_url)
    print(json.dumps(write(args.out, result, names), indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
