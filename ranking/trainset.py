"""Training sets for the ranker: labelled impressions with point-in-time user and item features.

Training sets come from the offline tier (``headwater training-set``, see
:mod:`headwater.ranking.training_set`): for each labelled impression, the online-vector
slots of the registry's user and item views as they were at its time, never a later value.
Rows of one slate (one page of a session) share a ``group``, the unit of NDCG.
The on-disk format (``--training-set``) is Parquet: ``group``, ``user_id``, ``item_id``,
``event_time`` (ms), ``label``, then ``user.<slot>`` and ``item.<slot>`` float columns; the
registry version and the view versions are the file's metadata
(:mod:`headwater.ranking.trainset_format`). An optional ``oracle`` column (and
``oracle_relevance``) holds a score known from outside the features, e.g. the synthetic generator's
true click probability (``EventGenerator(record_truth=True)``, NaN where unknown): evaluation then
reports it as the ceiling on the same holdout. An optional ``position`` column (the slot shown at)
feeds the ranker's training-only position-bias term. On-demand features (``tier: on_demand`` views) are
``pair.<feature>`` columns (:attr:`TrainingSet.pair`): the ranker takes them as item inputs
(:meth:`TrainingSet.for_ranker`), the two-tower model does not (its item tower sees no user).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import numpy.typing as npt

from headwater.ranking.trainset_format import VERSION_KEY, VIEW_VERSIONS_KEY
from headwater.registry.errors import HeadwaterError

ORACLE_COLUMNS = ("oracle", "oracle_relevance")
"""Optional columns of scores known from outside the features (see the module docstring)."""


class TrainingFileError(HeadwaterError, ValueError):
    """A training-set file is missing columns or holds no usable rows."""


@dataclass(frozen=True)
class TrainingSet:
    """Row-aligned arrays of one training set."""

    user_features: tuple[str, ...]
    item_features: tuple[str, ...]
    registry_version: str
    user: npt.NDArray[np.float32]
    item: npt.NDArray[np.float32]
    label: npt.NDArray[np.float32]
    group: npt.NDArray[np.int64]
    event_time_ms: npt.NDArray[np.int64]
    user_ids: npt.NDArray[np.str_]
    item_ids: npt.NDArray[np.str_]
    view_versions: Mapping[str, str] = field(default_factory=dict)
    """``{view: version}`` of the views the slots come from (empty for a set that did not record them)."""
    oracle: Mapping[str, npt.NDArray[np.float64]] = field(default_factory=dict)
    """Row-aligned scores known from outside the features (``{"oracle": ..., "oracle_relevance": ...}``;
    NaN where unknown); empty for a set without them."""
    pair: Mapping[str, npt.NDArray[np.float32]] = field(default_factory=dict)
    """On-demand features ``{name: values}`` (Parquet ``pair.<name>``), computed per (user, item,
    label time) by :mod:`headwater.ranking.on_demand`; :meth:`for_ranker` makes them item inputs."""
    position: npt.NDArray[np.int64] | None = None
    """The slot each impression was shown at (1 = top; 0 = unknown), or None for a set without it
    (Parquet ``position``). Training only: the ranker's position-bias term reads it
    (:mod:`headwater.ranking.train`); no serving input depends on it."""

    def __len__(self) -> int:
        return len(self.label)

    def take(self, rows: npt.NDArray[np.intp]) -> TrainingSet:
        """Return the subset of ``rows``."""
        return TrainingSet(
            self.user_features,
            self.item_features,
            self.registry_version,
            self.user[rows],
            self.item[rows],
            self.label[rows],
            self.group[rows],
            self.event_time_ms[rows],
            self.user_ids[rows],
            self.item_ids[rows],
            self.view_versions,
            {name: values[rows] for name, values in self.oracle.items()},
            {name: values[rows] for name, values in self.pair.items()},
            None if self.position is None else self.position[rows],
        )

    def user_at_slate_start(self) -> TrainingSet:
        """Return the set with every row's user inputs those of its slate's first row.

        The service reads a user's vector once and scores the whole slate with it, so within a
        served slate every user input is one value. A training set joined as of each impression's
        own time instead counts the slate's earlier impressions into its later rows (a 5-minute
        impressions counter rises by one per slot), so a user input tracks the slot within the
        slate: the position leaks into it, a model learns that order, and the service can never use
        it (the ``make demo`` set: ``user.impressions_5m`` alone scored NDCG@10 0.705 within slates
        against the DCN's 0.582, and it varied inside 99% of the slates). The first row is the
        earliest (``event_time``, then ``position``, then row order). On-demand (pair) columns are
        left as they are: they were computed from the rows' own user values.
        """
        if len(self) == 0:
            return self
        slot = self.position if self.position is not None else np.zeros(len(self), np.int64)
        order = np.lexsort((np.arange(len(self)), slot, self.event_time_ms, self.group))
        grouped = self.group[order]
        first = order[np.r_[True, grouped[1:] != grouped[:-1]]]  # one row per slate, slates ascending
        _, slate = np.unique(self.group, return_inverse=True)
        return replace(self, user=self.user[first[slate]])

    def for_ranker(self) -> TrainingSet:
        """Return the set with the on-demand (pair) features appended to the item inputs, in order.

        The ranker takes them as item-side inputs (the service appends the same slots after the
        stored item slots); the two-tower model reads ``item`` alone (no user in its item tower).
        """
        if not self.pair:
            return self
        names = tuple(self.pair)
        extra = np.column_stack([np.asarray(self.pair[n], dtype=np.float32) for n in names])
        return replace(
            self, item_features=self.item_features + names, item=np.hstack([self.item, extra]), pair={}
        )


def write_parquet(ts: TrainingSet, path: Path) -> None:
    """Write ``ts`` in the ``--training-set`` format."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    columns: dict[str, object] = {
        "group": ts.group,
        "user_id": ts.user_ids,
        "item_id": ts.item_ids,
        "event_time": ts.event_time_ms,
        "label": ts.label,
    }
    columns.update({f"user.{f}": ts.user[:, j] for j, f in enumerate(ts.user_features)})
    columns.update({f"item.{f}": ts.item[:, j] for j, f in enumerate(ts.item_features)})
    columns.update({f"pair.{f}": values for f, values in ts.pair.items()})
    columns.update(ts.oracle)
    if ts.position is not None:
        columns["position"] = ts.position
    meta = {
        VERSION_KEY: ts.registry_version.encode(),
        VIEW_VERSIONS_KEY: json.dumps(dict(ts.view_versions), sort_keys=True).encode(),
    }
    table = pa.table(columns).replace_schema_metadata(meta)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)


def read_parquet(path: Path) -> TrainingSet:
    """Read a ``--training-set`` file; errors name the file and the missing columns."""
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except (OSError, ValueError) as exc:
        msg = f"training set {path}: cannot be read as Parquet ({exc})"
        raise TrainingFileError(msg) from exc
    names = table.column_names
    missing = [c for c in ("group", "user_id", "item_id", "event_time", "label") if c not in names]
    user_cols = [c for c in names if c.startswith("user.")]
    item_cols = [c for c in names if c.startswith("item.")]
    pair_cols = [c for c in names if c.startswith("pair.")]
    if missing or not user_cols or not item_cols:
        msg = (
            f"training set {path}: expected columns group, user_id, item_id, event_time, label and at least"
            f" one user.<feature> and item.<feature>; missing {missing or 'user./item. feature columns'}"
        )
        raise TrainingFileError(msg)
    meta = table.schema.metadata or {}

    def matrix(cols: list[str]) -> npt.NDArray[np.float32]:
        return np.column_stack([table.column(c).to_numpy(zero_copy_only=False) for c in cols]).astype(
            np.float32
        )

    return TrainingSet(
        tuple(c[5:] for c in user_cols),
        tuple(c[5:] for c in item_cols),
        meta.get(VERSION_KEY, b"unversioned").decode(),
        matrix(user_cols),
        matrix(item_cols),
        table.column("label").to_numpy().astype(np.float32),
        table.column("group").to_numpy().astype(np.int64),
        table.column("event_time").to_numpy().astype(np.int64),
        np.asarray(table.column("user_id").to_pylist()),
        np.asarray(table.column("item_id").to_pylist()),
        _view_versions(path, meta.get(VIEW_VERSIONS_KEY)),
        {
            c: table.column(c).to_numpy(zero_copy_only=False).astype(np.float64)
            for c in ORACLE_COLUMNS
            if c in names
        },
        pair={c[5:]: table.column(c).to_numpy(zero_copy_only=False).astype(np.float32) for c in pair_cols},
        position=(
            np.nan_to_num(table.column("position").to_numpy(zero_copy_only=False).astype(np.float64)).astype(
                np.int64
            )
            if "position" in names
            else None
        ),
    )


def _view_versions(path: Path, raw: bytes | None) -> dict[str, str]:
    """Parse the view-versions metadata; a set written before it existed has none (empty)."""
    if raw is None:
        return {}
    try:
        parsed = json.loads(raw)
    except ValueError as exc:
        msg = f"training set {path}: metadata {VIEW_VERSIONS_KEY.decode()} is not JSON ({exc}); rebuild it"
        raise TrainingFileError(msg) from exc
    if not isinstance(parsed, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in parsed.items()
    ):
        msg = f"training set {path}: metadata {VIEW_VERSIONS_KEY.decode()} must map view names to versions"
        raise TrainingFileError(msg)
    return parsed
