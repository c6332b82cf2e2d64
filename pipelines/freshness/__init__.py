"""Freshness, end to end: pipeline lag and read-time age of every view against its SLA.

The online store's write script (``headwater/pipelines/store/write.lua``) appends one entry per
write call to a capped stream per view, whoever the writer is. This package reads those logs
(:mod:`.samples`), computes lag and age percentiles (:mod:`.stats`), reports them per view against
the SLA of the applied plans (:mod:`.report`, rendered by :mod:`.text` and :mod:`.html`), and
exposes them to Prometheus (:mod:`.metrics`). The CLI is ``headwater freshness``
(:mod:`headwater.cli.freshness`).
"""

from headwater.pipelines.freshness.report import (
    BREACH,
    NO_DATA,
    OK,
    FreshnessTarget,
    NoPlansError,
    Report,
    ViewFreshness,
    build_report,
    plan_views,
    view_freshness,
)
from headwater.pipelines.freshness.samples import Entry, SampleFormatError, parse_entry, read_entries
from headwater.pipelines.freshness.stats import Progress, weighted_quantiles

__all__ = [
    "BREACH",
    "NO_DATA",
    "OK",
    "Entry",
    "FreshnessTarget",
    "NoPlansError",
    "Progress",
    "Report",
    "SampleFormatError",
    "ViewFreshness",
    "build_report",
    "parse_entry",
    "plan_views",
    "read_entries",
    "view_freshness",
    "weighted_quantiles",
]
