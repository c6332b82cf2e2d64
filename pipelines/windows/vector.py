"""The online vector of a view: slot names, the store layout, and values packed as float32.

One float32 slot per feature in plan order, except ``top_k`` which expands into 2k slots,
``<feature>.top<i>`` (dictionary id of the i-th value) then ``<feature>.share<i>``, i = 1..k.
A text value (``last`` of a string field) is stored as its dictionary id too. Dictionary ids
come from :class:`RedisDictionary`: one Redis hash per field, ``<ns>:dict:{<field>}``, values
mapped to small ints assigned atomically in Lua, shared by every tier.
The layout version is the view's own version (``PlanView.version``: what defines its values), so
editing another view, or this view's description, owner or cost, keeps the stored values current; the
event time written with a vector is the window boundary it was computed for.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from headwater.pipelines.store import ViewLayout
from headwater.pipelines.windows.aggs import Value
from headwater.pipelines.windows.spec import ViewSpec
from headwater.registry.slots import feature_slots

IdLookup = Callable[[str, Sequence[Any]], list[int]]
"""``(field, values) -> ids``: dictionary ids of values of one field (see :class:`RedisDictionary`)."""

MAX_DICTIONARY_ID = 2**24
"""Largest id a dictionary assigns: ids are stored in float32 slots, exact only up to 2^24."""
OVERFLOW_ID = 0
"""The id of every value that arrives once a field's dictionary is full (never a real value's id)."""

CACHE_BOUND = 1 << 16
"""Values of one field whose ids a process keeps (Python and the JVM sink); past it the cache starts over."""


def assign_script(max_id: int = MAX_DICTIONARY_ID) -> str:
    """Return the Lua text that assigns dictionary ids: KEYS = (the hash, its overflow count), ARGV = values.

    A new value's id is the hash's size plus one, read and written in one script: the mapping is its
    own counter, so no second key can be lost (kill -9, failover, eviction) and hand out ids that are
    taken already (the old design INCRed a separate ``:next`` key; an old hash keeps working, since
    every id it holds is at most its size). Entries are never deleted, which is what keeps size + 1
    unused. Past ``max_id`` a new value gets ``OVERFLOW_ID`` (and no entry), so no two values ever
    share a float32 slot value, and the overflow count grows: a full dictionary is counted, never a
    silent 0. The JVM sink of the realtime tier runs this same text (pipelines/realtime/program.py).
    """
    return f"""
local out = {{}}
local size = redis.call('HLEN', KEYS[1])
for i = 1, #ARGV do
  local id = redis.call('HGET', KEYS[1], ARGV[i])
  if not id then
    if size >= {max_id} then
      id = {OVERFLOW_ID}
      redis.call('INCR', KEYS[2])
    else
      size = size + 1
      id = size
      redis.call('HSET', KEYS[1], ARGV[i], id)
    end
  end
  out[i] = tonumber(id)
end
return out
"""


ASSIGN_LUA = assign_script()


def slot_names(view: ViewSpec) -> tuple[str, ...]:
    """Return the names of the view's float32 slots, in vector order."""
    return tuple(slot for f in view.features for slot in feature_slots(f.name, f.agg, f.k))


def view_layout(view: ViewSpec, ttl_s: int | None = None) -> ViewLayout:
    """Return the store layout of ``view``, stamped with its version.

    The TTL defaults to twice the longest window (in seconds).
    """
    ttl = 2 * view.longest_window_ms // 1000 if ttl_s is None else ttl_s
    return ViewLayout(
        view=view.name,
        entity=view.entity,
        features=slot_names(view),
        ttl_s=ttl,
        version=view.version,
    )


def dictionary_fields(view: ViewSpec) -> dict[str, str]:
    """Feature name -> the field whose values need dictionary ids (top_k and ``last``)."""
    return {f.name: f.field for f in view.features if f.field and f.agg in ("top_k", "last")}


def to_vectors(view: ViewSpec, rows: Sequence[Sequence[Value]], ids: IdLookup) -> npt.NDArray[np.float32]:
    """Pack rows of values (feature order) into an (n, slots) float32 matrix.

    Text values go through ``ids`` (one call per field for the whole batch).
    """
    fields = dictionary_fields(view)
    wanted: dict[str, set[Any]] = {}
    for i, f in enumerate(view.features):
        if f.name in fields:
            bag = wanted.setdefault(fields[f.name], set())
            for row in rows:
                v = row[i]
                if isinstance(v, tuple):
                    bag.update(val for val, _ in v)
                elif isinstance(v, str):
                    bag.add(v)
    table: dict[str, dict[Any, int]] = {}
    for field, values in wanted.items():
        ordered = sorted(values, key=str)
        table[field] = dict(zip(ordered, ids(field, ordered), strict=True))
    out = np.empty((len(rows), len(slot_names(view))), dtype=np.float32)
    for r, row in enumerate(rows):
        out[r] = _row(view, row, table)
    return out


def _row(view: ViewSpec, row: Sequence[Value], table: dict[str, dict[Any, int]]) -> list[float]:
    flat: list[float] = []
    for f, v in zip(view.features, row, strict=True):
        if f.agg == "top_k":
            pairs = v if isinstance(v, tuple) else ()
            lookup = table.get(f.field or "", {})
            tops = [float(lookup[val]) for val, _ in pairs] + [math.nan] * (f.k - len(pairs))
            shares = [float(s) for _, s in pairs] + [0.0] * (f.k - len(pairs))
            flat += tops + shares
        elif isinstance(v, str):
            flat.append(float(table[f.field or ""][v]))
        else:
            flat.append(float(v) if isinstance(v, (int, float)) else math.nan)
    return flat


class RedisDictionary:
    """Dictionary ids of field values in Redis (``<ns>:dict:{<field>}``), cached in-process.

    Ids start at 1 and are assigned atomically by a Lua script (:func:`assign_script`: HGET, else the
    hash's size + 1 and HSET), so every tier and process gets the same id for a value. ``max_id`` is
    smaller only in tests of the boundary.
    """

    def __init__(self, client: Any, namespace: str = "hw", max_id: int = MAX_DICTIONARY_ID) -> None:
        self.client = client
        self.namespace = namespace
        self._script = client.register_script(
            ASSIGN_LUA if max_id == MAX_DICTIONARY_ID else assign_script(max_id)
        )
        self._cache: dict[str, dict[str, int]] = {}

    def key(self, field: str) -> str:
        """Return the hash that maps values of ``field`` to ids."""
        return f"{self.namespace}:dict:{{{field}}}"

    def overflow_key(self, field: str) -> str:
        """Return the count of values ``field``'s full dictionary could not give an id (same slot)."""
        return self.key(field) + ":overflow"

    def overflowed(self, field: str) -> int:
        """How many values of ``field`` got ``OVERFLOW_ID`` because its dictionary was full."""
        return int(self.client.get(self.overflow_key(field)) or 0)

    def ids(self, field: str, values: Sequence[Any]) -> list[int]:
        """Ids of ``values`` (as their str), assigning new ones for unseen values."""
        cache = self._cache.setdefault(field, {})
        if len(cache) > CACHE_BOUND:  # bounded memory at any cardinality; ids stay in Redis
            cache.clear()
        texts = [str(v) for v in values]
        missing = sorted({t for t in texts if t not in cache})
        for s in range(0, len(missing), 500):
            chunk = missing[s : s + 500]
            got = self._script(keys=[self.key(field), self.overflow_key(field)], args=chunk)
            cache.update(zip(chunk, (int(i) for i in got), strict=True))
        return [cache[t] for t in texts]

    def lookup(self, field: str, values: Iterable[Any]) -> dict[str, int | None]:
        """Existing ids of ``values`` without assigning (None where unknown)."""
        texts = [str(v) for v in values]
        if not texts:
            return {}
        got = self.client.hmget(self.key(field), texts)
        return {t: int(g) if g is not None else None for t, g in zip(texts, got, strict=True)}
