"""``headwater freshness``: every applied view's pipeline lag and read-time age against its SLA.

Exit status: 0 when every view with data meets its SLA, 1 when at least one breaches it, 2 when the
command cannot report (no applied plans, bad option, online store unreachable).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from headwater.cli.errors import HeadwaterCommand
from headwater.cli.options import STATE_HELP
from headwater.pipelines.store.layout import DEFAULT_NAMESPACE
from headwater.registry.config import state_dir as resolve_state_dir
from headwater.registry.errors import HeadwaterError

if TYPE_CHECKING:
    from headwater.pipelines.freshness.report import FreshnessTarget, Report

EXIT_OK, EXIT_BREACH, EXIT_ERROR = 0, 1, 2


class FreshnessCommandError(HeadwaterError, click.ClickException):
    """The report could not be made; exits with status 2 (1 means an SLA breach)."""

    exit_code = EXIT_ERROR


def _window_s(text: str) -> float:
    from headwater.registry.durations import DurationError, parse_duration

    try:
        seconds = parse_duration(text).seconds
    except DurationError as exc:
        msg = f"--window {text!r}: {exc}"
        raise FreshnessCommandError(msg) from exc
    if seconds <= 0:
        msg = f"--window must be a positive duration such as 15m; got {text!r}"
        raise FreshnessCommandError(msg)
    return seconds


def _state_dir(given: Path | None) -> Path:
    return resolve_state_dir(given)


@click.command("freshness", cls=HeadwaterCommand)
@click.option(
    "--window", default="15m", show_default=True, help="Window of the p50/p99 figures (15m, 1h, PT30M)."
)
@click.option(
    "--format", "fmt", type=click.Choice(["text", "json", "html"]), default="text", show_default=True
)
@click.option(
    "--out", type=click.Path(dir_okay=False, path_type=Path), help="Write the report here, not stdout."
)
@click.option(
    "--html-out",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Also write the HTML page here, from the same report as the text/JSON (same views, same verdicts).",
)
@click.option(
    "--after-catch-up",
    is_flag=True,
    help="Judge each view only from when its tier caught up (its first write within the SLA);"
    " the catch-up is shown with its duration, a view not caught up yet is 'catching up'.",
)
@click.option(
    "--state-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help=f"Applied state with plans/ {STATE_HELP}.",
)
@click.option("--redis-url", help="Online store (default: $HEADWATER_REDIS_URL or redis://127.0.0.1:6379/0).")
@click.option("--namespace", default=DEFAULT_NAMESPACE, show_default=True, help="Online store key namespace.")
@click.option(
    "--serve-metrics",
    type=click.IntRange(1, 65535),
    metavar="PORT",
    help="Serve the Prometheus metrics on 127.0.0.1:PORT/metrics until interrupted, no report.",
)
def freshness(
    window: str,
    fmt: str,
    out: Path | None,
    html_out: Path | None,
    after_catch_up: bool,
    state_dir: Path | None,
    redis_url: str | None,
    namespace: str,
    serve_metrics: int | None,
) -> None:
    """Report each applied view's pipeline lag and read-time age (p50/p99) against its SLA.

    Pipeline lag = write time - event time (the window boundary B) of each written row; read-time
    age = now - the boundary the view's tier has published up to. Figures come from the write logs
    that the online store's write script keeps per view. Exit status: 0 all views with data meet
    their SLA, 1 at least one breaches it (or, with --after-catch-up, has not caught up yet), 2 the
    report could not be made.
    """
    from headwater.pipelines.freshness.report import NoPlansError, build_report, plan_views
    from headwater.pipelines.settings import Settings
    from headwater.pipelines.store.connect import redis_client
    from headwater.pipelines.store.transport import StoreError
    from headwater.registry.plans import PlanError

    window_s = _window_s(window)
    state = _state_dir(state_dir)
    try:
        specs = plan_views(state)
    except (NoPlansError, PlanError) as exc:
        raise FreshnessCommandError(str(exc)) from exc
    url = redis_url or Settings.from_env().redis_url
    client = redis_client(url, socket_timeout=5.0, socket_connect_timeout=2.0)
    if serve_metrics is not None:
        _serve(client, specs, window_s, namespace, serve_metrics)
        return
    try:
        report = build_report(
            client, specs, time.time_ns() // 1_000_000, window_s, namespace, after_catch_up=after_catch_up
        )
    except StoreError as exc:
        raise FreshnessCommandError(str(exc)) from exc
    finally:
        client.close()
    text = _render(report, fmt)
    if out is None:
        click.echo(text, nl=False)
    else:
        out.write_text(text, encoding="utf-8")
        click.echo(f"wrote {out}: {len(report.views)} views, {len(report.failing)} failing", err=True)
    if html_out is not None:
        html_out.write_text(_render(report, "html"), encoding="utf-8")
        click.echo(f"wrote {html_out}: the same {len(report.views)} views and verdicts", err=True)
    sys.exit(EXIT_BREACH if report.failing else EXIT_OK)


def _render(report: Report, fmt: str) -> str:
    from headwater.pipelines.freshness.html import render_html
    from headwater.pipelines.freshness.text import render_text

    if fmt == "json":
        return json.dumps(report.to_json(), indent=2) + "\n"
    if fmt == "html":
        return render_html(report)
    return render_text(report)


def _serve(client: Any, specs: Sequence[FreshnessTarget], window_s: float, namespace: str, port: int) -> None:
    from prometheus_client import CollectorRegistry, start_http_server

    from headwater.pipelines.freshness.metrics import FreshnessCollector

    registry = CollectorRegistry()
    registry.register(FreshnessCollector(client, specs, window_s=window_s, namespace=namespace))
    server, thread = start_http_server(port, addr="127.0.0.1", registry=registry)
    click.echo(
        f"serving freshness metrics of {len(specs)} views on http://127.0.0.1:{port}/metrics (Ctrl-C stops)"
    )
    try:
        while thread.is_alive():
            thread.join(1.0)
    except KeyboardInterrupt:
        click.echo("stopping")
    finally:
        server.shutdown()
