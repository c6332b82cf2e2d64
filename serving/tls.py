"""TLS on the service's ports: HTTPS on uvicorn and gRPC TLS, with mutual TLS when a client CA is given.

The serving config's ``tls:`` section (:class:`~headwater.serving.config.TlsConfig`), or the
``--tls-cert``/``--tls-key``/``--tls-client-ca`` options of ``headwater serve`` and ``headwater
ingest serve``, name the PEM files. :func:`check` loads them once at start, the way the servers
will, so a key that is not the certificate's, or a file that is not PEM, stops the start with the
file's name and what to do, instead of a handshake failure on the first call. :func:`uvicorn_tls_options`
and :func:`bind_grpc` then turn the same section into uvicorn's ``ssl_*`` keywords and a gRPC
``add_secure_port`` (``require_client_auth`` with a client CA). Without TLS, :func:`plaintext_warning`
is the line printed at start when the address is not loopback (bearer tokens then cross the network
readable).
"""

from __future__ import annotations

import ipaddress
import ssl
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from headwater.serving.config import ServingConfigError, TlsConfig


def is_loopback(host: str) -> bool:
    """Whether ``host`` is ``localhost`` or a loopback address (127.0.0.0/8, ::1)."""
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def from_options(
    configured: TlsConfig | None, cert: Path | None, key: Path | None, client_ca: Path | None
) -> TlsConfig | None:
    """Return the TLS section with the command-line options laid over the config's (None: plaintext).

    ``--tls-cert`` and ``--tls-key`` replace the config's pair; given alone, the other comes from
    the config, and with no ``tls:`` section both are needed. ``--tls-client-ca`` adds (or replaces)
    the client CA. Raises :class:`ServingConfigError` naming the option when a file cannot be read.
    """
    if cert is None and key is None and client_ca is None:
        return configured
    base: dict[str, Any] = configured.model_dump() if configured is not None else {}
    given = {"cert_file": cert, "key_file": key, "client_ca_file": client_ca}
    base.update({name: path for name, path in given.items() if path is not None})
    missing = [f"--tls-{n}" for n, field in (("cert", "cert_file"), ("key", "key_file")) if field not in base]
    if missing:
        msg = (
            f"{' and '.join(missing)} missing: TLS needs the certificate and its key (--tls-cert FILE"
            " --tls-key FILE, or a `tls:` section in --config)"
        )
        raise ServingConfigError(msg)
    try:
        return TlsConfig.model_validate(base)
    except ValidationError as exc:
        problems = "; ".join(str(err["msg"]).removeprefix("Value error, ") for err in exc.errors())
        msg = f"TLS options: {problems}"
        raise ServingConfigError(msg) from None


def server_context(tls: TlsConfig) -> ssl.SSLContext:
    """Return a server ``SSLContext`` of ``tls``; raises :class:`ServingConfigError` naming the bad file."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(tls.cert_file, tls.key_file)
    except ssl.SSLError as exc:
        if "KEY_VALUES_MISMATCH" in str(exc) or "key values mismatch" in str(exc):
            msg = (
                f"tls: key_file {tls.key_file} is not the private key of cert_file {tls.cert_file}: give"
                " the key the certificate was issued for"
            )
        else:
            msg = (
                f"tls: cert_file {tls.cert_file} and key_file {tls.key_file} are not a PEM certificate and"
                f" an unencrypted PEM key ({exc.reason or exc}); convert them with openssl"
            )
        raise ServingConfigError(msg) from None
    except OSError as exc:
        msg = f"tls: cert_file {tls.cert_file} or key_file {tls.key_file}: cannot be read ({exc.strerror})"
        raise ServingConfigError(msg) from None
    if tls.client_ca_file is not None:
        try:
            context.load_verify_locations(cafile=tls.client_ca_file)
        except (ssl.SSLError, OSError) as exc:
            why = exc.reason if isinstance(exc, ssl.SSLError) else exc.strerror
            msg = (
                f"tls: client_ca_file {tls.client_ca_file} is not a readable PEM certificate ({why or exc});"
                " give the authority's certificate that signs the clients' certificates"
            )
            raise ServingConfigError(msg) from None
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def check(tls: TlsConfig | None) -> None:
    """Load the files as the servers will (see :func:`server_context`); nothing to do without TLS."""
    if tls is not None:
        server_context(tls)


def uvicorn_tls_options(tls: TlsConfig | None) -> dict[str, Any]:
    """Return the ``uvicorn.run`` keywords of ``tls`` (none for plaintext); mTLS requires a certificate."""
    if tls is None:
        return {}
    options: dict[str, Any] = {"ssl_certfile": str(tls.cert_file), "ssl_keyfile": str(tls.key_file)}
    if tls.client_ca_file is not None:
        options["ssl_ca_certs"] = str(tls.client_ca_file)
        options["ssl_cert_reqs"] = ssl.CERT_REQUIRED
    return options


def grpc_credentials(tls: TlsConfig) -> Any:
    """Return the ``grpc.ssl_server_credentials`` of ``tls`` (client certificates required with a CA)."""
    import grpc

    pair = (tls.key_file.read_bytes(), tls.cert_file.read_bytes())
    root = tls.client_ca_file.read_bytes() if tls.client_ca_file is not None else None
    return grpc.ssl_server_credentials([pair], root_certificates=root, require_client_auth=root is not None)


def bind_grpc(server: Any, address: str, tls: TlsConfig | None) -> int:
    """Add ``address`` to a ``grpc`` or ``grpc.aio`` server, with TLS when given; return the bound port.

    Raises OSError naming the address when it cannot be bound (grpc answers 0 or raises RuntimeError).
    """
    try:
        if tls is None:
            bound = int(server.add_insecure_port(address))
        else:
            bound = int(server.add_secure_port(address, grpc_credentials(tls)))
    except RuntimeError as exc:
        bound, why = 0, str(exc)
    else:
        why = "in use or not a local address"
    if bound == 0:
        msg = f"gRPC cannot listen on {address} ({why}); pick another --grpc-port"
        raise OSError(msg)
    return bound


def scheme(tls: TlsConfig | None) -> str:
    """``https`` with TLS, else ``http`` (for the start line)."""
    return "http" if tls is None else "https"


def plaintext_warning(host: str, tls: TlsConfig | None) -> str | None:
    """Return the warning for serving ``host`` without TLS off loopback; None with TLS or on loopback."""
    if tls is not None or is_loopback(host):
        return None
    return (
        f"no TLS on {host}: requests, answers and bearer tokens cross the network readable; give a"
        " `tls:` section (or --tls-cert and --tls-key), or terminate TLS in front of the service"
        " (docs/operations/security.md)"
    )
