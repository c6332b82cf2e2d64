"""Feast's get_online_features through the headwater plugin returns what the direct API wrote."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis
import yaml

from headwater.pipelines.store import OnlineStore, ViewLayout
from headwater.pipelines.store.feast_yaml import online_store_section

FEATURES = tuple(f"f{i:02d}" for i in range(32))


@pytest.fixture
def db13_url(redis_url: str) -> str:
    return redis_url.rsplit("/", 1)[0] + "/13"


@pytest.fixture
def namespace(db13_url: str) -> Iterator[str]:
    ns = f"hwtest-{uuid.uuid4().hex[:8]}"
    yield ns
    client = redis.Redis.from_url(db13_url)
    keys = list(client.scan_iter(match=f"{ns}:*", count=1000))
    if keys:
        client.delete(*keys)
    client.close()


def _source(tmp_path: Path) -> Any:
    """A FileSource over an empty parquet file (Feast checks the file at apply)."""
    import pandas as pd
    from feast import FileSource

    path = tmp_path / "source.parquet"
    if not path.exists():
        frame = pd.DataFrame({"item_id": pd.Series([], dtype=str)})
        frame["event_timestamp"] = pd.Series([], dtype="datetime64[ns, UTC]")
        for name in FEATURES:
            frame[name] = pd.Series([], dtype="float32")
        frame["clicks"] = pd.Series([], dtype="int64")
        frame.to_parquet(path)
    return FileSource(path=str(path), timestamp_field="event_timestamp")


def _item() -> Any:
    from feast import Entity, ValueType

    return Entity(name="item", join_keys=["item_id"], value_type=ValueType.STRING)


def _feast_repo(tmp_path: Path, db13_url: str, namespace: str, ttl: timedelta) -> Any:
    from feast import FeatureStore, FeatureView, Field
    from feast.types import Float32, Int64

    config = {
        "project": "hwstoretest",
        "registry": str(tmp_path / "registry.db"),
        "provider": "local",
        "online_store": online_store_section(db13_url, namespace=namespace),
        "offline_store": {"type": "file"},
        "entity_key_serialization_version": 3,
    }
    (tmp_path / "feature_store.yaml").write_text(yaml.safe_dump(config))
    item = _item()
    source = _source(tmp_path)
    schema = [Field(name=name, dtype=Float32) for name in FEATURES] + [Field(name="clicks", dtype=Int64)]
    view = FeatureView(name="item_profile", entities=[item], ttl=ttl, schema=schema, source=source)
    fs = FeatureStore(repo_path=str(tmp_path))
    fs.apply([item, view])
    return fs


def test_get_online_features_equals_direct_read(tmp_path: Path, db13_url: str, namespace: str) -> None:
    fs = _feast_repo(tmp_path, db13_url, namespace, ttl=timedelta(days=1))
    layout = ViewLayout(view="item_profile", entity="item", features=(*FEATURES, "clicks"), ttl_s=86400)
    store = OnlineStore.from_url(db13_url, namespace=namespace)
    rng = np.random.default_rng(7)
    ids = [f"i{i}" for i in range(50)]
    values = rng.standard_normal((50, 33)).astype(np.float32)
    values[:, 32] = rng.integers(0, 1000, 50)
    event_ms = 1_750_000_000_000 + np.arange(50)
    assert store.write_batch(layout, ids, values, event_ms).written == 50

    wanted = [*ids[:40], "never-written"]
    refs = [f"item_profile:{name}" for name in layout.features]
    got = fs.get_online_features(features=refs, entity_rows=[{"item_id": i} for i in wanted]).to_dict()
    direct = store.read_batch(layout, wanted)

    assert got["item_id"] == wanted
    for j, name in enumerate(FEATURES):
        feast_col = np.array(got[name][:40], dtype=np.float32)
        np.testing.assert_array_equal(feast_col, direct.values[:40, j])
        np.testing.assert_array_equal(feast_col, values[:40, j])
        assert got[name][40] is None
    assert got["clicks"][:40] == [int(v) for v in values[:40, 32]]
    assert not direct.found[40]


def test_write_through_feast_is_read_by_direct_api(tmp_path: Path, db13_url: str, namespace: str) -> None:
    import pandas as pd

    fs = _feast_repo(tmp_path, db13_url, namespace, ttl=timedelta(hours=2))
    ts = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    frame = pd.DataFrame({"item_id": ["a", "b"], "event_timestamp": [ts, ts]})
    for j, name in enumerate(FEATURES):
        frame[name] = np.array([j, -j], dtype=np.float32) / 4
    frame["clicks"] = [3, 4]
    fs.write_to_online_store("item_profile", frame)

    layout = ViewLayout(view="item_profile", entity="item", features=(*FEATURES, "clicks"), ttl_s=7200)
    res = OnlineStore.from_url(db13_url, namespace=namespace).read_batch(layout, ["a", "b"])
    assert res.found.tolist() == [True, True]
    np.testing.assert_array_equal(res.values[0, :32], np.arange(32, dtype=np.float32) / 4)
    np.testing.assert_array_equal(res.values[:, 32], [3, 4])
    assert res.event_time_ms.tolist() == [int(ts.timestamp() * 1000)] * 2
    ttl_ms = redis.Redis.from_url(db13_url).pttl(f"{namespace}:{{item_profile}}:a")
    assert 7_000_000 < ttl_ms <= 7_200_000


def test_unsupported_field_type_is_rejected_at_apply(tmp_path: Path, db13_url: str, namespace: str) -> None:
    from feast import FeatureView, Field
    from feast.types import String

    from headwater.pipelines.store.feast_plugin import HeadwaterFeastError

    fs = _feast_repo(tmp_path, db13_url, namespace, ttl=timedelta(0))
    item = _item()
    bad = FeatureView(
        name="bad_view", entities=[item], schema=[Field(name="title", dtype=String)], source=_source(tmp_path)
    )
    with pytest.raises(HeadwaterFeastError, match="field 'title' has type String"):
        fs.apply([item, bad])
