"""Key naming, Redis Cluster slots and layout validation."""

from __future__ import annotations

import numpy as np
import pytest

from headwater.pipelines.store import LayoutError, ViewLayout, WriteResult, entity_key, view_slot
from headwater.pipelines.store.layout import entity_keys, key_prefix, schema_hash


def crc16_xmodem(data: bytes) -> int:
    """CRC16-CCITT (XMODEM), the hash Redis Cluster uses for slots, written out independently."""
    crc = 0
    for byte in data:
        crc ^= byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else crc << 1
            crc &= 0xFFFF
    return crc


def cluster_slot(key: str) -> int:
    raw = key.encode()
    start = raw.find(b"{")
    if start >= 0:
        end = raw.find(b"}", start + 1)
        if end > start + 1:
            raw = raw[start + 1 : end]
    return crc16_xmodem(raw) % 16384


def test_crc16_matches_the_redis_cluster_spec_vector() -> None:
    assert crc16_xmodem(b"123456789") == 0x31C3


def test_key_naming() -> None:
    assert entity_key("user_profile", "u42") == "hw:{user_profile}:u42"
    assert entity_key("user_profile", "u42", namespace="stg") == "stg:{user_profile}:u42"
    assert key_prefix("item_profile") == "hw:{item_profile}:"
    assert entity_keys("v", ["a", "b:c"]) == ["hw:{v}:a", "hw:{v}:b:c"]


def test_every_key_of_a_view_shares_one_cluster_slot() -> None:
    ids = [f"item-{i}" for i in range(2000)] + ["{weird}", "a}b{c", "ü-unicode", ""]
    for view in ("user_profile", "item_profile", "user_session_realtime"):
        slots = {cluster_slot(k) for k in entity_keys(view, ids)}
        assert slots == {view_slot(view)}
        assert view_slot(view) == crc16_xmodem(view.encode()) % 16384
    assert view_slot("user_profile") != view_slot("item_profile")


def test_layout_validation_messages() -> None:
    ok = ViewLayout(view="v", entity="user", features=["a", "b"], ttl_s=10, version="abc")  # type: ignore[arg-type]
    assert ok.features == ("a", "b")
    assert ok.dim == 2
    assert ok.ttl_ms == 10_000
    assert ok.schema_hash == schema_hash(("a", "b")) != schema_hash(("b", "a"))
    with pytest.raises(LayoutError, match=r"view must be .*got 'a\{b\}'"):
        ViewLayout(view="a{b}", entity="user", features=("x",))
    with pytest.raises(LayoutError, match="at least one feature"):
        ViewLayout(view="v", entity="user", features=())
    with pytest.raises(LayoutError, match=r"repeated: \['x'\]"):
        ViewLayout(view="v", entity="user", features=("x", "y", "x"))
    with pytest.raises(LayoutError, match="ttl_s must be an int >= 0"):
        ViewLayout(view="v", entity="user", features=("x",), ttl_s=-1)
    with pytest.raises(LayoutError, match="is 33 bytes, the value header holds at most 32"):
        ViewLayout(view="v", entity="user", features=("x",), version="a" * 33)
    with pytest.raises(LayoutError, match="ASCII"):
        ViewLayout(view="v", entity="user", features=("x",), version="vé")


def test_write_result_counts() -> None:
    result = WriteResult(np.array([1, 0, 2, 1, 1], dtype=np.int8))
    assert (result.written, result.stale, result.unchanged) == (3, 1, 1)


def test_online_store_section_for_feature_store_yaml() -> None:
    from headwater.pipelines.store.feast_yaml import online_store_section

    assert online_store_section("redis://127.0.0.1:6379/0") == {
        "type": "headwater.pipelines.store.feast_plugin.HeadwaterOnlineStore",
        "redis_url": "redis://127.0.0.1:6379/0",
        "namespace": "hw",
    }
    assert online_store_section("redis://h:1/2", namespace="x", key_ttl_seconds=60)["key_ttl_seconds"] == 60
