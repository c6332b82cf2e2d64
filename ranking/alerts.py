"""``headwater alerts``: Prometheus alerting rules generated from the feature repo.

One group per concern, each rule built as data and written by a YAML emitter (never a template),
so a view or feature name cannot break the file:

1. ``headwater-freshness``: per view, the p99 read-time age over the freshness window
   (``headwater_read_age_window_seconds``, exported by the tiers' freshness collector) above the
   view's ``freshness_sla``;
2. ``headwater-expectations``: per feature and ``expect:`` key, over the gauges
   ``headwater monitor --metrics-file`` writes (:mod:`headwater.ranking.monitor_metrics`), plus one
   rule for a report that stopped being refreshed;
3. ``headwater-serving``: the share of answers scored by a model trained on another version of a
   view it reads (``headwater_model_answers_total{version_drift="true"}``) above 0.1%, and
   reconciliation passes that keep finding missing keys (``headwater_repair_keys_total``).

Only features of user and item views get expectation rules: they are the model inputs the
monitor sees (:func:`headwater.ranking.monitor.watched_columns`); others would never fire.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import yaml

from headwater.ranking import monitor_metrics as mm
from headwater.ranking.monitor import SIDES
from headwater.registry.compiled import CheckResult, CompiledView
from headwater.registry.errors import HeadwaterError

VERSION_DRIFT_SHARE = 0.001
"""The seed's feature version drift target: under 0.1% of the answers."""
MONITOR_STALE_S = 3 * 86_400
"""A report whose monitored day began longer ago than this (a daily run for yesterday is up to
two days old): the daily monitor has stopped."""
FRESHNESS_METRIC = "headwater_read_age_window_seconds"
ANSWERS_METRIC = "headwater_model_answers_total"
REPAIR_METRIC = "headwater_repair_keys_total"
Rule = dict[str, Any]


def quote(value: str) -> str:
    """Return ``value`` as a PromQL string literal (double quotes; backslash, quote, controls escaped)."""
    # PromQL strings use Go's escapes, which JSON's are a subset of for these characters.
    return json.dumps(value, ensure_ascii=False)


def selector(metric: str, **labels: str) -> str:
    """Return ``metric{label="value", ...}`` with every value quoted."""
    inner = ", ".join(f"{k}={quote(v)}" for k, v in labels.items())
    return f"{metric}{{{inner}}}" if inner else metric


def number(value: float) -> str:
    """Return ``value`` as PromQL reads it back exactly (``:g`` would round 1.265625 to 1.26562)."""
    x = float(value)
    return str(int(x)) if x.is_integer() and abs(x) < 1e15 else repr(x)


def _duration(seconds: float) -> str:
    """Return a Prometheus duration (whole seconds, at least 1)."""
    return f"{max(1, round(seconds))}s"


def freshness_rule(view: CompiledView) -> Rule:
    """Return the rule: the view's p99 read-time age above its SLA, for as long as the SLA (1-30 min)."""
    sla = view.freshness_sla.seconds
    expr = (
        f"max by (view, tier) ({selector(FRESHNESS_METRIC, view=view.name, quantile='0.99')}) > {number(sla)}"
    )
    return {
        "alert": "HeadwaterFreshnessSLA",
        "expr": expr,
        # Long enough not to page on one slow window, short enough to matter for a realtime view.
        "for": _duration(min(max(sla, 60.0), 1800.0)),
        "labels": {"severity": "critical", "view": view.name, "tier": view.tier, "owner": view.owner},
        "annotations": {
            "summary": f"{view.name} ({view.tier}): p99 read-time age above its SLA {view.freshness_sla}",
            "description": (
                f"Values of {view.name} are read older than freshness_sla {view.freshness_sla}"
                f" ({view.file}:{view.line}). Run `headwater freshness` for the tier's lag and boundary."
            ),
        },
    }


def expectation_rules(view: CompiledView) -> list[Rule]:
    """One rule per ``expect:`` key of each feature of ``view``, over the monitor's gauges."""
    if view.join_key not in SIDES:
        return []
    rules: list[Rule] = []
    for f in view.features:
        if f.expect is None:
            continue
        for check in mm.CHECKS:
            limit = getattr(f.expect, check)
            if limit is None:
                continue
            metric, op, agg = _EXPECT[check]
            sel = selector(metric, view=view.name, feature=f.name)
            rules.append(
                {
                    "alert": "HeadwaterFeatureExpectation",
                    "expr": f"{agg} by (view, feature, column) ({sel}) {op} {number(limit)}",
                    "labels": {"severity": "warning", "view": view.name, "feature": f.name, "check": check},
                    "annotations": {
                        "summary": f"{view.name}.{f.name}: expect {check} {number(limit)} breached",
                        "description": (
                            f"headwater monitor's last report breaches {f.name}'s expect: {check}"
                            f" ({view.file}:{f.line}). Run `headwater monitor` for the figures."
                        ),
                    },
                }
            )
    return rules


_EXPECT = {
    "min": (mm.SERVED_MIN, "<", "min"),
    "max": (mm.SERVED_MAX, ">", "max"),
    "max_missing_rate": (mm.MISSING_RATE, ">", "max"),
    "max_drift_psi": (mm.PSI, ">", "max"),
    "max_drift_ks": (mm.KS, ">", "max"),
}
"""An ``expect:`` key's gauge, the comparison that breaches it and how its columns are folded."""


def monitor_stale_rule() -> Rule:
    """Return the rule: the monitor's metrics file not refreshed for :data:`MONITOR_STALE_S`."""
    return {
        "alert": "HeadwaterMonitorStale",
        "expr": f"time() - max({mm.DAY}) > {MONITOR_STALE_S}",
        "for": "1h",
        "labels": {"severity": "warning"},
        "annotations": {
            "summary": "headwater monitor's metrics file is older than three days",
            "description": (
                "The daily `headwater monitor --metrics-file` has stopped: expectations are unchecked."
            ),
        },
    }


def serving_rules() -> list[Rule]:
    """Return the rules: version drift share above 0.1%, repair passes finding missing keys."""
    drifted = f"sum(rate({selector(ANSWERS_METRIC, version_drift='true')}[15m]))"
    return [
        {
            "alert": "HeadwaterVersionDrift",
            "expr": f"{drifted} / sum(rate({ANSWERS_METRIC}[15m])) > {number(VERSION_DRIFT_SHARE)}",
            "for": "15m",
            "labels": {"severity": "critical"},
            "annotations": {
                "summary": "More than 0.1% of answers scored by a model trained on another view version",
                "description": (
                    "Retrain on the applied registry or roll back the view change; headwater skew and"
                    " headwater_model_view_version_changed name the views."
                ),
            },
        },
        {
            "alert": "HeadwaterRepairMissingKeys",
            "expr": (f"sum by (view, tier) (increase({selector(REPAIR_METRIC, kind='missing')}[1h])) > 0"),
            "for": "2h",
            "labels": {"severity": "warning"},
            "annotations": {
                "summary": "{{ $labels.view }}: the repair pass keeps finding missing keys",
                "description": (
                    "The tier's reconciliation keeps writing keys the stream missed for two hours:"
                    " the tier is dropping writes. Check its dead letters and `headwater freshness`."
                ),
            },
        },
    ]


def alert_rules(views: Sequence[CompiledView]) -> dict[str, Any]:
    """Return the rules file (``groups``) for ``views``, views in name order."""
    ordered = sorted(views, key=lambda v: v.name)
    return {
        "groups": [
            {"name": "headwater-freshness", "rules": [freshness_rule(v) for v in ordered]},
            {
                "name": "headwater-expectations",
                "rules": [r for v in ordered for r in expectation_rules(v)] + [monitor_stale_rule()],
            },
            {"name": "headwater-serving", "rules": serving_rules()},
        ]
    }


def dump_rules(views: Sequence[CompiledView]) -> str:
    """Return the rules file as YAML text (keys in Prometheus' documented order)."""
    return str(yaml.safe_dump(alert_rules(views), sort_keys=False, allow_unicode=True, width=1000))


def rule_metrics(rules: dict[str, Any]) -> set[str]:
    """Return every ``headwater_`` metric name a rules file's expressions read."""
    names: Iterable[str] = (
        m
        for group in rules["groups"]
        for rule in group["rules"]
        for m in re.findall(r"\bheadwater_[a-z_]+", rule["expr"])
    )
    return set(names)


class AlertsError(HeadwaterError, ValueError):
    """The rules cannot be generated: a broken feature repo or an unwritable file; the message says which."""


def write_rules(registry: CheckResult, out: Path | None) -> str:
    """Return the rules text of a checked repo, written to ``out`` when given.

    Raises:
        AlertsError: the repo has errors (rules of a half-valid repo would miss views), or ``out``
            cannot be written.
    """
    if not registry.ok:
        msg = f"the feature repo {registry.root} has errors: run `headwater check` and fix them first"
        raise AlertsError(msg)
    text = dump_rules(registry.views)
    if out is not None:
        try:
            out.write_text(text, encoding="utf-8")
        except OSError as exc:
            msg = f"--out {out}: cannot write it ({exc.strerror or exc}); check the folder exists"
            raise AlertsError(msg) from exc
    return text
