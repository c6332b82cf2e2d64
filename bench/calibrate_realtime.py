"""The realtime part of bench/bench_calibrate.py: one Flink job per view shape, at two rates.

Each shape (and each realtime example view of the behaviour source) is applied alone to a scratch
feature repo and run by ``bench/bench_realtime.py`` (the real ``headwater run realtime`` job: local
mini-cluster, parallelism 2, checkpoints every 5 s) at two offered rates, one phase each, start-up
paid once. The job's CPU is its process group's (the Flink JVM and PyFlink's Python workers: user +
system from ``/proc``) per wall second of each phase, so two rates give the view's fixed cores
(intercept) and CPU per event (slope). The state is the size of the job's newest checkpoint (Flink
keyed state of the window operator and the Kafka source's offsets) after the second phase.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SHAPES = {
    "rt_base": ["{name: f0, agg: count, window: 1m}"],
    "rt_wide": [
        "{name: f0, agg: count, window: 5m}",
        "{name: f1, agg: count, window: 5m, where: \"event_type = 'click'\"}",
        "{name: f2, agg: sum, field: dwell_ms, window: 5m}",
        "{name: f3, agg: avg, field: dwell_ms, window: 5m}",
        "{name: f4, agg: max, field: position, window: 5m}",
        "{name: f5, agg: last, field: item_id, window: 5m}",
        "{name: f6, agg: distinct_count, field: session_id, window: 5m}",
        "{name: f7, agg: top_k, field: category, k: 3, window: 5m}",
    ],
    "rt_panes": ["{name: f0, agg: count, window: 1h}"],
}


def shape_yaml(name: str, feats: list[str]) -> str:
    """Return the YAML of a realtime calibration view (user entity, behaviour source)."""
    body = "".join(f"  - {f}\n" for f in feats)
    return (
        f"feature_view: {name}\nentity: user\nsource: events\ntier: realtime\nfreshness_sla: PT10S\n"
        f"compute_cost: 1000\nowner: calibration\ndescription: calibration shape\nfeatures:\n{body}"
    )


def checkpoint_bytes(folder: Path) -> int:
    """Return the bytes of the newest completed checkpoint (``chk-N``) under ``folder``."""
    chks = [p for p in folder.rglob("chk-*") if p.is_dir() and p.name[4:].isdigit()]
    done = [p for p in chks if (p / "_metadata").is_file()]
    if not done:
        return 0
    newest = max(done, key=lambda p: int(p.name[4:]))
    return sum(f.stat().st_size for f in newest.rglob("*") if f.is_file())


def run_job(repo: Path, work: Path, rates: tuple[float, float], phase_s: float) -> dict[str, Any]:
    """Run bench_realtime.py on ``repo`` at two rates; return cores per phase, the fit and the state."""
    out = work / "rt.json"
    tmp = work / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, str(ROOT / "bench/bench_realtime.py"), "--registry", str(repo),
           "--rates", f"{rates[0]:g},{rates[1]:g}", "--more", "", "--phase-s", f"{phase_s:g}",
           "--settle-s", "8", "--out", str(out), "--label", "cal"]  # fmt: skip
    env = {**os.environ, "TMPDIR": str(tmp)}
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900, check=False)
    if done.returncode != 0 or not out.is_file():
        return {"error": (done.stdout + done.stderr)[-2000:]}
    run = json.loads(out.read_text())["runs"]["cal"]
    phases = run["phases"]
    state = checkpoint_bytes(tmp)
    shutil.rmtree(tmp, ignore_errors=True)
    # a phase that did not hold (the shared machine starved the job) still says what the job used
    # at the rate it consumed: the figures below are per consumed event
    pts = [(p.get("consumed_eps") or p["rate"], p["job_cpu_cores"], p["rate"]) for p in phases]
    if not pts:
        return {"error": "no phase ran", "startup_s": run.get("startup_s")}
    if len(pts) < 2:
        (r1, c1, offered) = pts[0]
        return {
            "phases": [{"rate": r1, "job_cpu_cores": c1, "offered_eps": offered}],
            "cores_per_event_at_rate": [round(c1 / r1 * 1e6, 2)],
            "checkpoint_bytes": state,
            "startup_s": run.get("startup_s"),
            "load_average": run["machine"]["load_average_at_start"],
        }
    (r1, c1, _), (r2, c2, _) = pts[:2]
    us = (c2 - c1) / (r2 - r1) * 1e6
    if us <= 0:  # the first phase carries the JVM's warm-up (JIT, first checkpoints): no slope to see
        us, c1 = 0.0, (c1 + c2) / 2
    return {
        "phases": [{"rate": r, "job_cpu_cores": c, "offered_eps": o} for r, c, o in pts],
        "us_per_event": round(us, 2),
        "fixed_cores": round(c1 - r1 * us / 1e6, 4),
        "cores_per_event_at_rate": [round(c / r * 1e6, 2) for r, c, _ in pts],
        "checkpoint_bytes": state,
        "startup_s": run.get("startup_s"),
        "load_average": run["machine"]["load_average_at_start"],
    }


def fit_realtime(shapes: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Constants from the three shapes: base -> event_us; wide -> per-feature us; panes -> pane_us."""
    base, wide, panes = (shapes[n] for n in ("rt_base", "rt_wide", "rt_panes"))
    event_us = max(0.0, base["us_per_event"])
    per_feature = max(0.0, (wide["us_per_event"] - event_us) / 7)
    # rt_base: 60 panes (1m / 1s); rt_panes: 3600
    pane_us = max(0.0, (panes["us_per_event"] - event_us) / (3600 - 60))
    fixed = float(np.median([s["fixed_cores"] for s in shapes.values()]))
    return {
        "event_us": round(event_us - per_feature, 3) if event_us > per_feature else round(event_us, 3),
        "agg_us": dict.fromkeys(
            ("count", "sum", "avg", "min", "max", "last", "distinct_count", "top_k"), round(per_feature, 3)
        ),
        "where_us": 0.0,
        "pane_us": round(pane_us, 5),
        "selectivity": 1.0,
        "rekey_us": 0.0,
        "fixed_cores": round(max(0.0, fixed), 4),
    }


# ---------------------------------------------------------------------------------------------
# Jobs of 1, 2 and 3 views, and the payments source: the per-job cost and each view's marginal cost
# ---------------------------------------------------------------------------------------------

PAY_ACCOUNTS = 5_000


def produce_payments(bootstrap: str, topic: str, rate: float, duration_s: float, tag: str, out: Any) -> None:
    """Send payment events of the example schema at ``rate``/s for ``duration_s`` (event time = now)."""
    import random
    import time

    from kafka import KafkaProducer

    from headwater.pipelines.events.codec import EventCodec
    from headwater.pipelines.events.producer import ProducerSettings
    from headwater.registry.plans import plan_source
    from headwater.registry.validate import check_repo

    codec = EventCodec(plan_source(check_repo(ROOT / "features").sources["payments"]))
    producer = KafkaProducer(**ProducerSettings(bootstrap, topic).kafka_config())
    rng = random.Random(17)
    statuses = ["authorized", "captured", "declined", "refunded"]
    start, sent = time.monotonic(), 0
    while (elapsed := time.monotonic() - start) < duration_s:
        due = int(rate * elapsed) - sent
        if due <= 0:
            time.sleep(0.002)
            continue
        now_us = time.time_ns() // 1000
        for _ in range(min(due, 2000)):
            ev = {
                "payment_id": f"{tag}-{sent}",
                "account_id": f"acct-{rng.randrange(PAY_ACCOUNTS):05d}",
                "merchant_id": f"m-{rng.randrange(200):03d}",
                "method": "card",
                "status": rng.choices(statuses, weights=[20, 60, 15, 5])[0],
                "amount": round(rng.uniform(1, 500), 2),
                "currency": "EUR",
                "risk_score": round(rng.random(), 4),
                "occurred_at": now_us,
            }
            producer.send(topic, key=codec.key(ev), value=codec.encode(ev), headers=codec.headers())
            sent += 1
    producer.flush()
    seconds = time.monotonic() - start
    producer.close()
    out.put((sent, seconds, 0.0, []))


def send(source: str, settings: Any, topic: str, rate: float, seconds: float, tag: str, pieces: Any) -> int:
    """Produce one phase of ``source`` events; return the events sent."""
    import multiprocessing as mp

    import bench_realtime as br

    if source == "events":
        sent, _ = br.run_phase(settings, topic, rate, seconds, tag, pieces, 5000.0)
        return int(sent["sent"])
    ctx = mp.get_context("spawn")
    queue: Any = ctx.Queue()
    proc = ctx.Process(
        target=produce_payments, args=(settings.kafka_bootstrap, topic, rate, seconds, tag, queue)
    )
    proc.start()
    n = queue.get(timeout=seconds + 120)[0]
    proc.join()
    return int(n)


def redis_footprint(redis_url: str, namespace: str, views: list[str], sample: int = 400) -> dict[str, Any]:
    """Per view: its keys in ``namespace`` and their MEMORY USAGE (a sample of ``sample`` keys, scaled)."""
    import redis

    client = redis.Redis.from_url(redis_url)
    out: dict[str, Any] = {}
    try:
        for view in views:
            keys = list(client.scan_iter(match=f"{namespace}:{{{view}}}:*", count=1000))
            picked = keys[:: max(1, len(keys) // sample)][:sample]
            mem = sum(int(client.memory_usage(k, samples=0) or 0) for k in picked)
            per_key = mem / len(picked) if picked else 0.0
            out[view] = {
                "keys": len(keys),
                "bytes": round(per_key * len(keys)),
                "bytes_per_key": round(per_key, 1),
            }
    finally:
        client.close()
    return out


def run_views(
    repo: Path, work: Path, source: str, rates: tuple[float, ...], phase_s: float, warm_s: float = 20.0
) -> dict[str, Any]:
    """Run the realtime job of ``repo``'s views of ``source``: a warm-up phase, then one phase per rate.

    The warm-up (JIT, Python workers, first checkpoints) is sent at the first rate and not measured.
    Per phase: the job's process group CPU per wall second (JVM and Python), the events it consumed
    (committed offsets). After the last phase: the newest checkpoint's bytes, each view's Redis keys
    and memory, and the events sent per second of wall time (the state holds the last window's).
    """
    import signal
    import time
    import uuid

    import bench_realtime as br

    from headwater.pipelines.settings import Settings
    from headwater.registry.plans import read_plan

    settings = Settings.from_env()
    tag = uuid.uuid4().hex[:8]
    state, chk, log = work / "state", work / "chk", work / "job.log"
    work.mkdir(parents=True, exist_ok=True)
    apply = [str(Path(sys.executable).parent / "headwater"), "apply", str(repo), "--state-dir", str(state)]
    done = subprocess.run([*apply, "--no-feast"], cwd=ROOT, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        return {"error": f"apply: {done.stdout}{done.stderr}"[-2000:]}
    plan = read_plan(state, "realtime")
    views = [v.name for v in plan.views if v.source == source]
    pieces = br.templates(5000, 2000, 60_000)[0] if source == "events" else None
    from kafka import KafkaAdminClient
    from kafka.admin import NewTopic

    topic, group, namespace = f"cal.rt.{tag}", f"cal-rt-{tag}", f"hwcal{tag}"
    admin = KafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap)
    admin.create_topics([NewTopic(topic, settings.partitions, 1), NewTopic(f"{topic}.dlq", 1, 1)])
    t_start = time.time()
    job = br.start_job(state, source, topic, namespace, group, chk, log)
    watch = br.OffsetWatch(settings.kafka_bootstrap, group, topic)
    import threading

    threading.Thread(target=watch.run, daemon=True).start()
    sent_total, timeline = 0, []  # (t0, t1, events) per phase: the events of the state's last window
    phases: list[dict[str, Any]] = []
    try:
        # warm-up: until the job has committed what was sent, and at least warm_s at the first rate
        t0 = time.time()
        sent_total += send(source, settings, topic, rates[0], 5, f"{tag}w", pieces)
        timeline.append((t0, time.time(), sent_total))
        while not watch.rows or watch.rows[-1][1] < sent_total:  # the job starts and catches up
            if job.poll() is not None:
                return {"error": f"the job exited ({job.returncode}): {log.read_text()[-2000:]}"}
            if time.time() - t_start > 900:
                return {"error": "the job did not consume the warm-up in 900 s"}
            time.sleep(1)
        # the warm-up proper: JIT and checkpoints at the first rate, with the job running
        t0 = time.time()
        n = send(source, settings, topic, rates[0], warm_s, f"{tag}w2", pieces)
        sent_total += n
        timeline.append((t0, time.time(), n))
        startup_s = time.time() - t_start
        for i, rate in enumerate(rates):
            t0 = time.time()
            cpu0 = br.group_cpu_s(job.pid)
            c0 = watch.rows[-1][1]
            n = send(source, settings, topic, rate, phase_s, f"{tag}p{i}", pieces)
            t1 = time.time()
            sent_total += n
            timeline.append((t0, t1, n))
            time.sleep(6)  # the last checkpoint (every 5 s) commits the phase's offsets
            t2 = time.time()
            cpu_by = {k: v - cpu0[k] for k, v in br.group_cpu_s(job.pid).items()}
            consumed = watch.rows[-1][1] - c0
            phases.append({
                "rate": rate, "sent": n, "consumed": consumed, "seconds": round(t2 - t0, 1),
                "consumed_eps": round(consumed / (t2 - t0), 1),
                "job_cpu_cores": round(sum(cpu_by.values()) / (t2 - t0), 4),
                "job_cpu_cores_by_kind": {k: round(v / (t2 - t0), 4) for k, v in cpu_by.items()},
                "lag_end": watch.rows[-1][2] - watch.rows[-1][1],
                "load_1m": round(os.getloadavg()[0], 2),
            })  # fmt: skip
            print(f"    {'+'.join(views)} phase {rate:g}/s: {phases[-1]}", flush=True)
        end = time.time()
        redis_mem = redis_footprint(settings.redis_url, namespace, views)
        ckpt = checkpoint_bytes(chk)
    finally:
        watch.stop.set()
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGTERM)
            try:
                job.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(job.pid, signal.SIGKILL)
        admin.delete_topics([topic, f"{topic}.dlq"])
        admin.close()
        import redis

        client = redis.Redis.from_url(settings.redis_url)
        for k in client.scan_iter(match=f"{namespace}:*", count=1000):
            client.unlink(k)
        client.close()
    return {
        "views": views,
        "source": source,
        "phases": phases,
        "startup_s": round(startup_s, 1),
        "checkpoint_bytes": ckpt,
        "redis": redis_mem,
        "timeline": [(round(a - end, 1), round(b - end, 1), n) for a, b, n in timeline],
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }


def events_in_last(timeline: list[tuple[float, float, int]], seconds: float) -> float:
    """Events sent in the last ``seconds`` before the end of a run (``timeline``: (t0, t1, n), t <= 0)."""
    total = 0.0
    for a, b, n in timeline:
        lo = max(a, -seconds)
        if b > lo and b > a:
            total += n * (b - lo) / (b - a)
    return total


JOBS = {
    # one source per job; 1, 2 and 3 views of the behaviour source, each example view alone, payments
    "user_session": ["user_session_realtime"],
    "behaviour_all": ["user_session_realtime", "user_dwell_realtime", "item_trending_realtime"],
    "account_payments": ["account_payments_realtime"],
    "item_trending": ["item_trending_realtime"],
    "user_dwell": ["user_dwell_realtime"],
    "user_session+user_dwell": ["user_session_realtime", "user_dwell_realtime"],
}


def measure_jobs(
    out: Path, rates: tuple[float, ...], phase_s: float, only: list[str] | None = None
) -> dict[str, Any]:
    """Run each job of :data:`JOBS` (or ``only``); write the runs to ``out`` as they finish."""
    import tempfile

    doc = json.loads(out.read_text()) if out.is_file() else {}
    runs = doc.setdefault("runs", {})
    for name, views in JOBS.items():
        if only and name not in only:
            continue
        work = Path(tempfile.mkdtemp(prefix=f"cal-rt-{name}-"))
        repo = work / "repo"
        repo.mkdir()
        for f in ("sources.yaml", "entities.yaml", "budget.yaml", "schemas"):
            src = ROOT / "features" / f
            (shutil.copytree if src.is_dir() else shutil.copy)(src, repo / f)
        for v in views:
            shutil.copy(ROOT / "features" / f"{v}.yaml", repo / f"{v}.yaml")
        source = "payments" if name == "account_payments" else "events"
        print(f"  job {name}: {views}", flush=True)
        try:
            runs[name] = run_views(repo, work / "run", source, rates, phase_s)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        runs[name]["phase_s"] = phase_s
        out.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    return doc


def _nonneg_lstsq(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Least squares with negative terms pinned at 0 (refit without them until none is negative)."""
    keep = [j for j in range(a.shape[1]) if a[:, j].any()]
    coef = np.zeros(a.shape[1])
    for _ in range(a.shape[1]):
        sol, *_ = np.linalg.lstsq(a[:, keep], b, rcond=None)
        coef[:] = 0
        coef[keep] = sol
        negative = [j for j in keep if coef[j] < 0]
        if not negative:
            break
        keep = [j for j in keep if j not in negative]
    coef[coef < 0] = 0
    return coef


def job_terms(views: list[Any], rate: float) -> list[float]:
    """One phase's terms: job, groups, job events, view events, aggregation events (rate-weighted)."""
    from headwater.registry.cost import view_shape

    groups = len({v.entity for v in views})
    aggs = sum(len(view_shape(v.features).aggs) for v in views)
    return [1.0, float(groups), rate, rate * len(views), rate * aggs]


def holds(phase: dict[str, Any]) -> bool:
    """Whether the job kept up in ``phase``: its lag at the end under 2 s of the offered rate.

    A job that fell behind was starved of CPU by the other processes on the machine: the cores it
    got are the scheduler's share, not its cost at that rate. Prior runs (no lag figure) held.
    """
    lag = phase.get("lag_end")
    return lag is None or lag <= 2 * phase["rate"]


def fit_jobs(runs: dict[str, Any], example: Any) -> dict[str, Any]:
    """Fit job_fixed_cores, group_fixed_cores, job_event_us, event_us and agg_us from the jobs' phases.

    Every phase of every job (1, 2 and 3 views of the behaviour source, each view alone, payments)
    is one row: job cores = job_fixed + groups x group_fixed + rate x (job_event_us + views x
    event_us + aggregations x agg_us). The per-aggregation term is one figure for every kind (the
    example views do not separate eight kinds; the shapes' runs showed no slope per kind).
    """
    rows, cores = [], []
    for run in runs.values():
        if "error" in run:
            continue
        views = [v for v in example.views if v.name in run["views"]]
        for p in run["phases"]:
            if not holds(p):  # starved: its cores are the scheduler's share, not what the job needs
                continue
            rows.append(job_terms(views, p["consumed_eps"] or p["rate"]))
            cores.append(p["job_cpu_cores"])
    coef = _nonneg_lstsq(np.asarray(rows), np.asarray(cores))
    return {
        "job_fixed_cores": round(float(coef[0]), 4),
        "group_fixed_cores": round(float(coef[1]), 4),
        "job_event_us": round(float(coef[2]) * 1e6, 3),
        "event_us": round(float(coef[3]) * 1e6, 3),
        "agg_us": dict.fromkeys(AGG_KINDS_RT, round(float(coef[4]) * 1e6, 3)),
        "where_us": 0.0,
        "pane_us": 0.0,
        "rekey_us": 0.0,
        "fixed_cores": 0.0,
    }


AGG_KINDS_RT = ("count", "sum", "avg", "min", "max", "last", "distinct_count", "top_k")


def state_inputs(view: Any, run: dict[str, Any]) -> tuple[tuple[Any, ...], float, float]:
    """Return what the model is given for a view's state at a run's end.

    Its windows capped to the run, the rate of its longest window's events (as sent), its live
    entities (its Redis keys: one per entity with state).
    """
    import dataclasses

    from headwater.registry.cost import view_shape
    from headwater.registry.durations import parse_duration

    span = -min(a for a, _, _ in run["timeline"])
    window = min(view_shape(view.features).longest_window_s, span)
    events = events_in_last(run["timeline"], window)
    capped = tuple(
        dataclasses.replace(f, window=parse_duration(f"{max(int(window), int(f.slide.seconds))}s"))
        if f.window.seconds > window else f
        for f in view.features
    )  # fmt: skip
    return capped, events / window, float(run["redis"][view.name]["keys"] or 1)


def state_terms(views: list[Any], run: dict[str, Any]) -> list[float]:
    """Return a run's state terms per the model (its own code): slices, slices x aggregations, ids.

    Each term is the model's state with one constant at 1 and the others at 0, summed over the views.
    """
    from headwater.registry.calibration import parse_calibration
    from headwater.registry.cost import estimate_footprint
    from headwater.registry.tiers import TIERS

    units = [
        {"state_pane_bytes": a, "state_slot_bytes": dict.fromkeys(AGG_KINDS_RT, b), "state_dedup_id_bytes": c}
        for a, b, c in ((1.0, 0.0, 0.0), (0.0, 1.0, 0.0), (0.0, 0.0, 1.0))
    ]
    terms = []
    for unit in units:
        cal = parse_calibration("realtime", {"constants": {**unit, "selectivity": 1.0}})
        total = 0.0
        for v in views:
            feats, rate, live = state_inputs(v, run)
            total += estimate_footprint(feats, rate, TIERS["realtime"], live, 12, cal).state_bytes
        terms.append(total)
    return terms


def fit_state(runs: dict[str, Any], example: Any) -> dict[str, Any]:
    """Bytes per slice, per aggregation in a slice and per event id, from the checkpoints' sizes."""
    rows, sizes = [], []
    for run in runs.values():
        if "error" in run or not run.get("checkpoint_bytes") or "timeline" not in run:
            continue
        views = [v for v in example.views if v.name in run["views"]]
        rows.append(state_terms(views, run))
        sizes.append(run["checkpoint_bytes"])
    coef = _nonneg_lstsq(np.asarray(rows), np.asarray(sizes, dtype=float))
    return {
        "state_pane_bytes": round(float(coef[0]), 1),
        "state_slot_bytes": dict.fromkeys(AGG_KINDS_RT, round(float(coef[1]), 2)),
        "state_dedup_id_bytes": round(float(coef[2]), 2),
    }


def job_accuracy(runs: dict[str, Any], example: Any, cal: Any) -> dict[str, Any]:
    """Per job and phase: the estimate (its views' charges summed, shares as in the job) vs its cores.

    A job of one view is that view's row (alone: the whole fixed cost is its); a job of several
    checks that the shares add up to the job. State: the model's estimate (windows capped to the
    run, entities = the views' Redis keys, rate = the events of the longest window) vs the newest
    checkpoint; online: the model vs Redis MEMORY USAGE of each view's keys.
    """
    from headwater.registry.cost import estimate_footprint, estimate_view, job_share
    from headwater.registry.tiers import TIERS

    tier = TIERS["realtime"]
    out: dict[str, Any] = {}
    for name, run in runs.items():
        if "error" in run:
            out[name] = {"error": run["error"][:300]}
            continue
        views = [v for v in example.views if v.name in run["views"]]
        keys = [(v.tier, v.source, v.entity) for v in views]
        rows = []
        for p in run["phases"]:
            rate = p["consumed_eps"] or p["rate"]
            est = sum(
                estimate_view(v.features, rate, tier, False, 5000, cal,
                              job_share(keys, v.tier, v.source, v.entity)).cpu_hours_per_day / 24
                for v in views
            )  # fmt: skip
            rows.append({
                "rate": p["rate"], "consumed_eps": rate, "estimated_cores": round(est, 4),
                "measured_cores": p["job_cpu_cores"], "cpu_error": round(est / p["job_cpu_cores"] - 1, 3),
                "load_1m": p["load_1m"], "holds": holds(p),
            })  # fmt: skip
        if "timeline" not in run:  # a prior run: CPU only
            out[name] = {"views": run["views"], "phases": rows, "state_estimate": None}
            continue
        span = -min(a for a, _, _ in run["timeline"])
        state_est = 0.0
        online_est = online_meas = 0.0
        for v in views:
            feats, srate, live = state_inputs(v, run)
            fp = estimate_footprint(feats, srate, tier, live, 12, cal)
            state_est += fp.state_bytes
            online_est += fp.online_bytes
            online_meas += run["redis"][v.name]["bytes"]
        ckpt = run["checkpoint_bytes"]
        out[name] = {
            "views": run["views"], "phases": rows, "span_s": round(span),
            "state_estimate": round(state_est), "checkpoint_bytes": ckpt,
            "state_error": round(state_est / ckpt - 1, 3) if ckpt else None,
            "online_estimate": round(online_est), "redis_bytes": round(online_meas),
            "online_error": round(online_est / online_meas - 1, 3) if online_meas else None,
        }  # fmt: skip
    return out


def print_job_table(acc: dict[str, Any]) -> None:
    """Estimate vs measured per job (a one-view job is that view alone) and rate; state; online."""
    print(f"\n{'job (views)':<44} {'rate/s':>7} {'est cores':>9} {'meas':>6} {'err':>6}  "
          f"{'state est':>10} {'ckpt':>10} {'err':>6}  {'redis est':>9} {'redis':>9} {'err':>6}")  # fmt: skip
    for name, row in acc.items():
        if "error" in row:
            print(f"{name:<44} error: {row['error'][:60]}")
            continue
        for i, p in enumerate(row["phases"]):
            tail = ""
            if i == len(row["phases"]) - 1 and row.get("state_estimate") is not None:
                tail = (f"  {row['state_estimate']:>10,} {row['checkpoint_bytes']:>10,} "
                        f"{(row['state_error'] or 0):>+6.0%}  {row['online_estimate']:>9,} "
                        f"{row['redis_bytes']:>9,} {(row['online_error'] or 0):>+6.0%}")  # fmt: skip
            label = f"{name} ({len(row['views'])})" if i == 0 else ""
            held = ("" if p["holds"] else " (starved)") + f" load {p['load_1m']:g}"
            print(f"{label:<44} {p['consumed_eps']:>7.0f} {p['estimated_cores']:>9.3f} "
                  f"{p['measured_cores']:>6.2f} {p['cpu_error']:>+6.0%}{tail}{held}")  # fmt: skip


def prior_runs() -> dict[str, Any]:
    """Return the realtime jobs measured before, in this module's run form (CPU only: no state figures).

    ``prior:registry``: bench/results/realtime.json's run ``registry`` (the 3 behaviour views, 120 s
    phases at 1k..20k events/s, load under 5: the quiet machine, the per-event slope) and
    ``registry-10k-20k``; ``prior:<view>``: each behaviour view alone (bench_calibrate.json,
    ``--rt-examples-only``, 20 s phases, load 10-18).
    """
    out: dict[str, Any] = {}
    rt_file = ROOT / "bench/results/realtime.json"
    if rt_file.is_file():
        for label, run in json.loads(rt_file.read_text())["runs"].items():
            if label not in ("registry", "registry-10k-20k"):
                continue
            out[f"prior:{label}"] = {
                "views": run["setup"]["views"], "source": "events", "measured_at": run["measured_at"],
                "phases": [{"rate": p["rate"], "consumed_eps": p.get("consumed_eps") or p["rate"],
                            "job_cpu_cores": p["job_cpu_cores"], "load_1m": p["load_average_end"][0]}
                           for p in run["phases"]],
            }  # fmt: skip
    cal_file = ROOT / "bench/results/bench_calibrate.json"
    if cal_file.is_file():
        acc = json.loads(cal_file.read_text())["tiers"].get("realtime", {}).get("accuracy", {})
        for view, row in acc.items():
            run = row.get("run") or {}
            if not run.get("phases"):
                continue
            out[f"prior:{view}"] = {
                "views": [view], "source": row["source"], "measured_at": "2026-12-01 (bench_calibrate.json)",
                "phases": [{"rate": p["offered_eps"], "consumed_eps": p["rate"],
                            "job_cpu_cores": p["job_cpu_cores"], "load_1m": run["load_average"][0]}
                           for p in run["phases"]],
            }  # fmt: skip
    return out


def calibrate_jobs(refit: bool, rates: tuple[float, ...], phase_s: float, write: bool, command: str) -> None:
    """Run (or, ``refit``, reuse) the jobs of :data:`JOBS`, fit realtime.json, print the accuracy table."""
    import time

    from headwater.registry.calibration import calibration_path, parse_calibration
    from headwater.registry.validate import check_repo

    out = ROOT / "bench/results/bench_calibrate_rt_jobs.json"
    started, load0 = time.monotonic(), os.getloadavg()
    if not refit:
        measure_jobs(out, rates, phase_s)
    doc = json.loads(out.read_text())
    runs = {**prior_runs(), **doc["runs"]}
    example = check_repo(ROOT / "features")
    path = calibration_path("realtime")
    kept = json.loads(path.read_text(encoding="utf-8"))
    constants = {**kept["constants"], **fit_jobs(runs, example), **fit_state(runs, example)}
    constants["selectivity"] = 1.0
    cal_data = {
        "tier": "realtime",
        "model": "registry/cost.py",
        "constants": constants,
        "machine": kept.get("machine", {}),
        "measured_at": time.strftime("%Y-%m-%d", time.gmtime()),
        "command": command,
        "isolation": "the Flink job's process group CPU (mini-cluster JVM + PyFlink Python workers, /proc "
        "utime+stime) per wall second of each phase, after a warm-up phase (JIT, first checkpoints) that "
        "is not measured; jobs of 1, 2 and 3 behaviour views, each view alone, and the payments view",
        "derivation": "least squares (negative terms pinned at 0) over every phase of every job: cores = "
        "job_fixed_cores + groups x group_fixed_cores + rate x (job_event_us + views x event_us + "
        "aggregations x agg_us); state: the newest checkpoint's bytes on slices, slices x aggregations "
        "and event ids (the model's counts at the run's end)",
        "stream": {"rates": list(rates), "phase_s": phase_s, "users": 5000, "items": 2000,
                   "accounts": PAY_ACCOUNTS},
        "notes": kept.get("notes", ""),
    }  # fmt: skip
    from bench_calibrate import machine

    cal_data["machine"] = machine()
    cal = parse_calibration("realtime", cal_data, path)
    acc = job_accuracy(runs, example, cal)
    cal_data["measured"] = {
        row["views"][0]: {"cores": [p["measured_cores"] for p in row["phases"]],
                          "rates": [p["consumed_eps"] for p in row["phases"]],
                          "state_bytes": row.get("checkpoint_bytes"), "online_bytes": row.get("redis_bytes")}
        for row in acc.values() if "error" not in row and len(row["views"]) == 1
    }  # fmt: skip
    if write:
        path.write_text(json.dumps(cal_data, indent=2) + "\n", encoding="utf-8")
        print(f"wrote {path.relative_to(ROOT)}")
    doc["fit"] = {"constants": constants, "command": command, "accuracy": acc,
                  "load_average_start": [round(x, 2) for x in load0],
                  "load_average_end": [round(x, 2) for x in os.getloadavg()],
                  "seconds": round(time.monotonic() - started)}  # fmt: skip
    out.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    print_job_table(acc)
