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

import functools
import itertools
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
    start, sent = time.monotonic(), 0
    while (elapsed := time.monotonic() - start) < duration_s:
        due = int(rate * elapsed) - sent
        if due <= 0:
            time.sleep(0.002)
            continue
        now_us = time.time_ns() // 1000
        for _ in range(min(due, 2000)):
            ev = payment_event(rng, f"{tag}-{sent}", now_us)
            producer.send(topic, key=codec.key(ev), value=codec.encode(ev), headers=codec.headers())
            sent += 1
    producer.flush()
    seconds = time.monotonic() - start
    producer.close()
    out.put((sent, seconds, 0.0, []))


PAY_STATUSES = ("authorized", "captured", "declined", "refunded")


def payment_event(rng: Any, payment_id: str, occurred_at_us: int) -> dict[str, Any]:
    """One payment of the example schema, drawn as the realtime calibration sends them."""
    return {
        "payment_id": payment_id,
        "account_id": f"acct-{rng.randrange(PAY_ACCOUNTS):05d}",
        "merchant_id": f"m-{rng.randrange(200):03d}",
        "method": "card",
        "status": rng.choices(PAY_STATUSES, weights=[20, 60, 15, 5])[0],
        "amount": round(rng.uniform(1, 500), 2),
        "currency": "EUR",
        "risk_score": round(rng.random(), 4),
        "occurred_at": occurred_at_us,
    }


@functools.cache
def stream_events(n: int = 60_000) -> dict[str, list[dict[str, Any]]]:
    """Return the calibration streams' events in the order they are sent: behaviour and payments."""
    import random

    from headwater.pipelines.events.generator import EventGenerator, GeneratorConfig

    config = GeneratorConfig(users=5000, items=2000, late_share=0.0, out_of_order_share=0.0,
                             duplicate_share=0.0, malformed_share=0.0)  # fmt: skip
    behaviour = [dict(em.event) for em in EventGenerator(config).take(n) if em.event is not None]
    rng = random.Random(17)
    return {"events": behaviour, "payments": [payment_event(rng, str(i), 0) for i in range(n)]}


def burst_of(keys: list[Any]) -> float:
    """Return the events per run of one key (consecutive events of one entity: one moment, one slice)."""
    keys = [k for k in keys if k is not None and k != ""]
    if not keys:
        return 1.0
    runs = 1 + sum(a != b for a, b in itertools.pairwise(keys))
    return len(keys) / runs


def deciles_of(keys: list[Any]) -> list[float]:
    """Return the share of events of each tenth of the entities, most active first."""
    from collections import Counter

    counts = sorted(Counter(k for k in keys if k is not None and k != "").values(), reverse=True)
    total, n = sum(counts), len(counts)
    out = []
    for d in range(10):
        lo, hi = d * n / 10, (d + 1) * n / 10
        part = sum(
            c * max(0.0, min(i + 1, hi) - max(i, lo)) for i, c in enumerate(counts) if i + 1 > lo and i < hi
        )
        out.append(round(part / total, 5))
    out[0] = round(out[0] + 1 - sum(out), 5)  # rounding: the shares sum to 1
    return out


def where_shares(
    example: Any, n: int = 60_000, events: dict[str, list[dict[str, Any]]] | None = None
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Return the calibration streams' filter shares and bursts, and their per-key profiles.

    Behaviour: the events bench_realtime.py sends (the generator, 5,000 users, 2,000 items, in
    order); payments: :func:`payment_event`'s draw. One entry per distinct filter (a ratio operand's
    filter includes its feature's) with its bursts per join key of the views of its source, as
    ``registry/calibration/realtime.json`` ``where_shares`` holds them; the profile per source and
    join key: the event share of each tenth of the entities and the burst of all events.
    ``events``: another tier's streams (source -> events in the order sent).
    """
    from headwater.registry.calibration import where_key
    from headwater.registry.expr import parse
    from headwater.registry.expr_eval import compile_predicate

    events = events or stream_events(n)
    keys: dict[str, set[str]] = {}
    for view in example.views:
        keys.setdefault(view.source, set()).add(view.join_key)
    profile = {
        source: {key: {"deciles": deciles_of([e.get(key) for e in events[source]]),
                       "burst": round(burst_of([e.get(key) for e in events[source]]), 3)}
                 for key in sorted(keys[source])}
        for source in sorted(keys)
    }  # fmt: skip
    out: dict[str, dict[str, Any]] = {}
    for view in example.views:
        for f in view.features:
            pairs = [(f.where, f.where_text)] + [
                (op.where, op.where_text) for op in (f.numerator, f.denominator) if op is not None
            ]
            for where, text in pairs:
                if where is None or text is None:
                    continue
                key = where_key(where)
                if key in out:
                    continue
                if where_key(parse(text)) != key:  # the text would not find this filter again
                    print(f"  where_shares: {text!r} does not parse back to its filter: left out")
                    continue
                pred = compile_predicate(where)
                sample = events[view.source]
                kept = [e for e in sample if pred(e)]
                out[key] = {
                    "where": text,
                    "share": round(len(kept) / len(sample), 5),
                    "source": view.source,
                    "bursts": {
                        k: round(burst_of([e.get(k) for e in kept]), 3) for k in sorted(keys[view.source])
                    },
                }
    return sorted(out.values(), key=lambda e: (e["source"], e["where"])), profile


PANE_SLIDES_S = (60, 300, 600, 1800, 3600)
"""The slides (s) every nearline filter set's pane burst is measured at, besides its own."""
SESSION_FIELD = "session_id"
"""The field that tells one visit from another (the generator's sessions)."""


def pane_bursts(
    example: Any, events: dict[str, list[dict[str, Any]]], tier: str = "nearline"
) -> list[dict[str, Any]]:
    """Return the events one visit brings to a pane record, per filter set, join key and slide.

    For each pane route (the features of one slide) of each ``tier`` view of ``example``, and each of
    its features' own filter: the kept events divided by the distinct (entity, session, pane) of
    them, at the route's slide and :data:`PANE_SLIDES_S`. A visit is one session of the entity
    (:data:`SESSION_FIELD`); a source whose events carry no session is left out (the model falls
    back to the run burst). ``registry/calibration/<tier>.json`` ``pane_bursts`` holds them.
    """
    from headwater.registry.calibration import where_key
    from headwater.registry.expr_eval import compile_predicate

    found: dict[tuple[str, tuple[str, ...], str], list[Any]] = {}  # (source, filters, key) -> features
    slides_of: dict[tuple[str, tuple[str, ...], str], set[int]] = {}
    for view in example.views:
        if view.tier != tier or not any(SESSION_FIELD in e for e in events.get(view.source, [])[:100]):
            continue
        routes: dict[float, list[Any]] = {}
        for f in view.features:
            routes.setdefault(f.slide.seconds, []).append(f)
        for slide, feats in routes.items():
            for group in [feats, *([f] for f in feats)]:
                unfiltered = any(f.where is None for f in group)
                distinct = [] if unfiltered else list({where_key(f.where): f for f in group}.values())
                key = (view.source, tuple(sorted(where_key(f.where) for f in distinct)), view.join_key)
                found.setdefault(key, distinct)
                slides_of.setdefault(key, set()).add(int(slide))
    out = []
    for (source, filters, join), feats in sorted(found.items(), key=lambda kv: kv[0]):
        preds = [compile_predicate(f.where) for f in feats]
        kept = [e for e in events[source] if e.get(join) and (not preds or any(p(e) for p in preds))]
        if not kept:
            continue
        slides = {}
        for s in sorted({*PANE_SLIDES_S, *slides_of[(source, filters, join)]}):
            visits = {(e[join], e.get(SESSION_FIELD), e["event_time"] // (s * 1000)) for e in kept}
            slides[str(s)] = round(len(kept) / len(visits), 3)
        out.append({"source": source, "where": [f.where_text for f in feats], "key": join, "slides": slides})
    return out


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

    threading.Thread(target=watch_forever, args=(watch,), daemon=True).start()
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
            rep0 = reported_snapshot(state)
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
                # the operators' own figure per view (headwater costs' reported): their timed share only
                "reported": reported_between(rep0, reported_snapshot(state)),
            })  # fmt: skip
            print(f"    {'+'.join(views)} phase {rate:g}/s: {phases[-1]}", flush=True)
        # the state is read once the job has committed all that was sent (a starved job lags behind)
        t_drain = time.time()
        while watch.rows[-1][1] < sent_total and time.time() - t_drain < DRAIN_MAX_S and job.poll() is None:
            time.sleep(1)
        drained = watch.rows[-1][1] >= sent_total
        drain_s = time.time() - t_drain
        time.sleep(6)  # a checkpoint after the last event
        end = time.time()
        redis_mem = redis_footprint(settings.redis_url, namespace, views)
        ckpt = checkpoint_bytes(chk)
        ckpt_at = checkpoint_time(chk) or end
        # the operators' clock: the newest event time, or, idle for 2 s, the wall clock less 2 s (the
        # windows slide on): the state holds the events sent in the window before it
        last_sent = timeline[-1][1]
        clock = max(last_sent, ckpt_at - 2.0)
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
        "clock_s": round(clock - end, 1),
        "drained": drained,
        "drain_s": round(drain_s, 1),
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }


Snapshot = dict[str, tuple[float, dict[str, float], int]]
"""Per realtime stats file: when written, each view's seconds, events read."""


def reported_snapshot(state: Path) -> Snapshot:
    """Per realtime stats file (``<state>/realtime/reported``): when written, each view's seconds, events.

    The job's operator subtasks rewrite them every 5 s (``ViewCpuStats``, what ``headwater costs``
    reports); two snapshots give each view's reported cores over the files' own interval.
    """
    out = {}
    for path in sorted((state / "realtime" / "reported").glob("stats-*.json")):
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
            task = doc["tasks"][0]
            out[path.name] = (float(doc["written"]), dict(task["fold_s"]), int(task["events"]))
        except (OSError, ValueError, KeyError, IndexError, TypeError):
            continue
    return out


def reported_between(before: Snapshot, after: Snapshot) -> dict[str, Any]:
    """Per view: the cores its operators reported between two snapshots and its us per event read."""
    cores: dict[str, float] = {}
    seconds: dict[str, float] = {}
    events: dict[str, int] = {}
    for name, (t1, fold1, n1) in after.items():
        t0, fold0, n0 = before.get(name, (t1, {}, n1))
        if t1 <= t0:
            continue
        for view, s1 in fold1.items():
            d = s1 - fold0.get(view, 0.0)
            cores[view] = cores.get(view, 0.0) + d / (t1 - t0)
            seconds[view] = seconds.get(view, 0.0) + d
            events[view] = events.get(view, 0) + n1 - n0
    return {
        "cores": {v: round(c, 4) for v, c in cores.items()},
        "us_per_event": {v: round(seconds[v] / events[v] * 1e6, 2) for v in seconds if events[v] > 0},
    }


def watch_forever(watch: Any) -> None:
    """Run ``watch`` (bench_realtime.OffsetWatch) until stopped, again after a broker error.

    On a loaded machine the admin client's broker connection drops now and then (NodeNotReadyError):
    the watch starts over instead of dying, which would leave the run waiting for offsets forever.
    """
    import time

    while not watch.stop.is_set():
        try:
            watch.run()
        except Exception as e:  # any client error: poll again
            print(f"    offset watch: {e!r}; again in 1 s", flush=True)
            time.sleep(1.0)


DRAIN_MAX_S = 300.0
"""How long a run waits, after its last phase, for the job to commit every event sent."""


def checkpoint_time(folder: Path) -> float | None:
    """Return when the newest completed checkpoint under ``folder`` was written (its ``_metadata``)."""
    done = [p / "_metadata" for p in folder.rglob("chk-*") if (p / "_metadata").is_file()]
    return max(p.stat().st_mtime for p in done) if done else None


def events_between(timeline: list[tuple[float, float, int]], lo: float, hi: float) -> float:
    """Events sent between ``lo`` and ``hi`` (seconds, relative to the run's end), pro rata per phase."""
    total = 0.0
    for a, b, n in timeline:
        x0, x1 = max(a, lo), min(b, hi)
        if x1 > x0 and b > a:
            total += n * (x1 - x0) / (b - a)
    return total


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
    "item_trending": ["item_trending_realtime"],
    "user_dwell": ["user_dwell_realtime"],
    "account_payments": ["account_payments_realtime"],
    "behaviour_all": ["user_session_realtime", "user_dwell_realtime", "item_trending_realtime"],
    "user_session+user_dwell": ["user_session_realtime", "user_dwell_realtime"],
}


WARM_S = 20.0
"""Seconds of the unmeasured warm-up phase at the first rate (``--rt-warm-s``)."""


def measure_jobs(
    out: Path, rates: tuple[float, ...], phase_s: float, only: list[str] | None = None, key: str = "runs"
) -> dict[str, Any]:
    """Run each job of :data:`JOBS` (or ``only``); write the runs to ``out[key]`` as they finish."""
    import tempfile

    doc = json.loads(out.read_text()) if out.is_file() else {}
    runs = doc.setdefault(key, {})
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
            runs[name] = run_views(repo, work / "run", source, rates, phase_s, WARM_S)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        runs[name]["phase_s"], runs[name]["warm_s"] = phase_s, WARM_S
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


def job_terms(views: list[Any], rate: float, cal: Any) -> list[float]:
    """One phase's terms: job, groups, job events, view events, aggregation events, values written.

    An aggregation folds the events its filter keeps (the operator returns early on an event no
    feature keeps): its term is weighted by its filter's share of the stream (``cal.share``). Values
    written: the model's writes per second (entities touched per slide, the stream's entities).
    """
    from headwater.registry.cost import SECONDS_PER_DAY, view_shape, writes_per_day

    groups = len({v.entity for v in views})
    folded = writes = 0.0
    for v in views:
        shape = view_shape(v.features)
        folded += sum(cal.share(w) for _, w, _ in shape.agg_filters)
        writes += writes_per_day(shape, rate, stream_entities(v.source, v.join_key)) / SECONDS_PER_DAY
    return [1.0, float(groups), rate, rate * len(views), rate * folded, writes]


def holds(phase: dict[str, Any]) -> bool:
    """Whether the job kept up in ``phase``: its lag at the end under 6 s of the offered rate.

    The lag is the committed offsets' (Flink commits them when a checkpoint completes, every 5 s):
    a job that keeps up trails by up to one checkpoint interval (at 3,000 events/s a checkpoint
    still under way at the phase's end leaves ~15,000), so 6 s of events; one that falls behind
    trails by more with every second. A job that fell behind was starved of CPU by the other
    processes on the machine: the cores it got are the scheduler's share, not its cost at that rate.
    Prior runs (no lag figure) held.
    """
    lag = phase.get("lag_end")
    return lag is None or lag <= HOLD_LAG_S * phase["rate"]


HOLD_LAG_S = 6.0


def phase_rate(phase: dict[str, Any]) -> float:
    """Events per second the job processed over a phase's CPU window (the phase and its 6 s tail).

    A phase that held: what was sent over the window (the committed offsets move a checkpoint at a
    time, +/- 5 s of events at either end); one that fell behind: what it committed. Prior runs
    (no ``sent``): their consumed or offered rate.
    """
    if "sent" in phase and phase.get("seconds") and holds(phase):
        return float(phase["sent"]) / float(phase["seconds"])
    return float(phase.get("consumed_eps") or phase["rate"])


def fit_jobs(runs: dict[str, Any], example: Any, cal: Any) -> dict[str, Any]:
    """Fit job_fixed_cores, group_fixed_cores, job_event_us, event_us and agg_us from the jobs' phases.

    Every phase of every job (1, 2 and 3 views of the behaviour source, each view alone, payments)
    is one row: job cores = job_fixed + groups x group_fixed + rate x (job_event_us + views x
    event_us + sum of the aggregations' filter shares x agg_us). One per-aggregation figure for
    every kind (the example views do not separate eight kinds; the shapes showed no slope per kind).
    """
    rows, cores = [], []
    for run in runs.values():
        if "error" in run:
            continue
        views = [v for v in example.views if v.name in run["views"]]
        for p in run["phases"]:
            if not holds(p):  # starved: its cores are the scheduler's share, not what the job needs
                continue
            rows.append(job_terms(views, phase_rate(p), cal))
            cores.append(p["job_cpu_cores"])
    a = np.asarray(rows)
    if not FIT_PUBLISH:
        a[:, 5] = 0.0  # the term left out (pinned at 0)
    if (a[:, 1] == 1).all():  # every job one group: a group's cost is not told from the job's
        a[:, 1] = 0.0
    coef = _nonneg_lstsq(a, np.asarray(cores))
    return {
        "job_fixed_cores": round(float(coef[0]), 4),
        "group_fixed_cores": round(float(coef[1]), 4),
        "job_event_us": round(float(coef[2]) * 1e6, 3),
        "event_us": round(float(coef[3]) * 1e6, 3),
        "agg_us": dict.fromkeys(AGG_KINDS_RT, round(float(coef[4]) * 1e6, 3)),
        "publish_us": round(float(coef[5]) * 1e6, 3),
        "where_us": 0.0,
        "pane_us": 0.0,
        "rekey_us": 0.0,
        "fixed_cores": 0.0,
    }


FIT_PUBLISH = True
"""Whether the job fit has a term per value written (``--rt-no-publish`` leaves it out)."""


AGG_KINDS_RT = ("count", "sum", "avg", "min", "max", "last", "distinct_count", "top_k")


def state_inputs(view: Any, run: dict[str, Any]) -> tuple[tuple[Any, ...], float, float]:
    """Return what the model is given for a view's state at a run's end.

    Its windows capped to the run, the rate of its longest window's events (as sent), its live
    entities (its Redis keys: one per entity with state).
    """
    import dataclasses

    from headwater.registry.cost import view_shape
    from headwater.registry.durations import parse_duration

    clock = run.get("clock_s", 0.0)
    span = clock - min(a for a, _, _ in run["timeline"])
    window = min(view_shape(view.features).longest_window_s, span)
    events = events_between(run["timeline"], clock - window, clock)
    capped = tuple(
        dataclasses.replace(f, window=parse_duration(f"{max(int(window), int(f.slide.seconds))}s"))
        if f.window.seconds > window else f
        for f in view.features
    )  # fmt: skip
    return capped, events / window, float(stream_entities(view.source, view.join_key))


@functools.cache
def stream_entities(source: str, key: str) -> int:
    """Return the distinct ``key`` values of the calibration stream of ``source`` (the state's entities).

    Behaviour: the template events bench_realtime.py cycles through; payments: the accounts drawn.
    """
    return len({e.get(key) for e in stream_events()[source] if e.get(key)})


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
            rate = phase_rate(p)
            told = p.get("reported")  # the job's own per-view figures (headwater costs' reported)
            est = sum(
                estimate_view(v.features, rate, tier, False, stream_entities(v.source, v.join_key), cal,
                              job_share(keys, v.tier, v.source, v.entity)).cpu_hours_per_day / 24
                for v in views
            )  # fmt: skip
            rows.append({
                "rate": p["rate"], "consumed_eps": rate, "estimated_cores": round(est, 4),
                "measured_cores": p["job_cpu_cores"], "cpu_error": round(est / p["job_cpu_cores"] - 1, 3),
                "load_1m": p["load_1m"], "holds": holds(p),
                "reported_cores": round(sum(told["cores"].values()), 4) if told else None,
            })  # fmt: skip
        if "timeline" not in run:  # a prior run: CPU only
            out[name] = {"views": run["views"], "phases": rows, "state_estimate": None}
            continue
        span = -min(a for a, _, _ in run["timeline"])
        state_est = 0.0
        online_est = online_meas = 0.0
        basis = {}
        for v in views:
            feats, srate, entities = state_inputs(v, run)
            fp = estimate_footprint(feats, srate, tier, entities, 12, cal, stream=(v.source, v.join_key))
            state_est += fp.state_bytes
            basis[v.name] = {"rate": round(srate, 1), "entities": entities, "state": fp.state_basis}
            # online: bytes a key as estimated, times the keys the view wrote (how many entities the
            # run touched is the run's, not the model's)
            keys = run["redis"][v.name]["keys"]
            online_est += fp.online_bytes / max(fp.entities, 1.0) * keys
            online_meas += run["redis"][v.name]["bytes"]
        ckpt = run["checkpoint_bytes"]
        out[name] = {
            "views": run["views"], "phases": rows, "span_s": round(span), "state_basis": basis,
            "drained": run.get("drained"),
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
            told = p.get("reported_cores")
            if told is not None:  # the views' reported share of the job's cores (their timed work only)
                held += f"; reported {told:.3f} ({told / p['measured_cores']:.0%})"
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


STATE_JOBS = ["user_session", "item_trending", "user_dwell", "account_payments"]
"""The state runs: each realtime example view alone."""


def calibrate_state(refit: bool, rate: float, seconds: float, write: bool, command: str) -> None:
    """Each realtime view alone at one steady rate for ``seconds`` (> its window): checkpoint vs estimate.

    State is an amount of data, not speed: these runs may share the machine (a job that falls behind
    is waited for before its state is read, ``drained``). The stream's filter shares and profile are
    measured again and written to realtime.json (``where_shares``, ``stream_profile``) unless
    ``write`` is false; the CPU constants are kept.
    """
    import time

    from headwater.registry.calibration import calibration_path, parse_calibration
    from headwater.registry.validate import check_repo

    out = ROOT / "bench/results/bench_calibrate_rt_jobs.json"
    started, load0 = time.monotonic(), os.getloadavg()
    if not refit:
        measure_jobs(out, (rate,), seconds, only=STATE_JOBS, key="state_runs")
    doc = json.loads(out.read_text())
    example = check_repo(ROOT / "features")
    path = calibration_path("realtime")
    cal_data = json.loads(path.read_text(encoding="utf-8"))
    cal_data["where_shares"], cal_data["stream_profile"] = where_shares(example)
    cal_data["state_command"] = command
    cal = parse_calibration("realtime", cal_data, path)
    if write:
        path.write_text(json.dumps(cal_data, indent=2) + "\n", encoding="utf-8")
        print(f"wrote {path.relative_to(ROOT)}")
    acc = job_accuracy(doc["state_runs"], example, cal)
    doc["state_fit"] = {"command": command, "accuracy": acc,
                        "load_average_start": [round(x, 2) for x in load0],
                        "load_average_end": [round(x, 2) for x in os.getloadavg()],
                        "seconds": round(time.monotonic() - started),
                        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}  # fmt: skip
    out.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    print_job_table(acc)


LONG_WARM_S = 60.0
"""Runs warmed up this long are fitted alone when they have 4 phases that held: a 20-s warm-up left
JIT and the first checkpoints in the first phase (user_session_realtime, quiet, 2026-12-02: 0.09 cores
at 940/s after 60 s, 0.22 at 800/s after 20 s)."""


PRIOR_MAX_RATE = 5000.0
"""The quiet 3-view run's phases fitted with the warmed runs: up to 5k events/s (above it the 2-core
machine's producer and job share the cores: its slope rises from 15 to 64 us an event at 20k/s)."""


def calibrate_jobs(
    refit: bool,
    rates: tuple[float, ...],
    phase_s: float,
    write: bool,
    command: str,
    only: list[str] | None = None,
) -> None:
    """Run (or, ``refit``, reuse) the jobs of :data:`JOBS` (or ``only``), fit realtime.json, print it."""
    import time

    from headwater.registry.calibration import calibration_path, parse_calibration
    from headwater.registry.validate import check_repo

    out = ROOT / "bench/results/bench_calibrate_rt_jobs.json"
    started, load0 = time.monotonic(), os.getloadavg()
    if not refit:
        measure_jobs(out, rates, phase_s, only)
    doc = json.loads(out.read_text())
    runs = {**prior_runs(), **doc["runs"]}
    example = check_repo(ROOT / "features")
    path = calibration_path("realtime")
    kept = json.loads(path.read_text(encoding="utf-8"))
    fresh = {k: r for k, r in runs.items() if "timeline" in r and "error" not in r}
    warmed = {k: r for k, r in fresh.items() if (r.get("warm_s") or 0) >= LONG_WARM_S}
    if warmed and "prior:registry" in runs:  # the quiet 3-view job (2 groups): tells a group from the job
        prior = runs["prior:registry"]
        low = [p for p in prior["phases"] if p["rate"] <= PRIOR_MAX_RATE]
        warmed["prior:registry"] = {**prior, "phases": low}
    fitted = next(
        (c for c in (warmed, fresh) if sum(holds(p) for r in c.values() for p in r["phases"]) >= 4), runs
    )
    shares, profile = where_shares(example)
    stream_cal = parse_calibration("realtime", {"where_shares": shares})
    constants = {**kept["constants"], **fit_jobs(fitted, example, stream_cal)}
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
        "derivation": "CPU: least squares (negative terms pinned at 0) over every phase that held of this "
        "command's jobs (the earlier runs only when fewer than 4 phases held): cores = job_fixed_cores + "
        "groups x group_fixed_cores + rate x (job_event_us + views x event_us + filter shares x agg_us). "
        "State: not fitted; the bytes of KeyStateSerializer's layout (format 2, no snapshot compression): "
        "per entity 1 namespace + 1 key length + 1 format + 8 boundary + 8 next change + 5 running array "
        "+ 4 slice count + 4 view count = 32 (+ the key); per view 13 (change, pending, size); per slot 5 "
        "(float + text marker), a text slot ~8 more; running: count long[1] 13, sum double[2] 21, avg "
        "double[3] 29, min/max a multiset 5 + 16 a value, last 56 (slice, partial), distinct_count/top_k a "
        "map 5 + an entry (28 / 16); a slice 8 start + 4 id count + 5 partial array = 17, 1 a null "
        "partial, a partial: count 13, sum 21, avg 29, min/max 13, last 42, distinct_count 33, top_k 21; "
        "8 an event id hash. where_shares and stream_profile are measured on the calibration streams "
        "(where_shares() of bench/calibrate_realtime.py); the checkpoints verify the whole.",
        "where_shares": shares,
        "stream_profile": profile,
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
