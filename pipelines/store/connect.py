"""One way to open the online store's Redis client from a URL: a single node or a Redis Cluster.

``redis://HOST:PORT/DB`` (and ``rediss://``, ``unix://``) opens a ``redis.Redis``;
``redis-cluster://HOST:PORT`` opens a ``redis.RedisCluster`` seeded with that node (it discovers
the others, and follows failovers and slot moves); ``rediss-cluster://`` is the same over TLS. Every
form takes an ACL user and password (``rediss://USER:PASSWORD@HOST:PORT/0?ssl_ca_certs=ca.pem``);
:func:`redact_url` is how such a URL is shown (``headwater config``, messages, logs). Every key of
one view, its freshness log and each dictionary share a hash tag, so every command and script of the
store touches one slot and runs unchanged on a cluster (:mod:`headwater.pipelines.store.layout`).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import redis

from headwater.registry.errors import HeadwaterError
from headwater.registry.security import redact_url

__all__ = [
    "CLUSTER_SCHEME",
    "TLS_CLUSTER_SCHEME",
    "EvictingStoreError",
    "StoreURLError",
    "check_eviction_policy",
    "cluster_options",
    "is_cluster_url",
    "redact_url",
    "redis_client",
]

CLUSTER_SCHEME = "redis-cluster"
TLS_CLUSTER_SCHEME = "rediss-cluster"
"""A Redis Cluster over TLS: ``rediss-cluster://USER:PASSWORD@HOST:PORT?ssl_ca_certs=/ca.pem``."""
SAFE_POLICY = "noeviction"
"""The one ``maxmemory-policy`` under which Redis never drops a value the tiers wrote."""

CLUSTER_QUERY_OPTIONS = ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_cert_reqs", "ssl_check_hostname")
"""The query options of a cluster URL (the TLS files); redis-py's ``from_url`` takes them for one node."""


class StoreURLError(HeadwaterError, ValueError):
    """The online store's URL cannot be used; the message says what a valid one looks like."""


class EvictingStoreError(HeadwaterError):
    """The online store may evict values (a memory limit with an evicting policy) and none was declared."""


def is_cluster_url(url: str) -> bool:
    """Whether ``url`` names a Redis Cluster (``redis-cluster://`` or, over TLS, ``rediss-cluster://``)."""
    return url.startswith((CLUSTER_SCHEME + "://", TLS_CLUSTER_SCHEME + "://"))


def redis_client(url: str, **client_kwargs: Any) -> redis.Redis[bytes] | redis.RedisCluster[bytes]:
    """Open a client for ``url``; ``client_kwargs`` (timeouts...) go to the redis-py constructor.

    ``redis://`` and ``rediss://`` (TLS) URLs take an ACL user and password
    (``rediss://USER:PASSWORD@HOST:PORT/0?ssl_ca_certs=/ca.pem``); so do cluster URLs
    (:func:`cluster_options`).

    Raises:
        StoreURLError: a cluster URL without a host and port, with a database number (a cluster
            has only database 0) or an unknown option; the message shows the URL without its password.
    """
    if not is_cluster_url(url):
        return redis.Redis.from_url(url, **client_kwargs)
    return redis.RedisCluster(**cluster_options(url), **client_kwargs)


def cluster_options(url: str) -> dict[str, Any]:
    """Return ``redis.RedisCluster``'s keyword arguments for a cluster URL.

    They hold the seed node, the ACL user and password (percent-decoded), and TLS
    (``rediss-cluster://``, with the query's TLS files).

    Raises:
        StoreURLError: see :func:`redis_client`.
    """
    shown = redact_url(url)
    tls = url.startswith(TLS_CLUSTER_SCHEME + "://")
    expected = f"{TLS_CLUSTER_SCHEME if tls else CLUSTER_SCHEME}://[USER:PASSWORD@]HOST:PORT"
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        msg = f"online store URL {shown!r}: not a valid URL (the port must be a number); expected {expected}"
        raise StoreURLError(msg) from exc
    if not parts.hostname or port is None:
        msg = f"online store URL {shown!r}: expected {expected} (any node of the cluster)"
        raise StoreURLError(msg)
    if parts.path not in ("", "/", "/0"):
        msg = f"online store URL {shown!r}: a Redis Cluster has only database 0; end the URL at HOST:PORT"
        raise StoreURLError(msg)
    options: dict[str, Any] = {"host": parts.hostname, "port": port}
    if parts.username:
        options["username"] = unquote(parts.username)
    if parts.password:
        options["password"] = unquote(parts.password)
    query = parse_qs(parts.query)
    unknown = sorted(set(query) - set(CLUSTER_QUERY_OPTIONS))
    if unknown:
        msg = (
            f"online store URL {shown!r}: unknown option {', '.join(unknown)}; a cluster URL takes "
            f"{', '.join(CLUSTER_QUERY_OPTIONS)}"
        )
        raise StoreURLError(msg)
    if query and not tls:
        msg = f"online store URL {shown!r}: TLS options need {TLS_CLUSTER_SCHEME}://"
        raise StoreURLError(msg)
    if tls:
        options["ssl"] = True
        for name, values in query.items():
            value = unquote(values[-1])
            options[name] = value.lower() in ("1", "true", "yes") if name == "ssl_check_hostname" else value
    return options


def check_eviction_policy(client: Any, *, allowed: str = "refuse", tier: str = "this tier") -> str:
    """Refuse to write to a Redis that may evict values, unless ``redis.eviction: allow`` is declared.

    An evicted value is not an error anyone sees: it reads as missing until its entity changes again.
    A policy other than ``noeviction`` evicts only once ``maxmemory`` is reached, so a store without a
    memory limit (``maxmemory 0``) is safe under any policy. Every node of a cluster is asked. Returns
    the policy found (``unknown`` when the server refuses CONFIG GET, as managed services do; then
    nothing can be checked and the tier starts).

    Raises:
        EvictingStoreError: some node evicts at a memory limit and ``allowed`` is not ``"allow"``.
    """
    nodes = {"target_nodes": redis.RedisCluster.ALL_NODES} if isinstance(client, redis.RedisCluster) else {}
    try:
        policies = _node_values(client.config_get("maxmemory-policy", **nodes), "maxmemory-policy")
        limits = _node_values(client.config_get("maxmemory", **nodes), "maxmemory")
    except redis.ResponseError:
        return "unknown"
    evicting = sorted({p for p in policies if p != SAFE_POLICY})
    if evicting and any(int(limit) > 0 for limit in limits) and allowed != "allow":
        msg = (
            f"{tier}: the online store evicts values at its memory limit (maxmemory-policy "
            f"{', '.join(evicting)}), and an evicted feature value would read as missing until its entity "
            f"changes again. Run Redis with --maxmemory-policy {SAFE_POLICY} (or no maxmemory), or declare "
            "`redis: {eviction: allow}` in headwater.yaml to accept it"
        )
        raise EvictingStoreError(msg)
    return ",".join(sorted(set(policies))) or SAFE_POLICY


def _node_values(answer: Any, key: str) -> list[str]:
    """Values of ``key`` in a CONFIG GET answer: one node's mapping, or a cluster's mapping per node."""
    if key in answer:
        return [_text(answer[key])]
    return [_text(node[key]) for node in answer.values() if isinstance(node, dict) and key in node]


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
