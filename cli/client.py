"""Command-line client of a running ranking service: ``headwater rank`` and ``headwater feedback``.

Both print what the service answered; a 4xx prints the service's message and exits 1, an unreachable
service says which address was tried and how to start one.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import click

from headwater.cli.errors import HeadwaterCommand
from headwater.cli.tls import client_options, client_tls
from headwater.client.tls import ClientTls

DEFAULT_URL = "http://127.0.0.1:8080"
URL = click.option("--url", default=DEFAULT_URL, show_default=True, help="Base URL of `headwater serve`.")


def post(
    url: str, path: str, body: dict[str, Any], timeout_s: float = 10.0, tls: ClientTls | None = None
) -> dict[str, Any]:
    """POST ``body`` as JSON to ``url + path``; return the JSON answer or raise a ClickException.

    ``HEADWATER_API_KEY`` (an API key or a JWT), when set, is sent as ``Authorization: Bearer``.
    ``tls``: the CA (and the client certificate) an ``https://`` URL is checked with.
    """
    headers = {"content-type": "application/json"}
    if os.environ.get("HEADWATER_API_KEY"):
        headers["authorization"] = f"Bearer {os.environ['HEADWATER_API_KEY']}"
    request = urllib.request.Request(url.rstrip("/") + path, data=json.dumps(body).encode(), headers=headers)
    try:
        context = tls.ssl_context() if tls is not None else None
        with urllib.request.urlopen(request, timeout=timeout_s, context=context) as answer:
            return dict(json.load(answer))
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode("utf-8", "replace")[:2000]
        msg = f"{path} answered {exc.code}: {detail}"
        raise click.ClickException(msg) from exc
    except (urllib.error.URLError, OSError) as exc:
        msg = f"no ranking service at {url} ({exc}); start one with `headwater serve`"
        raise click.ClickException(msg) from exc


def item_range(spec: str) -> list[str]:
    """Expand ``i000001..i000500`` into ids (prefix and zero padding kept); a plain id stays itself."""
    first, sep, last = spec.partition("..")
    if not sep:
        return [spec]
    head = first.rstrip("0123456789")
    digits = len(first) - len(head)
    if not digits or not last.startswith(head) or not last[len(head) :].isdigit():
        msg = f"a range is PREFIX<digits>..PREFIX<digits>, e.g. i000001..i000500; got {spec!r}"
        raise click.BadParameter(msg)
    lo, hi = int(first[len(head) :]), int(last[len(head) :])
    return [f"{head}{n:0{digits}d}" for n in range(lo, hi + 1)]


@click.command("rank", cls=HeadwaterCommand)
@click.argument("user_id")
@click.argument("candidates", nargs=-1, required=True)
@click.option("-k", "k", type=click.IntRange(min=1), default=10, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print the whole answer as JSON.")
@URL
@client_options
def rank(
    user_id: str,
    candidates: tuple[str, ...],
    k: int,
    as_json: bool,
    url: str,
    tls_ca: Path | None,
    tls_cert: Path | None,
    tls_key: Path | None,
) -> None:
    """Rank CANDIDATES (ids or ranges like i000001..i000500) for USER_ID; print the top K."""
    items = [item for spec in candidates for item in item_range(spec)]
    body = {"user_id": user_id, "candidates": items, "k": k}
    answer = post(url, "/v1/rank", body, tls=client_tls(tls_ca, tls_cert, tls_key))
    if as_json:
        click.echo(json.dumps(answer))
        return
    ages = ", ".join(
        f"{side} {age:.1f}s" for side, age in (answer.get("feature_ages_s") or {}).items() if age
    )
    click.echo(
        f"user {user_id}: model {answer.get('model_version')}  fallback {answer.get('fallback') or 'none'}"
        f"  request {answer.get('request_id')}  feature ages: {ages or '-'}"
    )
    for position, item in enumerate(answer["items"], 1):
        click.echo(f"  {position:2d}. {item['item_id']}  {item['score']:.4f}")


@click.command("feedback", cls=HeadwaterCommand)
@click.argument("user_id")
@click.argument("item_id")
@click.option(
    "--type", "event_type", type=click.Choice(["click", "like", "purchase", "dwell"]), default="click"
)
@click.option("--request-id", default=None, help="The ranking that showed the item (links the impression).")
@click.option("--position", type=click.IntRange(min=1), default=None)
@click.option("--dwell-ms", type=click.IntRange(min=0), default=None)
@URL
@client_options
def feedback(
    user_id: str,
    item_id: str,
    event_type: str,
    request_id: str | None,
    position: int | None,
    dwell_ms: int | None,
    url: str,
    tls_ca: Path | None,
    tls_cert: Path | None,
    tls_key: Path | None,
) -> None:
    """Tell the service USER_ID clicked (liked, bought, dwelt on) ITEM_ID; it goes to Kafka as an event."""
    body: dict[str, Any] = {"user_id": user_id, "item_id": item_id, "event_type": event_type}
    for key, value in (("request_id", request_id), ("position", position), ("dwell_ms", dwell_ms)):
        if value is not None:
            body[key] = value
    click.echo(json.dumps(post(url, "/v1/feedback", body, tls=client_tls(tls_ca, tls_cert, tls_key))))
