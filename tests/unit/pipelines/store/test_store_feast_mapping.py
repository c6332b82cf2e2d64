"""How the Feast plugin maps Feast objects onto the headwater layout (no Redis needed)."""

from __future__ import annotations

import math
from datetime import timedelta

import pytest
from feast import Entity, FeatureView, Field, FileSource, ValueType
from feast.protos.feast.types.EntityKey_pb2 import EntityKey
from feast.protos.feast.types.Value_pb2 import Value
from feast.types import Float32, Float64, Int64, String

from headwater.pipelines.store.feast_plugin import (
    HeadwaterFeastError,
    HeadwaterOnlineStoreConfig,
    _as_float,
    entity_id,
    layout_for,
)


def _view(
    schema: list[Field], ttl: timedelta = timedelta(hours=1), tags: dict[str, str] | None = None
) -> FeatureView:
    user = Entity(name="user", join_keys=["user_id"], value_type=ValueType.STRING)
    source = FileSource(path="unused.parquet", timestamp_field="event_timestamp")
    return FeatureView(
        name="user_profile", entities=[user], schema=schema, source=source, ttl=ttl, tags=tags or {}
    )


def test_layout_follows_schema_order_ttl_and_version_tag() -> None:
    view = _view(
        [Field(name="b", dtype=Float32), Field(name="a", dtype=Float64), Field(name="n", dtype=Int64)],
        tags={"headwater.version": "r42"},
    )
    layout = layout_for(view, HeadwaterOnlineStoreConfig())
    assert layout.view == "user_profile"
    assert layout.features == ("b", "a", "n")
    assert layout.ttl_s == 3600
    assert layout.version == "r42"
    assert layout_for(view, HeadwaterOnlineStoreConfig(key_ttl_seconds=5)).ttl_s == 5
    assert (
        layout_for(
            _view([Field(name="x", dtype=Float32)], ttl=timedelta(0)), HeadwaterOnlineStoreConfig()
        ).ttl_s
        == 0
    )


def test_unsupported_type_names_view_field_and_fix() -> None:
    with pytest.raises(
        HeadwaterFeastError, match=r"'user_profile': field 'title' has type String.*Declare the field"
    ):
        layout_for(_view([Field(name="title", dtype=String)]), HeadwaterOnlineStoreConfig())


def test_entity_ids_from_feast_keys() -> None:
    assert (
        entity_id(EntityKey(join_keys=["user_id"], entity_values=[Value(string_val="u1")]), ["user_id"])
        == "u1"
    )
    assert (
        entity_id(EntityKey(join_keys=["user_id"], entity_values=[Value(int64_val=42)]), ["user_id"]) == "42"
    )
    composite = EntityKey(join_keys=["b", "a"], entity_values=[Value(string_val="x"), Value(int32_val=7)])
    assert entity_id(composite, ["a", "b"]) == "7:x"
    with pytest.raises(HeadwaterFeastError, match="'user_id' has no value"):
        entity_id(EntityKey(join_keys=["user_id"], entity_values=[Value()]), ["user_id"])


def test_feast_values_become_float32_inputs() -> None:
    assert _as_float(Value(float_val=1.5)) == 1.5
    assert _as_float(Value(int64_val=3)) == 3.0
    assert _as_float(Value(bool_val=True)) == 1.0
    assert math.isnan(_as_float(Value()))
    assert math.isnan(_as_float(None))
    with pytest.raises(HeadwaterFeastError, match="kind 'string_val' cannot be stored as float32"):
        _as_float(Value(string_val="x"))
