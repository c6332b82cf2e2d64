"""The online store shared by every tier and by serving: packed feature vectors in Redis.

One key per (view, entity), ``hw:{<view>}:<entity_id>``, holding a 72-byte header (event time,
write time, expiry, schema hash, view version) and the float32 features. Writes are
idempotent inside Redis (``write.lua``); reads are one ``MGET`` per view. See ``layout`` for the
Redis Cluster trade-off, ``codec`` for the byte layout and ``feast_plugin`` for the Feast
online-store plugin that reads the same keys. Every call of the write script also appends one
entry to the view's freshness log ``hw:fresh:{<view>}`` (read by ``headwater.pipelines.freshness``).
"""

from headwater.pipelines.store.layout import LayoutError, ViewLayout, entity_key, freshness_key, view_slot
from headwater.pipelines.store.store import (
    OnlineStore,
    ReadResult,
    StoreInputError,
    WriteResult,
    epoch_ms,
)
from headwater.pipelines.store.transport import StoreError, StoreUnavailableError

__all__ = [
    "LayoutError",
    "OnlineStore",
    "ReadResult",
    "StoreError",
    "StoreInputError",
    "StoreUnavailableError",
    "ViewLayout",
    "WriteResult",
    "entity_key",
    "epoch_ms",
    "freshness_key",
    "view_slot",
]
