"""Training sets for the ranker: labelled impressions with point-in-time user and item features.

Until the offline tier supplies point-in-time training sets, :func:`from_events` builds one
from a behaviour-event stream (the generator's, in event-time order): each impression becomes
a row whose features are the user's and the item's counters from the events strictly before
it, and whose label says whether the same (session, item, position) was clicked afterwards.
Counters cover the whole stream; the simulated span (minutes of event time) is far shorter
than the 7-day and 24-hour windows the feature names promise, so the counts are the same.

Rows of one slate (one page of a session) share a ``group``, the unit of NDCG.
The on-disk format (``--training-set``) is Parquet: ``group``, ``user_id``, ``item_id``,
``event_time``, ``label``, then ``user.<feature>`` and ``item.<feature>`` columns; the
registry version is the file's ``headwater.registry_version`` metadata.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from headwater.pipelines.events.schema import BehaviorEvent
from headwater.serving.config import CATEGORIES, DEFAULT_REGISTRY_VERSION, ITEM_FEATURES, USER_FEATURES

VERSION_KEY = b"headwater.registry_version"


class TrainingSetError(ValueError):
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
        )


class FeatureState:
    """Running counters per user and per item, turned into the demo views' feature vectors."""

    def __init__(self, categories: tuple[str, ...] = CATEGORIES) -> None:
        self.categories = {name: i for i, name in enumerate(categories)}
        self.n_cat = len(categories)
        self.users: dict[str, npt.NDArray[np.float64]] = {}  # [impressions, clicks, clicks per category...]
        self.items: dict[str, npt.NDArray[np.float64]] = {}  # [impressions, clicks, price, category index]
        self.last_ms: dict[str, int] = {}

    def _user(self, user_id: str) -> npt.NDArray[np.float64]:
        row = self.users.get(user_id)
        if row is None:
            row = self.users[user_id] = np.zeros(2 + self.n_cat)
        return row

    def _item(self, item_id: str) -> npt.NDArray[np.float64]:
        row = self.items.get(item_id)
        if row is None:
            row = self.items[item_id] = np.array([0.0, 0.0, np.nan, -1.0])
        return row

    def apply(self, event: BehaviorEvent) -> None:
        """Count one event (impressions and clicks; other kinds only refresh price/category)."""
        item_id, kind = event["item_id"], event["event_type"]
        if item_id is None:
            return
        user, item = self._user(event["user_id"]), self._item(item_id)
        if event["price"] is not None:
            item[2] = event["price"]
        cat = self.categories.get(event["category"] or "", -1)
        if cat >= 0:
            item[3] = cat
        if kind == "impression":
            user[0] += 1
            item[0] += 1
        elif kind == "click":
            user[1] += 1
            item[1] += 1
            if cat >= 0:
                user[2 + cat] += 1
        self.last_ms[event["user_id"]] = self.last_ms[item_id] = event["event_time"]

    def user_vector(self, user_id: str) -> npt.NDArray[np.float32]:
        """Return the ``user_profile`` vector (see ``config.USER_FEATURES``)."""
        row = self._user(user_id)
        imps, clicks = row[0], row[1]
        shares = row[2:] / max(clicks, 1.0)
        head = np.array([imps, clicks, clicks / max(imps, 1.0)])
        vector: npt.NDArray[np.float32] = np.concatenate([head, shares]).astype(np.float32)
        return vector

    def item_vector(self, item_id: str) -> npt.NDArray[np.float32]:
        """Return the ``item_stats`` vector (see ``config.ITEM_FEATURES``)."""
        row = self._item(item_id)
        onehot = np.zeros(self.n_cat)
        if row[3] >= 0:
            onehot[int(row[3])] = 1.0
        return np.concatenate([[row[0], row[1], row[1] / max(row[0], 1.0), row[2]], onehot]).astype(
            np.float32
        )


def from_events(
    events: Iterable[BehaviorEvent], registry_version: str = DEFAULT_REGISTRY_VERSION
) -> TrainingSet:
    """Labelled impressions with point-in-time features from events in event-time order."""
    state = FeatureState()
    users: list[npt.NDArray[np.float32]] = []
    items: list[npt.NDArray[np.float32]] = []
    labels: list[float] = []
    groups: list[int] = []
    times: list[int] = []
    uids: list[str] = []
    iids: list[str] = []
    shown: dict[tuple[str, str, int | None], int] = {}
    pages: dict[str, int] = {}
    slates: dict[tuple[str, int], int] = {}
    for event in events:
        item_id = event["item_id"]
        if event["event_type"] == "impression" and item_id is not None:
            session = event["session_id"]
            if event["position"] == 1 or session not in pages:
                pages[session] = pages.get(session, 0) + 1
            slate = slates.setdefault((session, pages[session]), len(slates))
            shown[(session, item_id, event["position"])] = len(labels)
            users.append(state.user_vector(event["user_id"]))
            items.append(state.item_vector(item_id))
            labels.append(0.0)
            groups.append(slate)
            times.append(event["event_time"])
            uids.append(event["user_id"])
            iids.append(item_id)
        elif event["event_type"] == "click" and item_id is not None:
            row = shown.get((event["session_id"], item_id, event["position"]))
            if row is not None:
                labels[row] = 1.0
        state.apply(event)
    if not labels:
        msg = "the event stream held no impressions: nothing to train on"
        raise TrainingSetError(msg)
    return TrainingSet(
        USER_FEATURES,
        ITEM_FEATURES,
        registry_version,
        np.stack(users),
        np.stack(items),
        np.asarray(labels, dtype=np.float32),
        np.asarray(groups, dtype=np.int64),
        np.asarray(times, dtype=np.int64),
        np.asarray(uids),
        np.asarray(iids),
    )


def generated_events(events: int, seed: int, users: int = 2_000, items: int = 2_000) -> list[BehaviorEvent]:
    """``events`` clean events (no late, duplicate or malformed ones) from the pipeline's generator."""
    from headwater.pipelines.events.generator import EventGenerator, GeneratorConfig

    config = GeneratorConfig(
        seed=seed,
        users=users,
        items=items,
        late_share=0.0,
        out_of_order_share=0.0,
        duplicate_share=0.0,
        malformed_share=0.0,
    )
    generator = EventGenerator(config)
    out: list[BehaviorEvent] = []
    for emission in generator:
        if emission.event is not None:
            out.append(emission.event)
            if len(out) >= events:
                return out
    return out  # pragma: no cover - the generator never ends


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
    table = pa.table(columns).replace_schema_metadata({VERSION_KEY: ts.registry_version.encode()})
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)


def read_parquet(path: Path) -> TrainingSet:
    """Read a ``--training-set`` file; errors name the file and the missing columns."""
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except (OSError, ValueError) as exc:
        msg = f"training set {path}: cannot be read as Parquet ({exc})"
        raise TrainingSetError(msg) from exc
    names = table.column_names
    missing = [c for c in ("group", "user_id", "item_id", "event_time", "label") if c not in names]
    user_cols = [c for c in names if c.startswith("user.")]
    item_cols = [c for c in names if c.startswith("item.")]
    if missing or not user_cols or not item_cols:
        msg = (
            f"training set {path}: expected columns group, user_id, item_id, event_time, label and at least"
            f" one user.<feature> and item.<feature>; missing {missing or 'user./item. feature columns'}"
        )
        raise TrainingSetError(msg)
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
    )
