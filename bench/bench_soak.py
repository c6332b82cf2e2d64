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
        lag = lags(cfg)
        out["lag"].append({"t_s": round(t), **lag})
        fresh = _freshness(system, cfg["state"], cfg["namespace"])
        if fresh is not None:
            out["freshness"].append({"t_s": round(t), "report": fresh})
        print(
            f"  t={t:5.0f}s lag={lag} rss="
            f"{ {n: round(m.samples[-1][1]) for n, m in memory.items() if m.samples} }",
            flush=True,
        )
    out["memory"] = memory


def wait_drained(cfg: dict[str, Any], timeout_s: float) -> dict[str, int | None]:
    """Wait until every group committed the source topics' end offsets (or the timeout); return the lags."""
    deadline = time.monotonic() + timeout_s
    while True:
        now = lags(cfg)
        if all(lag == 0 for lag in now.values()) or time.monotonic() > deadline:
            return now
        time.sleep(5)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--rate", type=float, default=1000.0, help="events/s produced")
    parser.add_argument("--qps", type=float, default=5.0, help="ranking requests/s (0: no service)")
    parser.add_argument("--sample-s", type=float, default=30.0)
    add_load_options(parser)
    parser.add_argument("--keep", action="store_true", help="keep the run's topics, keys and folder")
    args = parser.parse_args()

    run_id = f"soak-{uuid.uuid4().hex[:6]}"
    run_dir = ROOT / ".headwater/soak" / run_id
    state = run_dir / "state"
    run_dir.mkdir(parents=True)
    settings = Settings.from_env()
    env = {**os.environ, "HEADWATER_EVENTS_TOPIC": run_id, "HEADWATER_DLQ_TOPIC": f"{run_id}.dlq",
           "FLINK_LOG_DIR": str(run_dir / "flink")}  # the job's own log kept with the run  # fmt: skip
    repo = soak_repo(run_dir, run_id)
    namespace = run_id.replace("-", "")
    cfg = {
        "bootstrap": settings.kafka_bootstrap,
        "topic": run_id,
        "topics": {"events": run_id, "payments": f"{run_id}-payments"},
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


def add_load_options(parser: argparse.ArgumentParser) -> None:
    """Add the options both soaks share beyond rate, qps and sampling."""
    parser.add_argument("--payments-rate", type=float, default=20.0, help="payments/s produced (0: none)")
    parser.add_argument(
        "--seed", type=int, default=16, help="seed of the generated streams (and of the faults)"
    )
    parser.add_argument("--drain-s", type=float, default=300.0, help="longest wait for the groups to drain")


def soak_repo(run_dir: Path, run_id: str) -> Path:
    """Copy ``features/`` into the run folder with every source on a topic of the run's own."""
    repo = run_dir / "features"
    shutil.copytree(ROOT / "features", repo)
    sources = repo / "sources.yaml"
    text = sources.read_text(encoding="utf-8").replace("topic: events\n", f"topic: {run_id}\n")
    sources.write_text(text.replace("topic: payments\n", f"topic: {run_id}-payments\n"), encoding="utf-8")
    return repo


def robust_producer(bootstrap: str, topic: str, rate: float, duration_s: float) -> tuple[Any, Any]:
    """Return (ProducerSettings, KafkaProducer) that ride out a broker restart of up to 15 min.

    ``events produce`` gives up after 10 s without a broker (``max_block_ms``) and a record after the
    client's 120 s ``delivery_timeout_ms``; a private broker restarted on a loaded machine took 6.5 min.
    Here a send blocks (the generator waits) while no broker answers, and every record is retried until
    acknowledged: the producer is idempotent (acks=all), so a retry after the broker came back never
    writes a record twice. ``failed`` counts a record that still was not acknowledged.
    """
    from kafka import KafkaProducer

    from headwater.pipelines.events.producer import ProducerSettings

    settings = ProducerSettings(bootstrap=bootstrap, topic=topic, rate=rate, duration_s=duration_s,
                                connect_timeout_s=RIDE_OUT_S)  # fmt: skip
    config = {**settings.kafka_config(), "delivery_timeout_ms": int(RIDE_OUT_S * 1000)}
    return settings, KafkaProducer(**config)


RIDE_OUT_S = 900.0
"""How long the soak's producers wait for a broker (blocked sends, retried records)."""


def produce_all(cfg: dict[str, Any], args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """Produce behaviour events at ``--rate`` and payments at ``--payments-rate`` for ``--minutes``.

    In this process (not ``events produce``) with :func:`robust_producer`: generated behaviour events
    (late, out-of-order, duplicate and malformed shares as the generator's defaults, seed ``--seed``) and
    random valid payments of the applied ``payments`` source, so every source of the plan lands and its
    views are checked by ``consistency``. Returns each source's counts.
    """
    from headwater.pipelines.events.codec import EventCodec
    from headwater.pipelines.events.generator import GeneratorConfig
    from headwater.pipelines.events.producer import produce
    from headwater.pipelines.events.sources import applied_source
    from headwater.pipelines.events.synthetic import produce_synthetic

    duration = args.minutes * 60
    out: dict[str, dict[str, Any]] = {}
    errors: list[BaseException] = []

    def payments() -> None:
        try:
            source = applied_source("payments", cfg["state"])
            _, kafka = robust_producer(
                cfg["bootstrap"], cfg["topics"]["payments"], args.payments_rate, duration
            )
            try:
                stats = produce_synthetic(kafka, source, rate=args.payments_rate, duration_s=duration,
                                          seed=args.seed, topic=cfg["topics"]["payments"])  # fmt: skip
                kafka.flush(timeout=RIDE_OUT_S)
            finally:
                kafka.close(timeout=30)
            out["payments"] = stats.as_dict()
        except BaseException as exc:  # reported by the caller
            errors.append(exc)

    thread = threading.Thread(target=payments, daemon=True)
    if args.payments_rate > 0:
        thread.start()
    settings, kafka = robust_producer(cfg["bootstrap"], cfg["topics"]["events"], args.rate, duration)
    try:
        codec = EventCodec(applied_source("events", cfg["state"]))
        stats = produce(settings, GeneratorConfig(seed=args.seed), producer=kafka, codec=codec)
        kafka.flush(timeout=RIDE_OUT_S)
    finally:
        kafka.close(timeout=30)
    out["events"] = stats.as_dict()
    if args.payments_rate > 0:
        thread.join(RIDE_OUT_S)
    if errors:
        raise RuntimeError(f"the payments producer failed: {errors[0]!r}") from errors[0]
    return out


def lags(cfg: dict[str, Any]) -> dict[str, int | None]:
    """Per consumer group, the records of the run's source topics it has not committed (None: no commit)."""
    out: dict[str, int | None] = {}
    for group in cfg["groups"]:
        per_topic = [probe.group_lag(cfg["bootstrap"], group, t) for t in cfg["topics"].values()]
        out[group] = None if any(lag is None for lag in per_topic) else sum(lag or 0 for lag in per_topic)
    return out


def train_model(state: Path, out: Path, seed: int) -> Path:
    """Train a small DCN (and its linear fallback) on a synthetic world bound to the applied registry.

    The soak's ranking load needs a model; one trained here makes the run self-contained (the values it
    was trained on do not matter: the soak checks that the service answers, never with a 5xx).
    """
    from headwater.ranking.features import load_registry
    from headwater.ranking.synthetic import make_world, training_set
    from headwater.ranking.train import TrainOptions, train_and_save
    from headwater.serving.config import DEFAULT_POPULARITY

    registry = load_registry(state, DEFAULT_POPULARITY)
    world = make_world(registry, users=200, items=200, seed=seed, empty_share=0.1)
    train_and_save(training_set(registry, world, slates=400, seed=seed), out,
                   TrainOptions(epochs=1, linear_iterations=20, device="cpu"))  # fmt: skip
    return out


def land(system: System, state: Path, lake: Path) -> dict[str, dict[str, Any]]:
    """``run landing`` of every source; return its JSON line per source (one line each, in plan order)."""
    text = system.run("run", "landing", "--state-dir", str(state), "--lake", str(lake))
    rows = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
    return {row["source"]: row for row in rows}


def dead_letter_audit(letters: list[Any], tiers: int) -> dict[str, Any]:
    """Count the dead letters by source topic and reason, and check each tier wrote each at most once.

    Every tier (realtime, nearline, landing) reads every source and writes its own dead letters to the
    one DLQ topic, so a record has at most ``tiers`` letters; a record that does not decode (any reason
    but the timing ones, which each tier judges by its own clock) has exactly ``tiers``.
    """
    from collections import Counter

    by_reason: dict[str, Counter[str]] = {}
    per_record: Counter[tuple[str, int, int]] = Counter()
    decode: set[tuple[str, int, int]] = set()
    for d in letters:
        where = (d.source_topic, d.source_partition, d.source_offset)
        by_reason.setdefault(d.source_topic, Counter())[d.reason] += 1
        per_record[where] += 1
        if d.reason not in ("late", "future_dated"):
            decode.add(where)
    over = [list(w) for w, n in per_record.items() if n > tiers]
    short = [list(w) for w in decode if per_record[w] != tiers]
    return {
        "letters": len(letters),
        "records": len(per_record),
        "by_source_topic_and_reason": {t: dict(c) for t, c in by_reason.items()},
        "records_with_more_letters_than_tiers": over[:20],
        "records_with_more_letters_than_tiers_count": len(over),
        "undecodable_records_not_lettered_by_every_tier": short[:20],
        "undecodable_records_not_lettered_by_every_tier_count": len(short),
        "undecodable_records": len(decode),
    }


def soak(
    system: System,
    cfg: dict[str, Any],
    args: argparse.Namespace,
    run_dir: Path,
    partial: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Run the soak and return its figures (see the module docstring for the steps).

    ``partial`` receives each figure as soon as it is known, so a run that fails late keeps them.
    """
    partial = {} if partial is None else partial
    state, namespace, run_id = cfg["state"], cfg["namespace"], cfg["topic"]
    system.run("apply", str(cfg["repo"]), "--state-dir", str(state), "--no-feast")
    system.run("topics", "create", "--state-dir", str(state))
    model = train_model(state, run_dir / "models", args.seed) if args.qps > 0 else None
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
    ranking = RankingLoad.maybe_start(system, namespace, args.qps, model=model, state=state, topic=run_id)
    time.sleep(30)  # the Flink mini-cluster starts in ~20-60 s; events produced meanwhile wait in Kafka
    sampled: dict[str, Any] = {}
    stop = threading.Event()
    sampler = threading.Thread(target=sample_loop, args=(system, cfg, stop, sampled), daemon=True)
    sampler.start()
    produced = produce_all(cfg, args)
    produced_at = time.monotonic()
    print(f"produced: {produced}", flush=True)
    partial["produced"] = produced
    # the service sends an impression per answer to the events topic: stop the load before the drain
    ranking_stats: dict[str, Any] = ranking.stop() if ranking is not None else {"skipped": "--qps 0"}
    feedback_sent = int((ranking_stats.get("feedback") or {}).get("sent", 0))
    partial["ranking"] = ranking_stats
    drained = wait_drained(cfg, timeout_s=args.drain_s)
    drained_s = round(time.monotonic() - produced_at, 1)
    partial["group_lag_at_end"] = drained
    stop.set()
    sampler.join()
    partial["memory"] = {name: track.summary() for name, track in sampled.get("memory", {}).items()}
    final_fresh = _freshness(system, state, namespace)
    crashed = [n for n in ("realtime", "nearline", "serve") if n in system.procs and not system.alive(n)]
    system.stop_all()
    ends = {name: sum(probe.end_offsets(cfg["bootstrap"], t).values()) for name, t in cfg["topics"].items()}
    landing = land(system, state, run_dir / "lake")
    landed_s = round(time.monotonic() - produced_at, 1)
    partial.update(records_in_topic=ends, landing=landing)
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
            ok=(0, 1),  # 1: a view above the mismatch target, still a report
        )
    )
    consistency_s = round(time.monotonic() - produced_at, 1)
    partial["consistency"] = consistency
    dlq = f"{run_id}.dlq"
    deadline = time.monotonic() + 120  # a tier stopped mid-transaction: aborted at its timeout
    while (unstable := probe.unstable_records(cfg["bootstrap"], dlq)) and time.monotonic() < deadline:
        time.sleep(5)
    letters = probe.dead_letters(cfg["bootstrap"], dlq)
    audit = dead_letter_audit(letters, tiers=3)
    partial["dead_letters"] = audit
    memory = {name: track.summary() for name, track in sampled.get("memory", {}).items()}
    per_source = {}
    for name, count in produced.items():
        row = landing.get(name, {})
        sent = count["sent"] + (feedback_sent if name == "events" else 0)
        accounted = row.get("landed", 0) + row.get("malformed", 0) + row.get("future_dated", 0)
        per_source[name] = {
            "produced": count["sent"],
            "not_acknowledged": count["failed"],
            "feedback_sent_by_the_service": feedback_sent if name == "events" else 0,
            "records_in_topic": ends[name],
            "landing": row,
            "landed_plus_rejected": accounted,
            "every_record_in_topic": ends[name] == sent and count["failed"] == 0,
            "every_record_landed_or_rejected": row.get("records") == ends[name] == accounted,
        }
    # per view: {slot: values that differ}, over ``found`` entities x slots compared
    mismatches = sum(sum(v.get("mismatches", {}).values()) for v in consistency)
    compared = sum(v.get("found", 0) * len(v.get("mismatches", {})) for v in consistency)
    statuses = ranking_stats.get("statuses") or {}
    five_xx = sum(n for code, n in statuses.items() if code.startswith("5"))
    reconcile = {
        "per_source": per_source,
        # late events land too (flagged), and duplicates land and are dropped by event_id downstream
        "duplicates_produced": produced["events"].get("duplicates"),
        "group_lag_at_end": drained,
        "dead_letters": audit,
        "dlq_records_in_open_transactions_when_read": unstable,
        "seconds_after_the_last_record": {"drained": drained_s, "landed": landed_s,
                                          "consistency_done": consistency_s},
    }  # fmt: skip
    verdict = {
        "every_record_in_topic": all(s["every_record_in_topic"] for s in per_source.values()),
        "landing_accounts_for_every_record": all(
            s["every_record_landed_or_rejected"] for s in per_source.values()
        ),
        "dead_letters_once_per_tier": audit["records_with_more_letters_than_tiers_count"] == 0
        and audit["undecodable_records_not_lettered_by_every_tier_count"] == 0,
        # the records the landing rejected as malformed are the ones every tier dead-lettered
        "undecodable_records_equal_the_landing_malformed": audit["undecodable_records"]
        == sum(s["landing"].get("malformed", 0) for s in per_source.values()),
        "every_group_drained": all(lag == 0 for lag in drained.values()),
        "no_tier_crashed": not crashed,
        "memory_flat": all(m.get("flat", False) for m in memory.values()),
        "mismatches_after_drain": mismatches,
        "values_checked": compared,
        "entities_checked": sum(v.get("found", 0) for v in consistency),
        "service_5xx": five_xx if ranking is not None else None,
        "service_requests": ranking_stats.get("requests"),
        "no_sla_breach_at_end": bool(final_fresh and final_fresh.get("ok")),
        "samples_with_a_breach": [
            {"t_s": f["t_s"], "breached": f["report"].get("breached")}
            for f in sampled.get("freshness") or []
            if f["report"].get("breached")
        ],
    }
    return {
        "produced": produced,
        "reconcile": reconcile,
        "consistency": consistency,
        "final_freshness": final_fresh,
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
