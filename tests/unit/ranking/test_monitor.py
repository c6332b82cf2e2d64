"""The monitor's core on plain frames: logged answers to columns, the registry's columns, any served table."""

from __future__ import annotations

import json
import math
from datetime import date, timedelta
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headwater.ranking.monitor import (
    MonitorError,
    Served,
    Watched,
    baseline_columns,
    monitor,
    served_from_logged,
    served_from_table,
    trained_versions,
    version_notes,
    watched_columns,
)
from headwater.ranking.skew_pit import Logged, ServedView
from headwater.ranking.trainset_format import VIEW_VERSIONS_KEY
from headwater.registry.models import ExpectationSpec
from headwater.registry.validate import check_repo

EXAMPLE = Path(__file__).resolve().parents[3] / "features"
DEC_4 = 1_796_342_400_000  # 2026-12-04T00:00:00Z


def _answer(model: str, at_ms: int, user: list[float], items: list[list[float]], found: list[bool]) -> Logged:
    n = len(items)
    return Logged(
        request_id="r",
        at_ms=at_ms,
        user_id="u1",
        model_version=model,
        user=np.asarray(user, dtype=np.float32),
        items=[f"i{k}" for k in range(n)],
        item_features=np.asarray(items, dtype=np.float32).reshape(n, -1),
        found=np.asarray(found, dtype=bool),
        scores=np.zeros(n),
    )


def test_logged_answers_become_columns_by_the_models_slots() -> None:
    logged = [
        _answer(
            "m1", DEC_4 + 5, [1.0, math.nan], [[10.0, 0.5], [11.0, 0.25], [99.0, 9.0]], [True, True, False]
        ),
        _answer("m1", DEC_4 + 6, [2.0, 3.0], [[12.0, 0.75]], [True]),
        _answer("m9", DEC_4 + 7, [7.0], [[1.0]], [True]),
    ]
    served, notes = served_from_logged(
        logged, {"m1": (("clicks_5m", "ctr_5m"), ("views_1h", "affinity"))}, {"affinity"}
    )
    current = served.on(date(2026, 12, 4))
    assert sorted(current) == ["item.views_1h", "pair.affinity", "user.clicks_5m", "user.ctr_5m"]
    assert current["user.clicks_5m"].tolist() == [1.0, 2.0]
    assert np.isnan(current["user.ctr_5m"][0])
    assert current["user.ctr_5m"][1] == 3.0
    assert current["item.views_1h"].tolist() == [10.0, 11.0, 12.0]  # the item not found is left out
    assert current["pair.affinity"].tolist() == [0.5, 0.25, 0.75]
    assert notes == ["1 answer(s) of model m9: no artifact says its input slots; pass --models DIR"]
    assert served.last_day() == date(2026, 12, 4)
    assert served.versions == {}  # version 1 records: no view versions
    assert served.on(date(2026, 12, 3))["user.clicks_5m"].size == 0


def test_the_example_registry_gives_training_set_columns() -> None:
    watched = watched_columns(check_repo(EXAMPLE).views)
    clicks = watched["user.clicks_5m"]
    assert (clicks.view, clicks.feature, clicks.categorical) == ("user_session_realtime", "clicks_5m", False)
    assert clicks.expect == ExpectationSpec(min=0.0, max_missing_rate=0.01, max_drift_psi=0.25)
    assert clicks.where.startswith("features/user_session_realtime.yaml:")
    top = watched["user.category_share_30s.top1"]
    assert (top.categorical, top.expect) == (True, None)
    assert watched["user.category_share_30s.share1"].categorical is False
    assert not any(c.startswith(("account.", "merchant.")) for c in watched)  # no model reads them


def test_min_and_max_breaches_name_the_extremes() -> None:
    served = Served()
    served.add("user.ctr_5m", [0.5, 1.5, -0.25, math.nan], DEC_4)
    watched = watched_columns(check_repo(EXAMPLE).views)
    report = monitor(served, None, watched)
    assert [(b.check, b.value, b.limit) for b in report.breaches] == [("min", -0.25, 0.0), ("max", 1.5, 1.0)]
    assert report.breaches[0].detail == "1 of 3 value(s) below min 0 (lowest -0.25)"
    assert report.breaches[1].detail == "1 of 3 value(s) above max 1 (highest 1.5)"


def test_nothing_served_is_an_error() -> None:
    with pytest.raises(MonitorError, match="the prediction log is empty"):
        monitor(Served(), None, {})
    with pytest.raises(MonitorError, match=r"no user\./item\./pair\. feature column: not a training set"):
        baseline_columns(pa.table({"label": [1.0]}), "t.parquet")


# Any served table: float columns with NaN and infinities, any times over three days.
_FLOATS = st.floats(allow_nan=True, allow_infinity=True, width=32)


@settings(max_examples=150, deadline=None)
@given(
    rows=st.lists(st.tuples(st.integers(-1, 1), _FLOATS, _FLOATS), min_size=1, max_size=40),
    base=st.lists(_FLOATS, max_size=40),
    limits=st.tuples(st.floats(0, 1), st.floats(0, 5), st.floats(0, 1)),
)
def test_any_served_table_gives_finite_figures(
    rows: list[tuple[int, float, float]], base: list[float], limits: tuple[float, float, float]
) -> None:
    table = pa.table(
        {
            "at_ms": [DEC_4 + day * 86_400_000 + 1 for day, _, _ in rows],
            "user.clicks_5m": [a for _, a, _ in rows],
            "item.views_1h": [b for _, _, b in rows],
        }
    )
    expect = ExpectationSpec(max_missing_rate=limits[0], max_drift_psi=limits[1], max_drift_ks=limits[2])
    watched = {"user.clicks_5m": Watched("user.clicks_5m", "v", "clicks_5m", expect=expect)}
    report = monitor(served_from_table(table, "t"), {"user.clicks_5m": np.asarray(base)}, watched)
    assert report.day == date(2026, 12, 4) + timedelta(days=max(d for d, _, _ in rows))
    for column in report.columns:
        for result in (column.vs_training, column.vs_previous):
            if result is not None:
                assert math.isfinite(result.psi)
                assert result.psi >= 0
                assert 0 <= result.ks <= 1
    for b in report.breaches:
        assert b.value > b.limit
        assert math.isfinite(b.value)
    assert json.loads(json.dumps(report.as_dict(), allow_nan=False))["summary"] == report.summary_line()


def test_views_served_in_another_version_than_the_training_sets_are_named() -> None:
    table = pa.table({"user.clicks_5m": [1.0]}).replace_schema_metadata(
        {VIEW_VERSIONS_KEY: json.dumps({"user_session_realtime": "v1", "item_trending": "v7"}).encode()}
    )
    trained = trained_versions(table)
    assert trained == {"user_session_realtime": "v1", "item_trending": "v7"}
    served = {"user_session_realtime": {"v1", "v2"}, "item_trending": {"v7"}, "new_view": {"v3"}}
    assert version_notes(served, trained) == [
        "view user_session_realtime: served as v2, the training set has v1: its drift against the training"
        " set compares two definitions"
    ]
    assert trained_versions(pa.table({"a": [1]})) == {}
    broken = pa.table({"a": [1]}).replace_schema_metadata({VIEW_VERSIONS_KEY: b"{not json"})
    assert trained_versions(broken) == {}


def test_logged_view_versions_are_collected() -> None:
    answer = _answer("m1", DEC_4, [1.0], [[2.0]], [True])
    v2 = Logged(**{**answer.__dict__, "views": {"user_session_realtime": ServedView("user", "v2", DEC_4)}})
    served, _ = served_from_logged([answer, v2], {"m1": (("clicks_5m",), ("views_1h",))})
    assert served.versions == {"user_session_realtime": {"v2"}}
