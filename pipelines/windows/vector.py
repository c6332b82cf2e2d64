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

# Dictionary ids, assigned atomically: KEYS = (the hash, its counter), ARGV = values; returns their ids.
# The JVM sink of the realtime tier runs this same text (pipelines/realtime/program.py ships it).
# Past MAX_DICTIONARY_ID a new value gets OVERFLOW_ID (and no entry), so no two values ever share
# a float32 slot value; the counter stops instead of growing into ids float32 rounds together.
ASSIGN_LUA = f"""
local out = {{}}
for i = 1, #ARGV do
  local id = redis.call('HGET', KEYS[1], ARGV[i])
  if not id then
    if tonumber(redis.call('GET', KEYS[2]) or '0') >= {MAX_DICTIONARY_ID} then
      id = {OVERFLOW_ID}
    else
      id = redis.call('INCR', KEYS[2])
      redis.call('HSET', KEYS[1], ARGV[i], id)
    end
  end
  out[i] = tonumber(id)
end
return out
"""


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

    Ids start at 1 and are assigned atomically by a Lua script (HGET, else INCR a counter in
    the same hash slot and HSET), so every tier and process gets the same id for a value.
    """

    def __init__(self, client: Any, namespace: str = "hw") -> None:
        self.client = client
        self.namespace = namespace
        self._script = client.register_script(ASSIGN_LUA)
        self._cache: dict[str, dict[str, int]] = {}

    def key(self, field: str) -> str:
        """Return the hash that maps values of ``field`` to ids."""
        return f"{self.namespace}:dict:{{{field}}}"

    def ids(self, field: str, values: Sequence[Any]) -> list[int]:
        """Ids of ``values`` (as their str), assigning new ones for unseen values."""
        cache = self._cache.setdefault(field, {})
        texts = [str(v) for v in values]
        missing = sorted({t for t in texts if t not in cache})
        for s in range(0, len(missing), 500):
            chunk = missing[s : s + 500]
            got = self._script(keys=[self.key(field), self.key(field) + ":next"], args=chunk)
            cache.update(zip(chunk, (int(i) for i in got), strict=True))
        return [cache[t] for t in texts]

    def lookup(self, field: str, values: Iterable[Any]) -> dict[str, int | None]:
        """Existing ids of ``values`` without assigning (None where unknown)."""
        texts = [str(v) for v in values]
        if not texts:
            return {}
        got = self.client.hmget(self.key(field), texts)
        return {t: int(g) if g is not None else None for t, g in zip(texts, got, strict=True)}
