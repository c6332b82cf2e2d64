"""The training-set file's metadata keys, shared by the writer (offline tier) and the reader (serving).

A training set is Parquet (columns: see :mod:`headwater.ranking.training_set`); its schema
metadata records what the rows were computed from, so a model trained on it can say which feature
definitions it learned and the service can tell when the online store holds other ones.
"""

from __future__ import annotations

VERSION_KEY = b"headwater.registry_version"
"""The short registry version (:func:`headwater.registry.plans.short_version`) the set was built from."""
VIEW_VERSIONS_KEY = b"headwater.view_versions"
"""JSON ``{view: version}`` of every view whose slots are columns of the set."""
