"""Chaos soak (issue 16 item 9): the soak of ``bench_soak.py`` with seeded faults, on its own services.

One command (no shared service is touched; Java, redis-server and the Kafka jars of ``make setup``)::

    .venv/bin/python -u bench/soak.py --minutes 30 --rate 300 --seed 16

It starts a private Redis (``OwnRedis``: append-only file, so a restart keeps the data, as a Redis
with persistence does) and a private Kafka broker (``infra/kafka.sh`` with its own state folder and
free ports), points every component at them (``HEADWATER_KAFKA_BOOTSTRAP``/``HEADWATER_REDIS_URL``)
and runs ``bench_soak.soak``: apply, the realtime job, the nearline tier, the ranking service when
a model is trained, generated events at ``--rate`` for ``--minutes``, drain, landing, consistency.
Meanwhile a chaos thread (``random.Random(--seed)``, every fault logged with its time) waits
``--gap-s`` (uniform between its two values) and then, in turn at random:

- ``nearline``: kill -9 of the nearline process group, started again at once (restores its stores);
- ``realtime``: kill -9 of the Flink job's process group, started again (restores its checkpoint);
- ``redis``: the Redis server stopped (SIGTERM, the append-only file written), started after 5 s;
- ``kafka``: the broker stopped (``kafka.sh stop``) and started again.

``--targets`` picks among them. Faults start once the producer writes and stop ``--quiet-end-s``
before the producer ends so the tiers can drain. The producers (behaviour events and payments, in
this process: ``bench_soak.produce_all``) ride out a broker restart of up to 15 min: a send blocks
while no broker answers and every record is retried until acknowledged, idempotently (nothing
doubled). The ranking service runs on a small model trained in the set-up (``bench_soak.train_model``)
under ``--qps`` requests. The verdict is the plain soak's (every record in its topic, landed or
rejected by the landing; each tier's dead letters once; every group drained; no tier down at the end;
memory; ``consistency`` mismatches, run right after the drain so the realtime keys have not expired;
the service's 5xx) plus the fault log, in ``bench/results/soak.json`` (``summary`` first).

Not covered: a Redis kill -9 (with ``appendfsync everysec`` a kill -9 loses up to a second of
writes by design: a lost realtime value stays lost until it changes again), the landing and the
service are not killed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_soak as base
import soak_probe as probe
from soak_ranking import free_port

from headwater.pipelines.store.testing import OwnRedis

ROOT = Path(__file__).resolve().parents[1]
RESULT = ROOT / "bench/results/soak.json"


class Broker:
    """A private single-node Kafka broker (``infra/kafka.sh`` with its own state folder and ports)."""

    def __init__(self, state: Path) -> None:
        port = free_port()
        self.bootstrap = f"127.0.0.1:{port}"
        self.env = {
            **os.environ,
            "HEADWATER_SERVICES_DIR": str(state),
            "HEADWATER_KAFKA_PORT": str(port),
            "HEADWATER_KAFKA_CONTROLLER_PORT": str(free_port()),
            "HEADWATER_KAFKA_BOOTSTRAP": self.bootstrap,
        }

    def _script(self, verb: str) -> None:
        subprocess.run(
            ["bash", str(ROOT / "infra/kafka.sh"), verb],
            env=self.env,
            check=True,
            cwd=ROOT,
            capture_output=True,
            timeout=900,  # a JVM broker start takes minutes on a loaded machine (5 min at load 45)
        )

    def start(self) -> None:
        """Start the broker and wait for a produce/consume round trip."""
        self._script("start")

    def stop(self) -> None:
        """Stop the broker (its data stays)."""
        self._script("stop")


class ChaosSystem(base.System):
    """The soak's process table, which can kill -9 a component and start it again with its arguments."""

    def __init__(self, run_dir: Path, env: dict[str, str]) -> None:
        super().__init__(run_dir, env)
        self.args: dict[str, tuple[str, ...]] = {}
        self.lock = threading.Lock()

    def start(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        """Start ``headwater ARGS`` as ``name`` (its log appended to across restarts)."""
        with self.lock:
            self.args[name] = args
            log = (self.run_dir / f"{name}.log").open("ab")
            proc = subprocess.Popen(
                [base.HW, *args],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                cwd=ROOT,
                start_new_session=True,
            )
            self.procs[name] = proc
            return proc

    def kill9_and_restart(self, name: str) -> None:
        """Send SIGKILL to the process group of ``name``, then start it again with the same arguments."""
        with self.lock:
            proc = self.procs.get(name)
            if proc is not None and proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(30)
        self.start(name, *self.args[name])


def chaos(
    system: ChaosSystem,
    broker: Broker,
    store: OwnRedis,
    args: argparse.Namespace,
    stop: threading.Event,
    faults: list[dict[str, Any]],
) -> None:
    """Inject a seeded fault every ``--gap-s`` until ``stop`` or the quiet end; log each in ``faults``."""
    rng = random.Random(args.seed)
    while not stop.wait(2):  # the faults start once the producer writes (after apply and the tiers' start)
        if sum(_safe(probe.end_offsets, {}, args.bootstrap, args.topic).values()) > 0:
            break
    started = time.monotonic()
    until = args.minutes * 60 - args.quiet_end_s
    targets = list(args.targets)
    while True:
        wait_s = rng.uniform(*args.gap_s)
        if time.monotonic() - started + wait_s > until or stop.wait(wait_s):
            return
        target = rng.choice(targets)
        t0 = time.monotonic()
        entry: dict[str, Any] = {"t_s": round(t0 - started, 1), "target": target}
        print(f"  chaos t={entry['t_s']}s: {target}", flush=True)
        try:
            if target in ("nearline", "realtime"):
                system.kill9_and_restart(target)
            elif target == "redis":
                store.stop()
                time.sleep(5)
                store.start(timeout_s=30)
            else:
                broker.stop()
                broker.start()
        except Exception as exc:  # logged in the result; the soak goes on
            entry["error"] = f"{type(exc).__name__}: {exc}"[:500]
        entry["took_s"] = round(time.monotonic() - t0, 1)
        faults.append(entry)


def _safe(call: Any, default: Any, *args: Any) -> Any:
    """``call(*args)``, or ``default`` when it raises (the broker may be down while a fault runs)."""
    try:
        return call(*args)
    except Exception:
        return default


LATE_DETAIL_OF_TIER = (
    ("realtime", "greatest accepted event time"),  # infra/maven/flink-udfs Lateness
    ("nearline", "before watermark - allowed lateness"),  # pipelines/nearline/task.py _accept
    ("landing", "behind the partition watermark"),  # pipelines/offline/landing_batch.py
)
"""Which tier wrote a ``late`` letter, from its detail (every tier writes to the one DLQ topic)."""


def late_by_tier(letters: list[Any]) -> dict[str, dict[str, int]]:
    """Count the ``late`` letters per source topic and tier (``other``: a detail no tier's text matches).

    Issue 16: every tier judges lateness per partition in offset order by the same rule, so each tier's
    count must equal the landing's (realtime's ran 7x over it when its verdict was Flink's watermark).
    """
    out: dict[str, dict[str, int]] = {}
    for d in letters:
        if d.reason != "late":
            continue
        tier = next((t for t, text in LATE_DETAIL_OF_TIER if text in d.detail), "other")
        counts = out.setdefault(d.source_topic, {})
        counts[tier] = counts.get(tier, 0) + 1
    return out


def _audit_with_tiers(audit: Any) -> Any:
    """``bench_soak.dead_letter_audit`` plus ``late_by_source_topic_and_tier`` (:func:`late_by_tier`)."""

    def run(letters: list[Any], tiers: int) -> dict[str, Any]:
        return {**audit(letters, tiers), "late_by_source_topic_and_tier": late_by_tier(letters)}

    return run


def summary(result: dict[str, Any]) -> dict[str, Any]:
    """Return the figures the issue asks for (first in the JSON): records, letters, mismatches, 5xx, RSS."""
    rec, verdict = result["reconcile"], result["verdict"]
    return {
        "produced": {n: s["produced"] for n, s in rec["per_source"].items()},
        "records_in_topic": {n: s["records_in_topic"] for n, s in rec["per_source"].items()},
        "landed": {n: s["landing"].get("landed") for n, s in rec["per_source"].items()},
        "rejected_by_the_landing": {
            n: {k: s["landing"].get(k) for k in ("malformed", "future_dated", "late")}
            for n, s in rec["per_source"].items()
        },
        "dead_letters_by_source_topic_and_reason": rec["dead_letters"]["by_source_topic_and_reason"],
        "late_letters_by_source_topic_and_tier": rec["dead_letters"].get("late_by_source_topic_and_tier"),
        "mismatches_after_drain": verdict["mismatches_after_drain"],
        "mismatches_by_view": {
            v["view"]: sum(v.get("mismatches", {}).values())
            for v in result.get("consistency", [])
            if sum(v.get("mismatches", {}).values())
        },
        "values_checked": verdict["values_checked"],
        "service_5xx": verdict["service_5xx"],
        "service_requests": verdict["service_requests"],
        "memory_mb_min_max": {
            n: [m.get("min_mb"), m.get("peak_mb")] for n, m in result.get("memory", {}).items()
        },
        "faults": [
            f"{f['t_s']}s {f['target']}" + (" FAILED" if "error" in f else "") for f in result["faults"]
        ],
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--rate", type=float, default=300.0, help="events/s produced")
    parser.add_argument("--qps", type=float, default=5.0, help="ranking requests/s (0: no service)")
    parser.add_argument("--sample-s", type=float, default=30.0)
    parser.add_argument("--gap-s", type=float, nargs=2, default=(60.0, 180.0), help="seconds between faults")
    parser.add_argument("--quiet-end-s", type=float, default=180.0, help="no fault in the last seconds")
    parser.add_argument(
        "--targets", nargs="+", default=["nearline", "realtime", "redis", "kafka"], help="what the faults hit"
    )
    base.add_load_options(parser)
    parser.add_argument("--out", type=Path, default=RESULT, help="result JSON (a short try: soak_dry.json)")
    args = parser.parse_args()

    run_id = f"chaos-{uuid.uuid4().hex[:6]}"
    run_dir = ROOT / ".headwater/soak" / run_id
    state = run_dir / "state"
    run_dir.mkdir(parents=True)
    (run_dir / "redis").mkdir()
    store = OwnRedis(run_dir / "redis")
    store.start(timeout_s=30)
    broker = Broker(run_dir / "kafka")
    result: dict[str, Any] = {
        "benchmark": "soak",
        "chaos": True,
        "run_id": run_id,
        "load_average_at_start": os.getloadavg(),
        "command": " ".join(["bench/soak.py", *sys.argv[1:]]),
        "setup": {"minutes": args.minutes, "rate": args.rate, "payments_rate": args.payments_rate,
                  "qps": args.qps, "seed": args.seed, "gap_s": list(args.gap_s),
                  "quiet_end_s": args.quiet_end_s, "targets": args.targets},
    }  # fmt: skip
    faults: list[dict[str, Any]] = []
    stop = threading.Event()
    system: ChaosSystem | None = None
    partial: dict[str, Any] = {}
    try:
        broker.start()
        os.environ["HEADWATER_KAFKA_BOOTSTRAP"] = broker.bootstrap  # this process (Settings) and children
        os.environ["HEADWATER_REDIS_URL"] = store.url
        args.bootstrap, args.topic = broker.bootstrap, run_id
        lag = probe.group_lag
        base.dead_letter_audit = _audit_with_tiers(base.dead_letter_audit)
        probe.group_lag = lambda *a: _safe(lag, None, *a)  # the sampler survives a broker restart
        env = {**os.environ, "HEADWATER_EVENTS_TOPIC": run_id, "HEADWATER_DLQ_TOPIC": f"{run_id}.dlq",
               "FLINK_LOG_DIR": str(run_dir / "flink")}  # the job's own log kept with the run  # fmt: skip
        cfg = {
            "bootstrap": broker.bootstrap,
            "topic": run_id,
            "topics": {"events": run_id, "payments": f"{run_id}-payments"},
            "repo": base.soak_repo(run_dir, run_id),
            "state": state,
            "namespace": run_id.replace("-", ""),
            "groups": [f"{run_id}-rt", f"{run_id}-nl"],
            "sample_s": args.sample_s,
        }
        system = ChaosSystem(run_dir, env)
        print(
            f"chaos soak {run_id}: {args.minutes} min at {args.rate:.0f} events/s, seed {args.seed}; "
            f"Kafka {broker.bootstrap}, Redis {store.url}; logs in {run_dir}",
            flush=True,
        )
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
        threading.Thread(target=chaos, args=(system, broker, store, args, stop, faults), daemon=True).start()
        try:
            result.update(base.soak(system, cfg, args, run_dir, partial))
        except Exception as exc:  # keep the fault log and the figures known, and say where the run stopped
            result["error"] = f"{type(exc).__name__}: {exc}"[-2000:]
            result["partial"] = partial
    finally:
        stop.set()
        if system is not None:
            system.stop_all()
        with contextlib.suppress(Exception):
            broker.stop()
        store.stop()
    result["faults"] = faults
    result["load_average_at_end"] = os.getloadavg()
    if "verdict" in result:
        result["verdict"]["faults_injected"] = len(faults)
        result["verdict"]["faults_failed"] = [f for f in faults if "error" in f]
        result = {"summary": summary(result), **result}
    args.out.write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(
        json.dumps(result.get("summary", result.get("error", "no verdict")), indent=2, default=str),
        flush=True,
    )
    print(json.dumps(result.get("verdict", "no verdict"), indent=2, default=str), flush=True)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
