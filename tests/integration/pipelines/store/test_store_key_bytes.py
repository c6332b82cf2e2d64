r"""Entity ids of any Unicode are data in the online store (issue 33): keys, change feed, SCAN patterns.

Against the real Redis: ids holding ``\x1f``, ``\n``, ``\x00``, glob characters, braces, colons and
lone surrogates are written and read back by value, named exactly by the change feed, found by
the view's ``SCAN MATCH`` pattern; a namespace full of glob characters deletes its own keys and
none of a neighbour's.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import numpy as np
import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from headwater.pipelines.keycodec import pack_parts
from headwater.pipelines.store import OnlineStore, StoreInputError, ViewLayout
from headwater.pipelines.store.layout import changes_key, feed_entry_ids, key_pattern

T0 = 1_760_000_000_000
NASTY = ["\x1f", "\n", "\x00", "*", "?", "[", "]", "{", "}", "\\", ":", "^", "é", "\ud800", " "]
ID = st.text(st.characters(codec=None) | st.sampled_from(NASTY), min_size=0, max_size=20)
LAYOUT = ViewLayout(view="item_keys", entity="item", features=("a", "b"), ttl_s=600, version="v1")


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    c = redis.Redis.from_url(redis_url.rsplit("/", 1)[0] + "/13")
    yield c
    c.close()


@pytest.fixture
def namespaces(client: redis.Redis) -> Iterator[list[str]]:
    """Namespaces a test uses (unique prefix); every key under them is deleted afterwards."""
    used: list[str] = []
    yield used
    prefixes = tuple(f"{ns}:".encode() for ns in used)
    keys = [k for k in client.scan_iter(match="hwkeys-*", count=1000) if k.startswith(prefixes)]
    if keys:
        client.delete(*keys)


def _ns(namespaces: list[str], extra: str = "") -> str:
    ns = f"hwkeys-{uuid.uuid4().hex[:8]}{extra}"
    namespaces.append(ns)
    return ns


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ids=st.lists(ID, min_size=1, max_size=12, unique=True))
def test_any_ids_round_trip_through_keys_feed_and_scan(
    client: redis.Redis, namespaces: list[str], ids: list[str]
) -> None:
    store = OnlineStore(client, namespace=_ns(namespaces, "*?["))
    feed = changes_key(LAYOUT.view, store.namespace)
    client.xadd(feed, {"k": b""})  # what the index refresher does to subscribe
    values = np.arange(2 * len(ids), dtype=np.float32).reshape(-1, 2)
    written = store.write_batch(LAYOUT, ids, values, T0)
    assert written.written == len(ids)
    got = store.read_batch(LAYOUT, ids)
    assert got.found.all()
    np.testing.assert_array_equal(got.values, values)
    entries = [fields for _, fields in client.xrange(feed)]
    assert feed_entry_ids(entries[0]) is None  # the subscription names no write
    assert [feed_entry_ids(e) for e in entries[1:]] == [ids]
    assert entries[1][b"e"] == pack_parts(ids)  # write.lua writes what keycodec reads
    scanned = set(client.scan_iter(match=key_pattern(LAYOUT.view, store.namespace), count=1000))
    assert scanned == set(store.keys(LAYOUT, ids))
    assert store.delete_view(LAYOUT.view) == len(ids)
    assert not store.read_batch(LAYOUT, ids).found.any()


def test_delete_view_of_a_glob_namespace_leaves_its_neighbours(
    client: redis.Redis, namespaces: list[str]
) -> None:
    base = _ns(namespaces)
    glob = OnlineStore(client, namespace=_ns(namespaces, "*"))
    wild = OnlineStore(client, namespace=glob.namespace.replace("*", "?"))
    neighbour = OnlineStore(client, namespace=glob.namespace.replace("*", "x"))
    namespaces += [wild.namespace, neighbour.namespace, base]
    ids = ["a", "b*", "c[1]", "\x1f\n"]
    for s in (glob, wild, neighbour):
        s.write_batch(LAYOUT, ids, np.ones((len(ids), 2), dtype=np.float32), T0)
    # Before issue 33 the pattern escaped only braces: "<ns>*:\{item_keys\}:*" matched all three.
    assert glob.delete_view(LAYOUT.view) == len(ids)
    assert not glob.read_batch(LAYOUT, ids).found.any()
    assert wild.read_batch(LAYOUT, ids).found.all()
    assert neighbour.read_batch(LAYOUT, ids).found.all()
    assert wild.delete_view(LAYOUT.view) == len(ids)
    assert neighbour.read_batch(LAYOUT, ids).found.all()


def test_an_old_newline_feed_entry_is_still_read(client: redis.Redis, namespaces: list[str]) -> None:
    store = OnlineStore(client, namespace=_ns(namespaces))
    feed = changes_key(LAYOUT.view, store.namespace)
    client.xadd(feed, {"k": b"a1\na2"})  # what write.lua wrote before the length-prefixed field
    assert [feed_entry_ids(f) for _, f in client.xrange(feed)] == [["a1", "a2"]]


@pytest.mark.parametrize("namespace", ["", "a{b", "a}b", "{x}"])
def test_a_namespace_with_braces_is_refused(client: redis.Redis, namespace: str) -> None:
    with pytest.raises(StoreInputError, match="namespace"):
        OnlineStore(client, namespace=namespace)
