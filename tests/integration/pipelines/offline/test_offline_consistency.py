"""`headwater consistency` end to end: nearline values written by the nearline code, checked offline.

Events are landed in bronze; the nearline tier's own :class:`PartitionTask` folds the same events
(as Kafka records) and its published values are written to Redis the way its runner does; the
offline job computes the view for the day; then the consistency check (function and CLI)
recomputes every online value at its own boundary: no mismatch, until one stored value is corrupted.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import date
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from headwater.cli.offline import consistency as consistency_cli
from headwater.pipelines.events.codec import EventCodec
from headwater.pipelines.events.testing import Record as Rec
from headwater.pipelines.events.timing import SourceTiming
from headwater.pipelines.nearline.state import PartitionStore
from headwater.pipelines.nearline.task import PartitionTask
from headwater.pipelines.offline.bronze import append_events
from headwater.pipelines.offline.consistency import check_view
from headwater.pipelines.offline.job import read_bronze, run_view
from headwater.pipelines.offline.lake import bronze_path, feature_path
from headwater.pipelines.offline.testing import HOUR_MS, T0, behaviour, event, feature, view, write_plan
from headwater.pipelines.store import OnlineStore
from headwater.pipelines.windows import (
    RedisDictionary,
    compile_view,
    empty_values,
    reference_values,
    to_vectors,
    view_layout,
)

REGISTRY = "sha256:" + "cd" * 32
NEARLINE = view("cons_user_nearline", "user", "user_id", [
    feature("clicks_2h", "count", "2h", slide="1h", filter_="event_type = 'click'", dtype="int64"),
    feature("spend_3h", "sum", "3h", slide="1h", field="price", filter_="event_type = 'purchase'"),
    feature("dwell_avg_2h", "avg", "2h", slide="1h", field="dwell_ms", filter_="event_type = 'dwell'"),
    feature("price_max_2h", "max", "2h", slide="1h", field="price"),
    feature("last_item_2h", "last", "2h", slide="1h", field="item_id", dtype="string"),
    feature("sessions_3h", "distinct_count", "3h", slide="1h", field="session_id", dtype="int64"),
    feature("top_cat_3h", "top_k", "3h", slide="1h", field="category", k=2),
    feature("ctr_2h", "ratio", "2h", slide="1h", num=("count", None, "event_type = 'click'"),
            den=("count", None, "event_type = 'impression'")),
], tier="nearline")  # fmt: skip
USERS = [f"u{i}" for i in range(6)]
KINDS = ["impression", "click", "impression", "dwell", "purchase", "click", "like"]
CATEGORIES = ["music", "books", "art"]
START_MS = T0 + 18 * HOUR_MS
LAST_MS = T0 + 23 * HOUR_MS + 20 * 60_000
"""The newest event: 23:20, so the watermark (no out-of-orderness) publishes boundary 23:00."""


def history() -> list[dict[str, Any]]:
    """Six users, 18:00 to 23:20 of one day: every aggregation kind has data; a duplicate; an open pane."""
    ev = []
    for n in range(120):
        user = USERS[n % len(USERS)]
        kind = KINDS[(n * 5 + n // 7) % len(KINDS)]
        t = START_MS + n * 150_000 + (n % 4) * 1000  # 18:00 .. 22:57
        ev.append(event(n, user, kind, t, item_id=f"i{n % 9}", category=CATEGORIES[n % 3] if n % 5 else None,
                        price=float(n % 11) + 0.5 if kind in ("impression", "purchase", "click") else None,
                        dwell_ms=1000 + 37 * n if kind == "dwell" else None,
                        session_id=f"s-{user}-{n // 40}"))  # fmt: skip
    ev.append(dict(ev[17]))  # a duplicate event id: counts once on both tiers
    ev.append(event(500, "u0", "click", LAST_MS, item_id="i1", category="art", price=3.0))  # open pane
    return ev


def publish_nearline(store: OnlineStore, events: list[dict[str, Any]], tmp: Path) -> int:
    """Fold ``events`` with the nearline task and write what it publishes like its runner; return B."""
    codec = EventCodec()
    recs = [Rec(i, codec.encode(e), codec.headers()) for i, e in enumerate(events)]  # type: ignore[arg-type]
    spec = compile_view(NEARLINE)
    timing = SourceTiming(0, 24 * HOUR_MS, 5 * 60_000)  # in order, none late: the reference takes every event
    task = PartitionTask(0, PartitionStore(tmp, 0), [spec], timing, codec)
    dictionary = RedisDictionary(store.client, store.namespace)
    published: dict[str, int] = {}
    try:
        for s in range(0, len(recs), 40):
            out = task.process(recs[s : s + 40], now_ms=LAST_MS)
            task.store.commit(out.changes, s)
            for name, (boundary, entities) in out.publish.items():
                rows = task.values(name, entities, boundary)
                vectors = to_vectors(spec, rows, dictionary.ids)
                store.write_batch(view_layout(spec), entities, vectors, boundary)
                published.update(dict.fromkeys(entities, boundary))
    finally:
        task.store.close()
    boundary = task.views[NEARLINE.name].t_pub
    assert boundary == T0 + 23 * HOUR_MS
    assert {u: published[u] for u in USERS} == dict.fromkeys(USERS, boundary)
    return boundary


@pytest.fixture(scope="module")
def store(redis_url: str) -> Iterator[OnlineStore]:
    namespace = f"hwtest-{uuid.uuid4().hex[:8]}"
    s = OnlineStore.from_url(redis_url, namespace=namespace)
    yield s
    for key in s.client.scan_iter(match=f"{namespace}:*"):
        s.client.delete(key)
    s.close()


@pytest.fixture(scope="module")
def lake(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("lake")
    append_events(spark, behaviour(), history(), bronze_path(root, "events"))
    return root


def same(expected: Any, found: Any) -> bool:
    """A reference value (NaN: missing; top_k: (value, share) pairs) against a feature-table cell."""
    if isinstance(expected, tuple):
        return [(e["value"], pytest.approx(e["share"])) for e in found] == [(str(v), s) for v, s in expected]
    if isinstance(expected, str) or found is None:
        return expected == found or (found is None and expected != expected)
    return bool(float(found) == pytest.approx(expected))


def test_offline_day_of_the_nearline_view_equals_the_reference(spark: Any, lake: Path) -> None:
    bronze = read_bronze(spark, lake, behaviour())
    runs = run_view(spark, bronze, NEARLINE, behaviour(), lake, [date(2026, 1, 1)], zorder=False)
    assert [r.rows for r in runs] == [len(USERS)]
    rows = spark.read.format("delta").load(str(feature_path(lake, NEARLINE.name))).collect()
    spec = compile_view(NEARLINE)
    as_of = T0 + 24 * HOUR_MS  # the day's values are as of 2026-01-02 00:00
    expected = reference_values(spec, history(), as_of)
    by_user = {r["user_id"]: r.asDict(recursive=True) for r in rows}
    assert set(by_user) == set(USERS)
    assert sum(expected[u]["clicks_2h"] for u in expected) > 0  # windows 21:00/22:00 .. 24:00 hold events
    for user, row in by_user.items():
        assert row["event_time"].timestamp() * 1000 == as_of
        for name, value in expected.get(user, empty_values(spec)).items():
            assert same(value, row[name]), f"{user} {name}: expected {value!r}, found {row[name]!r}"


def test_consistency_of_nearline_values(
    spark: Any, lake: Path, store: OnlineStore, tmp_path: Path, redis_url: str
) -> None:
    spec = compile_view(NEARLINE)
    boundary = publish_nearline(store, history(), tmp_path / "nearline")
    expected = reference_values(spec, history(), boundary)
    assert set(expected) == set(USERS)
    assert all(expected[u]["clicks_2h"] > 0 for u in USERS[:3])  # the check compares real values

    bronze = read_bronze(spark, lake, behaviour())
    result = check_view(spark, bronze, store, NEARLINE, behaviour(), lake, sample=50)
    assert (result.sampled, result.found) == (len(USERS), len(USERS))
    assert result.mismatch_rate == 0.0, result.examples
    assert set(result.mismatches) == set(view_layout(spec).features)
    assert result.compared_values == len(USERS) * len(result.mismatches)

    # Corrupt one stored value (delete the key, write it back at the same boundary with one slot off).
    layout = view_layout(spec)
    read = store.read_batch(layout, ["u2"])
    bad = read.values.copy()
    slot = layout.features.index("spend_3h")
    bad[0, slot] += 1.0
    store.client.delete(*store.keys(layout, ["u2"]))
    assert store.write_batch(layout, ["u2"], bad, boundary).written == 1

    # The command finds exactly that value, and exits 1 (over the 0.1% target).
    state = tmp_path / "state"
    write_plan(state, "nearline", [NEARLINE], registry_hash=REGISTRY)
    args = ["--tier", "nearline", "--json", "--lake", str(lake), "--state-dir", str(state),
            "--redis-url", redis_url, "--namespace", store.namespace]  # fmt: skip
    run = CliRunner().invoke(consistency_cli, args)
    assert run.exit_code == 1, run.output
    report = json.loads(run.output)
    assert [(r["view"], r["sampled"], r["found"]) for r in report] == [
        (NEARLINE.name, len(USERS), len(USERS))
    ]
    assert report[0]["mismatches"] == {name: int(name == "spend_3h") for name in layout.features}
    assert report[0]["mismatch_rate"] == pytest.approx(1 / (len(USERS) * len(layout.features)))
    assert report[0]["feature_mismatch_rates"] == {
        name: pytest.approx(1 / len(USERS) if name == "spend_3h" else 0.0) for name in layout.features
    }
    assert len(report[0]["examples"]) == 1
    assert report[0]["examples"][0].startswith(f"u2 at {boundary}: spend_3h online {bad[0, slot]}")
