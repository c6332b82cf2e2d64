"""A Feast online-store plugin that reads and writes the headwater layout.

Configure it in ``feature_store.yaml`` (see :func:`online_store_section`)::

    online_store:
      type: headwater.pipelines.store.feast_plugin.HeadwaterOnlineStore
      redis_url: redis://127.0.0.1:6379/0
      namespace: hw

A FeatureView maps to a :class:`ViewLayout`: the view name is the FeatureView name, the
feature order is the order of its schema fields (entity columns excluded), the TTL is
``key_ttl_seconds`` or the FeatureView's ``ttl``. The entity id is the string form of the join
key value (several join keys: their values joined with ``:`` in the FeatureView's join-key
order). Values are stored as float32; Float32, Float64, Int32, Int64 and Bool fields are
converted on read; a NaN (missing feature) reads as null.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any, Literal

import numpy as np
from feast import Entity, FeatureView, RepoConfig
from feast.infra.online_stores.online_store import OnlineStore as FeastOnlineStore
from feast.protos.feast.types.EntityKey_pb2 import EntityKey as EntityKeyProto
from feast.protos.feast.types.Value_pb2 import Value as ValueProto
from feast.repo_config import FeastConfigBaseModel
from feast.value_type import ValueType
from pydantic import StrictStr

from headwater.pipelines.store.feast_yaml import PLUGIN_TYPE, online_store_section
from headwater.pipelines.store.layout import DEFAULT_NAMESPACE, ViewLayout
from headwater.pipelines.store.store import OnlineStore
from headwater.registry.errors import HeadwaterError

__all__ = ["HeadwaterOnlineStore", "HeadwaterOnlineStoreConfig", "layout_for", "online_store_section"]

VERSION_TAG = "headwater.version"
_READERS: dict[ValueType, Callable[[float], ValueProto]] = {
    ValueType.FLOAT: lambda v: ValueProto(float_val=v),
    ValueType.DOUBLE: lambda v: ValueProto(double_val=v),
    ValueType.INT32: lambda v: ValueProto(int32_val=int(v)),
    ValueType.INT64: lambda v: ValueProto(int64_val=int(v)),
    ValueType.BOOL: lambda v: ValueProto(bool_val=bool(v)),
}


class HeadwaterFeastError(HeadwaterError, ValueError):
    """A Feast object cannot be served by the headwater online store."""


class HeadwaterOnlineStoreConfig(FeastConfigBaseModel):
    """``online_store`` section of ``feature_store.yaml`` for the headwater layout."""

    type: Literal["headwater.pipelines.store.feast_plugin.HeadwaterOnlineStore"] = (
        "headwater.pipelines.store.feast_plugin.HeadwaterOnlineStore"
    )
    """Online store type selector (this class's import path)."""

    redis_url: StrictStr = "redis://127.0.0.1:6379/0"
    """Redis URL, ``redis://host:port/db``."""

    namespace: StrictStr = DEFAULT_NAMESPACE
    """Key namespace, the ``hw`` in ``hw:{view}:entity``; must match the pipelines' writers."""

    key_ttl_seconds: int | None = None
    """TTL of writes made through Feast; None uses each FeatureView's ``ttl`` (0 = no expiry)."""


def layout_for(table: FeatureView, config: HeadwaterOnlineStoreConfig) -> ViewLayout:
    """Map a Feast FeatureView to its headwater layout (checks that every field type is supported)."""
    for field in table.features:
        if field.dtype.to_value_type() not in _READERS:
            msg = (
                f"feature view {table.name!r}: field {field.name!r} has type {field.dtype}; the headwater"
                " online store packs float32 vectors and serves Float32, Float64, Int32, Int64 and Bool"
                " fields. Declare the field with one of these types."
            )
            raise HeadwaterFeastError(msg)
    if config.key_ttl_seconds is not None:
        ttl_s = config.key_ttl_seconds
    else:
        ttl_s = int(table.ttl.total_seconds()) if table.ttl else 0
    version = table.tags.get(VERSION_TAG, "")
    return ViewLayout(
        view=table.name,
        entity=table.entities[0] if table.entities else "entity",
        features=tuple(f.name for f in table.features),
        ttl_s=ttl_s,
        version=version,
    )


def entity_id(key: EntityKeyProto, join_keys: Sequence[str]) -> str:
    """Return the headwater entity id of a Feast entity key (values joined by ``:``, join-key order)."""
    by_name = dict(zip(key.join_keys, key.entity_values, strict=True))
    parts: list[str] = []
    for name in join_keys if len(join_keys) == len(by_name) else list(key.join_keys):
        value = by_name[name]
        kind = value.WhichOneof("val")
        if kind is None:
            msg = f"entity key {name!r} has no value; pass a value for every join key"
            raise HeadwaterFeastError(msg)
        raw = getattr(value, kind)
        parts.append(raw.decode("utf-8") if isinstance(raw, bytes) else str(raw))
    return ":".join(parts)


def _as_float(value: ValueProto | None) -> float:
    kind = value.WhichOneof("val") if value is not None else None
    if value is None or kind is None:
        return math.nan
    raw = getattr(value, kind)
    if isinstance(raw, bool | int | float):
        return float(raw)
    msg = f"feature value of kind {kind!r} cannot be stored as float32; got {raw!r}"
    raise HeadwaterFeastError(msg)


def _epoch_ms(ts: datetime) -> int:
    aware = ts if ts.tzinfo is not None else ts.replace(tzinfo=UTC)  # Feast: naive means UTC
    return int(aware.timestamp() * 1000)


class HeadwaterOnlineStore(FeastOnlineStore):
    """Feast's online-store interface over :class:`headwater.pipelines.store.OnlineStore`."""

    def __init__(self) -> None:
        self._stores: dict[tuple[str, str], OnlineStore] = {}

    def _config(self, config: RepoConfig) -> HeadwaterOnlineStoreConfig:
        store_config = config.online_store
        if not isinstance(store_config, HeadwaterOnlineStoreConfig):
            msg = f"HeadwaterOnlineStore needs online_store.type {PLUGIN_TYPE!r}; got {type(store_config)}"
            raise HeadwaterFeastError(msg)
        return store_config

    def _store(self, config: RepoConfig) -> tuple[OnlineStore, HeadwaterOnlineStoreConfig]:
        cfg = self._config(config)
        key = (cfg.redis_url, cfg.namespace)
        if key not in self._stores:
            self._stores[key] = OnlineStore.from_url(cfg.redis_url, namespace=cfg.namespace)
        return self._stores[key], cfg

    def online_write_batch(
        self,
        config: RepoConfig,
        table: FeatureView,
        data: list[tuple[EntityKeyProto, dict[str, ValueProto], datetime, datetime | None]],
        progress: Callable[[int], Any] | None,
    ) -> None:
        """Write Feast rows as packed vectors; older event times never overwrite newer ones."""
        store, cfg = self._store(config)
        layout = layout_for(table, cfg)
        ids = [entity_id(key, table.join_keys) for key, _, _, _ in data]
        values = np.array(
            [[_as_float(row.get(name)) for name in layout.features] for _, row, _, _ in data],
            dtype=np.float32,
        ).reshape(len(data), layout.dim)
        event_ms = np.array([_epoch_ms(ts) for _, _, ts, _ in data], dtype=np.int64)
        store.write_batch(layout, ids, values, event_ms)
        if progress is not None:
            progress(len(data))

    def online_read(
        self,
        config: RepoConfig,
        table: FeatureView,
        entity_keys: list[EntityKeyProto],
        requested_features: list[str] | None = None,
    ) -> list[tuple[datetime | None, dict[str, ValueProto] | None]]:
        """Read the packed vectors of ``entity_keys`` in one round trip and convert them to Feast values."""
        store, cfg = self._store(config)
        layout = layout_for(table, cfg)
        ids = [entity_id(key, table.join_keys) for key in entity_keys]
        res = store.read_batch(layout, ids)
        wanted = requested_features if requested_features is not None else list(layout.features)
        types = {f.name: f.dtype.to_value_type() for f in table.features}
        columns = [(name, layout.features.index(name), _READERS[types[name]]) for name in wanted]
        rows: list[tuple[datetime | None, dict[str, ValueProto] | None]] = []
        values = res.values.tolist()
        for i, found in enumerate(res.found.tolist()):
            if not found:
                rows.append((None, None))
                continue
            vec = values[i]
            ts = datetime.fromtimestamp(int(res.event_time_ms[i]) / 1000, tz=UTC)
            rows.append(
                (ts, {n: ValueProto() if math.isnan(vec[j]) else conv(vec[j]) for n, j, conv in columns})
            )
        return rows

    def update(
        self,
        config: RepoConfig,
        tables_to_delete: Sequence[FeatureView],
        tables_to_keep: Sequence[FeatureView],
        entities_to_delete: Sequence[Entity],
        entities_to_keep: Sequence[Entity],
        partial: bool,
    ) -> None:
        """Check that kept views can be served; delete the keys of removed views."""
        store, cfg = self._store(config)
        for table in tables_to_keep:
            layout_for(table, cfg)
        for table in tables_to_delete:
            store.delete_view(table.name)

    def teardown(self, config: RepoConfig, tables: Sequence[FeatureView], entities: Sequence[Entity]) -> None:
        """Delete the keys of ``tables`` and close the connections."""
        store, _ = self._store(config)
        for table in tables:
            store.delete_view(table.name)
        for opened in self._stores.values():
            opened.close()
        self._stores.clear()
