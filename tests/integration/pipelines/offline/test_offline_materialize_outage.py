"""Materialize through a Redis outage (issue 16 item 5): it waits for Redis and the values are exact.

The test's own redis-server is stopped before materialize and started again 5 s after the run's
first failed write (heard from its retry log). Before the retry, the first write raised and the run
died; now each chunk is retried with back-off, the values read back equal the offline reference
(written once: a second run writes nothing), and the retries are counted.
"""

from __future__ import annotations

import importlib.util
import logging
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import date
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from headwater.pipelines.offline.bronze import append_events
from headwater.pipelines.offline.job import read_bronze, run_view
from headwater.pipelines.offline.lake import bronze_path, days
from headwater.pipelines.offline.materialize import materialize
from headwater.pipelines.offline.testing import behaviour
from headwater.pipelines.store import OnlineStore
from headwater.pipelines.store.testing import OwnRedis
from headwater.pipelines.windows import (
    RedisDictionary,
    compile_view,
    reference_values,
    to_vectors,
    view_layout,
)

_spec = importlib.util.spec_from_file_location(
    "serving_paths", Path(__file__).with_name("test_offline_serving_paths.py")
)
assert _spec is not None
assert _spec.loader is not None
sp = importlib.util.module_from_spec(_spec)
sys.modules["serving_paths"] = sp
_spec.loader.exec_module(sp)


@pytest.fixture(scope="module")
def lake(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A bronze table and the pit_user feature table (test_offline_serving_paths' data)."""
    root = tmp_path_factory.mktemp("lake")
    append_events(spark, behaviour(), sp.history(), bronze_path(root, "events"))
    bronze = read_bronze(spark, root, behaviour())
    run_view(
        spark, bronze, sp.USERS, behaviour(), root, days(date(2026, 1, 1), date(2026, 1, 2)), zorder=False
    )
    return root


class FirstRetry(logging.Handler):
    """Sets ``heard`` at the first retry warning of ``headwater.retry``."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.heard = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        self.heard.set()


@pytest.fixture
def store(own_redis: OwnRedis) -> Iterator[OnlineStore]:
    s = OnlineStore.from_url(own_redis.url, namespace=f"hwtest-{uuid.uuid4().hex[:8]}")
    yield s
    s.close()


def test_redis_stopped_5_s_under_materialize_it_retries_and_the_values_are_exact(
    spark: Any, lake: Path, store: OnlineStore, own_redis: OwnRedis
) -> None:
    retries = FirstRetry()
    logging.getLogger("headwater.retry").addHandler(retries)

    def restart() -> None:
        if retries.heard.wait(600):
            time.sleep(5)  # down for 5 s after the first failed write
        own_redis.start()

    own_redis.stop()
    restarter = threading.Thread(target=restart)
    restarter.start()
    try:
        done = materialize(spark, store, [sp.USERS], lake)
    finally:
        retries.heard.set()
        restarter.join()
        logging.getLogger("headwater.retry").removeHandler(retries)
    assert [(m.view, m.date, m.rows) for m in done] == [("pit_user", date(2026, 1, 2), 2)]
    assert done[0].retries >= 2  # Redis was down for 5 s: the back-off starts at 0.25-0.5 s
    assert done[0].written == 2
    as_of = sp.T0 + 2 * sp.DAY_MS
    dictionary = RedisDictionary(store.client, store.namespace)
    for plan_view in (sp.USERS,):
        spec = compile_view(plan_view)
        expected = reference_values(spec, sp.history(), as_of)
        entities = sorted(expected)
        want = to_vectors(spec, [list(expected[e].values()) for e in entities], dictionary.ids)
        got = store.read_batch(view_layout(spec), entities)
        assert got.found.all()
        assert (got.event_time_ms == as_of).all()
        np.testing.assert_array_equal(got.values, want)
    again = materialize(spark, store, [sp.USERS], lake)
    assert [m.written for m in again] == [0]  # everything was written once
