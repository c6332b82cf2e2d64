"""Soak: the whole system under steady generated load for --minutes; nothing lost, SLAs held, memory flat.

One command (Kafka and Redis up, `make services-up`): ``.venv/bin/python -u bench/bench_soak.py``.

Isolation: the run applies a copy of ``features/`` whose sources read their own topics (``soak-<id>``
for the behaviour events, ``soak-<id>-<source>`` for the others; ``soak-<id>.dlq`` through
``HEADWATER_DLQ_TOPIC``), state dir, consumer groups and Redis namespace,
so it neither reads nor disturbs the demo's data. It then

1. applies ``features/`` into its state dir and starts the realtime tier (PyFlink), the nearline tier
   (one process) and, when a model is trained, the ranking service with a light request load;
2. produces generated events at --rate for --minutes (late, out-of-order, duplicate and malformed
   shares as the generator's defaults), sampling every --sample-s: each component's memory (RSS of
   its process tree), each consumer group's lag and ``headwater freshness --format json``;
3. waits for the tiers to drain, stops them, lands the topic into Delta and reconciles the counts:
   produced = records in the topic = records landed + rejected; each group committed the end offsets;
   dead letters by reason; ``headwater consistency`` mismatch rate (online vs offline recomputation,
   the check that nothing was lost or counted twice inside a tier);
4. prints a summary and writes ``bench/results/soak.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import soak_probe as probe
from soak_ranking import RankingLoad

from headwater.pipelines.settings import Settings

ROOT = Path(__file__).resolve().parents[1]
HW = str(ROOT / ".venv/bin/headwater")
RESULT = ROOT / "bench/results/soak.json"


class System:
    """The processes of one soak run, each in its own process group, with logs in the run folder."""

    def __init__(self, run_dir: Path, env: dict[str, str]) -> None:
        self.run_dir, self.env = run_dir, env
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        """Start ``headwater ARGS`` as component ``name``."""
        log = (self.run_dir / f"{name}.log").open("wb")
        proc = subprocess.Popen(
            [HW, *args], stdout=log, stderr=subprocess.STDOUT, env=self.env, cwd=ROOT, start_new_session=True
        )
        self.procs[name] = proc
        return proc

    def run(self, *args: str, timeout: float = 1800, ok: tuple[int, ...] = (0,)) -> str:
        """Run ``headwater ARGS`` to completion; return stdout, raise on an exit code not in ``ok``."""
        done = subprocess.run(
            [HW, *args], capture_output=True, text=True, env=self.env, cwd=ROOT, timeout=timeout, check=False
        )
        if done.returncode not in ok:
            msg = f"`headwater {' '.join(args)}` exited {done.returncode}:\n{done.stderr[-3000:]}"
            raise RuntimeError(msg)
        return done.stdout

    def alive(self, name: str) -> bool:
        """Whether component ``name`` is still running."""
        return name in self.procs and self.procs[name].poll() is None

    def stop(self, name: str, grace_s: float = 30) -> None:
        """Stop a component (SIGTERM to its group, SIGKILL after ``grace_s``)."""
        proc = self.procs.pop(name, None)
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)

    def stop_all(self) -> None:
        """Stop every component still running."""
        for name in list(self.procs):
            self.stop(name)


def _freshness(system: System, state: Path, namespace: str) -> dict[str, Any] | None:
    """Return ``headwater freshness --format json`` for the run, or None when it fails."""
    try:
        args = ["--format", "json", "--state-dir", str(state), "--namespace", namespace, "--window", "2m"]
        out = system.run("freshness", *args, timeout=120, ok=(0, 1))  # exit 1 = a breach, still a report
    except (RuntimeError, subprocess.TimeoutExpired) as exc:
        print(f"  freshness probe failed: {str(exc)[:300]}", flush=True)
        return None
    return dict(json.loads(out))


def sample_loop(system: System, cfg: dict[str, Any], stop: threading.Event, out: dict[str, Any]) -> None:
    """Sample memory, lag and freshness every ``cfg['sample_s']`` until ``stop`` is set."""
    memory: dict[str, probe.MemoryTrack] = {}
    out["lag"], out["freshness"] = [], []
    started = time.monotonic()
    while not stop.wait(cfg["sample_s"]):
        t = time.monotonic() - started
        for name, proc in list(system.procs.items()):
            memory.setdefault(name, probe.MemoryTrack()).add(t, probe.tree_rss_mb(proc.pid))
        lags = {g: probe.group_lag(cfg["bootstrap"], g, cfg["topic"]) for g in cfg["groups"]}
        out["lag"].append({"t_s": round(t), **lags})
        fresh = _freshness(system, cfg["state"], cfg["namespace"])
        if fresh is not None:
            out["freshness"].append({"t_s": round(t), "report": fresh})
        print(
            f"  t={t:5.0f}s lag={lags} rss="
            f"{ {n: round(m.samples[-1][1]) for n, m in memory.items() if m.samples} }",
            flush=True,
        )
    out["memory"] = memory


def wait_drained(cfg: dict[str, Any], timeout_s: float) -> dict[str, int | None]:
    """Wait until every group committed the topic's end offsets (or the timeout); return the lags."""
    deadline = time.monotonic() + timeout_s
    while True:
        lags = {g: probe.group_lag(cfg["bootstrap"], g, cfg["topic"]) for g in cfg["groups"]}
        if all(lag == 0 for lag in lags.values()) or time.monotonic() > deadline:
            return lags
        time.sleep(5)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--rate", type=float, default=1000.0, help="events/s produced")
    parser.add_argument("--qps", type=float, default=5.0, help="ranking requests/s (0: no service)")
    parser.add_argument("--sample-s", type=float, default=30.0)
    parser.add_argument("--keep", action="store_true", help="keep the run's topics, keys and folder")
    args = parser.parse_args()

    run_id = f"soak-{uuid.uuid4().hex[:6]}"
    run_dir = ROOT / ".headwater/soak" / run_id
    state = run_dir / "state"
    run_dir.mkdir(parents=True)
    settings = Settings.from_env()
    env = {**os.environ, "HEADWATER_EVENTS_TOPIC": run_id, "HEADWATER_DLQ_TOPIC": f"{run_id}.dlq"}
    repo = soak_repo(run_dir, run_id)
    namespace = run_id.replace("-", "")
    cfg = {
        "bootstrap": settings.kafka_bootstrap,
        "topic": run_id,
        "repo": repo,
        "state": state,
        "namespace": namespace,
        "groups": [f"{run_id}-rt", f"{run_id}-nl"],
        "sample_s": args.sample_s,
    }
    system = System(run_dir, env)
    result: dict[str, Any] = {
        "benchmark": "soak",
        "run_id": run_id,
        "load_average_at_start": os.getloadavg(),
        "setup": {"minutes": args.minutes, "rate": args.rate, "qps": args.qps},
    }
    print(f"soak {run_id}: {args.minutes} min at {args.rate:.0f} events/s; logs in {run_dir}", flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so `finally` stops the tiers it started
    try:
        result.update(soak(system, cfg, args, run_dir))
    finally:
        system.stop_all()
        if not args.keep:
            cleanup(system, cfg)
    result["load_average_at_end"] = os.getloadavg()
    RESULT.write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(json.dumps(result["verdict"], indent=2) if "verdict" in result else "no verdict", flush=True)
    print(f"wrote {RESULT}")


def soak_repo(run_dir: Path, run_id: str) -> Path:
    """Copy ``features/`` into the run folder with every source on a topic of the run's own."""
    repo = run_dir / "features"
    shutil.copytree(ROOT / "features", repo)
    sources = repo / "sources.yaml"
    text = sources.read_text(encoding="utf-8").replace("topic: events\n", f"topic: {run_id}\n")
    sources.write_text(text.replace("topic: payments\n", f"topic: {run_id}-payments\n"), encoding="utf-8")
    return repo


def soak(system: System, cfg: dict[str, Any], args: argparse.Namespace, run_dir: Path) -> dict[str, Any]:
    """Run the soak and return its figures (see the module docstring for the steps)."""
    state, namespace, run_id = cfg["state"], cfg["namespace"], cfg["topic"]
    system.run("apply", str(cfg["repo"]), "--state-dir", str(state), "--no-feast")
    system.run("topics", "create", "--state-dir", str(state))
    system.start(
        "realtime",
        "run",
        "realtime",
        "--state-dir",
        str(state),
        "--namespace",
        namespace,
        "--group-id",
        f"{run_id}-rt",
        "--checkpoint-dir",
        str(run_dir / "checkpoints"),
        "--from-earliest",
    )
    system.start(
        "nearline",
        "run",
        "nearline",
        "--state-dir",
        str(state),
        "--namespace",
        namespace,
        "--group",
        f"{run_id}-nl",
        "--store-dir",
        str(run_dir / "nearline"),
    )
    ranking = RankingLoad.maybe_start(system, namespace, args.qps)
    time.sleep(30)  # the Flink mini-cluster starts in ~20-60 s; events produced meanwhile wait in Kafka
    sampled: dict[str, Any] = {}
    stop = threading.Event()
    sampler = threading.Thread(target=sample_loop, args=(system, cfg, stop, sampled), daemon=True)
    sampler.start()
    produced = json.loads(
        system.run(
            "events",
            "produce",
            "--rate",
            str(args.rate),
            "--duration",
            str(args.minutes * 60),
            "--quiet",
            timeout=args.minutes * 60 + 600,
        )
    )
    print(f"produced: {produced}", flush=True)
    drained = wait_drained(cfg, timeout_s=180)
    stop.set()
    sampler.join()
    final_fresh = _freshness(system, state, namespace)
    ranking_stats = ranking.stop() if ranking is not None else {"skipped": "no trained model or --qps 0"}
    feedback_sent = int((ranking_stats.get("feedback") or {}).get("sent", 0))
    crashed = [n for n in ("realtime", "nearline") if not system.alive(n)]
    system.stop_all()
    ends = probe.end_offsets(cfg["bootstrap"], run_id)
    landing = json.loads(
        system.run("run", "landing", "--state-dir", str(state), "--lake", str(run_dir / "lake"))
        .strip()
        .splitlines()[-1]
    )
    consistency = json.loads(
        system.run(
            "consistency",
            "--json",
            "--state-dir",
            str(state),
            "--lake",
            str(run_dir / "lake"),
            "--namespace",
            namespace,
        )
    )
    dead = probe.dead_letters_by_reason(cfg["bootstrap"], f"{run_id}.dlq")
    memory = {name: track.summary() for name, track in sampled.get("memory", {}).items()}
    reconcile = {
        "produced": produced["sent"],
        "feedback_sent_by_the_service": feedback_sent,
        "records_in_topic": sum(ends.values()),
        "landing": landing,
        "landed_plus_rejected": landing["landed"] + landing["malformed"] + landing.get("future_dated", 0),
        # late events land too (flagged), and duplicates land and are dropped by event_id downstream
        "duplicates_produced": produced["duplicates"],
        "group_lag_at_end": drained,
        "dead_letters_by_reason": dead,
    }
    verdict = {
        "all_produced_in_topic": reconcile["records_in_topic"] == produced["sent"] + feedback_sent,
        "landing_accounts_for_every_record": landing["records"]
        == reconcile["records_in_topic"]
        == reconcile["landed_plus_rejected"],
        "every_group_drained": all(lag == 0 for lag in drained.values()),
        "no_tier_crashed": not crashed,
        "memory_flat": all(m.get("flat", False) for m in memory.values()),
        "no_sla_breach_at_end": bool(final_fresh and final_fresh.get("ok")),
        "samples_with_a_breach": [
            {"t_s": f["t_s"], "breached": f["report"].get("breached")}
            for f in sampled.get("freshness") or []
            if f["report"].get("breached")
        ],
        "consistency": consistency,
        "final_freshness": final_fresh,
    }
    return {
        "produced": produced,
        "reconcile": reconcile,
        "memory": memory,
        "lag": sampled.get("lag"),
        "freshness_samples": sampled.get("freshness"),
        "ranking": ranking_stats,
        "crashed": crashed,
        "verdict": verdict,
    }


def cleanup(system: System, cfg: dict[str, Any]) -> None:
    """Delete the run's topics and Redis keys (the run folder stays for its logs)."""
    import redis
    from kafka import KafkaAdminClient
    from kafka.errors import KafkaError

    admin = KafkaAdminClient(bootstrap_servers=cfg["bootstrap"], client_id="headwater-soak")
    mine = [t for t in admin.list_topics() if t.startswith(cfg["topic"])]  # events, DLQ, changelogs
    with contextlib.suppress(KafkaError):
        admin.delete_topics(mine)
    admin.close()
    client = redis.Redis.from_url(Settings.from_env().redis_url)
    for key in client.scan_iter(match=f"{cfg['namespace']}:*", count=1000):
        client.delete(key)


if __name__ == "__main__":
    main()
