"""The ``funnel`` section of the serving config: sizes of each stage and the business rules."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

from headwater.serving.schemas import MAX_RECOMMEND_K


class FunnelConfig(BaseModel):
    """How many candidates each stage keeps, how long an impression hides an item, the rules."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    retrieve_n: int = Field(default=500, ge=1, le=2000)
    """Candidates the retrieval stage takes from the whole catalog (after dropping seen items)."""
    rank_keep: int = Field(default=200, ge=1, le=2000)
    """Top candidates of the DCN kept for the re-ranker and the rules (at least the request's k)."""
    rerank_top: int = Field(default=50, ge=0, le=500)
    """Top candidates of the DCN the sequence re-ranker orders again (0 = off)."""
    seen_window_s: float = Field(default=600.0, gt=0.0)
    """An item served to a user is dropped from their recommendations for this long."""
    seen_max: int = Field(default=500, ge=1)
    """Recent impressions kept per user (the newest); older ones are forgotten first."""
    clicks_max: int = Field(default=20, ge=1, le=200)
    """Recent clicks kept per user: the re-ranker's sequence."""
    clicks_ttl_s: float = Field(default=86_400.0, gt=0.0)
    popular_max: int = Field(default=5000, ge=1)
    """Items kept in the clicked-items popularity set (the retrieval stage's fallback)."""
    max_per_category: int | None = Field(default=3, ge=1)
    """At most this many items of one category in the top k (None = no limit); pins are exempt."""
    pins: dict[str, int] = Field(default_factory=dict)
    """Editorial pins: item id -> 1-based position in every answer (the item is placed there)."""
    index_refresh_s: float = Field(default=30.0, gt=0.0)
    """How often the item index looks for changes: a refresh (a scan of the catalog's write times)
    runs when an item view's freshness log shows a written row since the last one."""
    index_feed_s: float | None = Field(default=0.5, gt=0.0)
    """How often the item views' change feeds are read between those looks: the items they name are
    re-read and re-embedded without a scan (``serving/retrieval/refresh.py``), so a write reaches the
    index and the in-memory item rows within about this long. When a feed cannot say (a writer that
    does not feed it), only the ``index_refresh_s`` look refreshes. None: no feed reads. At 0.5 s the
    in-memory rows stay under 1 s old, the bound of a 10-s realtime item view (``item_mirror_sla_share``
    0.1), so it is served from memory too (at 2 s it was read from Redis whenever they were over 1 s
    old: 1M items, 4 connections, 160.6 -> 169.3 QPS, ``bench_recommend.py --variants current,feed05``)."""
    index_full_scan_s: float = Field(default=600.0, gt=0.0)
    """A refresh runs at least this often even without a write: expired items are dropped from the
    index within it (expiry writes nothing to the log). Set it to ``index_refresh_s`` to scan at
    every look."""
    index_snapshot_s: float | None = Field(default=600.0, gt=0.0)
    """``headwater serve`` saves the item index (graph, ids, write times, item rows) under the state
    directory at most this often while it changes, and at stop; a restart loads it and re-embeds
    only the items written since instead of rebuilding from Redis (serving/retrieval/snapshot.py).
    None: neither saved nor loaded."""
    item_mirror_sla_share: float | None = Field(default=0.1, gt=0.0, le=1.0)
    """The index refresher also keeps every item's rows in memory, and the ranker reads an item view
    from there while the last confirmation that memory and store agree is at most this share of the
    view's freshness SLA old (serving/item_mirror.py); other views are read from Redis per request.
    None: every item view is read from Redis (through the item cache)."""
    categories_cache_s: float = Field(default=60.0, ge=0.0)
    """Item categories are kept in process this long after they were read (0 = read Redis each time):
    a category change reaches the diversity rule within it."""
    write_buffer: int = Field(default=10_000, ge=1)
    """Recent-items writes waiting for Redis; beyond it new ones are dropped and counted."""

    @field_validator("pins")
    @classmethod
    def _positions(cls, value: dict[str, int]) -> dict[str, int]:
        taken: dict[int, str] = {}
        for item, position in value.items():
            if not 1 <= position <= MAX_RECOMMEND_K:
                msg = f"pins: {item!r} is pinned at {position}; positions are 1..{MAX_RECOMMEND_K}"
                raise ValueError(msg)
            if position in taken:
                msg = f"pins: {item!r} and {taken[position]!r} are both pinned at position {position}"
                raise ValueError(msg)
            taken[position] = item
        return value
