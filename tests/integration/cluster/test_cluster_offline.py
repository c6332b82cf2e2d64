"""The offline tier on Spark standalone: the worker killed mid-job (with its executor), started again.

A session on ``spark://`` (offline_session: Delta jars passed explicitly, executors on this
interpreter) lands synthetic behaviour events into bronze and computes a daily view over 3 days; while
that job's stages run, the worker's whole process group (worker, executor, Python workers: a lost
host) gets SIGKILL, and the worker is started again. The job completes and every row equals the
reference semantics.
"""

from __future__ import annotations

import math
import os
import signal
import threading
import time
from datetime import date
from pathlib import Path
from typing import Any

import pytest

from headwater.pipelines.offline.bronze import append_events
from headwater.pipelines.offline.job import read_bronze, run_view
from headwater.pipelines.offline.lake import bronze_path, days, feature_path
from headwater.pipelines.offline.testing import DAY_MS, HOUR_MS, T0, behaviour, event, feature, view
from headwater.pipelines.windows import compile_view, empty_values, reference_values

from .conftest import SPARK_MASTER, cluster_sh, part_pid, record_figure, spark_alive_workers, wait_until

pytestmark = pytest.mark.cluster

D0 = date(2026, 1, 1)
USERS = 200
VIEW = view("cluster_user", "user", "user_id", [
    feature("clicks_2d", "count", "2d", filter_="event_type = 'click'", dtype="int64"),
    feature("spend_2d", "sum", "2d", field="price", filter_="event_type = 'purchase'"),
    feature("dwell_avg_1d", "avg", "1d", field="dwell_ms", filter_="event_type = 'dwell'"),
    feature("sessions_2d", "distinct_count", "2d", field="session_id", dtype="int64"),
    feature("clicks_3h", "count", "3h", slide="1h", filter_="event_type = 'click'", dtype="int64"),
])  # fmt: skip


def history() -> list[dict[str, Any]]:
    """3 days of 200 users, 7 events a user a day (a click, a purchase, a dwell...), deterministic."""
    out: list[dict[str, Any]] = []
    kinds = ["impression", "click", "purchase", "dwell", "click", "impression", "like"]
    n = 0
    for d in range(3):
        for u in range(USERS):
            for j, kind in enumerate(kinds):
                n += 1
                t = T0 + d * DAY_MS + ((u * 7 + j * 3) % 24) * HOUR_MS + j
                fields = {"item_id": f"i{(u + j) % 11}", "session_id": f"s{u}-{d}-{j % 2}",
                          "price": float((u + j) % 9) + 0.5, "dwell_ms": 1000 * (j + 1)}  # fmt: skip
                out.append(event(n, f"u{u}", kind, t, **fields))
    return out


def test_spark_worker_killed_mid_job_completes_exact(cluster: None, tmp_path: Path) -> None:
    from headwater.pipelines.offline.session import offline_session

    spark = offline_session("headwater-cluster-test", SPARK_MASTER)
    events = history()
    lake = tmp_path / "lake"
    outcome: dict[str, Any] = {}
    try:
        append_events(spark, behaviour(), events, bronze_path(lake, "events"))

        def job() -> None:
            try:
                bronze = read_bronze(spark, lake, behaviour())
                outcome["runs"] = run_view(spark, bronze, VIEW, behaviour(), lake, days(D0, date(2026, 1, 3)),
                                           chunk_days=1, zorder=False)  # fmt: skip
            except Exception as exc:  # reported by the assert below
                outcome["error"] = exc

        worker = threading.Thread(target=job)
        worker.start()
        tracker = spark.sparkContext.statusTracker()
        wait_until(lambda: bool(tracker.getActiveStageIds()), 120, "a stage of the offline job running")
        before = set(spark_alive_workers(ids=True))
        os.killpg(part_pid("spark-worker"), signal.SIGKILL)  # worker + executor + Python workers
        killed_at = time.monotonic()
        time.sleep(2)
        cluster_sh("start", "spark-worker")
        back_s = wait_until(lambda: bool(set(spark_alive_workers(ids=True)) - before), 180,
                            "a new worker registered")  # fmt: skip
        worker.join(timeout=600)
        done_s = time.monotonic() - killed_at
        assert not worker.is_alive(), "the offline job did not finish within 10 min of the kill"
        assert "error" not in outcome, outcome.get("error")
        assert [r.rows for r in outcome["runs"]] == [USERS, USERS, USERS]

        spec = compile_view(VIEW)
        rows = spark.read.format("delta").load(str(feature_path(lake, VIEW.name))).collect()
        by_key = {(str(r["date"]), r["user_id"]): r.asDict() for r in rows}
        assert len(by_key) == len(rows) == 3 * USERS  # each (day, user) once: no task wrote twice
        checked = 0
        for d in range(3):
            as_of = T0 + (d + 1) * DAY_MS
            expected = reference_values(spec, events, as_of)
            for u in range(USERS):
                row = by_key[(str(date(2026, 1, 1 + d)), f"u{u}")]
                for name, value in expected.get(f"u{u}", empty_values(spec)).items():
                    found = row[name]
                    ok = (
                        found is None
                        if math.isnan(value)
                        else math.isclose(value, float(found), rel_tol=1e-9)
                    )
                    assert ok, (d, u, name, value, found)
                    checked += 1
        assert checked == 3 * USERS * len(VIEW.features)
        record_figure("spark_worker_kill", {"worker_back_s": round(back_s + 2, 1), "job_done_after_kill_s":
                                            round(done_s, 1)})  # fmt: skip
    finally:
        spark.stop()
        if not spark_alive_workers(ids=True):
            cluster_sh("start", "spark-worker")
