"""The freshness report as one self-contained HTML page: a table and inline SVG plots per tier.

No scripts and no external resources: each view gets an SVG chart of the read-time age over the
window (``polyline.age``, a saw-tooth), the pipeline lag of each write (``circle.lag``) and its SLA
as a dashed horizontal line (``line.sla``). Charts are grouped per tier (``section.tier``).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from html import escape

from headwater.pipelines.freshness.report import FAILING, NO_DATA, Report, ViewFreshness
from headwater.pipelines.freshness.text import HEADER, fmt_s, row_cells, summary

W, H = 560, 200
LEFT, RIGHT, TOP, BOTTOM = 64, 12, 12, 28
STYLE = """
body{font-family:system-ui,sans-serif;margin:24px;color:#1d2330}
table{border-collapse:collapse;font-size:13px}
td,th{padding:3px 8px;border-bottom:1px solid #ddd;text-align:left}
.breach{color:#b3261e;font-weight:600}.ok{color:#1e7b34}.nodata{color:#777}
.charts{display:flex;flex-wrap:wrap;gap:16px}figure{margin:0}figcaption{font-size:13px;margin-bottom:4px}
svg{background:#fafbfc;border:1px solid #e3e6ea}.axis{stroke:#888}.grid{stroke:#e3e6ea}
.age{fill:none;stroke:#2f6fdf;stroke-width:1.5}.lag{fill:#e8871e}.sla{stroke:#b3261e;stroke-dasharray:6 4}
text{font-size:11px;fill:#444}
"""


def _clock(ms: float) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%H:%M:%S")


class _Scale:
    """Maps (time ms, seconds) to chart pixels."""

    def __init__(self, t0: float, t1: float, y_max: float) -> None:
        self.t0, self.t1, self.y_max = t0, max(t1, t0 + 1), max(y_max, 1e-3)

    def x(self, t: float) -> float:
        return LEFT + (t - self.t0) / (self.t1 - self.t0) * (W - LEFT - RIGHT)

    def y(self, v: float) -> float:
        return H - BOTTOM - min(max(v, 0.0), self.y_max) / self.y_max * (H - TOP - BOTTOM)


def _axes(s: _Scale, sla_s: float) -> list[str]:
    out = [
        f'<line class="axis" x1="{LEFT}" y1="{H - BOTTOM}" x2="{W - RIGHT}" y2="{H - BOTTOM}"/>',
        f'<line class="axis" x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{H - BOTTOM}"/>',
        f'<text x="{LEFT}" y="{H - 8}">{_clock(s.t0)}</text>',
        f'<text x="{W - RIGHT}" y="{H - 8}" text-anchor="end">{_clock(s.t1)} UTC</text>',
    ]
    for v in (0.0, s.y_max / 2, s.y_max):
        y = s.y(v)
        out.append(f'<line class="grid" x1="{LEFT}" y1="{y:.1f}" x2="{W - RIGHT}" y2="{y:.1f}"/>')
        label = fmt_s(v) if v else "0"
        out.append(f'<text x="{LEFT - 4}" y="{y + 4:.1f}" text-anchor="end">{label}</text>')
    y = s.y(sla_s)
    out.append(f'<line class="sla" x1="{LEFT}" y1="{y:.1f}" x2="{W - RIGHT}" y2="{y:.1f}"/>')
    out.append(f'<text x="{W - RIGHT - 2}" y="{y - 3:.1f}" text-anchor="end">SLA {fmt_s(sla_s)}</text>')
    return out


def chart(v: ViewFreshness, start_ms: int, end_ms: int) -> str:
    """One view's SVG: age saw-tooth, lag dots, SLA line; a 'no data' note when the log is empty."""
    peak = max([a for _, a in v.age_series] + [m for _, _, m in v.lag_series] + [0.0])
    s = _Scale(start_ms, end_ms, max(v.sla_s * 1.25, peak * 1.05))
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}"'
        f' role="img" aria-label="freshness of {escape(v.view)}">'
    ]
    parts += _axes(s, v.sla_s)
    if v.age_series:
        pts = " ".join(f"{s.x(t):.1f},{s.y(a):.1f}" for t, a in v.age_series)
        parts.append(f'<polyline class="age" points="{pts}"><title>read-time age</title></polyline>')
    for t, p50, _ in v.lag_series:
        parts.append(f'<circle class="lag" cx="{s.x(t):.1f}" cy="{s.y(p50):.1f}" r="2"/>')
    if not v.age_series and not v.lag_series:
        parts.append(
            f'<text class="nodata" x="{W / 2}" y="{H / 2}" text-anchor="middle">no data in window</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


def _css(verdict: str) -> str:
    if verdict in FAILING:
        return "breach"
    return "nodata" if verdict == NO_DATA else "ok"


def _table(views: Sequence[ViewFreshness]) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in HEADER)
    rows = []
    for v in views:
        cells = "".join(f"<td>{escape(c)}</td>" for c in row_cells(v)[:-1])
        rows.append(
            f'<tr data-view="{escape(v.view)}">{cells}<td class="{_css(v.verdict)}">'
            f"{escape(row_cells(v)[-1])}</td></tr>"
        )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def render_html(report: Report) -> str:
    """Render the whole report as a self-contained HTML page (same table and summary as the text)."""
    start = report.now_ms - int(report.window_s * 1000)
    sections = []
    for tier in dict.fromkeys(v.tier for v in report.views):
        figs = []
        for v in (x for x in report.views if x.tier == tier):
            caption = (
                f'<b>{escape(v.view)}</b> · <span class="{_css(v.verdict)}">{escape(v.verdict)}</span>'
                f" · age p99 {fmt_s(v.age_window.p99)} · lag p99 {fmt_s(v.lag_window.p99)}"
            )
            figs.append(
                f'<figure class="view" data-view="{escape(v.view)}" data-verdict="{escape(v.verdict)}">'
                f"<figcaption>{caption}</figcaption>{chart(v, start, report.now_ms)}</figure>"
            )
        sections.append(
            f'<section class="tier" data-tier="{escape(tier)}"><h2>{escape(tier)} tier</h2>'
            f'<div class="charts">{"".join(figs)}</div></section>'
        )
    verdict = summary(report)
    generated = datetime.fromtimestamp(report.now_ms / 1000, tz=UTC).isoformat(timespec="seconds")
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8"><title>headwater freshness</title>'
        f"<style>{STYLE}</style></head><body><h1>Freshness against SLA</h1>"
        f'<p>Generated {escape(generated)}. <span class="summary">{escape(verdict)}</span>.'
        f" {'All views with data meet their SLA.' if not report.failing else ''}"
        " Blue: read-time age (now minus the boundary the tier has published up to);"
        " orange: pipeline lag of each write (p50 of its rows); red dashed: the view's SLA.</p>"
        f"{_table(report.views)}{''.join(sections)}</body></html>\n"
    )
