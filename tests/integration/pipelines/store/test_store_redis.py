"""The online store against the real Redis: round trip, idempotent writes, TTL, missing keys."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import numpy as np
import pytest
import redis

from headwater.pipelines.store import (
    OnlineStore,
    StoreInputError,
    StoreUnavailableError,
    ViewLayout,
)
from headwater.pipelines.store import store as store_module

T0 = 1_760_000_000_000


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    c = redis.Redis.from_url(redis_url.rsplit("/", 1)[0] + "/13")
    yield c
    c.close()


@pytest.fixture
def store(client: redis.Redis) -> Iterator[OnlineStore]:
    namespace = f"hwtest-{uuid.uuid4().hex[:8]}"
    yield OnlineStore(client, namespace=namespace)
    keys = list(client.scan_iter(match=f"{namespace}:*", count=1000))
    if keys:
        client.delete(*keys)


def layout(d: int = 32, ttl_s: int = 3600, version: str = "reg-1", view: str = "item_profile") -> ViewLayout:
    return ViewLayout(
        view=view, entity="item", features=tuple(f"f{i}" for i in range(d)), ttl_s=ttl_s, version=version
    )


def test_round_trip_is_exact_bit_for_bit(store: OnlineStore) -> None:
    lay = layout()
    rng = np.random.default_rng(1)
    values = rng.standard_normal((300, 32)).astype(np.float32) * 1e6
    values[0, :6] = [np.inf, -np.inf, -0.0, np.float32(1e-45), np.finfo(np.float32).max, np.nan]
    ids = [f"item-{i}" for i in range(300)]
    events = T0 + np.arange(300)

    result = store.write_batch(lay, ids, values, events, write_time_ms=T0 + 5_000)

    assert (result.written, result.stale, result.unchanged) == (300, 0, 0)
    read = store.read_batch(lay, ids)
    assert read.values.dtype == np.float32
    assert read.values.tobytes() == values.tobytes()
    assert read.found.all()
    assert read.event_time_ms.tolist() == events.tolist()
    assert read.write_time_ms.tolist() == [T0 + 5_000] * 300
    assert read.versions == ["reg-1"] * 300
    np.testing.assert_allclose(read.ages_s(now_ms=T0 + 10_000), (10_000 - np.arange(300)) / 1000)


def test_missing_keys_read_as_nan_and_not_found(store: OnlineStore) -> None:
    lay = layout(d=4)
    store.write_batch(lay, ["a", "c"], np.ones((2, 4)), [T0, T0 + 1])

    read = store.read_batch(lay, ["a", "b", "c", "d"])

    assert read.found.tolist() == [True, False, True, False]
    assert np.isnan(read.values[[1, 3]]).all()
    assert (read.values[[0, 2]] == 1).all()
    assert read.event_time_ms.tolist() == [T0, 0, T0 + 1, 0]
    assert read.versions == ["reg-1", None, "reg-1", None]
    assert np.isnan(read.ages_s(now_ms=T0)[[1, 3]]).all()
    assert not read.mismatch.any()
    assert store.read_batch(lay, []).values.shape == (0, 4)


def test_older_event_never_overwrites_newer(store: OnlineStore) -> None:
    lay = layout(d=3)
    store.write_batch(lay, ["u"], [[1, 2, 3]], [T0 + 100], write_time_ms=T0 + 1)

    older = store.write_batch(lay, ["u"], [[9, 9, 9]], [T0 + 50])
    assert older.status.tolist() == [0]
    read = store.read_batch(lay, ["u"])
    assert read.values.tolist() == [[1, 2, 3]]
    assert read.event_time_ms.tolist() == [T0 + 100]
    assert read.write_time_ms.tolist() == [T0 + 1]

    replay = store.write_batch(lay, ["u"], [[1, 2, 3]], [T0 + 100], write_time_ms=T0 + 2)
    assert replay.status.tolist() == [2]
    assert store.read_batch(lay, ["u"]).write_time_ms.tolist() == [T0 + 1]

    corrected = store.write_batch(lay, ["u"], [[1, 2, 4]], [T0 + 100])
    assert corrected.status.tolist() == [1]
    newer = store.write_batch(lay, ["u"], [[5, 5, 5]], [T0 + 200])
    assert newer.status.tolist() == [1]
    assert store.read_batch(lay, ["u"]).values.tolist() == [[5, 5, 5]]


def test_batch_mixing_new_stale_and_duplicate_rows_across_chunks(
    client: redis.Redis, store: OnlineStore
) -> None:
    small = OnlineStore(client, namespace=store.namespace, chunk_rows=7)
    lay = layout(d=2)
    ids = [f"e{i}" for i in range(40)]
    small.write_batch(lay, ids, np.zeros((40, 2)), np.full(40, T0 + 10))

    batch_ids = [*ids, "e0"]
    times = np.array([T0 + 5 if i % 2 else T0 + 20 for i in range(40)] + [T0 + 30])
    vals = np.arange(82, dtype=np.float32).reshape(41, 2)
    result = small.write_batch(lay, batch_ids, vals, times)

    assert result.status.tolist()[:40] == [0 if i % 2 else 1 for i in range(40)]
    assert result.status.tolist()[40] == 1
    read = small.read_batch(lay, ids)
    assert read.values[0].tolist() == [80, 81]
    assert read.event_time_ms[0] == T0 + 30
    for i in range(1, 40):
        expected = [0, 0] if i % 2 else vals[i].tolist()
        assert read.values[i].tolist() == expected


def test_ttl_is_applied_and_kept_by_rejected_writes(client: redis.Redis, store: OnlineStore) -> None:
    lay = layout(d=2, ttl_s=100)
    store.write_batch(lay, ["a"], [[1, 1]], [T0 + 10])
    key = f"{store.namespace}:{{item_profile}}:a"
    assert 95_000 < client.pttl(key) <= 100_000

    longer = layout(d=2, ttl_s=10_000)
    assert store.write_batch(longer, ["a"], [[2, 2]], [T0]).stale == 1
    assert store.write_batch(longer, ["a"], [[1, 1]], [T0 + 10]).unchanged == 1
    assert 90_000 < client.pttl(key) <= 100_000

    forever = layout(d=2, ttl_s=0)
    store.write_batch(forever, ["a"], [[3, 3]], [T0 + 20])
    assert client.pttl(key) == -1


def test_value_expires_after_ttl(store: OnlineStore) -> None:
    lay = layout(d=2, ttl_s=1)
    store.write_batch(lay, ["short"], [[1, 2]], [T0])
    assert store.read_batch(lay, ["short"]).found.tolist() == [True]
    time.sleep(1.3)
    assert store.read_batch(lay, ["short"]).found.tolist() == [False]


def test_value_of_other_feature_order_is_a_mismatch(store: OnlineStore) -> None:
    store.write_batch(layout(d=3), ["x", "y"], [[1, 2, 3], [4, 5, 6]], [T0, T0])
    reordered = ViewLayout(view="item_profile", entity="item", features=("f1", "f0", "f2"), ttl_s=3600)
    shorter = layout(d=2)

    for other in (reordered, shorter):
        read = store.read_batch(other, ["x", "y", "z"])
        assert read.found.tolist() == [False, False, False]
        assert read.mismatch.tolist() == [True, True, False]
        assert np.isnan(read.values).all()


def test_read_many_reads_views_in_one_call(store: OnlineStore) -> None:
    user = layout(d=4, view="user_profile")
    item = layout(d=8, view="item_profile")
    store.write_batch(user, ["u1"], np.full((1, 4), 7.0), [T0])
    store.write_batch(item, ["i1", "i2"], np.arange(16).reshape(2, 8), [T0, T0 + 1])

    u, i, empty = store.read_many([(user, ["u1"]), (item, ["i2", "i1", "i3"]), (item, [])])

    assert u.values.tolist() == [[7.0] * 4]
    assert i.values[:2].tolist() == [list(range(8, 16)), list(range(8))]
    assert i.found.tolist() == [True, True, False]
    assert empty.values.shape == (0, 8)


def test_script_is_reloaded_when_redis_does_not_know_it(
    monkeypatch: pytest.MonkeyPatch, client: redis.Redis, store: OnlineStore
) -> None:
    import hashlib

    source = store_module.WRITE_SCRIPT + f"\n-- {uuid.uuid4().hex}\n"
    sha = hashlib.sha1(source.encode()).hexdigest()
    monkeypatch.setattr(store_module, "WRITE_SCRIPT", source)
    monkeypatch.setattr(store_module, "WRITE_SCRIPT_SHA", sha)
    assert client.script_exists(sha) == [False]

    result = store.write_batch(layout(d=2), ["a", "b"], [[1, 2], [3, 4]], [T0, T0])

    assert result.written == 2
    assert client.script_exists(sha) == [True]
    assert store.read_batch(layout(d=2), ["a", "b"]).values.tolist() == [[1, 2], [3, 4]]


def test_input_errors_name_the_view_and_the_shapes(store: OnlineStore) -> None:
    lay = layout(d=3)
    with pytest.raises(StoreInputError, match=r"'item_profile'.*\(2, 3\).*got shape \(2, 4\)"):
        store.write_batch(lay, ["a", "b"], np.zeros((2, 4)), [T0, T0])
    with pytest.raises(StoreInputError, match=r"one time per entity \(2\); got shape \(3,\)"):
        store.write_batch(lay, ["a", "b"], np.zeros((2, 3)), [T0, T0, T0])
    with pytest.raises(StoreInputError, match="must be integers"):
        store.write_batch(lay, ["a"], np.zeros((1, 3)), [1.5])
    with pytest.raises(StoreInputError, match=r"entity ids must be str; got 42 \(int\)"):
        store.read_batch(lay, ["a", 42])  # type: ignore[list-item]


def test_unreachable_redis_raises_store_unavailable() -> None:
    down = OnlineStore.from_url("redis://127.0.0.1:1/0", socket_connect_timeout=0.2)
    with pytest.raises(
        StoreUnavailableError, match=r"127\.0\.0\.1:1/0 is unavailable while reading views item_profile"
    ):
        down.read_batch(layout(), ["a"])
    with pytest.raises(StoreUnavailableError, match="writing view 'item_profile'"):
        down.write_batch(layout(d=1), ["a"], [[1.0]], [T0])


def test_a_value_valid_over_an_interval_is_compared_at_the_stored_time(
    client: redis.Redis, store: OnlineStore
) -> None:
    """write.lua ARGV[5] (the realtime tier after a restore): per row, the last boundary its value holds
    at. A stored event time inside (event time, valid to] dates the row there: written when its payload
    differs (another run's value at that time), unchanged when equal; outside, the rule as ever."""
    from headwater.pipelines.store import codec

    lay = layout(d=2)
    keys = [f"{store.namespace}:{{{lay.view}}}:{k}" for k in ("a", "b", "c", "d")]
    store.write_batch(lay, ["a", "b", "c", "d"], [[0, 0], [1, 1], [0, 0], [0, 0]], [T0 + 25] * 4,
                      write_time_ms=T0 + 1)  # fmt: skip

    expire = int(time.time() * 1000) + 3_600_000

    def write(values: list[list[float]], times: list[int], valid_to: list[int]) -> bytes:
        vals = np.asarray(values, np.float32)
        rec = codec.pack(vals, np.array(times), T0 + 2, expire, lay.schema_hash, "reg-1").tobytes()
        to = np.array(valid_to, dtype="<i8").tobytes()  # ARGV[4] empty: no fence
        return bytes(
            client.eval(store_module.WRITE_SCRIPT, 4, *keys, expire, codec.record_size(2), rec, "", to)
        )

    # a: other payload, 25 inside [5, 25]: written at 25; b: same payload: unchanged; c: 25 outside
    # [5, 20]: stale; d: valid_to not past the event time: the plain rule (30 is newer: written at 30)
    status = write([[1, 1], [1, 1], [1, 1], [2, 2]], [T0 + 5, T0 + 5, T0 + 5, T0 + 30],
                   [T0 + 25, T0 + 40, T0 + 20, T0 + 30])  # fmt: skip
    assert status == b"1201"
    read = store.read_batch(lay, ["a", "b", "c", "d"])
    assert read.values.tolist() == [[1, 1], [1, 1], [0, 0], [2, 2]]
    assert read.event_time_ms.tolist() == [T0 + 25, T0 + 25, T0 + 25, T0 + 30]
    assert read.write_time_ms.tolist() == [T0 + 2, T0 + 1, T0 + 1, T0 + 2]
    assert 3_000_000 < client.pttl(keys[0]) <= 3_600_000  # the rewritten value takes the call's expiry
    # the freshness log counts the rewritten row at the stored time
    entry = client.xrevrange(f"{store.namespace}:fresh:{{{lay.view}}}", count=1)[0][1]
    assert (entry[b"n"], entry[b"s"]) == (b"2", f"{T0 + 25}:1,{T0 + 30}:1".encode())
    with pytest.raises(redis.ResponseError, match="8 bytes of valid-to for 4 keys"):
        client.eval(
            store_module.WRITE_SCRIPT, 4, *keys, 0, codec.record_size(2), b"\0" * 4 * 80, "", b"\0" * 8
        )
