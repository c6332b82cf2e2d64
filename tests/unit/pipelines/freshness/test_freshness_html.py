"""The HTML report: self-contained, one chart per view grouped by tier, with age, lag and SLA."""

from __future__ import annotations

from html.parser import HTMLParser

from headwater.pipelines.freshness.html import render_html
from headwater.pipelines.freshness.report import FreshnessTarget, Report, view_freshness
from headwater.pipelines.freshness.samples import Entry

T0 = 1_800_000_000_000


class Shapes(HTMLParser):
    """Counts tags per view (by the enclosing figure's data-view)."""

    def __init__(self) -> None:
        super().__init__()
        self.view = ""
        self.tiers: list[str] = []
        self.count: dict[tuple[str, str], int] = {}
        self.external: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "section":
            self.tiers.append(a.get("data-tier") or "")
        if tag == "figure":
            self.view = a.get("data-view") or ""
        if tag in ("script", "link", "img") or any(
            (v or "").startswith("http") and k != "xmlns" for k, v in attrs
        ):
            self.external.append(tag)
        key = (self.view, f"{tag}.{a.get('class', '')}")
        self.count[key] = self.count.get(key, 0) + 1


def test_html_has_one_chart_per_view_with_age_lag_and_sla() -> None:
    entries = [
        Entry(T0 + i * 1000, 2, 2, T0 + i * 1000 - 1500, ((T0 + i * 1000 - 1500, 2),)) for i in range(61)
    ]
    views = [
        view_freshness(FreshnessTarget("rt_a", "realtime", 5.0), entries, T0 + 60_000, 60_000),
        view_freshness(FreshnessTarget("nl_b", "nearline", 300.0), [], T0 + 60_000, 60_000),
    ]
    page = render_html(Report(T0 + 60_000, 60.0, views))
    shapes = Shapes()
    shapes.feed(page)
    assert shapes.tiers == ["realtime", "nearline"]
    assert shapes.count[("rt_a", "polyline.age")] == 1
    assert shapes.count[("rt_a", "circle.lag")] == 60  # one dot per write inside the window
    assert shapes.count[("rt_a", "line.sla")] == 1
    assert ("nl_b", "polyline.age") not in shapes.count
    assert shapes.count[("nl_b", "line.sla")] == 1
    assert shapes.count[("nl_b", "text.nodata")] == 1
    assert shapes.external == []
    assert "<script" not in page


def test_html_escapes_names() -> None:
    page = render_html(
        Report(T0, 60.0, [view_freshness(FreshnessTarget("a<b", "realtime", 5.0), [], T0, 60_000)])
    )
    assert "a&lt;b" in page
    assert "a<b" not in page
