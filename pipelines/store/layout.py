"""Where and how one feature view lives in Redis: key naming and the view's layout.

Key scheme: ``<namespace>:{<view>}:<entity_id>``, e.g. ``hw:{user_profile}:u42``. One key holds
one (view, entity) vector. The braces are a Redis Cluster hash tag: every key of a view maps
to the same slot, so a batched read of 500 items of one view is one ``MGET`` (one round trip)
and a batched write is one Lua call per chunk, on one cluster node.

The entity id is data, never syntax: it is the key's tail after ``<namespace>:{<view>}:`` (the
view name holds no brace or colon, :class:`ViewLayout`; the namespace no brace,
:func:`check_namespace`), so ``write.lua`` cuts it off at a known length and any bytes round-trip.
A ``SCAN MATCH`` pattern escapes every glob metacharacter of the prefix (:func:`key_pattern`).
The change feed names the written ids length-prefixed (:func:`feed_entry_ids`), not line by line.

Trade-off: a whole view lives on one slot, hence one primary. A very large or very hot view
cannot be spread over the cluster; its memory and its load sit on one node (scale it with
replicas for reads). The alternative, if a view outgrows one node, is to drop the hash tag
(or tag by ``<view>:<bucket>``), group the keys of a request by slot and send one ``MGET``
per slot group through a cluster pipeline: still one round trip per node, but several nodes
per request, and tail latency becomes the slowest node's.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field

from redis.crc import key_slot

from headwater.pipelines.keycodec import KeyFormatError, to_text, unpack_parts
from headwater.registry.errors import HeadwaterError

DEFAULT_NAMESPACE = "hw"
FRESHNESS_MAXLEN = 20_000  # entries kept per view in the freshness log; write.lua uses the same cap
MAX_VERSION_BYTES = 32
_NAME = re.compile(r"^[A-Za-z0-9_.\-]+$")
_GLOB = re.compile(r"([\\*?\[\]{}^])")
FEED_IDS_FIELD = b"e"
"""The change-feed field ``write.lua`` writes: the written ids, each ``<length>:<bytes>``."""
LEGACY_FEED_FIELD = b"k"
"""The field of feed entries written before (ids newline-separated; the refresher's creation entry)."""


class LayoutError(HeadwaterError, ValueError):
    """A view layout (view name, features, TTL or version) is not valid."""


def _check_name(what: str, value: str, view: str) -> None:
    if not isinstance(value, str) or not _NAME.match(value):
        msg = (
            f"view layout {view!r}: {what} must be a non-empty string of letters, digits, '_', '.'"
            f" or '-' (no braces or colons, they are part of the Redis key scheme); got {value!r}"
        )
        raise LayoutError(msg)


@dataclass(frozen=True)
class ViewLayout:
    """The packed layout of one feature view in the online store.

    Attributes:
        view: feature view name; the Redis Cluster hash tag of all its keys.
        entity: entity name (e.g. ``user``); informative, it is not part of the key.
        features: feature names, in the order of the packed float32 vector.
        ttl_s: time to live of each key after its last accepted write, in seconds; 0 = never.
        version: the view's version (what defines its values; ASCII, at most 32 bytes).
    """

    view: str
    entity: str
    features: tuple[str, ...]
    ttl_s: int = 0
    version: str = ""
    schema_hash: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        _check_name("view", self.view, str(self.view))
        _check_name("entity", self.entity, self.view)
        features = tuple(self.features)
        object.__setattr__(self, "features", features)
        if not features:
            msg = f"view layout {self.view!r}: needs at least one feature; got an empty feature list"
            raise LayoutError(msg)
        for name in features:
            _check_name("feature name", name, self.view)
        if len(set(features)) != len(features):
            dupes = sorted({f for f in features if features.count(f) > 1})
            msg = f"view layout {self.view!r}: feature names must be unique; repeated: {dupes}"
            raise LayoutError(msg)
        if isinstance(self.ttl_s, bool) or not isinstance(self.ttl_s, int) or self.ttl_s < 0:
            msg = f"view layout {self.view!r}: ttl_s must be an int >= 0 (0 = no expiry); got {self.ttl_s!r}"
            raise LayoutError(msg)
        try:
            encoded = self.version.encode("ascii")
        except (UnicodeEncodeError, AttributeError) as exc:
            msg = f"view layout {self.view!r}: version must be an ASCII string; got {self.version!r}"
            raise LayoutError(msg) from exc
        if len(encoded) > MAX_VERSION_BYTES:
            msg = (
                f"view layout {self.view!r}: version {self.version!r} is {len(encoded)} bytes, the value"
                f" header holds at most {MAX_VERSION_BYTES}; pass a short id (e.g. 12 hex digits of the"
                " registry digest)"
            )
            raise LayoutError(msg)
        object.__setattr__(self, "schema_hash", schema_hash(features))

    @property
    def dim(self) -> int:
        """Number of features, i.e. float32 values per packed vector."""
        return len(self.features)

    @property
    def ttl_ms(self) -> int:
        """TTL in milliseconds (0 = no expiry)."""
        return self.ttl_s * 1000


def check_namespace(namespace: str) -> str:
    """Return ``namespace`` when it can prefix keys: a non-empty string without braces.

    A brace in the namespace would move the Redis Cluster hash tag off the view name, and let
    ``write.lua`` read the view from the wrong part of a key.

    Raises:
        LayoutError: it cannot.
    """
    if not isinstance(namespace, str) or not namespace or "{" in namespace or "}" in namespace:
        msg = (
            f"online store namespace must be a non-empty string without '{{' or '}}' (they delimit the"
            f" view's hash tag in every key); got {namespace!r}"
        )
        raise LayoutError(msg)
    return namespace


def glob_escape(text: str) -> str:
    r"""Return ``text`` as a Redis glob pattern that matches it literally (``*?[]{}^\`` escaped)."""
    return _GLOB.sub(r"\\\1", text)


def key_pattern(view: str, namespace: str = DEFAULT_NAMESPACE) -> str:
    """Return the ``SCAN MATCH`` pattern of every value key of ``view`` (the prefix escaped, then ``*``)."""
    return glob_escape(key_prefix(view, namespace)) + "*"


def feed_entry_ids(fields: dict[bytes, bytes]) -> list[str] | None:
    """Return the entity ids one change-feed entry names, or None when it names no write.

    ``write.lua`` writes field ``e`` (each id ``<length>:<bytes>``,
    :func:`headwater.pipelines.keycodec.pack_parts`); an entry written before that has field ``k``
    (ids newline-separated), and the entry the reader creates the feed with has an empty ``k``.

    Raises:
        KeyFormatError: an ``e`` field that is not length-prefixed ids.
    """
    packed = fields.get(FEED_IDS_FIELD)
    if packed is not None:
        return [to_text(part) for part in unpack_parts(packed)]
    legacy = fields.get(LEGACY_FEED_FIELD)
    if not legacy:
        return None
    try:
        return legacy.decode("utf-8").split("\n")
    except UnicodeDecodeError as exc:
        msg = f"change-feed entry {legacy[:60]!r} is not UTF-8: {exc}"
        raise KeyFormatError(msg) from exc


def schema_hash(features: Sequence[str]) -> int:
    """CRC32 of the ordered feature names: a reader detects a vector packed in another order."""
    return zlib.crc32("\x1f".join(features).encode("utf-8")) & 0xFFFFFFFF


def key_prefix(view: str, namespace: str = DEFAULT_NAMESPACE) -> str:
    """Return the key prefix shared by every entity of ``view``: ``<namespace>:{<view>}:``."""
    return f"{namespace}:{{{view}}}:"


def entity_key(view: str, entity_id: str, namespace: str = DEFAULT_NAMESPACE) -> str:
    """Return the Redis key of one (view, entity) vector."""
    return f"{namespace}:{{{view}}}:{entity_id}"


def entity_keys(view: str, entity_ids: Sequence[str], namespace: str = DEFAULT_NAMESPACE) -> list[str]:
    """Return the Redis keys of many entities of one view, in order."""
    prefix = key_prefix(view, namespace)
    return [prefix + e for e in entity_ids]


def freshness_key(view: str, namespace: str = DEFAULT_NAMESPACE) -> str:
    """Return the key of ``view``'s freshness log, a capped stream written by ``write.lua``.

    ``<namespace>:fresh:{<view>}``: the same hash tag as the view's values, hence the same slot.
    """
    return f"{namespace}:fresh:{{{view}}}"


def changes_key(view: str, namespace: str = DEFAULT_NAMESPACE) -> str:
    """Return the key of ``view``'s change feed, a capped stream ``write.lua`` appends to while it exists.

    ``<namespace>:changes:{<view>}``: the view's hash tag, hence its slot. A reader creates it (the
    serving index refresher, for item views: ``headwater.serving.retrieval.refresh``); each write
    call that writes rows then appends one entry ``e`` = the written entity ids, each
    ``<length>:<bytes>`` (read with :func:`feed_entry_ids`).
    ``write.lua`` derives the same name from the row keys (as it does ``freshness_key``).
    """
    return f"{namespace}:changes:{{{view}}}"


def view_slot(view: str, namespace: str = DEFAULT_NAMESPACE) -> int:
    """Return the Redis Cluster slot (CRC16 mod 16384 of the hash tag) that holds every key of ``view``."""
    return int(key_slot(entity_key(view, "", namespace).encode("utf-8")))
