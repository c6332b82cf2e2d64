"""The freshness report as a text table for people, one row per view, tiers in order."""

from __future__ import annotations

from headwater.pipelines.freshness.report import FAILING, Pair, Report, ViewFreshness


def fmt_s(seconds: float | None) -> str:
    """Format a duration for people: ``850ms``, ``4.2s``, ``3m05s``, ``2h10m``, ``1d03h``; ``-`` for none."""
    if seconds is None:
        return "-"
    sign = "-" if seconds < 0 else ""
    s = abs(seconds)
    if s < 1:
        return f"{sign}{s * 1000:.0f}ms"
    if s < 60:
        return f"{sign}{s:.1f}s"
    if s < 3600:
        return f"{sign}{int(s // 60)}m{int(s % 60):02d}s"
    if s < 86400:
        return f"{sign}{int(s // 3600)}h{int(s % 3600 // 60):02d}m"
    return f"{sign}{int(s // 86400)}d{int(s % 86400 // 3600):02d}h"


def _pair(p: Pair) -> str:
    return f"{fmt_s(p.p50)} / {fmt_s(p.p99)}"


HEADER = (
    "tier",
    "view",
    "SLA",
    "lag now p50/p99",
    "lag win p50/p99",
    "age now",
    "age win p50/p99",
    "rows",
    "catch-up",
    "verdict",
)


def row_cells(v: ViewFreshness) -> tuple[str, ...]:
    """Cells of one view's row of the table, in :data:`HEADER` order."""
    verdict = v.verdict.upper() if v.verdict in FAILING else v.verdict
    if v.lag_over_sla:
        verdict += " (lag>sla)"
    return (
        v.tier,
        v.view,
        fmt_s(v.sla_s),
        _pair(v.lag_now),
        _pair(v.lag_window),
        fmt_s(v.age_now_s),
        _pair(v.age_window),
        str(v.rows_window),
        catch_up_cell(v),
        verdict,
    )


def catch_up_cell(v: ViewFreshness) -> str:
    """``12.0s`` (caught up after that long), ``2m05s so far`` (not yet), ``-`` (not judged so)."""
    if v.catch_up_s is None:
        return "-"
    return fmt_s(v.catch_up_s) + ("" if v.caught_up_ms is not None else " so far")


def summary(report: Report) -> str:
    """Return the report's one-line verdict; the text table and the HTML page both show it."""
    with_data = sum(1 for v in report.views if v.age_now_s is not None)
    judged = ", each judged after its catch-up" if report.after_catch_up else ""
    line = (
        f"window {fmt_s(report.window_s)}{judged}: {len(report.views)} views, {with_data} with data,"
        f" {len(report.breached)} in breach"
    )
    if report.breached:
        line += ": " + ", ".join(v.view for v in report.breached)
    if report.catching_up:
        line += f"; {len(report.catching_up)} catching up: " + ", ".join(v.view for v in report.catching_up)
    return line


def repair_lines(report: Report) -> list[str]:
    """Return one line per view with repair counters: what the tier's reconciliation passes did."""
    lines = []
    for v in report.views:
        r = v.repair
        if r is None:
            continue
        c = r.counts
        last = "no pass finished yet"
        if r.last_pass_ms is not None:
            ago = fmt_s((report.now_ms - r.last_pass_ms) / 1000)
            last = f"last pass {ago} ago repaired {r.last_repaired}"
        lines.append(
            f"repair {r.tier} {v.view}: {c.repaired} repaired ({c.missing} missing, {c.stale} stale) of"
            f" {c.checked} checked in {r.passes} passes; {last}"
        )
    return lines


def render_text(report: Report) -> str:
    """Render the report as an aligned table with a closing summary line (and the repair counters)."""
    rows = [HEADER, *(row_cells(v) for v in report.views)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(HEADER))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines.append("")
    lines.append(summary(report))
    repairs = repair_lines(report)
    if repairs:
        lines += ["", *repairs]
    return "\n".join(lines) + "\n"
