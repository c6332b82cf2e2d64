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
