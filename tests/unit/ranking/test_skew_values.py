"""Skew in parts: value skew at each value's own event time, staleness, version drift, the record decoder.

The offline rebuild is given here as a TrainingSet (what the training-set path returns for
:func:`value_labels`' rows); the Spark join itself is the training-set path's own tests.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import numpy.typing as npt
from hypothesis import given, settings
from hypothesis import strategies as st

from headwater.ranking.skew_pit import Logged, Scorer, ServedView, parse_logged
from headwater.ranking.skew_values import (
    staleness,
    value_labels,
    value_line,
    value_skew,
    version_drift,
)
from headwater.ranking.trainset import TrainingSet

AT = 1_767_225_600_000
SLOTS = {"user_rt": ("clicks_5m",), "item_rt": ("views_1m",), "item_off": ("buys_1d",)}


def _score(user: npt.NDArray[np.float32], items: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    return np.asarray(items.sum(axis=1) + user.sum(), dtype=np.float32)


SCORER = Scorer(
    "m1", "linear", _score, ("clicks_5m",), ("views_1m", "buys_1d"), {"user_rt": "u1", "item_rt": "i1"}
)


def _logged(user_ms: int, item_ms: list[list[int]], versions: dict[str, str] | None = None) -> Logged:
    versions = versions or {}
    user = np.asarray([3.0], np.float32)
    items = np.asarray([[5.0, 1.0], [7.0, 2.0]], np.float32)
    views = {
        "user_rt": ServedView("user", versions.get("user_rt", "u1"), user_ms),
        "item_rt": ServedView("item", versions.get("item_rt", "i1")),
        "item_off": ServedView("item", "o1"),
    }
    return Logged("r1", AT, "alice", "m1", user, ["a", "b"], items, np.ones(2, bool),
                  np.asarray(_score(user, items), np.float64), views, ("item_rt", "item_off"),
                  np.asarray(item_ms, np.int64))  # fmt: skip


def _rebuilt(logged: Logged, value: dict[tuple[str, str], float]) -> tuple[list[Any], TrainingSet]:
    """Rebuild = the served value unless ``value`` plants another for (view, entity)."""
    _, rows = value_labels([logged])
    n = len(rows)
    user = np.full((n, 1), np.nan, np.float32)
    item = np.full((n, 2), np.nan, np.float32)
    for r, row in enumerate(rows):
        if row.side == "user":
            user[r, 0] = value.get((row.view, logged.user_id), float(logged.user[0]))
        else:
            col = 0 if row.view == "item_rt" else 1
            served = float(logged.item_features[row.item, col])
            item[r, col] = value.get((row.view, logged.items[row.item]), served)
    ts = TrainingSet(("clicks_5m",), ("views_1m", "buys_1d"), "reg", user, item, np.zeros(n, np.float32),
                     np.arange(n, dtype=np.int64), np.zeros(n, np.int64), np.asarray(["alice"] * n),
                     np.asarray(["a"] * n))  # fmt: skip
    return rows, ts


def test_value_labels_take_each_values_own_time() -> None:
    logged = _logged(AT - 5_000, [[AT - 2_000, AT - 86_400_000], [AT - 3_000, 0]])
    table, rows = value_labels([logged], first_group=10)
    assert table.column("group").to_pylist() == list(range(10, 10 + len(rows)))
    got = sorted((r.view, r.item, r.event_ms) for r in rows)
    assert got == [("item_off", 0, AT - 86_400_000), ("item_rt", 0, AT - 2_000), ("item_rt", 1, AT - 3_000),
                   ("user_rt", -1, AT - 5_000)]  # fmt: skip
    assert table.column("event_time").to_pylist() == [r.event_ms for r in rows]


def test_a_planted_wrong_value_is_named_by_view_feature_entity_and_time() -> None:
    logged = _logged(AT - 5_000, [[AT - 2_000, AT - 86_400_000], [AT - 3_000, AT - 86_400_000]])
    rows, ts = _rebuilt(logged, {("item_rt", "b"): 6.0})  # item b's window one slide off offline
    skew, at_values = value_skew([logged], rows, ts, {"m1": SCORER}, SLOTS)
    assert (skew.compared, skew.differ) == (5, 1)
    assert skew.breached()
    worst = skew.worst[0]
    assert (worst.view, worst.feature, worst.entity, worst.event_ms) == (
        "item_rt",
        "views_1m",
        "b",
        AT - 3_000,
    )
    assert (worst.served, worst.rebuilt) == (7.0, 6.0)
    assert "item_rt.views_1m entity b" in value_line(skew)
    assert at_values[0].max == 1.0  # the model on the rebuild scores item b one lower


def test_a_lagging_tier_shows_staleness_not_value_skew() -> None:
    # The realtime values are 40 s old at the request (SLA 10 s): rebuilt at their own time they match.
    logged = _logged(AT - 40_000, [[AT - 40_000, AT - 86_400_000], [AT - 40_000, AT - 86_400_000]])
    rows, ts = _rebuilt(logged, {})
    skew, at_values = value_skew([logged], rows, ts, {"m1": SCORER}, SLOTS)
    assert (skew.differ, skew.breached()) == (0, False)
    assert at_values[0].max == 0.0
    stale = {s.view: s for s in staleness([logged], {"user_rt": 10.0, "item_rt": 10.0, "item_off": 86_400.0})}
    assert stale["user_rt"].max_s == 40.0
    assert stale["user_rt"].over_sla == 1
    assert stale["item_rt"].p50_s == 40.0
    assert stale["item_rt"].over_sla == 2
    assert stale["item_off"].over_sla == 0


def test_version_drift_counts_answers_scored_on_another_view_version() -> None:
    same = _logged(AT, [[AT, AT], [AT, AT]])
    other = _logged(AT, [[AT, AT], [AT, AT]], {"item_rt": "i2"})
    drift = version_drift([same, other, same, same], {"m1": SCORER})
    assert (drift.answers, drift.drifted, drift.views) == (4, 1, {"item_rt": 1})
    assert drift.share == 0.25
    assert drift.breached()


def _record(**extra: Any) -> dict[str, Any]:
    return {"v": 2, "request_id": "r", "at_ms": AT, "user_id": "u", "model_version": "m1", "user": [1.0],
            "items": ["a"], "item_features": [[1.0, 2.0]], "found": [True], "scores": [0.5],
            **extra}  # fmt: skip


def test_version_1_records_parse_without_value_times() -> None:
    record = _record()
    record.pop("v")
    (answer,), notes = parse_logged([json.dumps(record)])
    assert notes == []
    assert not answer.has_value_times
    assert value_labels([answer])[1] == []


def test_version_2_fields_parse() -> None:
    text = json.dumps(_record(views={"user_rt": {"side": "user", "version": "u1", "event_ms": AT - 1},
                                     "item_rt": {"side": "item", "version": "i1"}},
                              item_views=["item_rt"], item_event_ms=[[AT - 2]]))  # fmt: skip
    (answer,), notes = parse_logged([text])
    assert notes == []
    assert answer.views["user_rt"] == ServedView("user", "u1", AT - 1)
    assert answer.item_event_ms is not None
    assert answer.item_event_ms.tolist() == [[AT - 2]]


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)


@settings(max_examples=300, deadline=None)
@given(st.fixed_dictionaries({}, optional=dict.fromkeys(("views", "item_views", "item_event_ms", "at_ms"),
                                                        json_values)))  # fmt: skip
def test_a_malformed_record_is_a_note_never_a_traceback(fields: dict[str, Any]) -> None:
    answers, notes = parse_logged([json.dumps(_record(**fields))])
    assert len(answers) + len(notes) == 1
    if notes:
        assert notes[0].startswith("landed record 0: not a prediction record")
