"""Rendering of ``check`` results: the text summary and the JSON document."""

from __future__ import annotations

from typing import Any

from headwater.registry.budget import totals
from headwater.registry.compiled import CheckResult
from headwater.registry.tiers import TIER_NAMES


def budget_rows(result: CheckResult) -> list[dict[str, Any]]:
    """Charged total and budget per tier and per listed owner."""
    budget = result.budget
    rows: list[dict[str, Any]] = []
    by_tier = totals(result.views, "tier")
    for tier in TIER_NAMES:
        limit = {str(k): v for k, v in budget.tiers.items()}.get(tier) if budget else None
        rows.append(
            {"kind": "tier", "name": tier, "charged": round(by_tier.get(tier, 0.0), 4), "budget": limit}
        )
    by_owner = totals(result.views, "owner")
    for owner, limit in sorted(budget.owners.items()) if budget else []:
        rows.append(
            {"kind": "owner", "name": owner, "charged": round(by_owner.get(owner, 0.0), 4), "budget": limit}
        )
    return rows


def check_text(result: CheckResult) -> str:
    """Diagnostics, then a one-line verdict and the budget table."""
    lines = [d.format() for d in result.diagnostics.sorted()]
    errors, warnings = len(result.diagnostics.errors), len(result.diagnostics.warnings)
    verdict = "FAILED" if errors else "OK"
    checked = len(result.views) + len(result.on_demand)  # on-demand views too
    lines.append(
        f"{verdict}: {result.view_files} view file(s), {checked} view(s) checked; "
        f"{errors} error(s), {warnings} warning(s)"
    )
    for row in budget_rows(result):
        limit = "no budget" if row["budget"] is None else f"{row['budget']:g}"
        lines.append(f"  {row['kind']:<5} {row['name']:<20} {row['charged']:>8.2f} / {limit} CPU-h/day")
    for od in result.on_demand:  # request-time views cost serving CPU, on no tier's budget
        lines.append(
            f"  on_demand {od.name}: {len(od.features)} feature(s), 0 CPU-h/day on every tier;"
            f" computed in the service per request ({od.ops} vector ops over the candidates)"
        )
    return "\n".join(lines)


def check_json(result: CheckResult) -> dict[str, Any]:
    """Build the ``--format json`` document."""
    return {
        "ok": result.ok,
        "errors": len(result.diagnostics.errors),
        "warnings": len(result.diagnostics.warnings),
        "diagnostics": [d.to_json() for d in result.diagnostics.sorted()],
        "views": [
            {
                "name": v.name,
                "tier": v.tier,
                "owner": v.owner,
                "freshness_sla_s": v.freshness_sla.seconds,
                "compute_cost": v.compute_cost,
                "estimated_cost": round(v.estimated_cost, 4),
                "charged_cost": round(v.charged_cost, 4),
                "file": v.file,
                "line": v.line,
            }
            for v in result.views
        ],
        "budget": budget_rows(result),
        "on_demand": [
            {
                "name": od.name,
                "features": [f.name for f in od.features],
                "ops_per_request": od.ops,
                "cpu_hours_per_day": 0.0,
                "file": od.file,
                "line": od.line,
            }
            for od in result.on_demand
        ],
    }
