"""Point-in-time ranker training sets computed in Python from a time-ordered list of events.

The offline tier builds training sets with Spark (``headwater training-set``); on a loaded 2-core
machine that takes the better part of an hour. For quality measurements (``bench/bench_quality.py
--stream-only``) and for tests, :func:`events_training_set` computes the same kind of set in one
pass over the events, each impression's features from the events before it only; the user's side
(user and pair features) as of the start of the impression's slate, since a ranker scores a whole
slate at once (counting the slate's own earlier slots would leak the position into them):

- user: ``clicks``, ``impressions`` and ``ctr`` (clicks per impression), so far;
- item: ``item_impressions``, ``item_clicks``, ``item_ctr`` and ``item_coec`` (clicks over expected
  clicks: the item's clicks over the sum, across its impressions, of the click rate of the position
  it was shown at, all so far; a CTR that a good slot does not inflate);
- pair (user x the item's category; ``pair.<f>`` in the Parquet format, the on-demand features):
  ``category_click_share`` (the share of the user's clicks in this category, what
  ``share_of(<user top_k category of clicks>, <item category>)`` gives), ``category_impression_share``
  (the same over the user's impressions: the slates a user was shown follow their taste, and there
  are ten impressions per click) and ``category_ctr`` (the user's clicks per impression in this
  category);
- neighbour (collaborative, user x item; ``pair.<f>`` too, with ``collaborative=True``, the
  default): ``neighbour_ctr`` (the item's click rate among the impressions of it to users who
  clicked any item this user had clicked, summed over those items and smoothed toward the item's
  own click rate with :data:`NEIGHBOUR_PRIOR` impressions), ``neighbour_lift`` (that rate over the
  item's own smoothed rate) and ``neighbour_impressions`` (the impressions it rests on). What other
  users with this user's taste did with this item: information no count of the user or of the item
  holds (the inputs above cannot order MovieLens slates better than ``item_coec`` alone). The co-click
  counts are point-in-time like the rest, the user's clicked items as of the slate's start. The
  service has no such slot yet: in the product it is what an item-embedding input would carry;
- ``position`` (the slot the impression was shown at): a training-only input of the ranker's
  position-bias term (:mod:`headwater.ranking.train`), never a serving input.

A row's label is 1 when the same session clicked the same item at the same position. A slate is one
page of a session (a new one at each position-1 impression).

:func:`movielens_events` reads MovieLens 100k (GroupLens: 100,000 ratings of 1,682 films by 943
users, 1997-98, the copy the ``recbole`` wheel ships) through the source import path of
``headwater events produce --from FILE``: each rating becomes a JSON Lines row of the ``events``
source (an impression, then a click when the rating is >= 4; the film's first genre is its
category), read back by the same reader, time shift and row checker (the source's schema, its
``min_event_time`` and its rules) as a user's file.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from headwater.ranking.trainset import TrainingSet

USER_FEATURES = ("clicks", "impressions", "ctr")
ITEM_FEATURES = ("item_impressions", "item_clicks", "item_ctr", "item_coec")
PAIR_FEATURES = ("category_click_share", "category_impression_share", "category_ctr")
NEIGHBOUR_FEATURES = ("neighbour_ctr", "neighbour_lift", "neighbour_impressions")
NEIGHBOUR_PRIOR = 5.0
"""Impressions at the item's own click rate added to ``neighbour_ctr`` (and to the item's rate, at
the click rate of all impressions so far): a pair with little co-click evidence scores near the
item's rate."""
NEIGHBOUR_MAX_ITEMS = 5_000
"""Most distinct items of a set with the neighbour features (two dense item x item count matrices)."""
COEC_PRIOR = 1.0
"""Expected clicks added to both sides of ``item_coec``: an item never shown scores 1 (as expected)."""
ML_SESSION_GAP_S = 1_800
"""A user's ratings less than 30 minutes apart are one session."""
ML_SLATE = 10
"""Ratings per slate: a session's ratings are cut into pages of 10."""
ML_LIKED = 4
"""A rating of at least this is a click."""


@dataclass
class _Own:
    """What the session's current slate has added to the user's counters (left out of its rows)."""

    impressions: int = 0
    clicks: int = 0
    cat_impressions: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    cat_clicks: dict[str, int] = field(default_factory=lambda: defaultdict(int))


class CoClicks:
    """Point-in-time co-click counts between items, for the neighbour features.

    ``shown[j, i]``: impressions of item ``i`` to users who clicked item ``j`` (whenever they did);
    ``clicked[j, i]``: clicks of ``i`` by users who clicked ``j`` (``j != i``). Both count the
    events seen so far.
    """

    def __init__(self, items: Sequence[str], users: Sequence[str]) -> None:
        if len(items) > NEIGHBOUR_MAX_ITEMS:
            msg = (
                f"neighbour features: {len(items)} items, at most {NEIGHBOUR_MAX_ITEMS} (dense item x item"
                " counts); build the set with collaborative=False"
            )
            raise ValueError(msg)
        self.item = {name: j for j, name in enumerate(items)}
        self.user = {name: j for j, name in enumerate(users)}
        n, m = len(items), len(users)
        self.shown = np.zeros((n, n), np.float32)
        self.clicked = np.zeros((n, n), np.float32)
        self.user_shown = np.zeros((m, n), np.float32)
        self.user_clicked = np.zeros((m, n), np.float32)
        self.liked: list[list[int]] = [[] for _ in range(m)]
        """Items each user clicked, in the order first clicked (append-only: a prefix is a past state)."""
        self.impressions = 0
        self.clicks = 0
        self.item_impressions = np.zeros(n, np.float64)
        self.item_clicks = np.zeros(n, np.float64)

    def liked_so_far(self, user: str) -> int:
        """How many items ``user`` has clicked so far (a prefix length of its liked list)."""
        return len(self.liked[self.user[user]])

    def features(self, user: str, item: str, liked: int) -> tuple[float, float, float]:
        """``(neighbour_ctr, neighbour_lift, neighbour_impressions)`` of ``item`` for ``user``.

        ``liked``: how many of the user's clicked items count (:meth:`liked_so_far` at the slate's start).
        """
        i = self.item[item]
        rate = (self.clicks + 1.0) / (self.impressions + 2.0)
        own = (self.item_clicks[i] + NEIGHBOUR_PRIOR * rate) / (self.item_impressions[i] + NEIGHBOUR_PRIOR)
        mine = self.liked[self.user[user]][:liked]
        shown = float(self.shown[mine, i].sum()) if mine else 0.0
        clicked = float(self.clicked[mine, i].sum()) if mine else 0.0
        ctr = (clicked + NEIGHBOUR_PRIOR * own) / (shown + NEIGHBOUR_PRIOR)
        return ctr, ctr / own, shown

    def impression(self, user: str, item: str) -> None:
        """Count an impression of ``item`` to ``user``."""
        u, i = self.user[user], self.item[item]
        if self.liked[u]:
            self.shown[self.liked[u], i] += 1.0
            self.shown[i, i] = 0.0  # the diagonal stays 0: an item is no neighbour of itself
        self.user_shown[u, i] += 1.0
        self.item_impressions[i] += 1.0
        self.impressions += 1

    def click(self, user: str, item: str) -> None:
        """Count a click of ``item`` by ``user`` (a first click also credits the user's past to ``item``)."""
        u, i = self.user[user], self.item[item]
        others = [j for j in self.liked[u] if j != i]
        if others:
            self.clicked[others, i] += 1.0
        if self.user_clicked[u, i] == 0.0:  # first click: the user's whole past joins item i's row
            self.shown[i] += self.user_shown[u]
            self.clicked[i] += self.user_clicked[u]
            self.shown[i, i] = self.clicked[i, i] = 0.0
            self.liked[u].append(i)
        self.user_clicked[u, i] += 1.0
        self.item_clicks[i] += 1.0
        self.clicks += 1


@dataclass(frozen=True)
class Truth:
    """What a generator knew about one impression (joined by ``event_id``)."""

    p_click: float
    relevance: float


def events_training_set(
    events: Iterable[Mapping[str, Any]],
    *,
    truth: Mapping[str, Truth] | None = None,
    until_ms: int | None = None,
    name: str = "events",
    collaborative: bool = True,
) -> TrainingSet:
    """Return the labelled impressions of ``events`` (time order) with point-in-time features.

    ``truth`` (by ``event_id``) adds the ``oracle`` and ``oracle_relevance`` columns; impressions
    without it are left out when it is given. Impressions at or after ``until_ms`` are left out
    (their clicks may not have been emitted yet) but still count in later features.
    ``collaborative`` adds the neighbour features (:class:`CoClicks`).
    """
    stream = list(events)
    co = (
        CoClicks(sorted({e["item_id"] or "" for e in stream}), sorted({e["user_id"] for e in stream}))
        if collaborative
        else None
    )
    slate_liked: dict[str, int] = {}
    neighbour: list[tuple[float, float, float]] = []
    clicked = {(e["session_id"], e["item_id"], e["position"]) for e in stream if e["event_type"] == "click"}
    user_clk: dict[str, int] = defaultdict(int)
    user_imp: dict[str, int] = defaultdict(int)
    item_imp: dict[str, int] = defaultdict(int)
    item_clk: dict[str, int] = defaultdict(int)
    item_exp: dict[str, float] = defaultdict(float)
    cat_clk: dict[tuple[str, str], int] = defaultdict(int)
    cat_imp: dict[tuple[str, str], int] = defaultdict(int)
    pos_imp: dict[int, int] = defaultdict(int)
    pos_clk: dict[int, int] = defaultdict(int)
    pages: dict[str, int] = defaultdict(int)
    slates: dict[tuple[str, int], int] = {}
    own: dict[str, _Own] = {}
    rows: list[tuple[Any, ...]] = []
    nan = math.nan
    for e in stream:
        user, item, kind, cat = e["user_id"], e["item_id"] or "", e["event_type"], e.get("category") or ""
        session, position = e["session_id"], int(e["position"] or 0)
        if kind == "impression":
            if position == 1:
                pages[session] += 1
                own[session] = _Own()
                if co is not None:
                    slate_liked[session] = co.liked_so_far(user)
            mine = own.setdefault(session, _Own())
            known = truth.get(e["event_id"]) if truth is not None else None
            keep = (truth is None or known is not None) and (until_ms is None or e["event_time"] < until_ms)
            if keep:  # the user's side as of the slate's start: the ranker scores a slate at once
                uc, ui = user_clk[user] - mine.clicks, user_imp[user] - mine.impressions
                cc, ci = (
                    cat_clk[(user, cat)] - mine.cat_clicks[cat],
                    cat_imp[(user, cat)] - mine.cat_impressions[cat],
                )
                imp, clk = item_imp[item], item_clk[item]
                rows.append((
                    slates.setdefault((session, pages[session]), len(slates)),
                    user, item, e["event_time"], float((session, e["item_id"], e["position"]) in clicked),
                    position, uc, ui, uc / ui if ui else nan, imp, clk, clk / imp if imp else nan,
                    (clk + COEC_PRIOR) / (item_exp[item] + COEC_PRIOR),
                    cc / uc if uc else nan, ci / ui if ui else nan, cc / ci if ci else nan,
                    known.p_click if known else nan, known.relevance if known else nan,
                ))  # fmt: skip
                if co is not None:
                    liked = slate_liked.setdefault(session, co.liked_so_far(user))
                    neighbour.append(co.features(user, item, liked))
            if co is not None:
                co.impression(user, item)
            item_exp[item] += (pos_clk[position] + 0.1) / (pos_imp[position] + 1.0)
            user_imp[user] += 1
            item_imp[item] += 1
            cat_imp[(user, cat)] += 1
            pos_imp[position] += 1
            mine.impressions += 1
            mine.cat_impressions[cat] += 1
        elif kind == "click":
            if co is not None:
                co.click(user, item)
            user_clk[user] += 1
            item_clk[item] += 1
            cat_clk[(user, cat)] += 1
            pos_clk[position] += 1
            if session in own:
                own[session].clicks += 1
                own[session].cat_clicks[cat] += 1
    if not rows:
        msg = f"training set {name!r}: no labelled impression in {len(stream)} events"
        raise ValueError(msg)
    col = list(zip(*rows, strict=True))
    floats = np.asarray(col[6:16], np.float32).T
    pair = {f: floats[:, 7 + j].copy() for j, f in enumerate(PAIR_FEATURES)}
    if co is not None:
        values = np.asarray(neighbour, np.float32).reshape(-1, len(NEIGHBOUR_FEATURES))
        pair.update({f: values[:, j].copy() for j, f in enumerate(NEIGHBOUR_FEATURES)})
    return TrainingSet(
        USER_FEATURES,
        ITEM_FEATURES,
        name,
        floats[:, :3].copy(),
        floats[:, 3:7].copy(),
        np.asarray(col[4], np.float32),
        np.asarray(col[0], np.int64),
        np.asarray(col[3], np.int64),
        np.asarray(col[1]),
        np.asarray(col[2]),
        oracle=(
            {"oracle": np.asarray(col[16], np.float64), "oracle_relevance": np.asarray(col[17], np.float64)}
            if truth is not None
            else {}
        ),
        pair=pair,
        position=np.asarray(col[5], np.int64),
    )


def generator_set(events: int, seed: int, users: int = 2_000, items: int = 1_000) -> TrainingSet:
    """Return the behaviour generator's stream (no duplicates, no malformed records), with the oracle.

    Late events are left out (they carry an old time); impressions in the last 10% of the stream's
    time are not labelled.
    """
    from headwater.pipelines.events.generator import EventGenerator, GeneratorConfig

    config = GeneratorConfig(seed=seed, users=users, items=items, duplicate_share=0.0, malformed_share=0.0)
    generator = EventGenerator(config, record_truth=True)
    stream = [e.event for e in generator.take(events) if e.event is not None and not e.late]
    truth = {t.event_id: Truth(t.p_click, t.relevance) for t in generator.truth or []}
    cut = int(config.start_ms + 0.9 * (stream[-1]["event_time"] - config.start_ms))
    return events_training_set(stream, truth=truth, until_ms=cut, name=f"generator-s{seed}-e{events}")


def movielens_rows(inter: Path, items: Path | None = None) -> list[dict[str, Any]]:
    """Rows of the ``events`` source for MovieLens ratings (``user item rating timestamp``, tab-separated).

    The first line (a header) is skipped. Sessions: a user's ratings less than
    :data:`ML_SESSION_GAP_S` apart, in the order entered (ties by film id), cut into slates of
    :data:`ML_SLATE`. Each rating is an impression at its slot; a rating >= :data:`ML_LIKED` adds a
    click 1 ms later. ``items`` (``item title year genres``) gives each film's first genre as its
    category. Times are the ratings' own (1997-98): shift them on import.
    """
    genre: dict[str, str] = {}
    if items is not None:
        for line in items.read_text(encoding="latin-1").splitlines()[1:]:
            cells = line.split("\t")
            if len(cells) >= 4 and cells[3].strip():
                genre[cells[0]] = cells[3].split()[0]
    raw = []
    for number, line in enumerate(inter.read_text(encoding="latin-1").splitlines()[1:], start=2):
        cells = line.split("\t")
        if len(cells) < 4:
            msg = f"{inter}:{number}: expected user, item, rating, timestamp (tab-separated), found {line!r}"
            raise ValueError(msg)
        raw.append((cells[0], int(cells[3].split(".")[0]), int(cells[1]), float(cells[2])))
    raw.sort()
    rows: list[dict[str, Any]] = []
    session, position, last_user, last_t = "", 0, "", -(10**12)
    for n, (user, ts, item, rating) in enumerate(raw):
        if user != last_user or ts - last_t > ML_SESSION_GAP_S or position == ML_SLATE:
            session, position = f"ml-{user}-{n}", 0
        position += 1
        last_user, last_t = user, ts
        base = {"user_id": f"mlu{user}", "item_id": f"mli{item}", "session_id": session, "device": "web",
                "category": genre.get(str(item)), "position": position}  # fmt: skip
        rows.append({**base, "event_id": f"ml-{n}-i", "event_type": "impression", "event_time": ts * 1000})
        if rating >= ML_LIKED:
            rows.append({**base, "event_id": f"ml-{n}-c", "event_type": "click", "event_time": ts * 1000 + 1})
    return rows


@dataclass
class Imported:
    """Events that passed the source's import checks, and the rejects' reasons by count."""

    events: list[dict[str, Any]]
    rejected: dict[str, int]
    shift_ms: int


def import_rows(
    rows: Sequence[Mapping[str, Any]], work: Path, source: Any, time_shift: str, now_ms: int
) -> Imported:
    """Write ``rows`` as JSON Lines under ``work`` and read them back as ``events produce --from`` does.

    The file goes through :func:`~headwater.pipelines.events.readers.open_rows`, the time shift
    (``to-now`` with ``now_ms``, or a signed duration) and the source's row checker; the valid events
    come back in the file's order (Kafka and the bronze table are not involved).
    """
    from headwater.pipelines.events.ingest import Reject, check_row, resolve_shift
    from headwater.pipelines.events.readers import open_rows
    from headwater.pipelines.events.rows import RowChecker

    work.mkdir(parents=True, exist_ok=True)
    path = work / f"{source.name}-rows.jsonl"
    with path.open("w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row) + "\n")
    reader = open_rows(path)
    try:
        checker = RowChecker(source, text_cells=reader.text_cells)
        checker.shift_ms, _ = resolve_shift(time_shift, reader, checker, now_ms)
        events: list[dict[str, Any]] = []
        rejected: dict[str, int] = defaultdict(int)
        for line in reader:
            result = check_row(checker, line)
            if isinstance(result, Reject):
                rejected[f"{result.field}: {result.reason}"] += 1
            else:
                events.append(result.event)
    finally:
        reader.close()
    return Imported(events, dict(rejected), checker.shift_ms)


def events_source(features: Path, name: str = "events") -> Any:
    """Return the :class:`~headwater.registry.plans.PlanSource` ``name`` of the registry in ``features``."""
    from headwater.registry.plans import plan_sources
    from headwater.registry.validate import check_repo

    for source in plan_sources(check_repo(features)):
        if source.name == name:
            return source
    msg = f"{features}/sources.yaml: no source named {name!r}"
    raise KeyError(msg)


__all__ = [
    "ITEM_FEATURES",
    "NEIGHBOUR_FEATURES",
    "PAIR_FEATURES",
    "USER_FEATURES",
    "CoClicks",
    "Imported",
    "Truth",
    "events_source",
    "events_training_set",
    "generator_set",
    "import_rows",
    "movielens_rows",
]
