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

``--targets`` picks among them. Faults start once the producer writes (a broker restart during the
producer's start-up ends the run: ``events produce`` gives up after 10 s without a broker) and stop
``--quiet-end-s`` before the producer ends so the tiers can drain. A broker restart must stay within
the producer's delivery timeout (120 s): on a machine at load ~45 a private broker took 6.5 min to
start, so the run of this round left ``kafka`` out (the broker restart is tested under each tier by
the slow tests instead). The verdict is the
plain soak's (every record landed or dead-lettered, every group drained, no tier down at the end,
memory flat, ``consistency`` mismatches, the service's statuses) plus the fault log, in
``bench/results/soak.json``.

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
            "HEADWATER_STATE_DIR": str(state),
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
        if sum(_safe(base.probe.end_offsets, {}, args.bootstrap, args.topic).values()) > 0:
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


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--rate", type=float, default=300.0, help="events/s produced")
    parser.add_argument("--qps", type=float, default=5.0, help="ranking requests/s (0: no service)")
    parser.add_argument("--sample-s", type=float, default=30.0)
    parser.add_argument("--seed", type=int, default=16)
    parser.add_argument("--gap-s", type=float, nargs=2, default=(60.0, 180.0), help="seconds between faults")
    parser.add_argument("--quiet-end-s", type=float, default=180.0, help="no fault in the last seconds")
    parser.add_argument(
        "--targets", nargs="+", default=["nearline", "realtime", "redis", "kafka"], help="what the faults hit"
    )
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
        "setup": {"minutes": args.minutes, "rate": args.rate, "qps": args.qps, "seed": args.seed,
                  "gap_s": list(args.gap_s), "quiet_end_s": args.quiet_end_s, "targets": args.targets},
    }  # fmt: skip
    faults: list[dict[str, Any]] = []
    stop = threading.Event()
    system: ChaosSystem | None = None
    try:
        broker.start()
        os.environ["HEADWATER_KAFKA_BOOTSTRAP"] = broker.bootstrap  # this process (Settings) and children
        os.environ["HEADWATER_REDIS_URL"] = store.url
        args.bootstrap, args.topic = broker.bootstrap, run_id
        lag = base.probe.group_lag
        base.probe.group_lag = lambda *a: _safe(lag, None, *a)  # the sampler survives a broker restart
        env = {**os.environ, "HEADWATER_EVENTS_TOPIC": run_id, "HEADWATER_DLQ_TOPIC": f"{run_id}.dlq"}
        cfg = {
            "bootstrap": broker.bootstrap,
            "topic": run_id,
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
            result.update(base.soak(system, cfg, args, run_dir))
        except Exception as exc:  # keep the fault log and say where the run stopped
            result["error"] = f"{type(exc).__name__}: {exc}"[-2000:]
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
    RESULT.write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(json.dumps(result.get("verdict", "no verdict"), indent=2, default=str), flush=True)
    print(f"wrote {RESULT}")


if __name__ == "__main__":
    main()
