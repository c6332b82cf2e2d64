"""Skew in parts: each served value against its rebuild at its own event time, staleness, version drift.

The prediction log (record version 2, :func:`headwater.serving.skew.prediction_record`) says for
every value the service scored which view it came from, that view's version and the event time of
the row (the window boundary the tier had folded in). Rebuilding offline at the *request* time
counts the events the tiers had not folded in yet, so a tier that is seconds behind looks like a
wrong value; here the two are told apart:

- **value skew**: each logged value against the point-in-time value rebuilt at that value's OWN
  event time (one label row per served (answer, view) and (answer, item, view), joined by the
  training-set path at the row's time, :func:`value_labels`). On exact tiers it is 0: any value
  that differs (beyond float32 storage, :data:`~.skew_pit.RELATIVE_TOLERANCE`) is a bug, and the
  worst rows are named by view, feature, entity and time;
- **staleness**: request time minus value time, per view, against the view's freshness SLA: what
  a lagging tier costs, which is not an error of the values;
- **prediction skew at value times**: the model rescored on the logged vector with every view's
  values replaced by their rebuild at their own times (the on-demand features and the views the
  entity had no row in keep their logged values: they have no time of their own);
- **version drift**: the share of answers whose model was trained on another version of a view
  than the one the service read (the artifact's ``view_versions`` against the record's).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from headwater.ranking.skew_pit import Logged, Scorer, differs

if TYPE_CHECKING:
    from headwater.ranking.trainset import TrainingSet

DRIFT_THRESHOLD = 0.001
"""The seed's feature version drift: under 0.1% of the answers."""
WORST_ROWS = 5


@dataclass(frozen=True)
class ValueRow:
    """What one label row of the value-time rebuild stands for."""

    answer: int
    """Index in the logged answers."""
    side: str
    view: str
    item: int
    """The item's position in the answer (``-1`` for a user view)."""
    event_ms: int


def value_labels(logged: Sequence[Logged], first_group: int = 0) -> tuple[pa.Table, list[ValueRow]]:
    """Return one label row per served user view of each answer and per (found item, item view).

    Each row's ``event_time`` is the served value's own event time and its ``group`` is its own
    (from ``first_group``), so the training-set path joins both sides at that time. Answers of
    version 1 records (no value times) and views without a row (nothing to rebuild) give no row.
    """
    users: list[str] = []
    items: list[str] = []
    times: list[int] = []
    rows: list[ValueRow] = []
    for a, answer in enumerate(logged):
        found = np.flatnonzero(answer.found)
        if not answer.has_value_times or not len(found):
            continue
        first = answer.items[int(found[0])]
        for view, served in sorted(answer.views.items()):
            if served.side == "user" and served.event_ms is not None:
                users.append(answer.user_id)
                items.append(first)
                times.append(served.event_ms)
                rows.append(ValueRow(a, "user", view, -1, served.event_ms))
        if answer.item_event_ms is None:
            continue
        for i in found.tolist():
            for j, view in enumerate(answer.item_views):
                at = int(answer.item_event_ms[i, j])
                if at > 0:
                    users.append(answer.user_id)
                    items.append(answer.items[i])
                    times.append(at)
                    rows.append(ValueRow(a, "item", view, i, at))
    n = len(rows)
    table = pa.table(
        {
            "group": pa.array(np.arange(first_group, first_group + n, dtype=np.int64)),
            "user_id": pa.array(users, pa.string()),
            "item_id": pa.array(items, pa.string()),
            "event_time": pa.array(times, pa.int64()),
            "label": pa.array(np.zeros(n, dtype=np.float32)),
        }
    )
    return table, rows


@dataclass
class ViewFeatureSkew:
    """One (view, feature slot): served values against their rebuild at their own times."""

    view: str
    feature: str
    compared: int = 0
    differ: int = 0
    max_abs_diff: float = 0.0
    """Over the values where both are numbers (NaN against a number counts in ``differ`` only)."""


@dataclass(frozen=True)
class WorstValue:
    """One served value that differs from its rebuild: where and by how much."""

    view: str
    feature: str
    entity: str
    event_ms: int
    request_id: str
    served: float
    rebuilt: float

    @property
    def gap(self) -> float:
        """``|served - rebuilt|``; infinite when one of them is NaN."""
        d = abs(self.served - self.rebuilt)
        return math.inf if math.isnan(d) else d


@dataclass
class ValueSkew:
    """Every compared value: how many differ, per (view, feature), and the worst rows."""

    compared: int
    differ: int
    features: list[ViewFeatureSkew]
    """The (view, feature) pairs compared, those that differ most first."""
    worst: list[WorstValue]
    not_read: int
    """Served values of slots the model does not read (the log holds its inputs only): not compared."""

    @property
    def share(self) -> float:
        """Share of the compared values that differ."""
        return self.differ / self.compared if self.compared else 0.0

    def breached(self) -> bool:
        """Whether any value differs from its rebuild at its own time (on exact tiers: a bug)."""
        return self.differ > 0

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON data."""
        data = asdict(self)
        data["share"] = self.share
        data["breached"] = self.breached()
        data["worst"] = [{**asdict(w), "gap": None if math.isinf(w.gap) else w.gap} for w in self.worst]
        return data


@dataclass
class ViewStaleness:
    """Request time minus value time over one view's served values, against its SLA."""

    view: str
    side: str
    sla_s: float | None
    values: int
    p50_s: float
    p99_s: float
    max_s: float
    over_sla: int
    """Values older than the SLA at their request."""

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON data."""
        return asdict(self)


@dataclass
class ValueTimesSkew:
    """One model version rescored on the served values' rebuild at their own times."""

    model_version: str
    kind: str
    scores: int
    p50: float
    p99: float
    max: float

    def breached(self, threshold: float) -> bool:
        """Whether the largest ``|online - offline at value times|`` is over ``threshold``."""
        return self.max > threshold

    def as_dict(self, threshold: float) -> dict[str, Any]:
        """Plain JSON data."""
        return {**asdict(self), "breached": self.breached(threshold)}


@dataclass
class VersionDrift:
    """Answers whose model was trained on another version of a served view."""

    answers: int
    drifted: int
    views: dict[str, int] = field(default_factory=dict)
    """Per view, the answers where the model's version of it is not the served one."""

    @property
    def share(self) -> float:
        """Share of the answers (with value times and a known model) that drifted."""
        return self.drifted / self.answers if self.answers else 0.0

    def breached(self, threshold: float = DRIFT_THRESHOLD) -> bool:
        """Whether the share is over ``threshold``."""
        return self.share > threshold

    def as_dict(self, threshold: float = DRIFT_THRESHOLD) -> dict[str, Any]:
        """Plain JSON data."""
        return {**asdict(self), "share": self.share, "breached": self.breached(threshold)}


def _index(names: Sequence[str]) -> dict[str, int]:
    return {n: i for i, n in enumerate(names)}


def value_skew(
    logged: Sequence[Logged],
    rows: Sequence[ValueRow],
    rebuilt: TrainingSet,
    scorers: Mapping[str, Scorer],
    slots: Mapping[str, Sequence[str]],
    worst: int = WORST_ROWS,
) -> tuple[ValueSkew, list[ValueTimesSkew]]:
    """Compare each served value with ``rebuilt`` (rows in :func:`value_labels` order); rescore per version.

    ``slots``: each view's slot names (as the training set's columns). A value is compared when the
    answer's model reads its slot (the log holds the model's inputs) and the model is loaded.
    """
    per: dict[tuple[str, str], ViewFeatureSkew] = {}
    worst_rows: list[WorstValue] = []
    compared = differ = not_read = 0
    ucol, icol = _index(rebuilt.user_features), _index(rebuilt.item_features)
    # The vectors rescored at value times: the logged ones with each view's slots replaced.
    user_at: dict[int, npt.NDArray[np.float32]] = {}
    items_at: dict[int, npt.NDArray[np.float32]] = {}
    for r, row in enumerate(rows):
        answer = logged[row.answer]
        scorer = scorers.get(answer.model_version)
        if scorer is None:
            continue
        names = slots.get(row.view, ())
        model_slots = scorer.user_slots if row.side == "user" else scorer.item_slots
        model_index = _index(model_slots)
        cols = ucol if row.side == "user" else icol
        matrix = rebuilt.user if row.side == "user" else rebuilt.item
        if row.side == "user":
            target = user_at.setdefault(row.answer, answer.user.copy())
            served_vec = answer.user
            entity = answer.user_id
        else:
            target = items_at.setdefault(row.answer, answer.item_features.copy())[row.item]
            served_vec = answer.item_features[row.item]
            entity = answer.items[row.item]
        for slot in names:
            if slot not in model_index or slot not in cols:
                not_read += 1
                continue
            served = float(served_vec[model_index[slot]])
            value = float(matrix[r, cols[slot]])
            target[model_index[slot]] = value
            stat = per.setdefault((row.view, slot), ViewFeatureSkew(row.view, slot))
            stat.compared += 1
            compared += 1
            if bool(differs(np.asarray([served], np.float32), np.asarray([value], np.float32))[0]):
                stat.differ += 1
                differ += 1
                if math.isfinite(served) and math.isfinite(value):
                    stat.max_abs_diff = max(stat.max_abs_diff, abs(served - value))
                worst_rows.append(WorstValue(row.view, slot, entity, row.event_ms, answer.request_id, served,
                                             value))  # fmt: skip
    worst_rows.sort(key=lambda w: (-w.gap, w.view, w.feature, w.entity))
    features = sorted(per.values(), key=lambda f: (-f.differ, -f.max_abs_diff, f.view, f.feature))
    skew = ValueSkew(compared, differ, features, worst_rows[:worst], not_read)
    return skew, _rescored(logged, user_at, items_at, scorers)


def _rescored(
    logged: Sequence[Logged],
    user_at: Mapping[int, npt.NDArray[np.float32]],
    items_at: Mapping[int, npt.NDArray[np.float32]],
    scorers: Mapping[str, Scorer],
) -> list[ValueTimesSkew]:
    diffs: dict[str, list[float]] = {}
    for a in sorted(set(user_at) | set(items_at)):
        answer = logged[a]
        scorer = scorers[answer.model_version]
        user = user_at.get(a, answer.user)
        items = items_at.get(a, answer.item_features)
        offline = np.asarray(scorer.score(user, items), dtype=np.float64)[answer.found]
        diffs.setdefault(answer.model_version, []).extend(
            np.abs(answer.scores[answer.found] - offline).tolist()
        )
    out = []
    for version, values in sorted(diffs.items()):
        arr = np.asarray(values or [0.0])
        p50, p99 = np.percentile(arr, [50, 99])
        out.append(ValueTimesSkew(version, scorers[version].kind, len(values), float(p50), float(p99),
                                  float(arr.max())))  # fmt: skip
    return out


def staleness(logged: Sequence[Logged], slas: Mapping[str, float]) -> list[ViewStaleness]:
    """Per served view: request time minus each value's time (seconds), against its SLA (``slas``)."""
    ages: dict[tuple[str, str], list[float]] = {}
    for answer in logged:
        if not answer.has_value_times:
            continue
        for view, served in answer.views.items():
            if served.side == "user" and served.event_ms is not None:
                ages.setdefault((view, "user"), []).append((answer.at_ms - served.event_ms) / 1000.0)
        if answer.item_event_ms is None:
            continue
        for j, view in enumerate(answer.item_views):
            times = answer.item_event_ms[answer.found, j]
            times = times[times > 0]
            ages.setdefault((view, "item"), []).extend(((answer.at_ms - times) / 1000.0).tolist())
    out = []
    for (view, side), values in sorted(ages.items()):
        if not values:
            continue
        arr = np.maximum(np.asarray(values), 0.0)
        sla = slas.get(view)
        p50, p99 = np.percentile(arr, [50, 99])
        over = int((arr > sla).sum()) if sla is not None else 0
        out.append(
            ViewStaleness(view, side, sla, len(values), float(p50), float(p99), float(arr.max()), over)
        )
    return out


def version_drift(logged: Sequence[Logged], scorers: Mapping[str, Scorer]) -> VersionDrift:
    """Share of the answers whose model was trained on another version of a served view than the one read.

    Counted over the answers with value times (they say each view's version) whose model is loaded;
    a model that records no view versions cannot drift by this measure.
    """
    answers = drifted = 0
    views: dict[str, int] = {}
    for answer in logged:
        scorer = scorers.get(answer.model_version)
        if not answer.has_value_times or scorer is None:
            continue
        answers += 1
        changed = [v for v, s in answer.views.items()
                   if v in scorer.view_versions and scorer.view_versions[v] != s.version]  # fmt: skip
        if changed:
            drifted += 1
            for v in changed:
                views[v] = views.get(v, 0) + 1
    return VersionDrift(answers, drifted, dict(sorted(views.items())))


def _when(ms: int) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def value_line(skew: ValueSkew) -> str:
    """One line: the share of values that differ from their rebuild at their own time, the worst named."""
    verdict = "BREACH" if skew.breached() else "ok"
    text = (
        f"value skew: {skew.differ} of {skew.compared} served values differ from their rebuild at their"
        f" own event time ({skew.share:.2%}): {verdict}"
    )
    if skew.worst:
        named = "; ".join(
            f"{w.view}.{w.feature} entity {w.entity} at {_when(w.event_ms)} served {w.served:.6g}"
            f" rebuilt {w.rebuilt:.6g}"
            for w in skew.worst[:3]
        )
        text += f"; worst: {named}"
    return text


def staleness_line(views: Sequence[ViewStaleness]) -> str:
    """One line: per view the p99 age of the served values against its SLA (never a breach)."""
    if not views:
        return "staleness: no value times logged (record version 1)"
    parts = []
    for v in views:
        sla = "no SLA" if v.sla_s is None else f"SLA {v.sla_s:g} s"
        over = f", {v.over_sla / v.values:.1%} over" if v.over_sla else ""
        parts.append(f"{v.view} p99 {v.p99_s:.3g} s ({sla}{over})")
    return "staleness (request time - value time): " + "; ".join(parts)


def value_times_line(
    result: Sequence[ValueTimesSkew], threshold: float, logged_max: Mapping[str, float] | None = None
) -> str:
    """One line: the model rescored on the rebuild at the values' times, per version, vs ``threshold``.

    ``logged_max``: per version, the largest difference of the logged vector rescored (scoring skew alone).
    """
    if not result:
        return "prediction skew at value times: no answer with value times"
    logged = logged_max or {}
    versions = "; ".join(
        f"{r.model_version[:12]} ({r.kind}) {r.scores} scores p99 {r.p99:.2e} max {r.max:.2e}"
        f" {'BREACH' if r.breached(threshold) else 'ok'}"
        + (
            f" (logged vector rescored: max {logged[r.model_version]:.2e})"
            if r.model_version in logged
            else ""
        )
        for r in result
    )
    return f"prediction skew at value times vs {threshold:g}: {versions}"


def drift_line(drift: VersionDrift, threshold: float = DRIFT_THRESHOLD) -> str:
    """One line: the share of answers whose model was trained on another version of a served view."""
    verdict = "BREACH" if drift.breached(threshold) else "ok"
    views = ", ".join(f"{v} ({n})" for v, n in drift.views.items())
    text = (
        f"version drift: {drift.drifted} of {drift.answers} answers ({drift.share:.2%}) scored by a model"
        f" trained on another view version vs {threshold:.1%}: {verdict}"
    )
    return text + (f"; views: {views}" if views else "")
