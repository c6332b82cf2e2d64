"""Prediction skew against the point-in-time path: rescore each logged answer from the training-set features.

For every landed answer (:mod:`.skew_land`) and each of its top-k items, one *label row* is made:
``user_id``, ``item_id``, ``event_time`` = the request's arrival ``at_ms``, ``group`` = the row's
number. :func:`~headwater.ranking.training_set.build_training_set` joins them to every user
and item view exactly as a training set is built (offline views as of the day boundary, realtime and
nearline views recomputed from bronze as of ``at_ms``), so the offline side sees what a model
trained on the training-set path would see at that instant. The model version the service used
(logged with the answer) rescores those features; per model version the report gives the
distribution of ``|online score - offline score|`` and, to say *why*, per feature slot the mean
``|online value - point-in-time value|`` and the share of rows where they differ.

Two scores are compared per row: ``offline`` (the point-in-time features: the skew the issue asks
for, which the threshold judges) and ``logged`` (the logged inputs rescored: a difference there is
scoring skew alone, another model or a column order, with no feature involved).

Only items found in the online store are compared: the service ranks a missing item last with a
made-up score (:func:`headwater.serving.engine._missing_last`); they are counted (``missing_items``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from headwater.registry.errors import HeadwaterError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from headwater.pipelines.offline.job import BronzeTables
    from headwater.pipelines.offline.vectors import IdLookup
    from headwater.ranking.trainset import TrainingSet
    from headwater.registry.plans import PlanOnDemandView, PlanView

DEFAULT_THRESHOLD = 0.003
TOP_FEATURES = 5
RELATIVE_TOLERANCE = 1e-5
"""Two feature values differ when ``|a - b| > RELATIVE_TOLERANCE * max(1, |a|, |b|)`` (float32 storage)."""

Score = Callable[[npt.NDArray[np.float32], npt.NDArray[np.float32]], npt.NDArray[np.float32]]


class SkewError(HeadwaterError, ValueError):
    """The skew cannot be computed; the message says what is missing and what to do."""


@dataclass(frozen=True)
class Scorer:
    """One model version: how it scores and which slots it reads, in its input order."""

    version: str
    kind: str
    score: Score
    user_slots: tuple[str, ...]
    item_slots: tuple[str, ...]
    view_versions: Mapping[str, str] = field(default_factory=dict)
    """``{view: version}`` the model was trained on (its artifact's metadata; empty: not recorded)."""


@dataclass(frozen=True)
class ServedView:
    """One view as a record (version 2) says it was served: its side, version and row's event time."""

    side: str
    """``user`` or ``item``."""
    version: str
    event_ms: int | None = None
    """User views: the row's event time; None: the user had no row (the empty window was served)."""


@dataclass(frozen=True)
class Logged:
    """One landed answer, parsed: what the service used and gave."""

    request_id: str
    at_ms: int
    user_id: str
    model_version: str
    user: npt.NDArray[np.float32]
    items: list[str]
    item_features: npt.NDArray[np.float32]
    found: npt.NDArray[np.bool_]
    scores: npt.NDArray[np.float64]
    views: Mapping[str, ServedView] = field(default_factory=dict)
    """Record version 2: every view served, by name; empty for a version 1 record (no value times)."""
    item_views: tuple[str, ...] = ()
    """The item views in the order of ``item_event_ms``'s columns."""
    item_event_ms: npt.NDArray[np.int64] | None = None
    """(top k, item views) each item's row time in each item view, 0 where it has none."""

    @property
    def has_value_times(self) -> bool:
        """Whether the record says each value's event time (version 2)."""
        return bool(self.views)


@dataclass
class FeatureSkew:
    """One feature slot: how often and by how much the served value differs from the point-in-time one."""

    feature: str
    """``user.<slot>`` or ``item.<slot>``."""
    compared: int
    differ: int
    mean_abs_diff: float
    """Over the rows where both values are numbers (NaN against a number counts in ``differ`` only)."""

    @property
    def share(self) -> float:
        """Share of the compared rows where the values differ."""
        return self.differ / self.compared if self.compared else 0.0


@dataclass
class VersionSkew:
    """``|online - offline|`` over one model version's logged scores."""

    model_version: str
    kind: str
    requests: int
    scores: int
    p50: float
    p99: float
    max: float
    logged_max: float
    """Largest ``|online - rescored logged inputs|``: scoring skew alone."""
    missing_items: int
    features: list[FeatureSkew] = field(default_factory=list)
    """The slots that differ most (by share of rows, then mean difference), top :data:`TOP_FEATURES`."""

    def breached(self, threshold: float) -> bool:
        """Whether the largest ``|online - offline|`` is over ``threshold``."""
        return self.max > threshold

    def as_dict(self, threshold: float) -> dict[str, Any]:
        """Plain JSON data."""
        data = asdict(self)
        data["features"] = [{**asdict(f), "share": f.share} for f in self.features]
        data["breached"] = self.breached(threshold)
        return data

    def line(self, threshold: float) -> str:
        """One line: the distribution, the verdict and the features that differ most."""
        verdict = "BREACH" if self.breached(threshold) else "ok"
        text = (
            f"skew {self.model_version} ({self.kind}): {self.requests} requests, {self.scores} scores,"
            f" |online - offline| p50 {self.p50:.2e} p99 {self.p99:.2e} max {self.max:.2e}"
            f" vs {threshold:g}: {verdict} (logged inputs rescored: max {self.logged_max:.2e})"
        )
        differing = [f for f in self.features if f.differ]
        if differing:
            named = ", ".join(
                f"{f.feature} {f.share:.1%} of rows, mean |diff| {f.mean_abs_diff:.3g}" for f in differing
            )
            text += f"; features that differ most: {named}"
        return text


def _vector(values: Any, where: str) -> npt.NDArray[np.float32]:
    if not isinstance(values, list):
        msg = f"{where}: expected a list of numbers"
        raise SkewError(msg)
    return np.asarray([math.nan if v is None else float(v) for v in values], dtype=np.float32)


def _int(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**63:
        msg = f"{where}: expected a time in ms (an integer >= 0); got {value!r:.40}"
        raise SkewError(msg)
    return value


def _served_views(r: Mapping[str, Any], n_items: int) -> tuple[dict[str, ServedView], tuple[str, ...],
                                                                npt.NDArray[np.int64] | None]:  # fmt: skip
    """Return the version 2 fields of a record: views, item views, item event times (checked)."""
    raw = r.get("views")
    if raw is None:
        return {}, (), None
    if not isinstance(raw, dict):
        msg = "views: expected an object of view name to {side, version, event_ms}"
        raise SkewError(msg)
    views: dict[str, ServedView] = {}
    for name, v in raw.items():
        if not isinstance(v, dict) or v.get("side") not in ("user", "item"):
            msg = f"views.{name}: expected {{side: user|item, version, event_ms}}"
            raise SkewError(msg)
        at = v.get("event_ms")
        views[str(name)] = ServedView(str(v["side"]), str(v.get("version")),
                                      None if at is None else _int(at, f"views.{name}.event_ms"))  # fmt: skip
    item_views = r.get("item_views", [])
    if not isinstance(item_views, list) or not all(isinstance(v, str) for v in item_views):
        msg = "item_views: expected a list of view names"
        raise SkewError(msg)
    times = r.get("item_event_ms")
    if times is None:
        return views, tuple(item_views), None
    if not isinstance(times, list) or len(times) != n_items:
        msg = f"item_event_ms: expected one list per item ({n_items})"
        raise SkewError(msg)
    for row in times:
        if not isinstance(row, list) or len(row) != len(item_views):
            msg = f"item_event_ms: expected one time per item view ({len(item_views)}) for each item"
            raise SkewError(msg)
    matrix = np.asarray([[_int(t, "item_event_ms") for t in row] for row in times], dtype=np.int64)
    return views, tuple(item_views), matrix.reshape(n_items, len(item_views))


def parse_logged(records: Sequence[str]) -> tuple[list[Logged], list[str]]:
    """Parse landed JSON records; return the usable answers and a note for each one that is not.

    A record of version 1 (no ``views``) is parsed without value times; a malformed one is a note
    naming its position and what is wrong, never an exception.
    """
    out: list[Logged] = []
    notes: list[str] = []
    for n, text in enumerate(records):
        try:
            r = json.loads(text)
            if not isinstance(r, dict):
                msg = "not a JSON object"
                raise SkewError(msg)
            if r.get("model_version") is None:
                continue  # a fallback answer with no model: nothing to rescore
            items = [str(i) for i in r["items"]]
            matrix = np.asarray(
                [_vector(row, "item_features") for row in r["item_features"]], dtype=np.float32
            ).reshape(len(items), -1)
            found = np.asarray(r["found"], dtype=bool)
            scores = np.asarray(r["scores"], dtype=np.float64)
            if not len(found) == len(scores) == len(items):
                msg = "items, found and scores differ in length"
                raise SkewError(msg)
            user = _vector(r["user"], "user")
            version = str(r["model_version"])
            views, item_views, item_ms = _served_views(r, len(items))
            out.append(
                Logged(str(r["request_id"]), _int(r["at_ms"], "at_ms"), str(r["user_id"]), version, user,
                       items, matrix, found, scores, views, item_views, item_ms)
            )  # fmt: skip
        except (SkewError, KeyError, TypeError, ValueError, OverflowError) as exc:
            notes.append(f"landed record {n}: not a prediction record ({exc})")
    return out, notes


def labels_table(logged: Sequence[Logged]) -> pa.Table:
    """Return one label row per (answer, found item); ``group`` numbers them, ``event_time`` is ``at_ms``."""
    users, items, times = [], [], []
    for answer in logged:
        for item, found in zip(answer.items, answer.found.tolist(), strict=True):
            if found:
                users.append(answer.user_id)
                items.append(item)
                times.append(answer.at_ms)
    return pa.table(
        {
            "group": pa.array(np.arange(len(users), dtype=np.int64)),
            "user_id": pa.array(users, pa.string()),
            "item_id": pa.array(items, pa.string()),
            "event_time": pa.array(times, pa.int64()),
            "label": pa.array(np.zeros(len(users), dtype=np.float32)),
        }
    )


def point_in_time(
    spark: SparkSession,
    labels: pa.Table,
    views: Sequence[PlanView],
    lake: Path,
    registry_hash: str,
    ids: IdLookup,
    bronze: BronzeTables,
    out: Path,
    on_demand: Sequence[PlanOnDemandView] = (),
) -> TrainingSet:
    """Join ``labels`` to ``views`` by the training-set path; return the rows in ``group`` order.

    ``on_demand``: the registry's on-demand views; their values join the item inputs, as the ranker
    was trained (:meth:`~headwater.ranking.trainset.TrainingSet.for_ranker`).

    Raises:
        SkewError: the training-set path cannot serve these times (a missing day, no bronze...).
    """
    from headwater.pipelines.offline.arrow_io import arrow_to_spark, staging_dir
    from headwater.ranking.training_set import TrainingSetError, build_training_set
    from headwater.ranking.trainset import read_parquet

    with staging_dir(lake / "_staging") as folder:
        frame: DataFrame = arrow_to_spark(spark, labels, folder)
        try:
            build_training_set(spark, frame, views, lake, out, registry_hash, ids, bronze, on_demand)
        except TrainingSetError as exc:
            msg = f"the point-in-time features of the logged requests: {exc}"
            raise SkewError(msg) from exc
    ts = read_parquet(out)
    order = np.argsort(ts.group, kind="stable")
    if len(order) != labels.num_rows or not np.array_equal(ts.group[order], np.arange(labels.num_rows)):
        msg = (
            f"the training-set path returned {len(order)} rows for {labels.num_rows} logged"
            " (request, item) pairs"
        )
        raise SkewError(msg)
    return ts.take(order).for_ranker()


def differs(a: npt.NDArray[np.float32], b: npt.NDArray[np.float32]) -> npt.NDArray[np.bool_]:
    """Return where two float32 arrays differ beyond storage (:data:`RELATIVE_TOLERANCE`); NaN = NaN."""
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    both_nan = np.isnan(a64) & np.isnan(b64)
    scale = np.maximum(1.0, np.maximum(np.abs(np.nan_to_num(a64)), np.abs(np.nan_to_num(b64))))
    with np.errstate(invalid="ignore"):
        far: npt.NDArray[np.bool_] = ~(np.abs(a64 - b64) <= RELATIVE_TOLERANCE * scale)
    out: npt.NDArray[np.bool_] = far & ~both_nan
    return out


def feature_skew(
    names: Sequence[str], served: npt.NDArray[np.float32], pit: npt.NDArray[np.float32]
) -> list[FeatureSkew]:
    """Return per column: rows compared, rows that differ, mean |diff| where both are numbers."""
    out = []
    differ = differs(served, pit)
    finite = np.isfinite(served) & np.isfinite(pit)
    gap = np.where(finite, np.abs(served.astype(np.float64) - pit.astype(np.float64)), 0.0)
    for j, name in enumerate(names):
        n_finite = int(finite[:, j].sum())
        mean = float(gap[:, j].sum() / n_finite) if n_finite else 0.0
        out.append(FeatureSkew(name, int(served.shape[0]), int(differ[:, j].sum()), mean))
    return out


def top_features(features: Sequence[FeatureSkew], top: int = TOP_FEATURES) -> list[FeatureSkew]:
    """Return the ``top`` features that differ most: by share of differing rows, then mean |diff|."""
    return sorted(features, key=lambda f: (-f.share, -f.mean_abs_diff, f.feature))[:top]


def _columns(have: Sequence[str], want: Sequence[str], side: str, version: str) -> npt.NDArray[np.intp]:
    missing = [s for s in want if s not in have]
    if missing:
        msg = (
            f"model {version} reads {side} slots the applied registry's training-set path does not have:"
            f" {', '.join(missing[:6])}; the registry changed since the model was trained: rescore with"
            " the registry the service ran on (--state-dir) or retrain"
        )
        raise SkewError(msg)
    index = {s: i for i, s in enumerate(have)}
    return np.asarray([index[s] for s in want], dtype=np.intp)


def compare(
    logged: Sequence[Logged], pit: TrainingSet, scorers: Mapping[str, Scorer], top: int = TOP_FEATURES
) -> tuple[list[VersionSkew], list[str]]:
    """Rescore each answer from its point-in-time rows (``pit``, in :func:`labels_table` order); per version.

    Raises:
        SkewError: a model reads slots the point-in-time rows do not have.
    """
    notes: list[str] = []
    by_version: dict[str, list[tuple[Logged, npt.NDArray[np.intp]]]] = {}
    row = 0
    for answer in logged:
        n = int(answer.found.sum())
        rows = np.arange(row, row + n, dtype=np.intp)
        row += n
        if answer.model_version not in scorers:
            notes.append(
                f"request {answer.request_id}: model {answer.model_version} is not in the models folder"
            )
            continue
        by_version.setdefault(answer.model_version, []).append((answer, rows))
    out = []
    for version, answers in sorted(by_version.items()):
        scorer = scorers[version]
        ucols = _columns(pit.user_features, scorer.user_slots, "user", version)
        icols = _columns(pit.item_features, scorer.item_slots, "item", version)
        diffs: list[float] = []
        logged_diffs: list[float] = []
        served_users, pit_users, served_items, pit_items = [], [], [], []
        missing = 0
        for answer, rows in answers:
            found = answer.found
            missing += int((~found).sum())
            if not len(rows):
                continue
            online = answer.scores[found]
            user_pit = pit.user[rows[0], ucols]  # one user per answer: every row holds the same values
            items_pit = pit.item[rows][:, icols]
            offline = np.asarray(scorer.score(user_pit, items_pit), dtype=np.float64)
            rescored = np.asarray(scorer.score(answer.user, answer.item_features), dtype=np.float64)[found]
            diffs.extend(np.abs(online - offline).tolist())
            logged_diffs.extend(np.abs(online - rescored).tolist())
            served_users.append(answer.user)
            pit_users.append(user_pit)
            served_items.append(answer.item_features[found])
            pit_items.append(items_pit)
        arr = np.asarray(diffs or [0.0])
        p50, p99 = np.percentile(arr, [50, 99])
        features: list[FeatureSkew] = []
        if served_users:
            features += feature_skew([f"user.{s}" for s in scorer.user_slots], np.stack(served_users),
                                     np.stack(pit_users))  # fmt: skip
            features += feature_skew([f"item.{s}" for s in scorer.item_slots], np.concatenate(served_items),
                                     np.concatenate(pit_items))  # fmt: skip
        out.append(
            VersionSkew(
                version,
                scorer.kind,
                len(answers),
                len(diffs),
                float(p50),
                float(p99),
                float(arr.max()),
                float(max(logged_diffs, default=0.0)),
                missing,
                top_features(features, top),
            )
        )
    return out, notes


def load_scorers(models_dir: Path) -> tuple[dict[str, Scorer], list[str]]:
    """Load every model artifact (``*.pt``) in ``models_dir`` by version; notes name those that fail."""
    from headwater.ranking.artifact import ArtifactError, load_artifact
    from headwater.ranking.scorers import linear_from_artifact, neural_from_artifact

    scorers: dict[str, Scorer] = {}
    notes: list[str] = []
    for path in sorted(models_dir.glob("*.pt")):
        try:
            art = load_artifact(path)
            score: Score
            if art.kind == "dcn":
                neural = neural_from_artifact(art, "cpu")

                def score(user: Any, items: Any, neural: Any = neural) -> Any:
                    return neural.score_batch([(user, items)])[0]

            elif art.kind == "linear":
                score = linear_from_artifact(art).score
            else:
                continue
        except ArtifactError as exc:
            notes.append(str(exc))
            continue
        meta = art.metadata
        trained = meta.get("view_versions")
        versions = {str(k): str(v) for k, v in trained.items()} if isinstance(trained, dict) else {}
        scorers[art.version] = Scorer(art.version, art.kind, score, tuple(map(str, meta["user_features"])),
                                      tuple(map(str, meta["item_features"])), versions)  # fmt: skip
    return scorers, notes
