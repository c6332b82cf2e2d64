"""The TLS options of the commands, declared once: the servers' certificate and the clients' trust.

``headwater serve`` and ``headwater ingest serve`` take :func:`server_options` (``--tls-cert``,
``--tls-key``, ``--tls-client-ca``: laid over the serving config's ``tls:`` section). ``headwater
rank``, ``feedback`` and ``ingest push`` take :func:`client_options` (``--tls-ca``, ``--tls-cert``,
``--tls-key``, each defaulting to its ``HEADWATER_TLS_*`` variable of :mod:`headwater.client.tls`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from headwater.client.tls import ENV_CA, ENV_CERT, ENV_KEY, ClientTls, ClientTlsError

F = TypeVar("F", bound=Callable[..., Any])
_FILE = click.Path(dir_okay=False, path_type=Path)


def server_options(command: F) -> F:
    """Add ``--tls-cert``, ``--tls-key`` and ``--tls-client-ca`` (the command gets ``tls_cert`` ...)."""
    options = [
        click.option(
            "--tls-cert", type=_FILE, default=None,
            help="Serve HTTPS and gRPC TLS with this PEM certificate [default: the config's tls.cert_file].",
        ),
        click.option(
            "--tls-key", type=_FILE, default=None,
            help="The certificate's PEM private key [default: tls.key_file].",
        ),
        click.option(
            "--tls-client-ca", type=_FILE, default=None,
            help="Require client certificates signed by this PEM CA (mTLS) [default: tls.client_ca_file].",
        ),
    ]  # fmt: skip
    for option in reversed(options):
        command = option(command)
    return command


def client_options(command: F) -> F:
    """Add ``--tls-ca``, ``--tls-cert`` and ``--tls-key`` (read them with :func:`client_tls`)."""
    options = [
        click.option(
            "--tls-ca", type=_FILE, envvar=ENV_CA, default=None,
            help=f"Check the service's certificate with this PEM CA [default: ${ENV_CA}, else the system's].",
        ),
        click.option(
            "--tls-cert", type=_FILE, envvar=ENV_CERT, default=None,
            help=f"Client certificate (PEM) for a service that requires one (mTLS) [default: ${ENV_CERT}].",
        ),
        click.option(
            "--tls-key", type=_FILE, envvar=ENV_KEY, default=None,
            help=f"The client certificate's PEM key [default: ${ENV_KEY}].",
        ),
    ]  # fmt: skip
    for option in reversed(options):
        command = option(command)
    return command


def client_tls(ca: Path | None, cert: Path | None, key: Path | None) -> ClientTls | None:
    """Return the client TLS of the options (None: none given); a bad file is a usage error naming it."""
    try:
        return ClientTls.of(ca, cert, key)
    except ClientTlsError as exc:
        raise click.UsageError(str(exc)) from None
