"""One way to open the online store's Redis client from a URL: a single node or a Redis Cluster.

``redis://HOST:PORT/DB`` (and ``rediss://``, ``unix://``) opens a ``redis.Redis``;
``redis-cluster://HOST:PORT`` opens a ``redis.RedisCluster`` seeded with that node (it discovers
the others, and follows failovers and slot moves). Every key of one view, its freshness log and
each dictionary share a hash tag, so every command and script of the store touches one slot and
runs unchanged on a cluster (:mod:`headwater.pipelines.store.layout`).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import redis

from headwater.registry.errors import HeadwaterError

CLUSTER_SCHEME = "redis-cluster"


class StoreURLError(HeadwaterError, ValueError):
    """The online store's URL cannot be used; the message says what a valid one looks like."""


def is_cluster_url(url: str) -> bool:
    """Whether ``url`` names a Redis Cluster (``redis-cluster://HOST:PORT``)."""
    return url.startswith(CLUSTER_SCHEME + "://")


def redis_client(url: str, **client_kwargs: Any) -> redis.Redis[bytes] | redis.RedisCluster[bytes]:
    """Open a client for ``url``; ``client_kwargs`` (timeouts...) go to the redis-py constructor.

    Raises:
        StoreURLError: a cluster URL without a host and port, or with a database number (a cluster
            has only database 0).
    """
    if not is_cluster_url(url):
        return redis.Redis.from_url(url, **client_kwargs)
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError as exc:
        msg = f"online store URL {url!r}: the port is not a number; expected redis-cluster://HOST:PORT"
        raise StoreURLError(msg) from exc
    if not parts.hostname or port is None:
        msg = f"online store URL {url!r}: expected redis-cluster://HOST:PORT (any node of the cluster)"
        raise StoreURLError(msg)
    if parts.path not in ("", "/", "/0"):
        msg = f"online store URL {url!r}: a Redis Cluster has only database 0; drop {parts.path!r}"
        raise StoreURLError(msg)
    return redis.RedisCluster(host=parts.hostname, port=port, **client_kwargs)
