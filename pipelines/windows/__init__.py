"""The window-aggregation core shared by every tier (semantics: docs/concepts/windows.md).

- :mod:`.spec`: a plan view compiled once (windows in ms, filters as predicates).
- :mod:`.reference`: :func:`reference_values`, the literal definition, the oracle of tests.
- :mod:`.aggs` and :mod:`.panes`: incremental per-pane partials for streaming tiers.
- :mod:`.vector`: the online vector (slots, top_k expansion, dictionary ids) and its layout.
"""

from headwater.pipelines.windows.aggs import NAN, Value, make_agg
from headwater.pipelines.windows.panes import PaneAggregator, Panes, incremental_values
from headwater.pipelines.windows.reference import dedup, empty_values, reference_values, split_late
from headwater.pipelines.windows.spec import FeatureSpec, ViewSpec, WindowSpecError, compile_view
from headwater.pipelines.windows.vector import (
    RedisDictionary,
    slot_names,
    to_vectors,
    view_layout,
)

__all__ = [
    "NAN",
    "FeatureSpec",
    "PaneAggregator",
    "Panes",
    "RedisDictionary",
    "Value",
    "ViewSpec",
    "WindowSpecError",
    "compile_view",
    "dedup",
    "empty_values",
    "incremental_values",
    "make_agg",
    "reference_values",
    "slot_names",
    "split_late",
    "to_vectors",
    "view_layout",
]
