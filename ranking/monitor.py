"""Feature monitoring: served values against the training set and the previous day, and expectations.

``headwater monitor`` (cli/monitor.py) hands this module three samples per feature column, in the
training set's names (``user.<slot>``, ``item.<slot>``, ``pair.<feature>``):

1. the values served on the day monitored (from the landed prediction log, :func:`served_from_logged`,
   or a Parquet file of served vectors, :func:`served_from_table`);
2. the values served the day before (drift against yesterday: what changed overnight);
3. the training set the live model was trained on (drift against what the model learned).

For every column it reports the statistics (:mod:`headwater.ranking.feature_stats`), PSI and KS
against both baselines, and checks the feature's ``expect:`` block of the view YAML (range, missing
rate, drift): each failed check is a :class:`Breach`. A feature without expectations is reported,
never breached.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from headwater.ranking.feature_stats import Drift, FeatureStats, drift, present, summarize
from headwater.ranking.skew_pit import Logged
from headwater.ranking.trainset_format import VIEW_VERSIONS_KEY
from headwater.registry.compiled import CompiledView
from headwater.registry.errors import HeadwaterError
from headwater.registry.models import ExpectationSpec
from headwater.registry.slots import feature_slots

DAY_MS = 86_400_000
SIDES = {"user_id": "user", "item_id": "item"}
"""The entities whose views are model inputs, and their column prefix in training sets."""
TIME_COLUMN = "at_ms"


class MonitorError(HeadwaterError, ValueError):
    """The monitor cannot run: a missing or malformed input; the message says which and what to do.

    It exits 2, so that exit 1 stays the verdict (an expectation breached).
    """

    exit_code = 2


@dataclass(frozen=True)
class Watched:
    """A monitored column: the view and feature it holds and the feature's expectations."""

    column: str
    view: str
    feature: str
    categorical: bool = False
    """Dictionary ids (top_k ids, a ``last`` of strings): the report lists the most frequent values."""
    expect: ExpectationSpec | None = None
    where: str = ""
    """``file:line`` of the feature in the feature repo."""


def watched_columns(views: Iterable[CompiledView]) -> dict[str, Watched]:
    """Return every user and item view slot as its training-set column, with its feature's expectations."""
    out: dict[str, Watched] = {}
    for view in views:
        side = SIDES.get(view.join_key)
        if side is None:
            continue  # accounts, merchants...: no model reads them, no training set holds them
        for f in view.features:
            for slot in feature_slots(f.name, f.agg, f.k):
                ids = (f.agg == "top_k" and ".top" in slot) or f.dtype == "string"
                out[f"{side}.{slot}"] = Watched(
                    f"{side}.{slot}", view.name, f.name, ids, f.expect, f"{view.file}:{f.line}"
                )
    return out


@dataclass
class Served:
    """Served values per column, each with the request time (ms) it was served at."""

    values: dict[str, list[npt.NDArray[np.float64]]] = field(default_factory=dict)
    times: dict[str, list[npt.NDArray[np.int64]]] = field(default_factory=dict)
    versions: dict[str, set[str]] = field(default_factory=dict)
    """``{view: versions served}`` as the records (version 2) say; empty when they do not."""

    def add(self, column: str, values: npt.ArrayLike, at_ms: npt.ArrayLike) -> None:
        """Append values of ``column`` served at ``at_ms`` (one time per value, or one for all)."""
        v = np.asarray(values, dtype=np.float64).ravel()
        t = np.broadcast_to(np.asarray(at_ms, dtype=np.int64), v.shape)
        self.values.setdefault(column, []).append(v)
        self.times.setdefault(column, []).append(np.array(t))

    def on(self, day: date) -> dict[str, npt.NDArray[np.float64]]:
        """Return each column's values served on the UTC ``day``."""
        start = int(datetime(day.year, day.month, day.day, tzinfo=UTC).timestamp() * 1000)
        out: dict[str, npt.NDArray[np.float64]] = {}
        for column, parts in self.values.items():
            v, t = np.concatenate(parts), np.concatenate(self.times[column])
            out[column] = v[(t >= start) & (t < start + DAY_MS)]
        return out

    def last_day(self) -> date | None:
        """Return the UTC day of the latest serving time (None: nothing served)."""
        latest = max((int(t.max()) for parts in self.times.values() for t in parts if t.size), default=None)
        return None if latest is None else datetime.fromtimestamp(latest / 1000, UTC).date()


def served_from_logged(
    logged: Sequence[Logged],
    slots: Mapping[str, tuple[Sequence[str], Sequence[str]]],
    pairs: Iterable[str] = (),
) -> tuple[Served, list[str]]:
    """Return the values of landed answers per column; notes name the model versions without slots.

    ``slots``: ``{model_version: (user slots, item slots)}`` in the model's input order (its
    artifact). Each answer gives one value per user slot and one per found item and item slot; an
    item slot in ``pairs`` (the on-demand features) is a ``pair.`` column, any other an ``item.`` one.
    """
    on_demand = set(pairs)
    served = Served()
    unknown: dict[str, int] = {}
    for answer in logged:
        known = slots.get(answer.model_version)
        if known is None:
            unknown[answer.model_version] = unknown.get(answer.model_version, 0) + 1
            continue
        user_slots, item_slots = known
        for view, info in answer.views.items():
            served.versions.setdefault(view, set()).add(info.version)
        for j, slot in enumerate(user_slots[: answer.user.size]):
            served.add(f"user.{slot}", answer.user[j : j + 1], answer.at_ms)
        rows = answer.item_features[answer.found]
        for j, slot in enumerate(item_slots[: rows.shape[1] if rows.ndim == 2 else 0]):
            prefix = "pair" if slot in on_demand else "item"
            served.add(f"{prefix}.{slot}", rows[:, j], answer.at_ms)
    notes = [
        f"{n} answer(s) of model {version}: no artifact says its input slots; pass --models DIR"
        for version, n in sorted(unknown.items())
    ]
    return served, notes


def model_slots(models_dir: Path) -> tuple[dict[str, tuple[tuple[str, ...], tuple[str, ...]]], list[str]]:
    """Return ``{model_version: (user slots, item slots)}`` of the artifacts (``*.pt``) in ``models_dir``.

    Only the metadata is used (no model is built); notes name the files that do not load.
    """
    from headwater.ranking.artifact import ArtifactError, load_artifact

    out: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {}
    notes: list[str] = []
    for path in sorted(models_dir.glob("*.pt")):
        try:
            art = load_artifact(path)
            meta = art.metadata
            out[art.version] = (
                tuple(map(str, meta["user_features"])),
                tuple(map(str, meta["item_features"])),
            )
        except (ArtifactError, KeyError, TypeError) as exc:
            notes.append(f"{path.name}: not a ranking model artifact ({exc})")
    return out, notes


def served_from_table(table: pa.Table, where: str) -> Served:
    """Return the values of a table of served vectors: ``at_ms`` and one float column per feature.

    Raises:
        MonitorError: the table has no ``at_ms`` column, or a feature column is not numeric.
    """
    if TIME_COLUMN not in table.column_names:
        msg = f"{where}: no {TIME_COLUMN!r} column (the time each vector was served, ms); add it"
        raise MonitorError(msg)
    at = _numbers(table, TIME_COLUMN, where)
    if not np.isfinite(at).all():
        msg = f"{where}: {TIME_COLUMN!r} has nulls or non-finite values; every served vector needs its time"
        raise MonitorError(msg)
    served = Served()
    times = at.astype(np.int64)
    for name in table.column_names:
        if name.split(".", 1)[0] in ("user", "item", "pair"):
            served.add(name, _numbers(table, name, where), times)
    return served


def version_notes(served: Mapping[str, set[str]], trained: Mapping[str, str]) -> list[str]:
    """Name the views served in another version than the training set's: their drift is expected.

    A view redefined since the set was built (window, filter, field...) serves values of another
    meaning, so a drift against the set says so rather than that the data moved.
    """
    return [
        f"view {view}: served as {', '.join(sorted(versions - {trained[view]}))}, the training set has"
        f" {trained[view]}: its drift against the training set compares two definitions"
        for view, versions in sorted(served.items())
        if view in trained and versions - {trained[view]}
    ]


def trained_versions(table: pa.Table) -> dict[str, str]:
    """Return ``{view: version}`` a training set's metadata records (empty when it records none)."""
    raw = (table.schema.metadata or {}).get(VIEW_VERSIONS_KEY)
    try:
        data = json.loads(raw) if raw else {}
    except ValueError:
        return {}  # unreadable metadata only costs the note; the columns are what is compared
    return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}


def baseline_columns(table: pa.Table, where: str) -> dict[str, npt.NDArray[np.float64]]:
    """Return the feature columns (``user.``, ``item.``, ``pair.``) of a training set as floats.

    Raises:
        MonitorError: the table holds no feature column, or one is not numeric.
    """
    out = {
        n: _numbers(table, n, where)
        for n in table.column_names
        if n.split(".", 1)[0] in ("user", "item", "pair")
    }
    if not out:
        msg = (
            f"{where}: no user./item./pair. feature column: not a training set;"
            " pass the Parquet file `headwater training-set` wrote"
        )
        raise MonitorError(msg)
    return out


def _numbers(table: pa.Table, name: str, where: str) -> npt.NDArray[np.float64]:
    column = table.column(name)
    kind = column.type
    if not (pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind)):
        msg = f"{where}: column {name!r} is {kind}, not numbers; served and training values are floats"
        raise MonitorError(msg)
    return np.asarray(column.cast(pa.float64()).to_numpy(zero_copy_only=False), dtype=np.float64)


@dataclass(frozen=True)
class Breach:
    """One failed expectation: which column, which check, the figure and the limit."""

    column: str
    view: str
    feature: str
    check: str
    """The ``expect`` key: ``min``, ``max``, ``max_missing_rate``, ``max_drift_psi``, ``max_drift_ks``."""
    value: float
    limit: float
    against: str = "served"
    """``served`` (the day's values themselves), ``training set`` or ``previous day``."""
    detail: str = ""
    where: str = ""

    def line(self) -> str:
        """One line: ``BREACH view.feature (column): what > limit [file:line]``."""
        text = f"BREACH {self.view}.{self.feature} ({self.column}): {self.detail}"
        return text + (f" [{self.where}]" if self.where else "")

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON data."""
        return {k: getattr(self, k) for k in self.__dataclass_fields__} | {"line": self.line()}


@dataclass(frozen=True)
class ColumnReport:
    """One column: its statistics on the day, the day before and in the training set, and drift."""

    column: str
    view: str | None
    feature: str | None
    served: FeatureStats
    previous: FeatureStats | None
    baseline: FeatureStats | None
    vs_training: Drift | None
    vs_previous: Drift | None

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON data."""
        return {
            "column": self.column,
            "view": self.view,
            "feature": self.feature,
            "served": self.served.as_dict(),
            "previous_day": None if self.previous is None else self.previous.as_dict(),
            "training_set": None if self.baseline is None else self.baseline.as_dict(),
            "drift_vs_training": None if self.vs_training is None else self.vs_training.as_dict(),
            "drift_vs_previous_day": None if self.vs_previous is None else self.vs_previous.as_dict(),
        }


@dataclass
class MonitorReport:
    """Everything ``headwater monitor`` prints."""

    day: date
    columns: list[ColumnReport] = field(default_factory=list)
    breaches: list[Breach] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    expectations: int = 0
    """Columns checked against an ``expect`` block."""
    expected: dict[str, ExpectationSpec] = field(default_factory=dict)
    """``{column: its feature's expect block}`` of those columns (the metrics file's limits)."""

    @property
    def previous_day(self) -> date:
        """The day compared with."""
        return self.day - timedelta(days=1)

    def summary_line(self) -> str:
        """One line: the day, what was compared, the verdict and the largest drift."""
        served = max((c.served.count for c in self.columns), default=0)
        text = (
            f"monitor {self.day.isoformat()}: {len(self.columns)} feature column(s), up to {served} served"
            f" value(s) each, {self.expectations} with expectations: "
        )
        text += f"{len(self.breaches)} BREACH(ES)" if self.breaches else "ok"
        drifted = [c for c in self.columns if c.vs_training is not None]
        if drifted:
            worst = max(drifted, key=lambda c: c.vs_training.psi if c.vs_training else 0.0)
            if worst.vs_training is not None:
                text += f"; largest PSI vs the training set: {worst.column} {worst.vs_training.psi:.3f}"
        return text

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON data (``--format json``)."""
        return {
            "day": self.day.isoformat(),
            "previous_day": self.previous_day.isoformat(),
            "ok": not self.breaches,
            "expectations": self.expectations,
            "breaches": [b.as_dict() for b in self.breaches],
            "columns": [c.as_dict() for c in self.columns],
            "notes": self.notes,
            "summary": self.summary_line(),
        }


def monitor(
    served: Served,
    baseline: Mapping[str, npt.NDArray[np.float64]] | None,
    watched: Mapping[str, Watched],
    day: date | None = None,
) -> MonitorReport:
    """Compare the values served on ``day`` (default: the last day served) and check expectations.

    Raises:
        MonitorError: nothing was served, or nothing on ``day``.
    """
    last = served.last_day()
    if last is None:
        msg = "no served value to monitor: the prediction log is empty (serve with predictions enabled)"
        raise MonitorError(msg)
    day = day or last
    current, previous = served.on(day), served.on(day - timedelta(days=1))
    if not any(v.size for v in current.values()):
        msg = (
            f"nothing was served on {day.isoformat()} (the last day served is {last.isoformat()}); pick --day"
        )
        raise MonitorError(msg)
    report = MonitorReport(day)
    if baseline is None:
        report.notes.append("no training set given (--baseline): drift against the previous day only")
    for column in sorted(current):
        values = current[column]
        info = watched.get(column)
        base = None if baseline is None else baseline.get(column)
        if baseline is not None and base is None:
            report.notes.append(f"{column}: not a column of the training set: no drift against it")
        before = previous.get(column)
        before = before if before is not None and before.size else None
        categorical = info.categorical if info else False
        row = ColumnReport(
            column=column,
            view=info.view if info else None,
            feature=info.feature if info else None,
            served=summarize(values, categorical=categorical),
            previous=None if before is None else summarize(before, categorical=categorical),
            baseline=None if base is None else summarize(base, categorical=categorical),
            vs_training=None if base is None else drift(base, values),
            vs_previous=None if before is None else drift(before, values),
        )
        report.columns.append(row)
        if info is not None and info.expect is not None:
            report.expectations += 1
            report.expected[column] = info.expect
            report.breaches += check_expectations(info, row, values)
    if not any(c.previous is not None for c in report.columns):
        report.notes.append(f"nothing served on {report.previous_day.isoformat()}: no drift against it")
    return report


def check_expectations(info: Watched, row: ColumnReport, values: npt.NDArray[np.float64]) -> list[Breach]:
    """Return the breaches of ``info.expect`` by one column's served values and drift."""
    expect = info.expect
    if expect is None:
        return []
    out: list[Breach] = []

    def breach(check: str, value: float, limit: float, detail: str, against: str = "served") -> None:
        out.append(
            Breach(info.column, info.view, info.feature, check, value, limit, against, detail, info.where)
        )

    kept = present(values)
    if expect.min is not None and kept.size and (below := int((kept < expect.min).sum())):
        breach("min", float(kept.min()), expect.min,
               f"{below} of {kept.size} value(s) below min {expect.min:g}"
               f" (lowest {kept.min():g})")  # fmt: skip
    if expect.max is not None and kept.size and (above := int((kept > expect.max).sum())):
        breach("max", float(kept.max()), expect.max,
               f"{above} of {kept.size} value(s) above max {expect.max:g}"
               f" (highest {kept.max():g})")  # fmt: skip
    rate = row.served.missing_rate
    if expect.max_missing_rate is not None and rate > expect.max_missing_rate:
        breach("max_missing_rate", rate, expect.max_missing_rate,
               f"missing rate {rate:.3f} ({row.served.missing} of {row.served.count})"
               f" > max_missing_rate {expect.max_missing_rate:g}")  # fmt: skip
    for against, result in (("training set", row.vs_training), ("previous day", row.vs_previous)):
        if result is None or result.note:
            continue
        if expect.max_drift_psi is not None and result.psi > expect.max_drift_psi:
            breach("max_drift_psi", result.psi, expect.max_drift_psi,
                   f"PSI {result.psi:.3f} against the {against} > max_drift_psi {expect.max_drift_psi:g}",
                   against)  # fmt: skip
        if expect.max_drift_ks is not None and result.ks > expect.max_drift_ks:
            breach("max_drift_ks", result.ks, expect.max_drift_ks,
                   f"KS {result.ks:.3f} against the {against} > max_drift_ks {expect.max_drift_ks:g}",
                   against)  # fmt: skip
    return out
