"""write.lua records one freshness entry per call and view, whatever the writer (real Redis)."""

from __future__ import annotations

import numpy as np
import pytest
import redis
from redis.crc import key_slot

from headwater.pipelines.freshness.report import FreshnessTarget, build_report
from headwater.pipelines.freshness.samples import Entry, read_entries, read_since
from headwater.pipelines.store import OnlineStore, ViewLayout, epoch_ms, freshness_key, view_slot
from headwater.pipelines.store.store import WRITE_SCRIPT

T0 = 1_800_000_000_000
LAYOUT = ViewLayout(view="user_session_realtime", entity="user", features=("a", "b"), ttl_s=600, version="v1")


def ids(n: int, start: int = 0) -> list[str]:
    return [f"u{i}" for i in range(start, start + n)]


def zeros(n: int) -> np.ndarray:
    return np.zeros((n, 2), dtype=np.float32)


def test_each_call_appends_rows_written_and_their_boundaries(store: OnlineStore, client: redis.Redis) -> None:
    store.write_batch(LAYOUT, ids(5), zeros(5), [T0, T0, T0, T0 - 1000, T0 - 1000], write_time_ms=T0 + 700)
    # a replay of u0..u2 (unchanged), a stale u3 (older boundary) and a new u9: 1 row written
    store.write_batch(
        LAYOUT,
        ["u0", "u1", "u2", "u3", "u9"],
        zeros(5),
        [T0, T0, T0, T0 - 5000, T0 + 1000],
        write_time_ms=T0 + 2500,
    )
    entries, last = read_entries(client, LAYOUT.view, store.namespace)
    assert entries == [  # each entry names the view version of its values (the layout's)
        Entry(T0 + 700, 5, 5, T0, ((T0 - 1000, 2), (T0, 3)), "v1"),
        Entry(T0 + 2500, 1, 5, T0 + 1000, ((T0 + 1000, 1),), "v1"),
    ]
    assert last is not None
    assert read_entries(client, LAYOUT.view, store.namespace, last) == ([], None)


def test_the_log_lives_in_the_slot_of_the_view(store: OnlineStore, client: redis.Redis) -> None:
    store.write_batch(LAYOUT, ids(1), zeros(1), T0)
    key = freshness_key(LAYOUT.view, store.namespace)
    assert client.type(key) == b"stream"
    assert key_slot(key.encode()) == view_slot(LAYOUT.view, store.namespace)


def test_one_entry_per_chunk_and_quantile_points_beyond_8_boundaries(
    client: redis.Redis, namespace: str
) -> None:
    store = OnlineStore(client, namespace=namespace, chunk_rows=100)
    times = T0 - 1000 * (np.arange(250) % 50)  # 50 distinct boundaries, 5 rows each
    store.write_batch(LAYOUT, ids(250), zeros(250), times, write_time_ms=T0 + 1)
    entries, _ = read_entries(client, LAYOUT.view, namespace)
    assert [e.rows for e in entries] == [100, 100, 50]
    for e, chunk in zip(entries, (times[:100], times[100:200], times[200:]), strict=True):
        assert len(e.samples) == 8
        assert sum(c for _, c in e.samples) == len(chunk)
        assert e.progress_ms == chunk.max()
        points = [b for b, _ in e.samples]
        assert points == sorted(points)
        assert points[0] >= chunk.min()
        assert points[-1] <= chunk.max()


def test_a_writer_calling_the_script_itself_is_logged_too(client: redis.Redis, namespace: str) -> None:
    """Another writer (e.g. a JVM sink) runs the same script with the same arguments."""
    from headwater.pipelines.store import codec

    rec = codec.pack(zeros(2), np.array([T0, T0 - 2000]), T0 + 900, 0, LAYOUT.schema_hash, "v1").tobytes()
    keys = [f"{namespace}:{{{LAYOUT.view}}}:x1", f"{namespace}:{{{LAYOUT.view}}}:x2"]
    assert client.eval(WRITE_SCRIPT, 2, *keys, 0, codec.record_size(2), rec) == b"11"
    entries, _ = read_entries(client, LAYOUT.view, namespace)
    assert entries == [Entry(T0 + 900, 2, 2, T0, ((T0 - 2000, 1), (T0, 1)), "v1")]


def test_publish_progress_and_delete_view(store: OnlineStore, client: redis.Redis) -> None:
    store.write_batch(LAYOUT, ids(2), zeros(2), T0, write_time_ms=T0 + 500)
    store.publish_progress(LAYOUT, T0 + 1000, write_time_ms=T0 + 1500)
    entries, _ = read_entries(client, LAYOUT.view, store.namespace)
    assert entries[-1] == Entry(T0 + 1500, 0, 0, T0 + 1000, ())
    assert store.delete_view(LAYOUT.view) == 2
    assert client.exists(freshness_key(LAYOUT.view, store.namespace)) == 0


def test_report_figures_equal_what_was_written(store: OnlineStore, client: redis.Redis) -> None:
    """Writes of the last 10 minutes (the report reads the log by Redis time, so times are real)."""
    rng = np.random.default_rng(7)
    now = epoch_ms()
    t0 = now - 600_000
    written_lags: list[float] = []
    published: list[tuple[int, int]] = []  # (write time, greatest boundary of the call)
    for k in range(60):  # one publication every 10 s, boundaries 1..4 s behind the write
        wt = t0 + k * 10_000
        n = int(rng.integers(1, 6))
        lag_ms = rng.integers(1, 5, size=n) * 1000
        store.write_batch(LAYOUT, ids(n, start=10 * k), zeros(n), wt - lag_ms, write_time_ms=wt)
        written_lags += (lag_ms / 1000).tolist()
        published.append((wt, int((wt - lag_ms).max())))
    report = build_report(
        client, [FreshnessTarget(LAYOUT.view, "realtime", 5.0)], now, 700.0, store.namespace
    )
    (v,) = report.views
    expected = np.percentile(written_lags, [50, 99], method="inverted_cdf")
    assert (v.lag_window.p50, v.lag_window.p99) == tuple(expected.tolist())
    assert v.rows_window == len(written_lags)
    assert v.writes_window == 60
    progress = max(b for _, b in published)
    assert v.progress_ms == progress
    assert v.age_now_s == (now - progress) / 1000
    # age from the first publication (t0) on, on a 1 ms grid, from the running max of the boundaries
    grid = np.arange(t0, now, 1)
    times = np.array([t for t, _ in published])
    running = np.maximum.accumulate(np.array([b for _, b in published]))
    ages = (grid - running[np.searchsorted(times, grid, side="right") - 1]) / 1000
    assert v.age_window.p50 == pytest.approx(np.percentile(ages, 50), abs=0.002)
    assert v.age_window.p99 == pytest.approx(np.percentile(ages, 99), abs=0.002)


def test_read_since_keeps_the_window_and_one_anchor_of_the_progress_before(
    store: OnlineStore, client: redis.Redis
) -> None:
    now = epoch_ms()
    for k, boundary in enumerate((now - 9000, now - 4000, now - 6000)):
        store.write_batch(LAYOUT, ids(1, start=k), zeros(1), boundary, write_time_ms=now - 3000 + k)
    everything, _ = read_entries(client, LAYOUT.view, store.namespace)
    assert read_since(client, LAYOUT.view, now - 600_000, store.namespace) == everything
    # a window opening 2 minutes from now: all three were logged before it (the margin is 1 minute)
    assert read_since(client, LAYOUT.view, now + 120_000, store.namespace) == [
        Entry(now - 3000 + 2, 0, 0, now - 4000, ())
    ]
