"""Freshness judged after the tier's catch-up, and one report rendered as text and HTML alike (issue 37).

A realtime job started with ``--from-latest`` still reads a backlog first: its first writes are
stale. ``--after-catch-up`` shows that as the catch-up (with its duration) and judges the window
after it; the text table and the HTML page come from one :class:`Report` and agree view by view.
"""

from __future__ import annotations

import re
from html.parser import HTMLParser

from hypothesis import given, settings
from hypothesis import strategies as st

from headwater.pipelines.freshness.html import render_html
from headwater.pipelines.freshness.report import (
    BREACH,
    CATCHING_UP,
    OK,
    FreshnessTarget,
    Report,
    caught_up_at,
    view_freshness,
)
from headwater.pipelines.freshness.samples import Entry
from headwater.pipelines.freshness.text import HEADER, render_text, summary

T0 = 1_800_000_000_000
SPEC = FreshnessTarget("user_session_realtime", "realtime", 5.0)


def write(t_ms: int, lag_ms: int, rows: int = 4) -> Entry:
    return Entry(t_ms, rows, rows, t_ms - lag_ms, ((t_ms - lag_ms, rows),))


def starting_job() -> list[Entry]:
    """Writes every second: 20 s of a backlog (40 s behind, catching 2 s up per write), then live (200 ms)."""
    backlog = [write(T0 + i * 1000, 40_000 - i * 2000) for i in range(20)]
    live = [write(T0 + i * 1000, 200) for i in range(20, 90)]
    return backlog + live


def test_the_catch_up_is_shown_and_not_judged() -> None:
    entries, now, window = starting_job(), T0 + 89_500, 90_000
    plain = view_freshness(SPEC, entries, now, window)
    assert plain.verdict == BREACH  # the backlog's stale values count without the catch-up
    judged = view_freshness(SPEC, entries, now, window, after_catch_up=True)
    assert judged.verdict == OK
    assert judged.caught_up_ms == T0 + 18_000  # the first write with its own lag within 5 s (4 s)
    assert judged.catch_up_s == 18.0
    assert judged.judged_from_ms == T0 + 18_000
    assert judged.age_window.p99 is not None
    assert judged.age_window.p99 <= 5.0


def test_a_breach_after_the_catch_up_still_counts() -> None:
    entries = [*starting_job(), write(T0 + 95_000, 9_000)]  # 9 s behind, 60 s after catching up
    judged = view_freshness(SPEC, entries, T0 + 100_000, 90_000, after_catch_up=True)
    assert judged.verdict == BREACH


def test_a_view_not_caught_up_yet_is_catching_up_and_failing() -> None:
    backlog = [write(T0 + i * 1000, 60_000) for i in range(30)]
    judged = view_freshness(SPEC, backlog, T0 + 30_000, 30_000, after_catch_up=True)
    assert (judged.verdict, judged.caught_up_ms, judged.catch_up_s) == (CATCHING_UP, None, 30.0)
    report = Report(T0 + 30_000, 30.0, [judged], after_catch_up=True)
    assert report.failing == [judged]
    assert report.breached == []
    assert summary(report).endswith("0 in breach; 1 catching up: user_session_realtime")
    assert "30.0s so far" in render_text(report)


class _Verdicts(HTMLParser):
    """The view and verdict cells of the HTML table, and the page's summary."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: dict[str, list[str]] = {}
        self.summary = ""
        self._row: str | None = None
        self._in: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "tr" and a.get("data-view"):
            self._row = a["data-view"]
            self.rows[self._row] = []
        elif tag == "td" and self._row is not None:
            self._in = "td"
            self.rows[self._row].append("")
        elif tag == "span" and a.get("class") == "summary":
            self._in = "summary"

    def handle_endtag(self, tag: str) -> None:
        if tag == "tr":
            self._row = None
        if tag in ("td", "span"):
            self._in = None

    def handle_data(self, data: str) -> None:
        if self._in == "td" and self._row is not None:
            self.rows[self._row][-1] += data
        elif self._in == "summary":
            self.summary += data


def _text_rows(text: str) -> dict[str, list[str]]:
    lines = text.splitlines()
    starts = [m.start() for m in re.finditer(r"\S+", lines[1])]  # the dashes under each header cell
    rows = {}
    for line in lines[2:]:
        if not line.strip():
            break
        cells = [line[a:b].strip() for a, b in zip(starts, [*starts[1:], len(line) + 1], strict=True)]
        rows[cells[1]] = cells
    return rows


def _mixed_report() -> Report:
    views = [
        view_freshness(SPEC, starting_job(), T0 + 89_500, 30_000, after_catch_up=True),
        view_freshness(
            FreshnessTarget("item_trending_realtime", "realtime", 10.0),
            [write(T0 + i * 1000, 60_000) for i in range(80)],
            T0 + 89_500,
            30_000,
            after_catch_up=True,
        ),
        view_freshness(
            FreshnessTarget("user_dwell_realtime", "realtime", 5.0),
            [e for e in starting_job() if e.write_ms < T0 + 80_000],  # stopped writing 9.5 s ago
            T0 + 89_500,
            30_000,
            after_catch_up=True,
        ),
        view_freshness(FreshnessTarget("user_search_nearline", "nearline", 300.0), [], T0 + 89_500, 30_000),
    ]
    return Report(T0 + 89_500, 30.0, views, after_catch_up=True)


def test_text_and_html_from_one_report_agree_view_by_view() -> None:
    report = _mixed_report()
    text, page = render_text(report), render_html(report)
    parsed = _Verdicts()
    parsed.feed(page)
    text_rows = _text_rows(text)
    assert list(text_rows) == list(parsed.rows) == [v.view for v in report.views]
    assert all(len(cells) == len(HEADER) for cells in parsed.rows.values())
    assert text_rows == parsed.rows  # every cell, verdicts included
    verdicts = {view: cells[-1] for view, cells in parsed.rows.items()}
    assert verdicts == {
        "user_session_realtime": "ok",
        "item_trending_realtime": "CATCHING UP (lag>sla)",
        "user_dwell_realtime": "BREACH",
        "user_search_nearline": "no data",
    }
    assert text.rstrip().endswith(summary(report))
    assert parsed.summary == summary(report)
    assert "1 in breach: user_dwell_realtime; 1 catching up: item_trending_realtime" in parsed.summary


@settings(max_examples=60, deadline=None)
@given(
    lags=st.lists(st.integers(min_value=0, max_value=60_000), min_size=1, max_size=40),
    window_s=st.integers(min_value=1, max_value=60),
)
def test_any_log_renders_the_same_verdicts_and_the_catch_up_is_never_judged(
    lags: list[int], window_s: int
) -> None:
    entries = [write(T0 + i * 1000, lag) for i, lag in enumerate(lags)]
    now = T0 + len(lags) * 1000
    v = view_freshness(SPEC, entries, now, window_s * 1000, after_catch_up=True)
    caught = caught_up_at(entries, SPEC.sla_s)
    assert v.caught_up_ms == caught
    if caught is None:
        assert v.verdict == CATCHING_UP
    else:
        assert v.judged_from_ms == max(now - window_s * 1000, caught)
        assert v.catch_up_s == (caught - T0) / 1000
    report = Report(now, float(window_s), [v], after_catch_up=True)
    parsed = _Verdicts()
    parsed.feed(render_html(report))
    assert _text_rows(render_text(report)) == parsed.rows
