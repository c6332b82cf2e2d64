"""Late events healed (Spark + Delta + a private Redis): a click landed late for an old day ends, after
the next offline run, in the healed online value and the as-corrected training set, not the as-served one."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import date
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest

from headwater.pipelines.offline.bronze import append_events
from headwater.pipelines.offline.heal import heal_online, heal_view
from headwater.pipelines.offline.job import read_bronze, run_view
from headwater.pipelines.offline.lake import bronze_path, feature_path, healed_path
from headwater.pipelines.offline.materialize import materialize
from headwater.pipelines.offline.testing import DAY_MS, HOUR_MS, T0, behaviour, event, feature, view
from headwater.pipelines.store import OnlineStore
from headwater.pipelines.store.testing import OwnRedis
from headwater.pipelines.windows import compile_view, view_layout
from headwater.ranking.training_set import AS_CORRECTED, AS_SERVED, build_training_set

pytestmark = pytest.mark.integration

D0, D1, D2 = date(2026, 1, 1), date(2026, 1, 2), date(2026, 1, 3)
VIEW = view("healed_user", "user", "user_id", [
    feature("clicks_2d", "count", "2d", filter_="event_type = 'click'", dtype="int64"),
]).model_copy(update={"late": "heal"})  # fmt: skip
REGISTRY = "sha256:" + "ef" * 32


@pytest.fixture
def store(own_redis: OwnRedis) -> Iterator[OnlineStore]:
    s = OnlineStore.from_url(own_redis.url, namespace=f"hwtest-{uuid.uuid4().hex[:8]}")
    yield s
    s.close()


def click(n: int, user: str, t: int) -> dict[str, Any]:
    return event(n, user, "click", t, item_id="i1")


def day_values(spark: Any, path: Path) -> dict[tuple[str, str], int]:
    rows = spark.read.format("delta").load(str(path)).collect()
    return {(str(r["date"]), r["user_id"]): r["clicks_2d"] for r in rows}


def online(store: OnlineStore, users: list[str]) -> tuple[list[float], list[int]]:
    got = store.read_batch(view_layout(compile_view(VIEW)), users)
    assert got.found.all()
    return got.values[:, 0].tolist(), got.event_time_ms.tolist()


def test_a_late_click_heals_the_online_value_and_the_corrected_training_set(
    spark: Any, tmp_path: Path, store: OnlineStore
) -> None:
    lake, source = tmp_path / "lake", behaviour()
    path = bronze_path(lake, source.name)
    # Days 0 and 1 land on time and are computed (served and healed values), day 1 materialized.
    append_events(spark, source, [click(1, "u1", T0 + HOUR_MS), click(2, "u1", T0 + DAY_MS + HOUR_MS),
                                  click(3, "u2", T0 + DAY_MS + 2 * HOUR_MS)], path)  # fmt: skip
    bronze = read_bronze(spark, lake, source)
    run_view(spark, bronze, VIEW, source, lake, [D0, D1], zorder=False)
    first = heal_view(spark, bronze, VIEW, source, lake, [D0, D1], zorder=False)
    assert first.rehealed == ()
    materialize(spark, store, [VIEW], lake)
    assert online(store, ["u1"]) == ([2.0], [T0 + 2 * DAY_MS])

    # Then a click of u1 on day 1 lands late (the streaming tiers dead-lettered it), with day 2's events.
    append_events(spark, source, [click(4, "u1", T0 + DAY_MS + 5 * HOUR_MS)], path, late=[True])
    append_events(spark, source, [click(5, "u1", T0 + 2 * DAY_MS + HOUR_MS),
                                  click(6, "u3", T0 + 2 * DAY_MS + 2 * HOUR_MS)], path)  # fmt: skip
    bronze = read_bronze(spark, lake, source)
    # The next offline run, for day 2 only: day 1's healed values are computed again (its bronze changed).
    run_view(spark, bronze, VIEW, source, lake, [D2], zorder=False)
    second = heal_view(spark, bronze, VIEW, source, lake, [D2], zorder=False)
    assert second.rehealed == (D1,)
    served, healed = (
        day_values(spark, feature_path(lake, VIEW.name)),
        day_values(spark, healed_path(lake, VIEW.name)),
    )
    # the late click is in no served value, and in both healed windows it reaches (days 1 and 2)
    assert (served[(str(D1), "u1")], served[(str(D2), "u1")]) == (2, 2)
    assert (healed[(str(D1), "u1")], healed[(str(D2), "u1")]) == (3, 3)
    assert {k: v for k, v in healed.items() if k[1] != "u1"} == {
        k: v for k, v in served.items() if k[1] != "u1"
    }

    # Online: day 2's served values, then u2 gets a newer value (a streaming write after midnight).
    materialize(spark, store, [VIEW], lake)
    layout = view_layout(compile_view(VIEW))
    end_d2 = T0 + 3 * DAY_MS
    newer = end_d2 + HOUR_MS
    store.write_batch(layout, ["u2"], np.array([[7.0]], dtype=np.float32), np.array([newer]))
    done = heal_online(spark, store, VIEW, lake)
    assert (done.date, done.rows) == (D2, 3)
    assert (done.healed, done.kept, done.unchanged) == (1, 1, 1)  # u1 healed, u2 newer kept, u3 same
    assert online(store, ["u1", "u2", "u3"]) == ([3.0, 7.0, 1.0], [end_d2, newer, end_d2])

    # Training sets: a slate of u1 on day 2 reads the values as of day 1's end.
    labels = spark.createDataFrame(
        [
            (1, "u1", "i1", T0 + 2 * DAY_MS + 3 * HOUR_MS, 1.0),
            (2, "u2", "i1", T0 + 2 * DAY_MS + 3 * HOUR_MS, 0.0),
        ],
        "group long, user_id string, item_id string, event_time long, label float",
    )
    got = {}
    for values in (AS_SERVED, AS_CORRECTED):
        out = tmp_path / f"{values}.parquet"
        build_training_set(spark, labels, [VIEW], lake, out, REGISTRY, lambda _f, v: list(range(len(v))),
                           values=values)  # fmt: skip
        table = pq.read_table(out, columns=["user_id", "user.clicks_2d"]).to_pydict()
        got[values] = dict(zip(table["user_id"], table["user.clicks_2d"], strict=True))
    assert got == {AS_SERVED: {"u1": 2.0, "u2": 1.0}, AS_CORRECTED: {"u1": 3.0, "u2": 1.0}}
