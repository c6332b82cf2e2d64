"""Feature views for the realtime tier's tests, and the reference of its ``late`` verdict.

The views: every aggregation kind, and an item view of another slide. The unit tests of the JVM
operator's arithmetic and the integration tests of the whole job apply the same two views (with the
example repo's entities, sources and budget), so one definition is checked both ways.
"""

from __future__ import annotations

ALL_KINDS_VIEW = """\
feature_view: rt_all
entity: user
source: events
tier: realtime
freshness_sla: PT10S
compute_cost: 20
owner: feed-ranking
description: every aggregation kind, for the realtime tier's tests
features:
  - {name: clicks_10s, agg: count, where: "event_type = 'click'", window: 10s}
  - {name: dwell_count_20s, agg: count, field: dwell_ms, window: 20s}
  - {name: price_sum_20s, agg: sum, field: price, window: 20s}
  - {name: dwell_avg_20s, agg: avg, field: dwell_ms, where: "event_type = 'dwell'", window: 20s}
  - {name: position_min_20s, agg: min, field: position, window: 20s}
  - {name: position_max_20s, agg: max, field: position, window: 20s}
  - {name: last_item_20s, agg: last, field: item_id, window: 20s}
  - {name: last_position_10s, agg: last, field: position, window: 10s}
  - {name: sessions_20s, agg: distinct_count, field: session_id, window: 20s}
  - {name: top_categories_20s, agg: top_k, field: category, k: 2, window: 20s}
  - name: ctr_20s
    agg: ratio
    window: 20s
    numerator: {agg: count, where: "event_type = 'click'"}
    denominator: {agg: count, where: "event_type = 'impression'"}
"""
"""A user view with one feature of each aggregation kind (count with and without a field, last of a
text and of a number field), windows of 10 s and 20 s, slide 1 s."""

ITEM_VIEW = """\
feature_view: rt_items
entity: item
source: events
tier: realtime
freshness_sla: PT10S
compute_cost: 5
owner: feed-ranking
description: item counts with a 5 s slide
features:
  - {name: item_clicks_20s, agg: count, where: "event_type = 'click'", window: 20s, slide: 5s}
  - name: item_buyers_20s
    agg: distinct_count
    field: user_id
    where: "event_type = 'purchase'"
    window: 20s
    slide: 5s
"""
"""An item view (another join key) with a 5 s slide."""

CLICKS_VIEW = """\
feature_view: rt_clicks
entity: user
source: events
tier: realtime
freshness_sla: PT10S
compute_cost: 2
owner: feed-ranking
description: user clicks and spend, in the same group as rt_all (user, 1 s slide)
features:
  - {name: clicks_15s, agg: count, where: "event_type = 'click'", window: 15s}
  - {name: spend_15s, agg: sum, field: price, window: 15s}
"""
"""A second user view with a 1 s slide: it shares rt_all's window operator (group ``user_id@1000``), so a
change of one view's version inside a group is tested (issue 14: restore keeps the other's panes)."""


def edit_metadata(text: str) -> str:
    """Return a view's YAML with its description and owner changed: its version must not change."""
    lines = [
        "description: edited, nothing that defines a value" if line.startswith("description:") else line
        for line in text.splitlines()
    ]
    return "\n".join("owner: another-team" if line.startswith("owner:") else line for line in lines) + "\n"
