"""The ``online_store`` section of a generated ``feature_store.yaml`` (no Feast import here).

The registry calls :func:`online_store_section` when it writes the Feast repo, so Feast's
``get_online_features`` reads the same Redis keys as :class:`headwater.pipelines.store.OnlineStore`.
"""

from __future__ import annotations

from headwater.pipelines.store.layout import DEFAULT_NAMESPACE

PLUGIN_TYPE = "headwater.pipelines.store.feast_plugin.HeadwaterOnlineStore"


def online_store_section(
    redis_url: str, namespace: str = DEFAULT_NAMESPACE, key_ttl_seconds: int | None = None
) -> dict[str, object]:
    """Return the mapping to put under ``online_store:`` in ``feature_store.yaml``.

    Args:
        redis_url: ``redis://host:port/db`` of the online store (``Settings.from_env().redis_url``).
        namespace: key namespace, the ``hw`` in ``hw:{view}:entity``; must match the writers'.
        key_ttl_seconds: TTL for writes made through Feast (``materialize``, ``write_to_online_store``);
            None uses each FeatureView's ``ttl`` (0 = no expiry).
    """
    section: dict[str, object] = {"type": PLUGIN_TYPE, "redis_url": redis_url, "namespace": namespace}
    if key_ttl_seconds is not None:
        section["key_ttl_seconds"] = key_ttl_seconds
    return section
