"""Dictionary ids fit their float32 slots (issue 16 item 8), at the 2^24 boundary, on real Redis.

``top_k`` ids (and ``last`` of a text field) are stored as float32, exact only up to 2^24: two ids
above it can round to the same float and two values would read back as one. The dictionary
stops at ``MAX_DICTIONARY_ID``; later values get ``OVERFLOW_ID``, never another value's id.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import numpy as np
import pytest
import redis

from headwater.pipelines.windows.vector import MAX_DICTIONARY_ID, OVERFLOW_ID, RedisDictionary


@pytest.fixture
def dictionary(redis_url: str) -> Iterator[RedisDictionary]:
    client = redis.Redis.from_url(redis_url)
    namespace = f"hwtest-dict-{uuid.uuid4().hex[:8]}"
    yield RedisDictionary(client, namespace)
    keys = list(client.scan_iter(match=f"{namespace}:*"))
    if keys:
        client.delete(*keys)
    client.close()


def test_the_boundary_is_where_float32_stops_being_exact() -> None:
    assert MAX_DICTIONARY_ID == 2**24
    last = np.float32(MAX_DICTIONARY_ID)
    assert int(last) == MAX_DICTIONARY_ID
    assert np.float32(MAX_DICTIONARY_ID + 1) == last  # the collision the cap prevents
    assert OVERFLOW_ID == 0


def test_ids_stop_at_the_boundary_and_never_collide(dictionary: RedisDictionary) -> None:
    counter = dictionary.key("item_id") + ":next"
    dictionary.client.set(counter, MAX_DICTIONARY_ID - 2)  # as if 16.7M values were seen already
    ids = dictionary.ids("item_id", ["a", "b", "c", "d"])
    assert ids == [MAX_DICTIONARY_ID - 1, MAX_DICTIONARY_ID, OVERFLOW_ID, OVERFLOW_ID]
    slots = np.asarray(ids, dtype=np.float32)
    assert [int(x) for x in slots] == ids  # every id reads back exactly from its float32 slot
    assert int(dictionary.client.get(counter)) == MAX_DICTIONARY_ID  # the counter stopped
    # Known values keep their ids; a value past the cap stays unassigned (not written to the hash).
    fresh = RedisDictionary(dictionary.client, dictionary.namespace)  # no in-process cache
    assert fresh.ids("item_id", ["b", "a", "e"]) == [MAX_DICTIONARY_ID, MAX_DICTIONARY_ID - 1, OVERFLOW_ID]
    assert fresh.lookup("item_id", ["a", "c"]) == {"a": MAX_DICTIONARY_ID - 1, "c": None}


def test_ids_below_the_boundary_are_dense_from_one(dictionary: RedisDictionary) -> None:
    # New values get ids in sorted order within a call: android 1, ios 2, web 3.
    assert dictionary.ids("device", ["web", "ios", "web", "android"]) == [3, 2, 3, 1]
