"""Calibrate the cost model from measured CPU, then check every example view's estimate against a real run.

Nearline: one fixed generated stream of the behaviour source (the event generator, seed 17,
``--events`` records at ``--sim-rate`` and at ``--second-rate`` events/s of event time, with its
late, duplicate and malformed records) and of the payments source is produced once. Then, for
each view *shape* (one aggregation kind x 4 features, filters, many panes, another join key than
the topic's, ...) and each example nearline view, the real worker (``python -m
headwater.cli.nearline``, one process, a fresh consumer group, store folder and Redis
namespace) consumes the whole stream alone and exits when idle.

How the tier's CPU is isolated: the worker writes ``time.process_time()`` of its own process (user +
system CPU, not wall time) into its stats file; an idle run's (start-up, empty topic, idle exit) is
subtracted, and the rest is divided by the records consumed: decode, rules, dedup, state, changelog,
Redis writes, polling and commits of that view. Other agents' load still inflates CPU time (shared
cores and caches, up to 1.6x here), so every measurement is paired with a reference run (cal_base)
just before it: the figure kept is the ratio, times the reference's least CPU of the calibration.

The fit: least squares (numpy, negative terms pinned at 0) of the per-shape CPU per record on the
terms of :mod:`headwater.registry.cost` (``event_us``, ``agg_us`` per kind, ``where_us``,
``pane_us``, ``rekey_us``); the selectivity is the share of events the calibration filter keeps;
state bytes per slice, per aggregation and per dedup id come from a least squares of the RocksDB
folder's size (less the idle run's) on the worker's slice and id counts. The constants go to
``registry/calibration/nearline.json`` with ``/proc/cpuinfo``'s model name, the cores, the date and
this command; the figures to ``bench/results/bench_calibrate.json`` (``tiers.nearline``).

Accuracy: each example view alone at both event-time rates (payments: its own stream), estimate vs
measured CPU per record (target +/-30%), RocksDB size vs the state estimate (windows capped to the
stream's event-time span: the estimate is of full windows), Redis ``MEMORY USAGE`` of the view's keys
vs the online estimate. A benchmark: it prints and writes JSON, nothing asserts.

Realtime (``--tiers realtime``, :mod:`calibrate_realtime`): each shape and each example view of the
behaviour source alone in ``bench/bench_realtime.py``'s real Flink job at two offered rates; the
job's process group CPU (JVM + Python workers) per wall second gives fixed cores and us/event;
``--rt-examples-only`` keeps the file's constants and measures the example views. Offline is not
run (its file says NOT MEASURED).

Usage: python bench/bench_calibrate.py [--tiers nearline,realtime] [--events 60000] [--sim-rate 200]
       [--second-rate 50] [--rt-rates 2000,6000] [--rt-examples-only] [--table-only] [--quick]
       (or ``headwater calibrate ARGS``)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np

from headwater.pipelines.settings import Settings
from headwater.registry.calibration import AGG_KINDS, calibration_path, parse_calibration
from headwater.registry.cost import DEDUP_BUCKET_S, estimate_footprint, estimate_view, view_shape
from headwater.registry.plans import TierPlan, build_plans, registry_hash
from headwater.registry.sources import resolve_timing
from headwater.registry.tiers import TIERS
from headwater.registry.validate import check_repo

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests/integration/pipelines/nearline"))
import harness as h  # noqa: E402  (the integration tests' helpers: topics, producers, worker start)

FEATURES = ROOT / "features"
SEED = 17
USERS = 5_000
CLICK_FILTER = "event_type = 'click'"


def shape_views() -> dict[str, str]:
    """Return the calibration views (YAML), each a shape that isolates one constant."""

    def view(name: str, feats: list[str], entity: str = "user") -> str:
        body = "".join(f"  - {f}\n" for f in feats)
        return (
            f"feature_view: {name}\nentity: {entity}\nsource: events\ntier: nearline\nfreshness_sla: PT10M\n"
            f"compute_cost: 1000\nowner: calibration\ndescription: calibration shape\nfeatures:\n{body}"
        )

    def four(kind: str, extra: str = "", window: str = "1h", slide: str = "") -> list[str]:
        s = f", slide: {slide}" if slide else ""
        return [f"{{name: f{i}, agg: {kind}, window: {window}{s}{extra}}}" for i in range(4)]

    return {
        "cal_base": view("cal_base", ["{name: f0, agg: count, window: 1h}"]),
        "cal_count4": view("cal_count4", four("count")),
        "cal_sum4": view("cal_sum4", four("sum", ", field: dwell_ms")),
        "cal_avg4": view("cal_avg4", four("avg", ", field: dwell_ms")),
        "cal_max4": view("cal_max4", four("max", ", field: position")),
        "cal_last4": view("cal_last4", four("last", ", field: item_id")),
        "cal_distinct4": view("cal_distinct4", four("distinct_count", ", field: session_id")),
        "cal_topk4": view("cal_topk4", four("top_k", ", field: category, k: 5")),
        "cal_where4": view("cal_where4", four("count", f', where: "{CLICK_FILTER}"')),
        "cal_panes4": view("cal_panes4", four("count", window="24h", slide="1m")),
        "cal_rekey": view("cal_rekey", ["{name: f0, agg: count, window: 1h}"], entity="item"),
    }


def make_repo(tmp: Path, views: dict[str, str]) -> Path:
    """Write a feature repo: the example's entities, sources and schemas, and ``views`` (name -> YAML)."""
    repo = tmp / "features"
    shutil.rmtree(repo, ignore_errors=True)
    repo.mkdir(parents=True)
    for name in ("entities.yaml", "sources.yaml"):
        shutil.copy(FEATURES / name, repo / name)
    shutil.copytree(FEATURES / "schemas", repo / "schemas")
    (repo / "budget.yaml").write_text("tiers: {realtime: 100000, nearline: 100000, offline: 100000}\n")
    for name, text in views.items():
        (repo / f"{name}.yaml").write_text(text, encoding="utf-8")
    return repo


def plan_of(repo: Path, topics: dict[str, str]) -> tuple[TierPlan, Any]:
    """Return the nearline plan of ``repo`` (topics renamed to ``topics``) and the check result."""
    result = check_repo(repo)
    errors = [f"{d.file}:{d.line}: {d.message}" for d in result.diagnostics.errors]
    if errors:
        raise SystemExit("calibration repo does not check:\n" + "\n".join(errors))
    plan = build_plans(result, registry_hash(result))["nearline"]
    sources = [s.model_copy(update={"topic": topics[s.name]}) for s in plan.sources]
    return plan.model_copy(update={"sources": sources}), result


def machine() -> dict[str, Any]:
    """Return the CPU model (``/proc/cpuinfo``), cores and Python of this machine."""
    model = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"model": model, "cores": os.cpu_count(), "python": platform.python_version()}


class Stream:
    """The fixed stream: behaviour topics at two event-time rates, payments, an empty topic."""

    def __init__(self, settings: Settings, tmp: Path, events: int, rates: tuple[float, float]) -> None:
        self.env = h.Env(settings=settings, tmp=tmp)
        suffix = uuid.uuid4().hex[:8]
        self.topics = {
            "events": f"cal-events-{suffix}",
            "events_b": f"cal-events-b-{suffix}",
            "payments": f"cal-payments-{suffix}",
            "empty": f"cal-empty-{suffix}",
        }
        self.env.topics = dict(self.topics)
        self.env.settings = h.dataclasses.replace(
            settings, events_topic=self.topics["events"], dlq_topic=f"cal-dlq-{suffix}", partitions=4
        )
        wanted: dict[str, dict[str, str]] = {t: {} for t in self.topics.values()}
        h.ensure_topics(self.env.settings, {**wanted, self.env.settings.dlq_topic: {}}, 4)
        self.records: dict[str, int] = {}
        for key, rate in (("events", rates[0]), ("events_b", rates[1])):
            s = h.dataclasses.replace(self.env.settings, events_topic=self.topics[key])
            h.produce(s, events, seed=SEED, rate=rate, users=USERS)
            self.records[key] = self.end_offset(self.topics[key])
        h.produce_payments(self.env.settings, self.topics["payments"], max(2_000, events // 4), seed=SEED)
        self.records["payments"] = self.end_offset(self.topics["payments"])
        self.records["empty"] = 0

    def end_offset(self, topic: str) -> int:
        """Return the records in ``topic``."""
        from kafka import KafkaConsumer, TopicPartition

        consumer = KafkaConsumer(bootstrap_servers=self.env.settings.kafka_bootstrap)
        try:
            return sum(consumer.end_offsets([TopicPartition(topic, p) for p in range(4)]).values())
        finally:
            consumer.close()

    def cleanup(self) -> None:
        """Delete the topics and the Redis keys of every run."""
        self.env.cleanup()


def run_worker(
    stream: Stream,
    plan: TierPlan,
    topic_key: str,
    view: str | None,
    idle_exit_s: float = 5.0,
    deadline_s: float = 600.0,
) -> dict[str, Any]:
    """Run the nearline worker alone on one topic until it has committed every record; its figures.

    A worker that has not committed everything after ``deadline_s`` is stopped (SIGTERM: it writes
    its stats and closes); its figures say so (``complete``).
    """
    from redis import Redis

    env = stream.env
    env.group = f"cal-{uuid.uuid4().hex[:10]}"
    env.namespace = f"c{uuid.uuid4().hex[:8]}"
    shutil.rmtree(env.store_dir, ignore_errors=True)
    h._write(env.tmp, plan)
    topic = stream.topics[topic_key]
    records = stream.records[topic_key]
    proc = env.start(idle_exit_s, 5_000, 1)
    deadline = time.monotonic() + deadline_s
    complete = False
    while time.monotonic() < deadline:
        if records and env.committed(topic) >= records:
            complete = True
            break
        if proc.poll() is not None:
            break
        time.sleep(0.5)
    if not complete and proc.poll() is None:
        proc.terminate()
    proc.wait(timeout=300)
    stats = [json.loads(p.read_text()) for p in sorted(env.store_dir.glob("stats-*.json"))]
    if not stats:  # the worker never wrote its stats (stopped before its first checkpoint)
        return {"records": records, "complete": False, "events": 0}
    c = stats[0]["counters"]
    state = sum(sum(s["state_bytes"].values()) for s in stats)
    # what the stores hold (keys + values of panes and dedup ids, written at close): not the folder
    live = [b for s in stats for part in s.get("live_bytes", {}).values() for b in [part]]
    live_state = sum(v for part in live for k, v in part.items() if k != "other")
    redis = Redis.from_url(env.settings.redis_url)
    keys = list(redis.scan_iter(match=f"{env.namespace}:{{{view}}}:*", count=1000)) if view else []
    memory = sum(int(redis.memory_usage(k) or 0) for k in keys)
    for k in redis.scan_iter(match=f"{env.namespace}:*", count=1000):
        redis.unlink(k)
    redis.close()
    return {
        "records": records,
        "events": int(c["events"]),
        "cpu_s": float(c["cpu_s"]),
        "written": int(c.get("written", 0)),
        "state_bytes": state,
        "live_state_bytes": live_state,
        "complete": complete or env.committed(topic) >= records,
        "entities": sum(sum(t["entities"].values()) for t in stats[0]["tasks"]),
        "pane_records": sum(sum(t["panes"].values()) for t in stats[0]["tasks"]),
        "dedup_ids": sum(t["dedup_ids"] for t in stats[0]["tasks"]),
        "live_parts": {k: sum(part.get(k, 0) for part in live) for k in {k for part in live for k in part}},
        "redis_keys": len(keys),
        "redis_bytes": memory,
        "load_1m": round(os.getloadavg()[0], 2),
    }


class Reference:
    """The reference run (cal_base) that every measurement is paired with, so machine load cancels.

    Other agents share the 2 CPUs: under load a run's CPU time grows (shared caches and cores), by
    up to 1.5x here. Each measurement runs right after a reference run; its figure is the ratio of the
    two, times the reference's least CPU seen in the whole calibration (the least-loaded moment).
    """

    def __init__(self, stream: Stream, plan: TierPlan, idle: dict[str, Any]) -> None:
        self.stream, self.plan, self.idle = stream, plan, idle
        self.seen: list[float] = []

    def run(self) -> float:
        """Run the reference once; return its CPU per record."""
        r = run_worker(self.stream, self.plan, "events", "cal_base")
        us = (r["cpu_s"] - self.idle["cpu_s"]) / max(1, r["records"]) * 1e6
        self.seen.append(us)
        return us

    @property
    def quiet_us(self) -> float:
        """The reference's CPU per record at the least-loaded moment seen."""
        return min(self.seen)


def measure(
    stream: Stream, plan: TierPlan, topic_key: str, view: str, idle: dict[str, Any], ref: Reference
) -> dict[str, Any]:
    """Run the reference then ``view``; the view's CPU per record relative to the reference's.

    ``ratio``: view / reference of the pair; ``us_per_record`` is filled in later (``ratio`` x the
    reference's quiet figure); ``state_net``: the store folder less the idle run's (RocksDB's files).
    """
    ref_us = ref.run()
    r = run_worker(stream, plan, topic_key, view)
    r["raw_us"] = round((r["cpu_s"] - idle["cpu_s"]) / max(1, r["records"]) * 1e6, 2)
    r["ref_us"] = round(ref_us, 2)
    r["ratio"] = r["raw_us"] / ref_us if ref_us > 0 else 1.0
    r["state_net"] = max(0, r["state_bytes"] - idle["state_bytes"])
    return r


def design_row(shape: Any, selectivity: float) -> list[float]:
    """Return the model's terms of a shape: event, rekey, where, pane, one per aggregation kind."""
    row = [1.0, float(shape.rekeyed), float(shape.filters), 0.0] + [0.0] * len(AGG_KINDS)
    for kind, filtered, panes in shape.aggs:
        s = selectivity if filtered else 1.0
        row[3] += s * (panes - 1)
        row[4 + AGG_KINDS.index(kind)] += s
    return row


def fit(rows: list[list[float]], us: list[float]) -> dict[str, Any]:
    """Least squares of the per-shape CPU per event on the model's terms (negative terms pinned at 0)."""
    a, b = np.asarray(rows), np.asarray(us)
    keep = [j for j in range(a.shape[1]) if a[:, j].any()]
    # count is in every shape with event_us: pin count to the base shape's difference (identifiable)
    coef = np.zeros(a.shape[1])
    for _ in range(5):
        sol, *_ = np.linalg.lstsq(a[:, keep], b, rcond=None)
        coef[:] = 0
        coef[keep] = sol
        negative = [j for j in keep if coef[j] < 0 and j != 0]
        if not negative:
            break
        keep = [j for j in keep if j not in negative]
        coef[negative] = 0
    names = ["event_us", "rekey_us", "where_us", "pane_us"]
    out: dict[str, Any] = {n: round(float(coef[i]), 4) for i, n in enumerate(names)}
    out["agg_us"] = {k: round(float(coef[4 + i]), 4) for i, k in enumerate(AGG_KINDS) if a[:, 4 + i].any()}
    return out


def click_share(stream_events: int, rate: float) -> float:
    """Return the share of generated events the calibration filter keeps (the generator's own stream)."""
    from headwater.pipelines.events.generator import EventGenerator, GeneratorConfig

    gen = EventGenerator(GeneratorConfig(seed=SEED, rate=rate, users=USERS))
    ems = [em for em in gen.take(min(stream_events, 20_000)) if em.event is not None]
    return sum(em.event["event_type"] == "click" for em in ems) / max(1, len(ems))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--events", type=int, default=60_000)
    ap.add_argument("--sim-rate", type=float, default=200.0, help="events/s of event time (nearline stream)")
    ap.add_argument("--second-rate", type=float, default=50.0)
    ap.add_argument("--rt-rates", default="2000,6000", help="realtime: the two offered rates (events/s)")
    ap.add_argument("--rt-phase-s", type=float, default=30.0)
    ap.add_argument("--rt-warm-s", type=float, default=20.0, help="--rt-jobs: unmeasured warm-up seconds")
    ap.add_argument("--tiers", default="nearline,realtime")
    ap.add_argument(
        "--rt-examples-only",
        action="store_true",
        help="realtime: keep the file's constants, run the example views",
    )
    ap.add_argument("--no-write", action="store_true", help="print, do not write the calibration files")
    ap.add_argument("--quick", action="store_true", help="10k events, 20 s phases (development)")
    ap.add_argument(
        "--table-only", action="store_true", help="recompute and print the nearline accuracy table"
    )
    ap.add_argument(
        "--rt-refit", action="store_true", help="with --rt-shapes-only: refit the last shapes' figures"
    )
    ap.add_argument(
        "--rt-shapes-only",
        action="store_true",
        help="realtime: fit the constants from the shapes; re-estimate the example rows already measured",
    )
    ap.add_argument(
        "--rt-jobs",
        action="store_true",
        help="realtime: jobs of 1, 2, 3 views, each view alone, payments; fit the per-job model, table",
    )
    ap.add_argument("--rt-jobs-refit", action="store_true", help="--rt-jobs on the last runs' figures")
    ap.add_argument("--rt-jobs-only", default="", help="--rt-jobs: only these jobs (comma-separated)")
    ap.add_argument("--rt-no-publish", action="store_true", help="--rt-jobs fit: no term per value written")
    ap.add_argument(
        "--summary", action="store_true", help="print the accuracy table of every tier from the results"
    )
    ap.add_argument(
        "--rt-state", action="store_true", help="realtime: each view alone at one steady rate; state table"
    )
    ap.add_argument("--rt-state-refit", action="store_true", help="--rt-state on the last runs' figures")
    ap.add_argument("--rt-state-rate", type=float, default=300.0, help="--rt-state: events/s")
    ap.add_argument("--rt-state-s", type=float, default=330.0, help="--rt-state: seconds (> the windows)")
    ap.add_argument(
        "--nl-state", action="store_true", help="nearline: state constants from live bytes; state table"
    )
    ap.add_argument("--nl-shapes", default="", help="--nl-state: only these shapes (and cal_base)")
    ap.add_argument("--nl-one-rate", action="store_true", help="--nl-state: examples at the first rate only")
    ap.add_argument(
        "--nl-views", default="", help="--nl-state: only these example views, no shapes, constants kept"
    )
    ap.add_argument("--nl-state-refit", action="store_true", help="re-estimate the last --nl-state rows")
    ap.add_argument(
        "--nl-cpu-views",
        default="",
        help="nearline: re-measure only these example views' CPU (comma-separated), the constants kept",
    )
    args = ap.parse_args()
    if args.nl_cpu_views:
        command = "python bench/bench_calibrate.py " + " ".join(sys.argv[1:])
        nearline_cpu_views(args, command, [v for v in args.nl_cpu_views.split(",") if v])
        return
    if args.nl_state_refit:
        nearline_state_refit(not args.no_write, args.events, args.sim_rate)
        return
    if args.nl_state:
        command = "python bench/bench_calibrate.py " + " ".join(sys.argv[1:])
        out = ROOT / "bench/results/bench_calibrate.json"
        doc = json.loads(out.read_text())
        got = nearline_state(args, command)
        if args.nl_views:  # some views re-measured: their rows replace the last run's, the rest stay
            kept = doc["tiers"]["nearline"]["state"]
            kept["accuracy"].update(got["accuracy"])
            kept.setdefault("views_runs", []).append({k: v for k, v in got.items() if k != "accuracy"})
            got = kept
        doc["tiers"]["nearline"]["state"] = got
        out.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
        return
    if args.summary:
        summary()
        return
    if args.rt_state or args.rt_state_refit:
        import calibrate_realtime as rt

        command = "python bench/bench_calibrate.py " + " ".join(sys.argv[1:])
        rt.calibrate_state(
            args.rt_state_refit, args.rt_state_rate, args.rt_state_s, not args.no_write, command
        )
        return
    if args.rt_jobs or args.rt_jobs_refit:
        import calibrate_realtime as rt

        rates = tuple(float(r) for r in args.rt_rates.split(","))
        command = "python bench/bench_calibrate.py " + " ".join(sys.argv[1:])
        only = [j for j in args.rt_jobs_only.split(",") if j] or None
        rt.FIT_PUBLISH = not args.rt_no_publish
        rt.WARM_S = args.rt_warm_s
        rt.calibrate_jobs(args.rt_jobs_refit, rates, args.rt_phase_s, not args.no_write, command, only)
        return
    if args.table_only:
        recompute_table()
        return
    if args.rt_shapes_only:
        realtime_shapes_only(args)
        return
    if args.quick:
        args.events, args.rt_phase_s = 10_000, 20.0
    tiers = args.tiers.split(",")
    if not set(tiers) <= {"nearline", "realtime"}:
        raise SystemExit("--tiers: nearline and/or realtime (offline is not measured yet, see the docstring)")
    command = "python bench/bench_calibrate.py " + " ".join(sys.argv[1:])
    out = ROOT / "bench/results/bench_calibrate.json"
    previous = json.loads(out.read_text()) if out.is_file() else {}
    results: dict[str, Any] = {"benchmark": "calibrate", "tiers": previous.get("tiers", {})}
    for tier in tiers:
        section = (
            calibrate_nearline(args, command) if tier == "nearline" else calibrate_realtime(args, command)
        )
        results["tiers"][tier] = section
        out.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
        print(f"wrote {out.relative_to(ROOT)} ({tier}: {section.get('seconds')} s)")


def write_calibration(tier: str, data: dict[str, Any], args: argparse.Namespace) -> None:
    """Write ``registry/calibration/<tier>.json`` unless ``--no-write``."""
    if args.no_write:
        return
    path = calibration_path(tier)
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {path.relative_to(ROOT)}")


def calibrate_nearline(args: argparse.Namespace, command: str) -> dict[str, Any]:
    """Calibrate the nearline tier and check its example views; return the figures."""
    settings = Settings.from_env()
    tmp = Path(tempfile.mkdtemp(prefix="bench-cal-"))
    started, load0 = time.monotonic(), os.getloadavg()
    stream = Stream(settings, tmp, args.events, (args.sim_rate, args.second_rate))
    print(f"stream: {stream.records} records; produced in {time.monotonic() - started:.0f} s")
    results: dict[str, Any] = {"command": command}
    try:
        shapes = shape_views()
        plan0, _ = plan_of(make_repo(tmp, {"cal_base": shapes["cal_base"]}), {
            "events": stream.topics["empty"], "payments": stream.topics["empty"]})  # fmt: skip
        idles = [run_worker(stream, plan0, "empty", None) for _ in range(2)]
        idle = min(idles, key=lambda r: r["cpu_s"])
        idle_long = run_worker(stream, plan0, "empty", None, idle_exit_s=15.0)
        fixed_cores = max(0.0, (idle_long["cpu_s"] - idle["cpu_s"]) / 10.0)
        print(
            f"idle worker (start-up + 5 s idle): {[round(r['cpu_s'], 2) for r in idles]} CPU s, "
            f"idle polling {fixed_cores:.4f} cores"
        )
        sel = click_share(args.events, args.sim_rate)
        rows, us, per_shape = [], [], {}
        topics = {"events": stream.topics["events"], "payments": stream.topics["empty"]}
        ref_plan, _ = plan_of(make_repo(tmp, {"cal_base": shapes["cal_base"]}), topics)
        ref = Reference(stream, ref_plan, idle)
        runs = [(name, text, "events") for name, text in shapes.items() if name != "cal_base"]
        runs.append(("cal_base_slow", shapes["cal_base"], "events_b"))  # fewer ids kept: the dedup term
        base = run_worker(stream, ref_plan, "events", "cal_base")
        base.update(raw_us=0.0, ratio=1.0, state_net=max(0, base["state_bytes"] - idle["state_bytes"]))
        per_shape["cal_base"] = base
        for name, text, topic_key in runs:
            view_name = "cal_base" if name == "cal_base_slow" else name
            plan, _ = plan_of(
                make_repo(tmp, {view_name: text}), {**topics, "events": stream.topics[topic_key]}
            )
            run = measure(stream, plan, topic_key, view_name, idle, ref)
            per_shape[name] = run
            print(
                f"  {name}: {run['raw_us']} us/record (reference {run['ref_us']}: x{run['ratio']:.3f}), "
                f"state {run['state_net']:,} B net, {run['pane_records']} slices, {run['dedup_ids']} ids, "
                f"load {run['load_1m']}"
            )
        print(f"reference cal_base: least {ref.quiet_us:.1f} us/record of {[round(x, 1) for x in ref.seen]}")
        for name, run in per_shape.items():
            run["us_per_record"] = round(run["ratio"] * ref.quiet_us, 2)
            view_name = "cal_base" if name == "cal_base_slow" else name
            (view,) = check_repo(make_repo(tmp / "shape", {view_name: shapes[view_name]})).views
            rows.append(design_row(view_shape(view.features, rekeyed=view.join_key != "user_id"), sel))
            us.append(run["us_per_record"])
        constants = fit(rows, us)
        constants["selectivity"] = round(sel, 4)
        constants["fixed_cores"] = round(fixed_cores, 4)
        predicted = np.asarray(rows) @ np.asarray(
            [constants["event_us"], constants["rekey_us"], constants["where_us"], constants["pane_us"]]
            + [constants["agg_us"].get(k, 0.0) for k in AGG_KINDS]
        )
        for run, p in zip(per_shape.values(), predicted, strict=True):
            run["fitted_us"] = round(float(p), 2)
        constants.update(state_constants(per_shape, result_shapes(tmp, shapes)))
        cal_data = {
            "tier": "nearline",
            "model": "registry/cost.py",
            "constants": constants,
            "machine": machine(),
            "measured_at": time.strftime("%Y-%m-%d", time.gmtime()),
            "command": command,
            "isolation": "the nearline worker's own process CPU (time.process_time in its stats file), "
            "minus an idle run's (start-up + idle exit), per record consumed",
            "stream": {"events": args.events, "sim_rate": args.sim_rate, "users": USERS, "seed": SEED},
        }
        cal = parse_calibration("nearline", cal_data, calibration_path("nearline"))
        accuracy = check_examples(stream, tmp, idle, cal, args, ref)
        cal_data["measured"] = {
            v: {"us_per_record": r["rates"][0]["measured_us"], "state_bytes": r["rates"][0]["state_bytes"],
                "online_bytes": r["rates"][0]["redis_bytes"], "rate_per_s": r["rates"][0]["rate"]}
            for v, r in accuracy.items()
        }  # fmt: skip
        results.update(
            constants=constants,
            idle=idle,
            idle_long=idle_long,
            stream_records={"events": stream.records["events"], "payments": stream.records["payments"]},
            shapes=per_shape,
            accuracy=accuracy,
            machine=machine(),
            load_average_start=[round(x, 2) for x in load0],
            load_average_end=[round(x, 2) for x in os.getloadavg()],
            seconds=round(time.monotonic() - started),
            measured_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        )
        print_table(accuracy)
        write_calibration("nearline", cal_data, args)
        return results
    finally:
        stream.cleanup()
        shutil.rmtree(tmp, ignore_errors=True)


def calibrate_realtime(args: argparse.Namespace, command: str) -> dict[str, Any]:
    """Calibrate the realtime tier (one job per shape, two rates) and check its example views."""
    import calibrate_realtime as rt

    started, load0 = time.monotonic(), os.getloadavg()
    tmp = Path(tempfile.mkdtemp(prefix="bench-cal-rt-"))
    r1, r2 = (float(r) for r in args.rt_rates.split(","))
    tier = TIERS["realtime"]
    shapes: dict[str, Any] = {}
    try:
        if args.rt_examples_only:  # keep the constants of the file; measure the example views only
            kept = json.loads(calibration_path("realtime").read_text(encoding="utf-8"))
            constants = kept["constants"]
        else:
            for name, feats in rt.SHAPES.items():
                repo = make_repo(tmp / name, {name: rt.shape_yaml(name, feats)})
                shapes[name] = rt.run_job(repo, tmp / name, (r1, r2), args.rt_phase_s)
                print(f"  {name}: {shapes[name]}")
            if any("error" in s for s in shapes.values()):
                return {"command": command, "shapes": shapes, "error": "a shape's job failed"}
            constants = rt.fit_realtime(shapes)
            constants.update(realtime_state_constants(shapes, r2))
        cal_data = {
            "tier": "realtime",
            "model": "registry/cost.py",
            "constants": constants,
            "machine": machine(),
            "measured_at": time.strftime("%Y-%m-%d", time.gmtime()),
            "command": command,
            "isolation": "the Flink job's process group CPU (mini-cluster JVM + PyFlink Python workers, "
            "/proc utime+stime) per wall second of each phase; two rates give fixed cores and us/event",
            "stream": {"rates": [r1, r2], "phase_s": args.rt_phase_s, "users": 5000, "items": 2000},
        }
        if args.rt_examples_only:
            cal_data = {**kept, "accuracy_command": command}
        cal = parse_calibration("realtime", cal_data, calibration_path("realtime"))
        example = check_repo(FEATURES)
        accuracy: dict[str, Any] = {}
        for view in sorted((v for v in example.views if v.tier == "realtime"), key=lambda v: v.name):
            if view.source != "events":
                accuracy[view.name] = {
                    "source": view.source,
                    "skipped": "bench_realtime.py sends behaviour events only",
                }
                continue
            text = Path(ROOT / view.file).read_text(encoding="utf-8")
            run = rt.run_job(
                make_repo(tmp / view.name, {view.name: text}), tmp / view.name, (r1, r2), args.rt_phase_s
            )
            row: dict[str, Any] = {"source": view.source, "run": run, "rates": []}
            for phase in [] if "error" in run else run.get("phases", []):
                rate = phase["rate"]
                est = estimate_view(view.features, rate, tier, False, 5000, cal)
                est_cores = est.cpu_hours_per_day / 24
                cores = phase["job_cpu_cores"]
                row["rates"].append({
                    "rate": rate, "estimated_cores": round(est_cores, 4), "measured_cores": cores,
                    "cpu_error": round(est_cores / cores - 1, 3) if cores else None,
                })  # fmt: skip
            if run.get("phases") and "error" not in run:
                fp = estimate_footprint(view.features, r2, tier, 5000, 12, cal)
                row["state_estimate"] = round(fp.state_bytes)
                row["checkpoint_bytes"] = run["checkpoint_bytes"]
                row["state_error"] = (
                    round(fp.state_bytes / run["checkpoint_bytes"] - 1, 3)
                    if run["checkpoint_bytes"]
                    else None
                )
            print(
                f"  {view.name}: {row['rates']} state {row.get('state_estimate')} "
                f"vs {row.get('checkpoint_bytes')}"
            )
            accuracy[view.name] = row
        cal_data["measured"] = {
            v: {"cores": [p["measured_cores"] for p in r["rates"]], "rates": [p["rate"] for p in r["rates"]],
                "state_bytes": r.get("checkpoint_bytes")}
            for v, r in accuracy.items() if "rates" in r
        }  # fmt: skip
        write_calibration("realtime", cal_data, args)
        return {
            "command": command,
            "constants": constants,
            "shapes": shapes,
            "accuracy": accuracy,
            "machine": machine(),
            "load_average_start": [round(x, 2) for x in load0],
            "load_average_end": [round(x, 2) for x in os.getloadavg()],
            "seconds": round(time.monotonic() - started),
            "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def realtime_shapes_only(args: argparse.Namespace) -> None:
    """Fit realtime.json from the shapes' jobs; re-estimate the example rows measured before (kept)."""
    import calibrate_realtime as rt

    command = "python bench/bench_calibrate.py " + " ".join(sys.argv[1:])
    started = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix="bench-cal-rt-"))
    r1, r2 = (float(r) for r in args.rt_rates.split(","))
    shapes: dict[str, Any] = {}
    out = ROOT / "bench/results/bench_calibrate.json"
    doc = json.loads(out.read_text())
    section = doc["tiers"].setdefault("realtime", {})
    if args.rt_refit:  # the shapes' figures of the last run, fitted again
        command = f"{section.get('fit_command', '')}, refitted by {command}"
        shapes = section["shapes"]
        for s in shapes.values():
            cores = [p["job_cpu_cores"] for p in s["phases"]]
            if s.get("us_per_event", 0) <= 0:  # warm-up in the first phase: no slope to see
                s["us_per_event"], s["fixed_cores"] = 0.0, sum(cores) / len(cores)
    else:
        try:
            for name, feats in rt.SHAPES.items():
                repo = make_repo(tmp / name, {name: rt.shape_yaml(name, feats)})
                shapes[name] = rt.run_job(repo, tmp / name, (r1, r2), args.rt_phase_s)
                print(f"  {name}: {shapes[name]}")
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    section["shapes"] = shapes
    if any("us_per_event" not in s for s in shapes.values()):
        out.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
        raise SystemExit(
            "a shape's job did not hold two rates: no fit (see bench/results/bench_calibrate.json)"
        )
    constants = rt.fit_realtime(shapes)
    constants.update(realtime_state_constants(shapes, r2))
    path = calibration_path("realtime")
    kept = json.loads(path.read_text(encoding="utf-8"))
    cal_data = {
        **kept,
        "constants": constants,
        "machine": machine(),
        "measured_at": time.strftime("%Y-%m-%d", time.gmtime()),
        "command": command,
        "isolation": "the Flink job's process group CPU (mini-cluster JVM + PyFlink Python workers, "
        "/proc utime+stime) per wall second of each phase; two rates give fixed cores and us/event",
        "stream": {"rates": [r1, r2], "phase_s": args.rt_phase_s, "users": 5000, "items": 2000},
    }
    cal_data.pop("derivation", None)
    cal = parse_calibration("realtime", cal_data, path)
    example = check_repo(FEATURES)
    tier = TIERS["realtime"]
    for name, row in section.get("accuracy", {}).items():
        view = next(v for v in example.views if v.name == name)
        for r in row.get("rates", []):
            est = estimate_view(view.features, r["rate"], tier, False, 5000, cal).cpu_hours_per_day / 24
            r["estimated_cores"] = round(est, 4)
            r["cpu_error"] = round(est / r["measured_cores"] - 1, 3) if r["measured_cores"] else None
            print(f"  {name} @ {r['rate']}/s: estimated {est:.3f} cores, measured {r['measured_cores']}")
        if row.get("checkpoint_bytes"):
            last = row["rates"][-1]["rate"] if row.get("rates") else r2
            fp = estimate_footprint(view.features, last, tier, 5000, 12, cal)
            row["state_estimate"] = round(fp.state_bytes)
            row["state_error"] = round(fp.state_bytes / row["checkpoint_bytes"] - 1, 3)
    section.update(constants=constants, fit_command=command, fit_seconds=round(time.monotonic() - started))
    if not args.no_write:
        path.write_text(json.dumps(cal_data, indent=2) + "\n", encoding="utf-8")
    out.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {path.relative_to(ROOT)} and {out.relative_to(ROOT)}")


def realtime_state_constants(shapes: dict[str, Any], rate: float) -> dict[str, Any]:
    """Bytes per (entity, slice) record from the checkpoints of rt_base (1 count) and rt_wide (8 features)."""
    from headwater.registry.cost import Shape, live_entities, live_slices

    def records(window_s: float) -> float:
        shape = Shape(
            aggs=(), filters=0, slots=0, rekeyed=False, shortest_slide_s=1, longest_window_s=window_s
        )
        live = live_entities(shape, rate, 5000)
        return live * live_slices(shape, rate, live)

    base = shapes["rt_base"]["checkpoint_bytes"] / records(60)
    wide = shapes["rt_wide"]["checkpoint_bytes"] / records(300)
    slot = max(0.0, (wide - base) / 7)
    return {
        "state_pane_bytes": round(max(0.0, base - slot), 1),
        "state_slot_bytes": dict.fromkeys(AGG_KINDS, round(slot, 2)),
    }


COUNTER_SLOT_KINDS = ("distinct_count", "top_k")
COUNTER_ENTRY_BYTES = 16.0
"""One ``[value, count]`` entry of a counter map: the value's text (the stream's ~9 characters) + 7."""
COUNTER_SLOT_BYTES = 19.0
"""A counter map in a pane record: its brackets (2), its first entry (16) and the separator (1)."""


def state_constants(per_shape: dict[str, dict[str, Any]], kinds: dict[str, dict[str, int]]) -> dict[str, Any]:
    """Least squares of each run's net store size on its slices, slices x aggregations by kind, and ids.

    ``kinds``: per shape, the aggregations of each kind in its view. Negative terms are pinned at 0.
    A counter map (distinct_count, top_k) is not fitted: its first entry and brackets
    (:data:`COUNTER_SLOT_BYTES`) and each further event an entry (``state_running_event_bytes``, as
    the model counts them: every event of a record beyond its first) come from the layout and are
    taken off the runs' bytes first (a fitted slot would hold the entries too, which the model adds
    again).
    """
    names = list(per_shape)
    cols = ["pane", *AGG_KINDS, "ids"]
    a = np.zeros((len(names), len(cols)))
    b = np.asarray([per_shape[n]["state_net"] for n in names], dtype=float)
    for i, name in enumerate(names):
        run = per_shape[name]
        a[i, 0] = run["pane_records"]
        for kind, n in kinds[name].items():
            if kind in COUNTER_SLOT_KINDS:
                entries = max(0, run["events"] - run["pane_records"])
                b[i] -= n * (run["pane_records"] * COUNTER_SLOT_BYTES + entries * COUNTER_ENTRY_BYTES)
                continue
            a[i, 1 + AGG_KINDS.index(kind)] = run["pane_records"] * n
        a[i, -1] = run["dedup_ids"]
    keep = [j for j in range(len(cols)) if a[:, j].any()]
    coef = np.zeros(len(cols))
    for _ in range(len(cols)):
        sol, *_ = np.linalg.lstsq(a[:, keep], b, rcond=None)
        coef[:] = 0
        coef[keep] = sol
        negative = [j for j in keep if coef[j] < 0]
        if not negative:
            break
        keep = [j for j in keep if j not in negative]
    slots = {k: round(float(coef[1 + i]), 2) for i, k in enumerate(AGG_KINDS)}
    slots["min"] = slots["max"]
    slots.update(dict.fromkeys(COUNTER_SLOT_KINDS, COUNTER_SLOT_BYTES))
    return {
        "state_pane_bytes": round(float(coef[0]), 1),
        "state_slot_bytes": slots,
        "state_dedup_id_bytes": round(float(coef[-1]), 1),
    }


def result_shapes(tmp: Path, shapes: dict[str, str]) -> dict[str, dict[str, int]]:
    """Return the aggregations by kind of each calibration shape (and of cal_base_slow)."""
    out: dict[str, dict[str, int]] = {}
    for name, text in shapes.items():
        (view,) = check_repo(make_repo(tmp / "kinds", {name: text})).views
        counts: dict[str, int] = {}
        for kind, _, _ in view_shape(view.features).aggs:
            counts[kind] = counts.get(kind, 0) + 1
        out[name] = counts
    out["cal_base_slow"] = out["cal_base"]
    return out


def check_examples(
    stream: Stream,
    tmp: Path,
    idle: dict[str, Any],
    cal: Any,
    args: argparse.Namespace,
    ref: Reference,
    only: list[str] | None = None,
    quiet_us: float | None = None,
) -> dict[str, Any]:
    """Each example nearline view alone, at the declared rate and the second rate: estimate vs measured.

    ``only``: these views (default: every nearline example). ``quiet_us``: the reference's quiet CPU
    per record the figures are scaled to (default: the least this calibration's reference has seen;
    a re-measure passes the figure the file's constants were fitted at).
    """
    example = check_repo(FEATURES)
    out: dict[str, Any] = {}
    tier = TIERS["nearline"]
    for view in sorted((v for v in example.views if v.tier == "nearline"), key=lambda v: v.name):
        if only is not None and view.name not in only:
            continue
        source = example.sources[view.source]
        text = Path(ROOT / view.file).read_text(encoding="utf-8")
        rates: list[tuple[str, float]] = (
            [("events", args.sim_rate), ("events_b", args.second_rate)]
            if view.source == "events"
            else [("payments", 5.0)]
        )
        row: dict[str, Any] = {
            "source": view.source,
            "declared_rate": source.spec.expected_rate_per_s,
            "rates": [],
        }
        for key, stream_rate in rates:
            topics = {"events": stream.topics[key], "payments": stream.topics["empty"]}
            if view.source == "payments":
                topics = {"events": stream.topics["empty"], "payments": stream.topics["payments"]}
            plan, _ = plan_of(make_repo(tmp, {view.name: text}), topics)
            run = measure(
                stream, plan, "payments" if view.source == "payments" else key, view.name, idle, ref
            )
            # the quiet figure as of the calibration's constants
            measured = run["ratio"] * (quiet_us if quiet_us is not None else ref.quiet_us)
            run["state_bytes"] = run["state_net"]
            rekeyed = view.join_key != source.spec.key
            est = estimate_view(view.features, stream_rate, tier, rekeyed, None, cal)
            timing = resolve_timing(source.spec)
            dedup_s = (timing.max_out_of_orderness_ms + timing.allowed_lateness_ms) / 1000 + DEDUP_BUCKET_S
            span_s = run["records"] / stream_rate  # the stream's event time: windows are not full yet
            fp = estimate_footprint(
                capped(view.features, span_s), stream_rate, tier, run["entities"] or None, 12, cal, dedup_s
            )
            row["rates"].append({
                "rate": stream_rate, "measured_us": round(measured, 2),
                "estimated_us": round(est.us_per_event, 2),
                "cpu_error": round(est.us_per_event / measured - 1, 3) if measured > 0 else None,
                "state_bytes": run["state_bytes"], "state_estimate": round(fp.state_bytes),
                "state_error": round(fp.state_bytes / run["state_bytes"] - 1, 3)
                if run["state_bytes"] else None,
                "redis_bytes": run["redis_bytes"], "redis_keys": run["redis_keys"],
                "online_estimate": round(fp.online_bytes * run["redis_keys"] / max(1, fp.entities)),
                "entities": run["entities"], "load_1m": run["load_1m"],
                "raw_us": run["raw_us"], "ref_us": run["ref_us"], "ratio": round(run["ratio"], 4),
            })  # fmt: skip
            r = row["rates"][-1]
            r["online_error"] = (
                round(r["online_estimate"] / r["redis_bytes"] - 1, 3) if r["redis_bytes"] else None
            )
            print(f"  {view.name} @ {stream_rate:g}/s: {r}")
        out[view.name] = row
    return out


def nearline_cpu_views(args: argparse.Namespace, command: str, views: list[str]) -> None:
    """Re-measure the CPU of some example nearline views alone; their rows replace the last ones.

    The same stream, idle runs and reference pairing as the full calibration (``--tiers nearline``),
    without the shapes: the constants (``registry/calibration/nearline.json``) are kept. Each view's
    figure is its ratio to the reference run just before it, times the reference's quiet CPU per
    record that the constants were fitted at (``shapes.cal_base`` of the last calibration), so the
    rows compare with the estimate on one scale; ``raw_us`` and the reference runs of this re-measure
    are kept beside them. The rows replaced and the new ones go to ``cpu_remeasures`` with this
    command; ``--no-write`` records them there but leaves the accuracy rows as they were.
    """
    out = ROOT / "bench/results/bench_calibrate.json"
    doc = json.loads(out.read_text())
    section = doc["tiers"]["nearline"]
    example = {v.name for v in check_repo(FEATURES).views if v.tier == "nearline"}
    unknown = sorted(set(views) - example)
    if unknown:
        raise SystemExit(f"--nl-cpu-views: {unknown} are not nearline example views ({sorted(example)})")
    scale = float(section["shapes"]["cal_base"]["us_per_record"])
    settings = Settings.from_env()
    tmp = Path(tempfile.mkdtemp(prefix="bench-cal-nlcpu-"))
    started, load0 = time.monotonic(), os.getloadavg()
    stream = Stream(settings, tmp, args.events, (args.sim_rate, args.second_rate))
    print(f"stream: {stream.records} records; produced in {time.monotonic() - started:.0f} s", flush=True)
    try:
        base = shape_views()["cal_base"]
        empty = {"events": stream.topics["empty"], "payments": stream.topics["empty"]}
        plan0, _ = plan_of(make_repo(tmp, {"cal_base": base}), empty)
        idle = min((run_worker(stream, plan0, "empty", None) for _ in range(2)), key=lambda r: r["cpu_s"])
        topics = {"events": stream.topics["events"], "payments": stream.topics["empty"]}
        ref = Reference(stream, plan_of(make_repo(tmp, {"cal_base": base}), topics)[0], idle)
        path = calibration_path("nearline")
        cal = parse_calibration("nearline", json.loads(path.read_text(encoding="utf-8")), path)
        got = check_examples(stream, tmp, idle, cal, args, ref, only=views, quiet_us=scale)
    finally:
        stream.cleanup()
        shutil.rmtree(tmp, ignore_errors=True)
    section.setdefault("cpu_remeasures", []).append({
        "command": command, "views": views, "adopted": not args.no_write, "rows": got,
        "replaced": {v: section["accuracy"].get(v) for v in views},
        "scale_us": scale, "reference_us": [round(x, 2) for x in ref.seen], "idle_cpu_s": idle["cpu_s"],
        "load_average_start": [round(x, 2) for x in load0],
        "load_average_end": [round(x, 2) for x in os.getloadavg()],
        "seconds": round(time.monotonic() - started),
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    })  # fmt: skip
    if not args.no_write:  # the rows replace the last ones (kept in cpu_remeasures beside the new)
        section["accuracy"].update(got)
    out.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    print(f"reference cal_base this run: {[round(x, 1) for x in ref.seen]} us/record; scale {scale} us")
    print_table(got)


def nearline_stream(events: int, rate: float) -> dict[str, list[dict[str, Any]]]:
    """Return the events of the nearline calibration streams, as produced (valid ones, in order).

    Behaviour: the generator as ``harness.produce`` runs it (seed 17, ``rate`` of event time, 5,000
    users); payments: ``harness.produce_payments``'s draws replayed (same seed, same calls), less its
    corrupt records.
    """
    import random

    from headwater.pipelines.events.generator import EventGenerator, GeneratorConfig

    gen = EventGenerator(GeneratorConfig(seed=SEED, rate=rate, users=USERS))
    behaviour = [dict(em.event) for em in gen.take(events) if em.event is not None]
    rng = random.Random(SEED)
    accounts = [f"acct-{i:04d}" for i in range(300)]
    merchants = [f"m-{i:03d}" for i in range(40)]
    statuses = ["authorized", "captured", "declined", "refunded"]
    payments: list[dict[str, Any]] = []
    sent: list[dict[str, Any]] = []  # what a duplicate repeats (not the duplicates)
    for _ in range(max(2_000, events // 4)):  # harness.produce_payments' draws, in its order
        rng.expovariate(1 / 200_000)
        draw = rng.random()
        if draw < 0.02 and sent:
            payments.append(rng.choice(sent[-500:]))
            continue
        if draw < 0.025:
            rng.randbytes(12)
            continue
        if draw < 0.08:
            rng.randint(0, 2_500_000)
        elif draw < 0.09:
            rng.randint(40_000_000, 180_000_000)
        payments.append({
            "account_id": rng.choice(accounts),
            "merchant_id": merchants[min(int(rng.paretovariate(1.2)) - 1, len(merchants) - 1)],
            "method": rng.choice(["card", "card", "wallet", "bank_transfer"]),
            "status": rng.choices(statuses, weights=[20, 60, 15, 5])[0],
            "amount": round(rng.uniform(1, 500), 2),
            "risk_score": None if rng.random() < 0.2 else round(rng.random(), 4),
        })  # fmt: skip
        sent.append(payments[-1])
    return {"events": behaviour, "payments": payments}


IDLE_EXIT_STATE_S = 30.0
"""State runs measure no CPU: the worker waits longer for its partitions on a loaded machine."""
DEADLINE_STATE_S = 600.0


def nearline_state(args: argparse.Namespace, command: str) -> dict[str, Any]:
    """Nearline state only: each shape and example view once, the stores' live bytes (not the folder).

    The state constants (bytes per slice, per aggregation in a slice, per dedup id) are fitted on the
    shapes' live bytes; each example view alone at both rates is then compared with its estimate
    (windows capped to the stream's span, entities as the worker counted). The CPU constants and
    rows of the last full calibration are kept (this mode runs each view once, without the paired
    reference runs that CPU needs).
    """
    settings = Settings.from_env()
    tmp = Path(tempfile.mkdtemp(prefix="bench-cal-st-"))
    started, load0 = time.monotonic(), os.getloadavg()
    stream = Stream(settings, tmp, args.events, (args.sim_rate, args.second_rate))
    print(f"stream: {stream.records} records; produced in {time.monotonic() - started:.0f} s", flush=True)
    try:
        shapes = shape_views()
        if args.nl_shapes:
            shapes = {k: v for k, v in shapes.items() if k in args.nl_shapes.split(",") or k == "cal_base"}
        topics = {"events": stream.topics["events"], "payments": stream.topics["empty"]}
        per_shape: dict[str, Any] = {}
        only = [v for v in args.nl_views.split(",") if v]
        runs = [(name, text, "events") for name, text in shapes.items()]
        runs.append(("cal_base_slow", shapes["cal_base"], "events_b"))
        runs = [] if only else runs
        for name, text, topic_key in runs:
            view_name = "cal_base" if name == "cal_base_slow" else name
            repo = make_repo(tmp, {view_name: text})
            plan, _ = plan_of(repo, {**topics, "events": stream.topics[topic_key]})
            run = run_worker(stream, plan, topic_key, view_name, IDLE_EXIT_STATE_S, DEADLINE_STATE_S)
            run["state_net"] = run["live_state_bytes"]
            if not run["complete"]:
                print(f"  {name}: did not consume the stream in {DEADLINE_STATE_S:g} s: left out", flush=True)
                continue
            per_shape[name] = run
            print(f"  {name}: live {run['live_state_bytes']:,} B (folder {run['state_bytes']:,}), "
                  f"{run['events']} events, {run['pane_records']} slices, {run['dedup_ids']} ids, "
                  f"load {run['load_1m']}",
                  flush=True)  # fmt: skip
        path = calibration_path("nearline")
        cal_data = json.loads(path.read_text(encoding="utf-8"))
        constants: dict[str, Any] = {}
        if per_shape:
            constants = state_constants(per_shape, result_shapes(tmp, shapes))
            kinds_run = {k for name in per_shape for k in result_shapes(tmp, shapes).get(name, {})}
            kept = {k: v for k, v in cal_data["constants"]["state_slot_bytes"].items() if k not in kinds_run}
            # kinds not run: as before
            constants["state_slot_bytes"] = {**constants["state_slot_bytes"], **kept}
            cal_data["constants"].update(constants)
            cal_data["state_command"] = command
        else:
            cal_data["state_views_command"] = command
        cal_data["state_isolation"] = (
            "the stores' live bytes (keys + values of pane records and dedup ids, PartitionStore.live_bytes "
            "at the worker's close), least squares on the worker's slice and id counts per shape"
        )
        example = check_repo(FEATURES)
        import calibrate_realtime as rt

        events = nearline_stream(args.events, args.sim_rate)
        cal_data["where_shares"], cal_data["stream_profile"] = rt.where_shares(example, events=events)
        cal_data["pane_bursts"] = rt.pane_bursts(example, events)
        cal = parse_calibration("nearline", cal_data, path)
        accuracy: dict[str, Any] = {}
        for view in sorted((v for v in example.views if v.tier == "nearline"), key=lambda v: v.name):
            if only and view.name not in only:
                continue
            source = example.sources[view.source]
            text = Path(ROOT / view.file).read_text(encoding="utf-8")
            pairs = ([("events", args.sim_rate), ("events_b", args.second_rate)] if view.source == "events"
                     else [("payments", 5.0)])  # fmt: skip
            pairs = pairs[:1] if args.nl_one_rate else pairs
            row: dict[str, Any] = {"source": view.source, "rates": []}
            for key, rate in pairs:
                t = {"events": stream.topics[key], "payments": stream.topics["empty"]}
                if view.source == "payments":
                    t = {"events": stream.topics["empty"], "payments": stream.topics["payments"]}
                plan, _ = plan_of(make_repo(tmp, {view.name: text}), t)
                run = run_worker(stream, plan, key, view.name, IDLE_EXIT_STATE_S, DEADLINE_STATE_S)
                if not run["complete"]:
                    print(f"  {view.name} @ {rate:g}/s: incomplete in {DEADLINE_STATE_S:g} s", flush=True)
                    continue
                span_s, srate, dedup_s = run["records"] / rate, rate, None
                if view.source == "events":  # the accepted events' event-time rate and span
                    win = stream_window(nearline_stream(args.events, rate)["events"], source)
                    span_s, srate, dedup_s = win["span_s"], win["rate"], win["dedup_s"]
                population = len({e.get(view.join_key) for e in events[view.source]} - {None, ""})
                fp = nl_state_estimate(view, source, srate, span_s, population, cal, dedup_s)
                meas = run["live_state_bytes"]
                row["rates"].append({
                    "rate": rate, "records": run["records"], "stream_span_s": round(span_s),
                    "stream_rate": round(srate, 2), "dedup_s": dedup_s,
                    "population": population, "state_basis": fp.state_basis,
                    "entities": run["entities"], "state_bytes": meas, "folder_bytes": run["state_bytes"],
                    "live_parts": run.get("live_parts"), "pane_records": run.get("pane_records"),
                    "dedup_ids": run.get("dedup_ids"),
                    "state_estimate": round(fp.state_bytes),
                    "state_error": round(fp.state_bytes / meas - 1, 3) if meas else None,
                    "redis_bytes": run["redis_bytes"], "redis_keys": run["redis_keys"],
                    "online_estimate": round(fp.online_bytes * run["redis_keys"] / max(1, fp.entities)),
                    "load_1m": run["load_1m"],
                })  # fmt: skip
                r = row["rates"][-1]
                redis_b = r["redis_bytes"]
                r["online_error"] = round(r["online_estimate"] / redis_b - 1, 3) if redis_b else None
                print(f"  {view.name} @ {rate:g}/s: state est {r['state_estimate']:,} vs live {meas:,} "
                      f"({r['state_error']}), redis est {r['online_estimate']:,} vs {redis_b:,}",
                      flush=True)  # fmt: skip
            accuracy[view.name] = row
        measured = cal_data.setdefault("measured", {})
        for name, row in accuracy.items():
            measured.setdefault(name, {})["state_bytes"] = row["rates"][0]["state_bytes"]
        write_calibration("nearline", cal_data, args)
        return {
            "command": command, "constants": constants, "shapes": per_shape, "accuracy": accuracy,
            "stream_records": stream.records, "load_average_start": [round(x, 2) for x in load0],
            "load_average_end": [round(x, 2) for x in os.getloadavg()],
            "seconds": round(time.monotonic() - started),
            "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }  # fmt: skip
    finally:
        stream.cleanup()
        shutil.rmtree(tmp, ignore_errors=True)


def nl_state_estimate(
    view: Any,
    source: Any,
    rate: float,
    span_s: float,
    population: int,
    cal: Any,
    dedup_s: float | None = None,
) -> Any:
    """Return the footprint estimate of a nearline view for a calibration run's stream.

    Windows capped to the stream's span (its state cannot be older), the stream's entities (the
    distinct join keys produced), its profile (``stream=(source, join key)``), the ids kept for
    ``dedup_s`` (the window at the run's end, :func:`stream_window`; default the source's peak:
    out-of-orderness + lateness + a whole bucket).
    """
    if dedup_s is None:
        timing = resolve_timing(source.spec)
        dedup_s = (timing.max_out_of_orderness_ms + timing.allowed_lateness_ms) / 1000 + DEDUP_BUCKET_S
    return estimate_footprint(
        capped(view.features, span_s), rate, TIERS["nearline"], population, 12, cal, dedup_s,
        stream=(view.source, view.join_key), rekeyed=view.join_key != source.spec.key, age_s=span_s,
    )  # fmt: skip


def stream_window(events: list[dict[str, Any]], source: Any) -> dict[str, float]:
    """Return the event-time rate, span and dedup window at the end of a nearline calibration stream.

    The generator's rate follows its diurnal curve (about 1.2x the nominal rate at the stream's
    hour), and about 1 % of its events are late (they go to the dead-letter topic): the state holds
    the accepted events, as the worker accepts them (older than the newest event time less
    out-of-orderness and lateness: late). The ids kept at the end are those of the buckets the
    horizon has not passed: out-of-orderness + lateness + where the horizon falls in its bucket.
    """
    timing = resolve_timing(source.spec)
    slack = timing.max_out_of_orderness_ms + timing.allowed_lateness_ms
    max_t: int | None = None
    times = []
    for e in events:
        t = int(e["event_time"])
        if max_t is not None and t < max_t - slack:
            continue
        max_t = t if max_t is None else max(max_t, t)
        times.append(t)
    if not times or max_t is None:
        return {"rate": 0.0, "span_s": 0.0, "dedup_s": 0.0}
    span_s = max((max_t - min(times)) / 1000, 1.0)
    bucket_ms = DEDUP_BUCKET_S * 1000
    dedup_s = (slack + (max_t - slack) % bucket_ms) / 1000
    return {"rate": len(times) / span_s, "span_s": span_s, "dedup_s": dedup_s}


def nearline_state_refit(write: bool, events_n: int, sim_rate: float) -> None:
    """Re-estimate the last ``--nl-state`` rows with registry/calibration/nearline.json; print them.

    The pane bursts are measured again on the stream (``nearline_stream(events_n, sim_rate)``, no
    worker run) and written to nearline.json unless ``write`` is false; each behaviour row's rate,
    span and dedup window are the accepted stream's (:func:`stream_window`).
    """
    import calibrate_realtime as rt

    out = ROOT / "bench/results/bench_calibrate.json"
    doc = json.loads(out.read_text())
    section = doc["tiers"]["nearline"]["state"]
    path = calibration_path("nearline")
    cal_data = json.loads(path.read_text())
    example = check_repo(FEATURES)
    cal_data["pane_bursts"] = rt.pane_bursts(example, nearline_stream(events_n, sim_rate))
    cal = parse_calibration("nearline", cal_data, path)
    if write:
        path.write_text(json.dumps(cal_data, indent=2) + "\n", encoding="utf-8")
        print(f"wrote {path.relative_to(ROOT)} (pane_bursts)")
    windows: dict[float, dict[str, float]] = {}
    for name, row in section["accuracy"].items():
        view = next(v for v in example.views if v.name == name)
        source = example.sources[view.source]
        for r in row["rates"]:
            span_s, srate, dedup_s = r["stream_span_s"], r["rate"], None
            if view.source == "events":
                if r["rate"] not in windows:
                    windows[r["rate"]] = stream_window(nearline_stream(events_n, r["rate"])["events"], source)
                win = windows[r["rate"]]
                span_s, srate, dedup_s = win["span_s"], win["rate"], win["dedup_s"]
                r["stream_span_s"], r["stream_rate"], r["dedup_s"] = round(span_s), round(srate, 2), dedup_s
            fp = nl_state_estimate(view, source, srate, span_s, r["population"], cal, dedup_s)
            r["state_estimate"], r["state_basis"] = round(fp.state_bytes), fp.state_basis
            r["state_error"] = round(fp.state_bytes / r["state_bytes"] - 1, 3) if r["state_bytes"] else None
            print(f"  {name} @ {r['rate']:g}/s: state est {r['state_estimate']:,} vs live "
                  f"{r['state_bytes']:,} ({r['state_error']:+.0%}): {fp.state_basis}")  # fmt: skip
    out.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")


def capped(features: tuple[Any, ...], span_s: float) -> tuple[Any, ...]:
    """Return ``features`` with windows no longer than ``span_s``: the state a stream that short can hold.

    The estimate is of the steady state (every window full); the calibration stream spans minutes of
    event time, so its state is compared with the estimate of windows as long as the stream.
    """
    import dataclasses

    from headwater.registry.durations import parse_duration

    out = []
    for f in features:
        if f.window.seconds > span_s:
            window = parse_duration(f"{max(int(span_s), int(f.slide.seconds))}s")
            f = dataclasses.replace(f, window=window)
        out.append(f)
    return tuple(out)


def recompute_table() -> None:
    """Re-estimate the nearline CPU rows of bench_calibrate.json with registry/calibration/nearline.json.

    The measured figures stay; the estimates follow the file as it is now (e.g. the filter shares
    ``--nl-state`` measured). State rows: ``--nl-state-refit``.
    """
    out = ROOT / "bench/results/bench_calibrate.json"
    doc = json.loads(out.read_text())
    section = doc["tiers"]["nearline"]
    path = calibration_path("nearline")
    cal = parse_calibration("nearline", json.loads(path.read_text(encoding="utf-8")), path)
    example = check_repo(FEATURES)
    tier = TIERS["nearline"]
    for name, row in section["accuracy"].items():
        view = next(v for v in example.views if v.name == name)
        rekeyed = view.join_key != example.sources[view.source].spec.key
        for r in row["rates"]:
            est = estimate_view(view.features, r["rate"], tier, rekeyed, None, cal)
            r["estimated_us"] = round(est.us_per_event, 2)
            r["cpu_error"] = round(est.us_per_event / r["measured_us"] - 1, 3) if r["measured_us"] else None
    section["estimates_from"] = cal.source_text()
    out.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    print_table(section["accuracy"])


def print_table(accuracy: dict[str, Any]) -> None:
    """Estimate vs measured per example view and rate: CPU per event, state, online memory."""
    print(f"\n{'view':<34} {'rate/s':>7} {'est us':>7} {'meas us':>8} {'err':>6}  {'state est':>10} "
          f"{'state meas':>10} {'err':>6}  {'redis est':>9} {'redis meas':>10} {'err':>6}")  # fmt: skip
    for name, row in accuracy.items():
        for r in row["rates"]:

            def pct(x: float | None) -> str:
                return "   n/a" if x is None else f"{x:+.0%}"

            print(f"{name:<34} {r['rate']:>7g} {r['estimated_us']:>7.1f} {r['measured_us']:>8.1f} "
                  f"{pct(r['cpu_error']):>6}  {r['state_estimate']:>10,} {r['state_bytes']:>10,} "
                  f"{pct(r['state_error']):>6}  {r['online_estimate']:>9,} {r['redis_bytes']:>10,} "
                  f"{pct(r['online_error']):>6}")  # fmt: skip


def summary() -> dict[str, Any]:
    """Build the accuracy table of every tier and example view: CPU at two rates and state, est vs meas.

    From the last runs' results: realtime ``bench_calibrate_rt_jobs.json`` (``fit``: each view alone
    at two rates; ``state_fit``: each view alone at a steady rate), nearline and offline
    ``bench_calibrate.json``. Written to ``bench_calibrate.json`` (``summary``) and printed.
    """
    out = ROOT / "bench/results/bench_calibrate.json"
    doc = json.loads(out.read_text())
    rt_file = ROOT / "bench/results/bench_calibrate_rt_jobs.json"
    rt_doc = json.loads(rt_file.read_text()) if rt_file.is_file() else {}
    rows: list[dict[str, Any]] = []
    cpu = {r["views"][0]: r for k, r in rt_doc.get("fit", {}).get("accuracy", {}).items()
           if "error" not in r and len(r["views"]) == 1 and not k.startswith("prior:")}  # fmt: skip
    state = {r["views"][0]: r for r in rt_doc.get("state_fit", {}).get("accuracy", {}).values()
             if "error" not in r and len(r["views"]) == 1}  # fmt: skip
    for view in sorted(set(cpu) | set(state)):
        c, st = cpu.get(view, {}), state.get(view, {})
        rows.append({
            "tier": "realtime", "view": view, "cpu_unit": "cores",
            "cpu": [{"rate": p["consumed_eps"], "estimate": p["estimated_cores"],
                     "measured": p["measured_cores"], "error": p["cpu_error"], "held": p["holds"],
                     "load_1m": p["load_1m"]} for p in c.get("phases", [])],
            "state": {"estimate": st.get("state_estimate"), "measured": st.get("checkpoint_bytes"),
                      "error": st.get("state_error"), "what": "Flink checkpoint, steady rate"}
            if st else None,
            "online": {"estimate": st.get("online_estimate"), "measured": st.get("redis_bytes"),
                       "error": st.get("online_error")} if st else None,
        })  # fmt: skip
    nl = doc["tiers"].get("nearline", {})
    nl_state = {v: r for v, r in nl.get("state", {}).get("accuracy", {}).items()}
    for view, row in nl.get("accuracy", {}).items():
        srows = {r["rate"]: r for r in nl_state.get(view, {}).get("rates", [])}
        rows.append({
            "tier": "nearline", "view": view, "cpu_unit": "us/event",
            "cpu": [{"rate": r["rate"], "estimate": r["estimated_us"], "measured": r["measured_us"],
                     "error": r["cpu_error"], "load_1m": r["load_1m"]} for r in row["rates"]],
            "state": [{"rate": rate, "estimate": r["state_estimate"], "measured": r["state_bytes"],
                       "error": r["state_error"], "what": "RocksDB live bytes"} for rate, r in srows.items()]
            or None,
            "online": {"estimate": row["rates"][0]["online_estimate"],
                       "measured": row["rates"][0]["redis_bytes"], "error": row["rates"][0]["online_error"]},
        })  # fmt: skip
    off = doc["tiers"].get("offline", {})
    for view, row in off.get("accuracy", {}).items():
        rows.append({
            "tier": "offline", "view": view, "cpu_unit": "CPU s/day",
            # rate: the events the day's run read (events/day x the days of its window bronze held)
            "cpu": [{"rate": r["events_per_day"] * r.get("read_days", 1),
                     "read_days": r.get("read_days", 1), "estimate": r["estimated_cpu_s_per_day"],
                     "measured": r["measured_cpu_s_per_day"], "error": r["cpu_error"],
                     "load_1m": r["load_1m"]} for r in row["rates"]],
            "state": [{"rate": r["events_per_day"], "estimate": r["state_estimate"],
                       "measured": r["state_bytes"], "error": r["state_error"],
                       "what": "Delta table (Parquet)"} for r in row["rates"]],
            "online": None,
        })  # fmt: skip
    doc["summary"] = {"rows": rows, "written_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    out.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    print_summary(rows)
    return doc["summary"]


def print_summary(rows: list[dict[str, Any]]) -> None:
    """Print the summary: one line per view and rate."""

    def pct(x: float | None) -> str:
        return "   n/a" if x is None else f"{x:+5.0%}"

    def num(x: float | None) -> str:
        return "-" if x is None else (f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}")

    print(f"\n{'tier':<9}{'view':<33}{'unit':<10}{'rate':>10}{'cpu est':>10}{'meas':>9}{'err':>7}   "
          f"{'state est':>12}{'meas':>12}{'err':>7}  load")  # fmt: skip
    for r in rows:
        states = r["state"] if isinstance(r["state"], list) else [r["state"]] * len(r["cpu"] or [None])
        for i, c in enumerate(r["cpu"] or [{}]):
            st = states[i] if i < len(states) and states[i] else {}
            print(f"{r['tier'] if i == 0 else '':<9}{r['view'] if i == 0 else '':<33}"
                  f"{r['cpu_unit'] if i == 0 else '':<10}{num(c.get('rate')):>10}{num(c.get('estimate')):>10}"
                  f"{num(c.get('measured')):>9}{pct(c.get('error')):>7}   "
                  f"{num(st.get('estimate')):>12}{num(st.get('measured')):>12}{pct(st.get('error')):>7}  "
                  f"{c.get('load_1m', '')}")  # fmt: skip


if __name__ == "__main__":
    main()
