"""Repair counters of the streaming tiers, kept in Redis beside each view's write log.

The nearline tier's reconciliation pass (:mod:`headwater.pipelines.nearline.repair`) compares the
values it computed with what the online store holds and rewrites what is missing or older. What each
step of a pass found is added to one hash per view, ``<namespace>:repair:{<view>}`` (the view's hash
tag: the same cluster slot as its values and write log), so every reader of the store sees it:
``headwater freshness`` (a line per view under the table), its ``--json`` and ``/metrics``
(``headwater_repair_keys_total{view, tier, kind}``).

Fields (integers; counts since the hash was created, never reset by a worker restart):

- ``checked``: keys compared with the state; ``missing``: no value (or one of another layout);
  ``stale``: an older or different value than the state's at the view's boundary; ``repaired``: rows
  the fenced write put back (a row whose stored value turned newer in between is not counted);
- ``passes``: passes finished; ``last_pass_ms``: when the last one finished (epoch ms);
  ``last_repaired``: rows the last finished pass repaired.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from headwater.pipelines.freshness.samples import _call
from headwater.pipelines.store.layout import DEFAULT_NAMESPACE

COUNT_FIELDS = ("checked", "missing", "stale", "repaired")


@dataclass(frozen=True)
class RepairCounts:
    """What a repair step (or pass) found for one view."""

    checked: int = 0
    missing: int = 0
    stale: int = 0
    repaired: int = 0

    def __add__(self, other: RepairCounts) -> RepairCounts:
        return RepairCounts(
            self.checked + other.checked,
            self.missing + other.missing,
            self.stale + other.stale,
            self.repaired + other.repaired,
        )

    def as_dict(self) -> dict[str, int]:
        """Return the counts by :data:`COUNT_FIELDS` name."""
        return {name: int(getattr(self, name)) for name in COUNT_FIELDS}


@dataclass(frozen=True)
class RepairStatus:
    """A view's repair hash as read back: totals, finished passes, the last pass."""

    counts: RepairCounts
    passes: int = 0
    last_pass_ms: int | None = None
    last_repaired: int = 0
    tier: str = "nearline"


def repair_key(view: str, namespace: str = DEFAULT_NAMESPACE) -> str:
    """Return the key of ``view``'s repair counters: ``<namespace>:repair:{<view>}``."""
    return f"{namespace}:repair:{{{view}}}"


def add_repair_counts(
    client: Any,
    counts: Mapping[str, RepairCounts],
    namespace: str = DEFAULT_NAMESPACE,
    finished: Mapping[str, RepairCounts] | None = None,
    now_ms: int = 0,
) -> None:
    """Add one step's ``counts`` (view -> counts) to each view's hash, in one pipelined round trip.

    ``finished``: the totals of a pass that ended with this step (view -> counts): ``passes`` goes
    up by one, ``last_pass_ms`` becomes ``now_ms`` and ``last_repaired`` that pass's repaired rows.
    """
    pipe = client.pipeline(transaction=False)
    for view, c in counts.items():
        key = repair_key(view, namespace)
        for name, value in c.as_dict().items():
            if value:
                pipe.hincrby(key, name, value)
    for view, total in (finished or {}).items():
        key = repair_key(view, namespace)
        pipe.hincrby(key, "passes", 1)
        pipe.hset(key, mapping={"last_pass_ms": int(now_ms), "last_repaired": total.repaired})
    pipe.execute()


def read_repair_status(
    client: Any, views: Sequence[str], namespace: str = DEFAULT_NAMESPACE
) -> dict[str, RepairStatus]:
    """Return the repair status of each of ``views`` that has one (one pipelined round trip).

    Raises:
        StoreError: Redis could not be read (StoreUnavailableError: not reachable).
    """
    if not views:
        return {}
    pipe = client.pipeline(transaction=False)
    for view in views:
        pipe.hgetall(repair_key(view, namespace))
    replies = _call(client, repair_key("*", namespace), pipe.execute)
    out: dict[str, RepairStatus] = {}
    for view, raw in zip(views, replies, strict=True):
        if raw:
            out[view] = parse_status(raw)
    return out


def parse_status(raw: Mapping[Any, Any]) -> RepairStatus:
    """Return a :class:`RepairStatus` from a hash's fields (bytes or str; a bad field counts 0)."""
    fields = {_text(k): _int(v) for k, v in raw.items()}
    counts = RepairCounts(*(fields.get(name, 0) for name in COUNT_FIELDS))
    last = fields.get("last_pass_ms")
    return RepairStatus(counts, fields.get("passes", 0), last or None, fields.get("last_repaired", 0))


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _int(value: Any) -> int:
    try:
        return int(_text(value))
    except ValueError:
        return 0
